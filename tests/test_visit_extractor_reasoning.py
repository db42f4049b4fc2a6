"""The extractor as it is deployed by default: the research model, a reasoning model.

Every reply here is a whole non-streamed completion in the shape one server
sends it (vLLM/SGLang with a reasoning parser, llama.cpp, Ollama, OpenRouter,
a template that opens the think block itself), served over real HTTP by
FakeOpenAI. Checked: thinking is turned off where the server understands it,
a field a server refuses is dropped (once per endpoint), the JSON is read after
the think block, a reply that thought its whole budget away falls back to the
page start at once, and the user sees that fallback in the status line.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fakes.events import Events
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.pages import PageSite, load_visit_tool

vt = load_visit_tool("visit_tool_reasoning_tests")

ANSWER = {"rational": "r", "evidence": "Water boils at 100 C.", "summary": "Boiling."}
JSON = json.dumps(ANSWER)
EXTRACTED = ("extracted", ANSWER["evidence"], ANSWER["summary"])
THOUGHT = (
    "The user wants the boiling point. The page says water boils at 100 C. "
    'I could answer {"evidence": "draft"} but let me check the goal first.'
)
MODEL = "Alibaba-NLP/Tongyi-DeepResearch-30B-A3B"


@pytest.fixture(autouse=True)
def _fresh_memory() -> Any:
    """No test inherits another's refused fields."""
    vt._REFUSED_FIELDS.clear()
    yield
    vt._REFUSED_FIELDS.clear()


async def never_sleeps(seconds: float) -> None:
    """The extraction's sleep: no reply here is a transient error to wait for."""
    raise AssertionError(f"no transient error here, yet slept {seconds}s")


async def extract(page: Any, goal: str, settings: Any) -> Any:
    """`_extract`, with a sleep that fails the test if it is ever called."""
    return await vt._extract(page, goal, settings, sleep=never_sleeps)


def tool() -> Any:
    """The visit tool, with a sleep that fails the test if it is ever called."""
    return vt.Tools(seams=vt._Seams(sleep=never_sleeps))


@pytest.fixture(scope="module")
def fake_server() -> Any:
    with FakeOpenAI(model=MODEL) as server:
        yield server


@pytest.fixture
def fake(fake_server: Any) -> Any:
    fake_server.replies.clear()
    fake_server.bodies.clear()
    fake_server.responder = None
    fake_server.server.requests.clear()
    return fake_server


def valves(server: Any, **overrides: Any) -> Any:
    settings: dict[str, Any] = {"EXTRACTOR_BASE_URL": server.base_url}
    settings.update(overrides)
    return vt.Tools.Valves(**settings)


def page(text: str = "Water boils at 100 C at sea level.") -> Any:
    return vt._Page("https://science.example/water", "Water", text)


# -- recorded replies, one shape per server ---------------------------------------


def completion(message: dict[str, Any], finish: str = "stop", **extra: Any) -> Reply:
    """A whole chat completion as the server sends it (non-streamed)."""
    body = {
        "id": "chatcmpl-5f0e8c1d",
        "object": "chat.completion",
        "created": 1758000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 812, "completion_tokens": 240, "total_tokens": 1052},
        **extra,
    }
    return Reply(body=body)


def vllm_reasoning_parser(content: str | None, reasoning: str, finish: str = "stop"):
    """vLLM / SGLang with `--reasoning-parser`: the thought in `reasoning_content`."""
    return completion(
        {"content": content, "reasoning_content": reasoning, "tool_calls": []},
        finish,
        prompt_logprobs=None,
    )


def reasoning_field(content: str | None, reasoning: str, finish: str = "stop"):
    """OpenRouter and Ollama's /v1: the thought in `reasoning`."""
    return completion(
        {"content": content, "refusal": None, "reasoning": reasoning},
        finish,
        system_fingerprint="fp_ollama",
    )


