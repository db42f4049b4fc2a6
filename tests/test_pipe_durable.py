"""A chat's research outlives the process that ran it; Stop still stops it.

The pipe keeps each round's progress in its checkpoint store (Open WebUI's
database in production; a directory here, passed as the pipe's seam). A run
cut off by a restart (its generator closed while the process shuts down)
goes on from its last finished round when the question is asked again in the
chat: the model is not asked for finished rounds, the chat says it is
resuming and from which round, and earlier pages keep their numbers. A run
the user stopped is forgotten; another user never sees it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.fakes.chat import drive, fake_tools, make_pipe
from tests.fakes.events import Events
from tests.fakes.openai_server import FakeOpenAI, Reply, answer, tool_call
from tongyi_deepresearch_openwebui_pipeline.adapters.checkpoint_store import (
    DirectoryStore,
)
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe

QUESTION = [{"role": "user", "content": "Which lighthouse came first?"}]
PAGE_1 = "https://history.example/pharos"
PAGE_2 = "https://history.example/tower"
ANSWER = f"The Pharos [1]({PAGE_1}), then the Tower [2]({PAGE_2})."


def research(body: dict[str, Any]) -> Reply:
    """Two pages, one a round, then the answer citing both."""
    if not body.get("stream"):
        return Reply(content=json.dumps({"evidence": "e", "summary": "s"}))
    done = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if done < 2:
        url = (PAGE_1, PAGE_2)[done]
        return Reply(content=tool_call("visit", {"url": [url], "goal": "dates"}))
    return Reply(content=answer(ANSWER))


def research_requests(fake: FakeOpenAI) -> list[int]:
    """How many messages each research request carried, in order."""
    return [len(body["messages"]) for body in fake.bodies if body.get("stream")]


def pipe_on(fake: FakeOpenAI, store: DirectoryStore, *, restarting: bool) -> Pipe:
    pipe = Pipe(
        tool_resolver=fake_tools(),
        checkpoints=lambda: store,
        shutting_down=lambda: restarting,
    )
    # The citation check after the answer has its own tests.
    return make_pipe(fake, pipe, CITATION_CHECK=False)


async def cut_off_at_round(pipe: Pipe, number: int, **params: Any) -> Events:
    """Run the chat until round ``number`` starts, then close it (Stop or restart)."""
    events = Events()
    chat = pipe.pipe(
        {"messages": QUESTION, "stream": True},
        __user__=params.get("user", {"id": "u1", "role": "user"}),
        __event_emitter__=events,
        __chat_id__="chat-1",
        __metadata__={},
    )
    async for _ in chat:
        if any(d.startswith(f"Round {number}/") for d in events.descriptions()):
            break
    await chat.aclose()
    return events


async def test_a_restarted_research_goes_on_from_its_last_finished_round(
    tmp_path: Path,
):
    store = DirectoryStore(tmp_path)
    with FakeOpenAI() as fake:
        fake.respond_with(research)
        await cut_off_at_round(pipe_on(fake, store, restarting=True), 3)
        before = research_requests(fake)
        turn = await drive(pipe_on(fake, store, restarting=False), QUESTION)
        after = research_requests(fake)[len(before) :]

    # Rounds 1 and 2, and round 3 in flight when the process went down ...
    assert before == [2, 4, 6]
    # ... asked again (only it), with rounds 1-2 as they were.
    assert after == [6]
    resuming = (
        "*Resuming the research from round 3: 2 rounds and 2 pages read before "
        "the interruption are kept.*"
    )
    # The note opens the message; the answer cites both pages by their numbers.
    assert turn.answer == (
        f"{resuming}\n\nThe Pharos [1]({PAGE_1}) [1], then the Tower [2]({PAGE_2}) [2]."
    )
    # Both pages are the message's sources, numbered as first read.
    assert [s["source"]["url"] for s in turn.events.sources()] == [PAGE_1, PAGE_2]
    assert turn.ending.startswith("Done")
    assert await store.load("u1", "chat-1") is None  # finished: forgotten


async def test_a_stopped_research_stays_stopped(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    with FakeOpenAI() as fake:
        fake.respond_with(research)
        await cut_off_at_round(pipe_on(fake, store, restarting=False), 3)
        assert await store.load("u1", "chat-1") is None
        before = len(research_requests(fake))
        turn = await drive(pipe_on(fake, store, restarting=False), QUESTION)
        after = research_requests(fake)[before:]

    assert after == [2, 4, 6]  # from round 1
    assert not turn.text.startswith("*Resuming")


async def test_another_user_in_the_chat_starts_from_round_one(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    with FakeOpenAI() as fake:
        fake.respond_with(research)
        await cut_off_at_round(pipe_on(fake, store, restarting=True), 3)
        before = len(research_requests(fake))
        turn = await drive(
            pipe_on(fake, store, restarting=False),
            QUESTION,
            __user__={"id": "u2", "role": "user"},
        )
        after = research_requests(fake)[before:]

    assert after == [2, 4, 6]
    assert not turn.text.startswith("*Resuming")
    assert await store.load("u1", "chat-1") is not None  # still u1's


async def test_no_checkpoint_outside_a_saved_chat(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    with FakeOpenAI() as fake:
        fake.respond_with(research)
        pipe = pipe_on(fake, store, restarting=True)
        events = Events()
        chat = pipe.pipe(
            {"messages": QUESTION, "stream": True},
            __user__={"id": "u1", "role": "user"},
            __event_emitter__=events,
            __chat_id__="local:temporary",
            __metadata__={},
        )
        async for _ in chat:
            if any(d.startswith("Round 3/") for d in events.descriptions()):
                break
        await chat.aclose()
    assert list(tmp_path.iterdir()) == []


async def test_a_checkpoint_holds_no_key_and_no_url_password(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    key, password = "sk-checkpoint-key-4242", "pw-checkpoint-9191"
    with FakeOpenAI() as fake:
        fake.respond_with(research)
        pipe = pipe_on(fake, store, restarting=True)
        host = fake.base_url.removeprefix("http://")
        pipe.valves = pipe.Valves(
            API_BASE_URL=f"http://user:{password}@{host}",
            API_KEY=key,
            MODEL_ID=fake.model,
        )
        await cut_off_at_round(pipe, 3)
    (saved,) = list(tmp_path.iterdir())
    data = saved.read_bytes()
    assert b'"format":"tongyi-deepresearch-checkpoint"' in data
    assert key.encode() not in data
    assert password.encode() not in data
    assert host.encode() not in data  # no server URL either
