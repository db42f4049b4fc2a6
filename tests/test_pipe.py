"""Driving `Pipe.pipe()` the way Open WebUI does, against a real local SSE server.

The tool classes are faked at one seam (the pipe's tool resolver) so these tests
are about the pipe; the real tools are exercised through the pipe in
tests/test_pipe_with_tools.py.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from tests.fakes.chat import QUESTION, answer_in, drive, fake_tools, make_pipe
from tests.fakes.client_watch import ClientWatch
from tests.fakes.openai_server import (
    FakeOpenAI,
    Reply,
    StreamGate,
    Style,
    answer,
    tool_call,
)
from tests.fakes.scripted_model import ScriptedModel
from tests.fakes.waits import Waits
from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import ModelSettings
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.toolbox import (
    ToolResolver,
)
from tongyi_deepresearch_openwebui_pipeline.core.prompts import WRAP_UP_MESSAGE
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe

KEY = "sk-live-VERY-SECRET-999"
#: The answer of `research_script` as the chat shows it: the page read cited,
#: the other link marked.
ANSWER_SHOWN = (
    "It was written by Ada [see](https://example.org/who) [1]. "
    "Also https://other.org/x *(unverified)*."
)


def research_script(
    style: Style, answer_gates: tuple[StreamGate, ...] = ()
) -> list[Reply]:
    return [
        Reply(
            reasoning="I should search.",
            content=tool_call("search", {"query": ["who"]}),
            style=style,
        ),
        Reply(
            reasoning="Now read the page.",
            content=tool_call(
                "visit", {"url": ["https://example.org/who"], "goal": "author"}
            ),
            style=style,
        ),
        Reply(
            reasoning="I know it.",
            content=answer(
                "It was written by Ada [see](https://example.org/who). "
                "Also https://other.org/x."
            ),
            style=style,
            gates=answer_gates,
        ),
    ]


@pytest.mark.parametrize("style", ["inline", "reasoning_content", "reasoning"])
async def test_full_research_run_in_each_server_style(style):
    # The server holds the rest of the answer back at each gate until the pipe's
    # output shows the answer so far: a handshake, not a count of network reads.
    gates = (
        StreamGate(after="It was written"),
        StreamGate(after="by Ada"),
        StreamGate(after="Also"),
    )
    with FakeOpenAI() as fake:
        fake.script(*research_script(style, gates))
        text, _, events = await drive(make_pipe(fake), QUESTION, gates)
        bodies = fake.bodies
    # live reasoning blocks, one per round
    assert text.count("<think>") == 3 and "I should search." in text
    # tool cards with arguments and results
    cards = re.findall(
        r'<details type="tool_calls" done="true" id="[^"]+" name="(\w+)"', text
    )
    assert cards == ["search", "visit"]
    assert '\n\n<details type="tool_calls"' in text  # blank line before each card
    # the answer streams in pieces and cites only the page that was read
    assert answer_in(text) == ANSWER_SHOWN
    # token by token, not one block at the end: each part reached the chat
    # before the server sent the next
    assert [gate.released_by for gate in gates] == ["opened"] * 3
    assert (
        "**Sources read**\n\n1. [Title of https://example.org/who](https://example.org/who)"
        in text
    )
    assert "<summary>Research summary</summary>" in text and "- Rounds: 3" in text
    # sources and a done status reach Open WebUI
    sources = [e for e in events if e["type"] == "source"]
    assert (
        len(sources) == 1
        and sources[0]["data"]["metadata"][0]["source"] == "https://example.org/who"
    )
    assert events[-1]["type"] == "status" and events[-1]["data"]["done"] is True
    assert not any(
        e["data"].get("done")
        for e in events[:-1]
        if e["type"] == "status" and not e["data"].get("action")
    )
    # the model saw the reference protocol
    system = bodies[0]["messages"][0]["content"]
    assert system.endswith("Current date: 2026-11-22")
    assert '"name": "search"' in system and '"name": "visit"' in system
    assert "google_scholar" not in system and "PythonInterpreter" not in system
    second = bodies[1]["messages"]
    assert second[-1]["role"] == "user" and second[-1]["content"].startswith(
        "<tool_response>\nA Google search for 'who' found 1 results:"
    )
    assert second[-2]["content"].startswith(
        "<think>\nI should search.\n</think>\n\n<tool_call>"
    )


async def test_history_is_identical_across_server_styles():
    histories = []
    styles: tuple[Style, ...] = ("inline", "reasoning_content", "reasoning")
    for style in styles:
        with FakeOpenAI() as fake:
            fake.script(*research_script(style))
            await drive(make_pipe(fake), QUESTION)
            histories.append(fake.bodies[-1]["messages"])
    assert histories[0] == histories[1] == histories[2]


async def test_default_sampling_is_the_labs_evaluation_setting():
    # The lab's runner passes TEMPERATURE=0.85 and PRESENCE_PENALTY=1.1 from its
    # .env.example (the published scores); react_agent.py's 0.6 is a fallback.
    with FakeOpenAI() as fake:
        fake.script(Reply(content=answer("Ada.")))
        await drive(make_pipe(fake), QUESTION)
        body = fake.bodies[0]
    assert body["temperature"] == 0.85
    assert body["presence_penalty"] == 1.1
    assert body["top_p"] == 0.95


async def test_thinking_hidden_by_user_valve():
    with FakeOpenAI() as fake:
        fake.script(*research_script("inline"))
        pipe = make_pipe(fake)
        user = {"id": "u", "valves": pipe.UserValves(SHOW_THINKING=False)}
        text, _, _ = await drive(pipe, QUESTION, __user__=user)
    assert "<think>" not in text and "I should search" not in text
    assert answer_in(text) == ANSWER_SHOWN


async def test_cards_and_summary_can_be_turned_off():
    with FakeOpenAI() as fake:
        fake.script(*research_script("inline"))
        text, _, _ = await drive(
            make_pipe(fake, SHOW_TOOL_CARDS=False, SHOW_RESEARCH_SUMMARY=False),
            QUESTION,
        )
    assert "tool_calls" not in text and "Research summary" not in text


#: Nothing listens here: the served-context probe finds no server, at once.
NO_SERVER = "http://127.0.0.1:9/v1"


async def test_every_model_client_comes_from_the_pipes_factory_with_its_sleep():
    model = ScriptedModel(
        tool_call("search", {"query": ["who"]}), answer("Ada wrote it.")
    )
    waits = Waits()
    built: list[tuple[str, Any]] = []

    def factory(settings: ModelSettings, http: Any, sleep: Any) -> ScriptedModel:
        built.append((settings.model, sleep))
        return model

    pipe = Pipe(tool_resolver=fake_tools(), model_client=factory, sleep=waits)
    pipe.valves = pipe.Valves(
        API_BASE_URL=NO_SERVER, MODEL_ID="research-model", SUMMARY_MODEL="summarizer"
    )
    turn = await drive(pipe, QUESTION)
    assert turn.answer == "Ada wrote it."
    assert turn.ending.split(" · ")[:2] == [
        "Done: the model gave its answer",
        "2 rounds",
    ]
    # One client for the research, one for its summaries and one for the
    # citation check (on the summary endpoint), all with the pipe's sleep.
    assert [name for name, _ in built] == [
        "research-model",
        "summarizer",
        "summarizer",
    ]
    assert all(sleep is waits for _, sleep in built)
    assert model.seen[1][-1]["content"].startswith(
        "<tool_response>\nA Google search for 'who' found 1 results:"
    )


async def test_a_kept_task_asks_the_model_through_the_pipes_factory():
    model = ScriptedModel("<think>\nShort.\n</think>\n\nThe user asked about kiwis.")
    pipe = Pipe(model_client=model.client)
    pipe.valves = pipe.Valves(API_BASE_URL=NO_SERVER, MODEL_ID="research-model")
    messages = [{"role": "user", "content": "### Task:\nSummarize the chat."}]
    turn = await drive(pipe, messages, __task__="context_compaction")
    assert turn.text == "The user asked about kiwis."
    assert [settings.model for settings in model.settings] == ["research-model"]
    assert model.seen == [messages]


async def test_title_task_gets_a_cheap_reply_without_research():
    with FakeOpenAI() as fake:
        task_messages = [
            {
                "role": "user",
                "content": "### Task:\nTitle\n<chat_history>\n"
                "USER: Why is the sky blue?\n</chat_history>",
            }
        ]
        text, _, events = await drive(
            make_pipe(fake), task_messages, __task__="title_generation"
        )
        assert fake.bodies == []
    assert json.loads(text) == {"title": "Why is the sky blue"}
    assert events == []


async def test_open_webui_system_prompt_is_kept_before_the_reference_prompt():
    with FakeOpenAI() as fake:
        fake.script(Reply(content=answer("ok")))
        messages = [
            {"role": "system", "content": "Always answer in German."},
            *QUESTION,
        ]
        await drive(make_pipe(fake, SYSTEM_PROMPT_PREAMBLE="House rules."), messages)
        system = fake.bodies[0]["messages"][0]["content"]
    assert system.startswith(
        "House rules.\n\nAlways answer in German.\n\nYou are a deep research assistant."
    )


async def test_follow_up_turn_sends_clean_history():
    with FakeOpenAI() as fake:
        fake.script(*research_script("inline"))
        first, _, _ = await drive(make_pipe(fake), QUESTION)
        fake.script(Reply(content=answer("Follow-up answer")))
        messages = [
            *QUESTION,
            {"role": "assistant", "content": first},
            {"role": "user", "content": "And when?"},
        ]
        await drive(make_pipe(fake), messages)
        history = fake.bodies[-1]["messages"]
    assert [m["role"] for m in history] == ["system", "user", "assistant", "user"]
    earlier = history[2]["content"]
    assert earlier.startswith(
        "It was written by Ada [see](https://example.org/who) [1]."
    )
    assert "**Sources read**" in earlier  # what was read stays available
    assert "<details" not in earlier and "<think>" not in earlier


async def test_model_failure_mid_research_keeps_what_was_shown():
    with FakeOpenAI() as fake:
        fake.script(
            Reply(
                reasoning="Searching first.",
                content=tool_call("search", {"query": ["a"]}),
            ),
            Reply(status=401, error=f"invalid key {KEY}"),
        )
        text, _, events = await drive(make_pipe(fake, API_KEY=KEY), QUESTION)
    assert "Searching first." in text and 'name="search"' in text
    assert "The research stopped" in text and "API_KEY" in text
    assert KEY not in text and KEY not in json.dumps(events)
    assert events[-1]["data"]["done"] is True


async def test_unreachable_server_gives_a_clear_message():
    with FakeOpenAI() as fake:
        url = fake.base_url
    waits = Waits()
    pipe = Pipe(
        tool_resolver=ToolResolver(
            classes={"search": None, "visit": None, "google_scholar": None}
        ),
        sleep=waits,
    )
    pipe.valves = pipe.Valves(API_BASE_URL=url, MAX_RETRIES=1)
    turn = await drive(pipe, QUESTION)
    assert (
        f"> ⚠️ **The research stopped:** The model server at {url} did not give a "
        "usable reply after 1 attempts (connection failed: ConnectError). Check that "
        "it is running and that API_BASE_URL is right, or try again later."
    ) in turn.text.splitlines()
    assert turn.answer == ""
    assert turn.ending == (
        "Done: an error stopped the research · 1 rounds · 0 sources · "
        "0 tokens in / 0 out"
    )
    assert waits == []  # one attempt: nothing to wait for


async def test_failing_emitter_does_not_stop_the_run():
    async def broken(_event):
        raise RuntimeError("socket closed")

    with FakeOpenAI() as fake:
        fake.script(*research_script("inline"))
        text, _, _ = await drive(make_pipe(fake), QUESTION, __event_emitter__=broken)
    assert answer_in(text) == ANSWER_SHOWN


async def test_two_concurrent_chats_do_not_mix():
    def route(body: dict[str, Any]) -> Reply:
        question = body["messages"][1]["content"]
        last = body["messages"][-1]["content"]
        topic = "cats" if "cats" in question else "dogs"
        if last.startswith("<tool_response>"):
            assert topic in last, "a chat received the other chat's tool result"
            return Reply(
                content=answer(f"All about {topic}"), chunk_size=2, delay=0.001
            )
        return Reply(
            content=tool_call("search", {"query": [topic]}), chunk_size=3, delay=0.001
        )

    with FakeOpenAI() as fake:
        fake.respond_with(route)
        pipe = make_pipe(fake)
        (cats, _, cat_events), (dogs, _, dog_events) = await asyncio.gather(
            drive(
                pipe,
                [{"role": "user", "content": "Tell me about cats"}],
                __chat_id__="c1",
            ),
            drive(
                pipe,
                [{"role": "user", "content": "Tell me about dogs"}],
                __chat_id__="c2",
            ),
        )
    assert answer_in(cats) == "All about cats" and "dogs" not in cats
    assert answer_in(dogs) == "All about dogs" and "cats" not in dogs
    assert "cats" not in json.dumps(dog_events) and "dogs" not in json.dumps(cat_events)


async def test_cancelling_a_chat_leaves_no_task_or_connection():
    with FakeOpenAI() as fake:
        # The server holds the rest of the answer until the client leaves, so
        # the chat is cancelled mid-answer however busy the machine is.
        gate = StreamGate(
            after="xxxx", client_gone=ClientWatch(fake.server).connection_closed
        )
        fake.script(Reply(content=answer("x" * 4000), chunk_size=1, gates=(gate,)))
        pipe = make_pipe(fake)
        before = asyncio.all_tasks()
        started = asyncio.Event()

        async def consume():
            shown = ""
            async for chunk in pipe.pipe({"messages": QUESTION}, __user__={"id": "u"}):
                shown += chunk
                if "xx" in shown:  # the answer is streaming
                    started.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(started.wait(), 10)
        assert await asyncio.to_thread(gate.reached.wait, 10)  # the server holds
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()
        for _ in range(200):
            if fake.server.open_connections == 0:
                break
            await asyncio.sleep(0.01)
        assert fake.server.open_connections == 0
        assert gate.released_by == "client left"


async def test_pipes_lists_its_models_cheaply():
    pipe = Pipe()
    assert pipe.pipes() == [
        {"id": "tongyi-deepresearch", "name": "Tongyi DeepResearch"},
        {"id": "tongyi-deepresearch-heavy", "name": "Tongyi DeepResearch Heavy"},
    ]


@pytest.mark.parametrize(
    ("valves", "message"),
    [
        ({"API_BASE_URL": "localhost:8000"}, "must start with http"),
        ({"MAX_TOOL_ROUNDS": -1}, "greater than or equal to 1"),
        ({"TEMPERATURE": 5}, "less than or equal to 2"),
    ],
)
def test_wrong_valve_values_get_a_clear_message(valves, message):
    with pytest.raises(ValueError, match=message):
        Pipe.Valves(**valves)


async def test_emits_never_overlap():
    # Open WebUI persists sources with a read-modify-write; overlapping emits
    # (pages read in parallel) lose updates, so the pipe serialises them.
    active = 0
    overlaps = 0
    seen: list[dict[str, Any]] = []

    async def slow_emitter(event: dict[str, Any]) -> None:
        nonlocal active, overlaps
        active += 1
        overlaps += active > 1
        await asyncio.sleep(0.005)
        seen.append(event)
        active -= 1

    with FakeOpenAI() as fake:
        fake.script(
            Reply(
                content=tool_call(
                    "visit", {"url": ["https://a.org", "https://b.org"], "goal": "g"}
                )
                + tool_call(
                    "visit", {"url": ["https://c.org", "https://d.org"], "goal": "g"}
                )
            ),
            Reply(content=answer("done")),
        )
        pipe = make_pipe(fake)
        await drive(pipe, QUESTION, __event_emitter__=slow_emitter)
    assert overlaps == 0
    assert len([e for e in seen if e["type"] == "source"]) == 4


@pytest.mark.parametrize(
    ("served", "wraps_up", "ending"),
    [
        (16384, True, "the context budget was reached"),
        (131072, False, "the model gave its answer"),
    ],
)
async def test_budget_follows_the_context_the_server_serves(served, wraps_up, ending):
    long_question = "Background: " + "facts and figures " * 2800  # ~13k tokens
    waits = Waits()
    with FakeOpenAI(max_model_len=served) as fake:
        fake.script(
            Reply(content=tool_call("search", {"query": ["q"]})),
            Reply(content=answer("done")),
        )
        # The answer at the limit (ReSum's point, 90% of the served context less
        # 1,000 tokens, is tested with the consolidations).
        pipe = make_pipe(
            fake,
            Pipe(tool_resolver=fake_tools(), sleep=waits),
            MAX_TOKENS=4096,
            CONTEXT_STRATEGY="wrap_up",
        )
        turn = await drive(pipe, [{"role": "user", "content": long_question}])
        last = fake.bodies[-1]["messages"][-1]["content"]
    assert turn.answer == "done"
    assert turn.ending.split(" · ")[:2] == [f"Done: {ending}", "2 rounds"]
    assert waits == []  # both calls were answered: no retry, no back-off
    assert (last == WRAP_UP_MESSAGE) is wraps_up