def inline(content: str, finish: str = "stop") -> Reply:
    """A raw server (llama.cpp --reasoning-format none, vLLM without a parser)."""
    return completion({"content": content}, finish, timings={"predicted_n": 240})


REPLIES_WITH_AN_ANSWER = {
    "reasoning_content": vllm_reasoning_parser(JSON, THOUGHT),
    "reasoning": reasoning_field(JSON, THOUGHT),
    "inline_think": inline(f"<think>\n{THOUGHT}\n</think>\n\n{JSON}"),
    "inline_think_fenced": inline(
        f"<think>\n{THOUGHT}\n</think>\n\n```json\n{JSON}\n```"
    ),
    # The chat template wrote `<think>\n` itself: the reply starts mid-thought.
    "template_opened_think": inline(f"{THOUGHT}\n</think>\n\n{JSON}"),
    # Thinking that mentions the closing tag, then closes it for real.
    "think_mentions_its_tag": inline(
        f"<think>\nI write </think> when done: {{draft}}\n</think>\n\n{JSON}"
    ),
    # Thinking turned off with vLLM's deepseek_r1 parser: the template closed an
    # empty think block, the parser saw no `</think>` and moved the whole answer
    # into `reasoning_content`, leaving `content` null.
    "answer_in_reasoning_content_null": vllm_reasoning_parser(None, JSON),
    "answer_at_end_of_reasoning": reasoning_field("", f"{THOUGHT}\n\n{JSON}"),
}


@pytest.mark.parametrize("style", REPLIES_WITH_AN_ANSWER)
async def test_the_json_is_read_in_every_reasoning_style(fake: Any, style: str) -> None:
    fake.script(REPLIES_WITH_AN_ANSWER[style])
    outcome = await extract(page(), "boiling point", valves(fake))
    assert (outcome.kind, outcome.evidence, outcome.summary) == EXTRACTED
    assert len(fake.bodies) == 1


# -- thinking is turned off where the server understands it ---------------------------


async def test_thinking_is_turned_off_by_default(fake: Any) -> None:
    fake.script(inline(JSON))
    await extract(page(), "g", valves(fake))
    (body,) = fake.bodies
    assert body["chat_template_kwargs"] == {
        "enable_thinking": False
    }  # vLLM, SGLang, llama.cpp
    assert body["reasoning_effort"] == "none"
    assert body["max_tokens"] == 8192


async def test_the_valve_sends_no_thinking_fields(fake: Any) -> None:
    fake.script(inline(JSON))
    await extract(page(), "g", valves(fake, EXTRACTOR_DISABLE_THINKING=False))
    (body,) = fake.bodies
    assert "chat_template_kwargs" not in body
    assert "reasoning_effort" not in body


REFUSALS = {
    # vLLM / SGLang built with extra="forbid", and strict OpenAI-style APIs.
    "chat_template_kwargs": (
        "1 validation error: {'type': 'extra_forbidden', 'loc': ('body', "
        "'chat_template_kwargs'), 'msg': 'Extra inputs are not permitted'}"
    ),
    # SGLang and vLLM releases that allow only low/medium/high.
    "reasoning_effort": (
        "1 validation error: {'type': 'literal_error', 'loc': ('body', "
        "'reasoning_effort'), 'msg': \"Input should be 'low', 'medium' or 'high'\"}"
    ),
}


def refusing(field: str) -> Any:
    def respond(body: dict[str, Any]) -> Reply:
        if field in body:
            return Reply(status=400, error=REFUSALS[field])
        return inline(JSON)

    return respond


@pytest.mark.parametrize("field", REFUSALS)
async def test_a_refused_field_is_dropped_once_and_remembered(field: str) -> None:
    with FakeOpenAI(model=MODEL) as server:
        server.respond_with(refusing(field))
        first = await extract(page(), "g", valves(server))
        second = await extract(page(), "g", valves(server))
        bodies = server.bodies
    assert (first.kind, second.kind) == ("extracted", "extracted")
    assert len(bodies) == 3  # refused, retried without it, then never sent again
    assert field in bodies[0]
    assert field not in bodies[1] and field not in bodies[2]
    other = next(name for name in REFUSALS if name != field)
    assert all(other in body for body in bodies)  # the other control stays


async def test_ollama_refusing_the_effort_value_is_understood() -> None:
    message = 'invalid reasoning value: \'none\' (must be "high", "medium", "low")'

    def respond(body: dict[str, Any]) -> Reply:
        if "reasoning_effort" in body:
            return Reply(status=400, error=message)
        return reasoning_field(JSON, THOUGHT)

    with FakeOpenAI(model=MODEL) as server:
        server.respond_with(respond)
        outcome = await extract(page(), "g", valves(server))
        assert len(server.bodies) == 2
    assert outcome.kind == "extracted"


async def test_a_server_refusing_both_fields_costs_at_most_two_extra_requests() -> None:
    def respond(body: dict[str, Any]) -> Reply:
        for field, error in REFUSALS.items():
            if field in body:
                return Reply(status=400, error=error)
        return inline(JSON)

    with FakeOpenAI(model=MODEL) as server:
        server.respond_with(respond)
        assert (await extract(page(), "g", valves(server))).kind == "extracted"
        assert (await extract(page(), "g", valves(server))).kind == "extracted"
        assert len(server.bodies) == 4


async def test_memory_is_per_endpoint(fake: Any) -> None:
    with FakeOpenAI(model=MODEL) as refusing_server:
        refusing_server.respond_with(refusing("chat_template_kwargs"))
        await extract(page(), "g", valves(refusing_server))
    fake.script(inline(JSON))
    await extract(page(), "g", valves(fake))
    assert "chat_template_kwargs" in fake.bodies[0]


async def test_a_400_naming_no_thinking_field_is_still_a_config_error(
    fake: Any,
) -> None:
    fake.respond_with(lambda body: Reply(status=400, error="unknown model 'x'"))
    outcome = await extract(page(), "g", valves(fake, EXTRACTOR_MODEL="x"))
    assert outcome.kind == "excerpt"
    assert len(fake.bodies) == 1
    assert "EXTRACTOR_MODEL" in outcome.summary
    assert not vt._REFUSED_FIELDS


# -- replies without an answer: bounded, and said so ------------------------------

BUDGET_EATEN = {
    "reasoning_content": vllm_reasoning_parser(None, THOUGHT * 40, "length"),
    "reasoning": reasoning_field("", THOUGHT * 40, "length"),
    "inline_unclosed_think": inline(f"<think>\n{THOUGHT * 40}", "length"),
    "template_opened_think": inline(THOUGHT * 40, "length"),
    "hidden_reasoning": completion({"content": ""}, "length"),
}


@pytest.mark.parametrize("style", BUDGET_EATEN)
async def test_thinking_that_eats_the_budget_falls_back_at_once(
    fake: Any, style: str
) -> None:
    fake.respond_with(lambda body: BUDGET_EATEN[style])
    outcome = await extract(page(), "g", valves(fake))
    assert len(fake.bodies) == 1  # not five shrinking retries of the same budget
    assert outcome.kind == "excerpt"
    assert outcome.evidence == "Water boils at 100 C at sea level."
    assert "EXTRACTOR_MAX_TOKENS" in outcome.summary
    assert "thinking" in outcome.reason


THINKING_ONLY = {
    "reasoning_content": vllm_reasoning_parser(None, THOUGHT),
    "reasoning": reasoning_field("", THOUGHT),
    "inline_think_then_nothing": inline(f"<think>\n{THOUGHT}\n</think>\n\n"),
    # Ends with prose after a draft: a draft inside thinking is not the answer.
    "draft_then_prose": reasoning_field(
        None, f'{{"evidence": "draft", "summary": "draft"}}\n{THOUGHT}'
    ),
}


@pytest.mark.parametrize("style", THINKING_ONLY)
async def test_a_reply_of_thinking_only_is_not_retried_five_times(
    fake: Any, style: str
) -> None:
    fake.respond_with(lambda body: THINKING_ONLY[style])
    outcome = await extract(page(), "g", valves(fake))
    assert len(fake.bodies) == 1
    assert outcome.kind == "excerpt"
    assert "draft" not in outcome.evidence + outcome.summary
    assert "without JSON" in outcome.reason


async def test_a_cut_answer_is_still_read_when_its_fields_are_there(fake: Any) -> None:
    cut = '{"rational": "r", "evidence": "Water boils at 100 C.", "summary": "Boil'
    fake.script(vllm_reasoning_parser(cut, THOUGHT, "length"))
    outcome = await extract(page(), "g", valves(fake))
    assert outcome.kind == "extracted"
    assert outcome.evidence == "Water boils at 100 C."


# -- the user sees the fallback -------------------------------------------------------


async def test_the_status_says_when_extraction_falls_back(fake: Any) -> None:
    fake.respond_with(lambda body: BUDGET_EATEN["reasoning_content"])
    events = Events()
    visit = tool()
    with PageSite() as site:
        visit.valves = valves(fake, ALLOW_PRIVATE_URLS=True)
        url = site.url("/plain")
        result = await visit.visit(url=[url], goal="g", __event_emitter__=events)
    assert "Plain facts" in result  # the page start is given
    fallback = [d for d in events.descriptions() if d.startswith("Could not extract")]
    assert fallback == [
        f"Could not extract from {url} (the extractor spent its whole reply "
        "budget thinking); gave the page start instead"
    ]
    assert [e["type"] for e in events].count("source") == 1
    assert len(fake.bodies) == 1


async def test_no_fallback_status_when_extraction_works(fake: Any) -> None:
    fake.respond_with(lambda body: vllm_reasoning_parser(JSON, THOUGHT))
    events = Events()
    visit = tool()
    with PageSite() as site:
        visit.valves = valves(fake, ALLOW_PRIVATE_URLS=True)
        await visit.visit(url=[site.url("/plain")], goal="g", __event_emitter__=events)
    assert not [d for d in events.descriptions() if d.startswith("Could not")]


async def test_a_cut_answer_without_its_fields_keeps_the_reference_retries(
    fake: Any,
) -> None:
    fake.respond_with(
        lambda body: vllm_reasoning_parser('{"rational": "The page', THOUGHT, "length")
    )
    outcome = await extract(page(), "g", valves(fake))
    assert outcome.kind == "failed"  # the reference's failure text, after its tries
    assert len(fake.bodies) == 5


# -- the rules, one by one ------------------------------------------------------------


@pytest.mark.parametrize(
    ("thought", "expected"),
    [
        (f"{THOUGHT}\n```json\n{JSON}\n```", (ANSWER["evidence"], ANSWER["summary"])),
        (
            f'{THOUGHT}\n{{"evidence": ["a", {{"summary": "inner"}}], "summary": "S"}}',
            ('a\n{"summary": "inner"}', "S"),
        ),
        (f"{THOUGHT}\n{JSON}\nThat is my answer.", None),  # not at the end
        (f'{THOUGHT}\n{{"evidence": "E", "summary": "S" "x"}}', None),  # broken
        (f"{THOUGHT} {{}}", None),
    ],
)
def test_only_a_thought_that_ends_in_json_is_an_answer(
    thought: str, expected: Any
) -> None:
    assert vt._answer_ending(thought) == expected


def test_refusal_memory_is_bounded() -> None:
    for index in range(vt._MAX_REMEMBERED_ENDPOINTS + 1):
        vt._remember_refused(f"http://host-{index}/v1", {"reasoning_effort"})
    assert len(vt._REFUSED_FIELDS) == vt._MAX_REMEMBERED_ENDPOINTS
    assert "http://host-0/v1" not in vt._REFUSED_FIELDS
    assert f"http://host-{vt._MAX_REMEMBERED_ENDPOINTS}/v1" in vt._REFUSED_FIELDS
