"""The extractor call: exact prompt, reply parsing, shrinking retries, transient
errors with backoff, configuration errors, and the no-extractor fallback.

The extractor is a real FakeOpenAI server on 127.0.0.1; the extraction is
given a recording sleep, so backoff is checked without waiting.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.pages import PageSite, load_visit_tool, page_text_from_prompt
from tests.fakes.visit_seams import Sleeps

vt = load_visit_tool("visit_tool_extract_tests")

PROMPTS = Path(__file__).parent / "fixtures" / "reference_agent" / "prompts.json"
GOOD = json.dumps({"rational": "r", "evidence": "E1", "summary": "S1"})
KEY = "sk-test-SECRET-123"


@pytest.fixture
def sleeps() -> Sleeps:
    """The extraction's waits between retries, recorded instead of waited."""
    return Sleeps()


@pytest.fixture(scope="module")
def fake_server() -> Any:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def fake(fake_server: Any) -> Any:
    """The module's fake extractor, emptied of earlier scripts and records."""
    fake_server.replies.clear()
    fake_server.bodies.clear()
    fake_server.responder = None
    fake_server.server.requests.clear()
    return fake_server


def valves(server: Any = None, **overrides: Any) -> Any:
    settings: dict[str, Any] = {"EXTRACTOR_MODEL": "qwen-extractor"}
    if server is not None:
        settings["EXTRACTOR_BASE_URL"] = server.base_url
    settings.update(overrides)
    return vt.Tools.Valves(**settings)


def page(text: str = "Body text of the page.") -> Any:
    return vt._Page("https://news.example/a", "A Title", text)


def sent_contents(server: Any) -> list[str]:
    return [page_text_from_prompt(b["messages"][0]["content"]) for b in server.bodies]


# -- prompt and request ------------------------------------------------------------


def test_extractor_prompt_is_byte_identical_to_the_reference() -> None:
    reference = json.loads(PROMPTS.read_text(encoding="utf-8"))["EXTRACTOR_PROMPT"]
    assert vt.EXTRACTOR_PROMPT.encode("utf-8") == reference.encode("utf-8")


async def test_request_is_one_user_message_with_the_formatted_prompt(
    fake: Any, sleeps: Sleeps
) -> None:
    fake.script(Reply(content=GOOD))
    outcome = await vt._extract(page(), "find facts", valves(fake), sleep=sleeps)
    assert (outcome.kind, outcome.evidence, outcome.summary) == (
        "extracted",
        "E1",
        "S1",
    )
    (body,) = fake.bodies
    document = (
        "Title: A Title\n\nURL Source: https://news.example/a\n\n"
        "Markdown Content:\nBody text of the page."
    )
    assert body["messages"] == [
        {
            "role": "user",
            "content": vt.EXTRACTOR_PROMPT.format(
                webpage_content=document, goal="find facts"
            ),
        }
    ]
    assert body["model"] == "qwen-extractor"
    assert body["temperature"] == 0.7
    assert body["max_tokens"] == 8192
    assert body["stream"] is False
    # No key: the reference agent's placeholder, as keyless servers expect.
    assert fake.requests[0].headers["authorization"] == "Bearer EMPTY"
    assert sleeps == []


async def test_api_key_is_sent_as_bearer_and_options_are_honoured(fake: Any) -> None:
    fake.script(Reply(content=GOOD))
    settings = valves(
        fake, EXTRACTOR_API_KEY=KEY, EXTRACTOR_TEMPERATURE=0.2, EXTRACTOR_MAX_TOKENS=0,
        EXTRACTOR_MODEL="",
    )  # fmt: skip
    await vt._extract(page(), "g", settings)
    assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"
    body = fake.bodies[0]
    assert body["temperature"] == 0.2
    assert "max_tokens" not in body
    assert "model" not in body


def test_api_base() -> None:
    assert vt._api_base("http://h/v1/") == "http://h/v1"
    assert vt._api_base("http://h/v1/chat/completions") == "http://h/v1"


# -- reply parsing -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "evidence", "summary"),
    [
        (GOOD, "E1", "S1"),
        ("```json\n" + GOOD + "\n```", "E1", "S1"),
        ("```\n" + GOOD + "\n```", "E1", "S1"),
        (
            '```json\n{"evidence": "run ```ls``` now", "summary": "S"}\n```',
            "run ```ls``` now",
            "S",
        ),
        ("Here you go:\n" + GOOD + "\nHope this helps.", "E1", "S1"),
        ('{"rationale": "r", "evidence": "E", "summary": "S"}', "E", "S"),
        (
            '<think>{"evidence": "no"}</think>\n{"evidence": "E", "summary": "S"}',
            "E",
            "S",
        ),
        ('{"evidence": ["first", "second"], "summary": "S"}', "first\nsecond", "S"),
        ('{"evidence": {"k": "v"}, "summary": "S"}', '{"k": "v"}', "S"),
        ('{"evidence": "E", "summary": 42}', "E", "42"),
        ('{"Evidence": "E", "Summary": "S"}', "E", "S"),
        ('{"evidence": "E"}', "E", "The extractor gave no summary."),
        ('{"summary": "S"}', "No verbatim evidence was quoted by the extractor.", "S"),
        ("{'evidence': 'E', 'summary': 'S',}", "E", "S"),
        (
            '{"evidence": "He said "hi" there", "summary": "S"}',
            'He said "hi" there',
            "S",
        ),
        ('{"evidence": "line1\nline2", "summary": "S"}', "line1\nline2", "S"),
    ],
)
def test_parse_extraction(reply: str, evidence: str, summary: str) -> None:
    assert vt._parse_extraction(reply) == (evidence, summary)


@pytest.mark.parametrize(
    "reply", ["", "I cannot help with that.", "{}", '{"rational": "only"}', "null"]
)
def test_unusable_replies(reply: str) -> None:
    assert vt._parse_extraction(reply) is None


def test_parsing_without_json5(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "json5", None)
    assert vt._loads("{'a': 1,}") is None  # json5 really is unavailable here
    assert vt._parse_extraction("{'evidence': 'E', 'summary': 'S',}") == ("E", "S")
    assert vt._parse_extraction('{"evidence": "E", "summary": "S"}') == ("E", "S")


# -- retries on unusable replies -----------------------------------------------------


async def test_empty_replies_shrink_the_page_like_the_reference(
    fake: Any, sleeps: Sleeps
) -> None:
    fake.script(*[Reply(content="") for _ in range(5)])
    outcome = await vt._extract(page("x" * 200_000), "g", valves(fake), sleep=sleeps)
    assert outcome.kind == "failed"
    lengths = [len(c) for c in sent_contents(fake)]
    assert len(lengths) == 5
    assert lengths[1] == int(lengths[0] * 0.7)
    assert lengths[2] == int(lengths[1] * 0.7)
    assert lengths[3] == int(lengths[2] * 0.7)
    assert lengths[4] == 25_000
    assert sleeps == []  # unusable replies are not transport errors


async def test_short_reply_then_good(fake: Any) -> None:
    fake.script(Reply(content="{ }"), Reply(content=GOOD))
    outcome = await vt._extract(page("y" * 1000), "g", valves(fake))
    assert outcome.kind == "extracted"
    first, second = (len(c) for c in sent_contents(fake))
    assert second == int(first * 0.7)


async def test_prose_replies_fail_after_five_calls(fake: Any) -> None:
    fake.respond_with(lambda body: Reply(content="I think the page is about cats."))
    outcome = await vt._extract(page(), "g", valves(fake))
    assert outcome.kind == "failed"
    assert len(fake.bodies) == 5


async def test_context_length_400_shrinks_instead_of_failing(fake: Any) -> None:
    fake.script(
        Reply(status=400, error="This model's maximum context length is 32768 tokens"),
        Reply(content=GOOD),
    )
    outcome = await vt._extract(page("z" * 1000), "g", valves(fake))
    assert outcome.kind == "extracted"
    first, second = (len(c) for c in sent_contents(fake))
    assert second < first


# -- transient errors --------------------------------------------------------------


async def test_5xx_is_retried_with_backoff(fake: Any, sleeps: Sleeps) -> None:
    fake.script(Reply(status=500), Reply(status=502), Reply(content=GOOD))
    outcome = await vt._extract(page(), "g", valves(fake), sleep=sleeps)
    assert outcome.kind == "extracted"
    assert sleeps == [1.0, 2.0]


async def test_retry_budget_is_bounded(fake: Any, sleeps: Sleeps) -> None:
    fake.respond_with(lambda body: Reply(status=503))
    outcome = await vt._extract(
        page(), "g", valves(fake, EXTRACTOR_MAX_RETRIES=3), sleep=sleeps
    )
    assert outcome.kind == "excerpt"
    assert len(fake.bodies) == 4  # no page shrinking on an outage
    assert sleeps == [1.0, 2.0, 4.0]
    assert "HTTP 503" in outcome.summary
    assert outcome.evidence == "Body text of the page."


async def test_429_honours_retry_after(fake: Any, sleeps: Sleeps) -> None:
    fake.script(Reply(status=429, headers={"Retry-After": "7"}), Reply(content=GOOD))
    outcome = await vt._extract(page(), "g", valves(fake), sleep=sleeps)
    assert outcome.kind == "extracted"
    assert sleeps == [7.0]


async def test_429_with_an_unreasonable_wait_gives_up(
    fake: Any, sleeps: Sleeps
) -> None:
    fake.respond_with(lambda body: Reply(status=429, headers={"Retry-After": "3600"}))
    outcome = await vt._extract(page(), "g", valves(fake), sleep=sleeps)
    assert outcome.kind == "excerpt"
    assert len(fake.bodies) == 1
    assert sleeps == []


def test_retry_after_http_date() -> None:
    assert vt._retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert vt._retry_after("soon") is None
    assert vt._retry_after("2.5") == 2.5


async def test_connection_refused_is_retried_then_excerpted(
    sleeps: Sleeps,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = valves(
        EXTRACTOR_BASE_URL=f"http://127.0.0.1:{port}/v1", EXTRACTOR_MAX_RETRIES=2
    )
    outcome = await vt._extract(page(), "g", settings, sleep=sleeps)
    assert outcome.kind == "excerpt"
    assert "ConnectError" in outcome.summary
    assert sleeps == [1.0, 2.0]


async def test_extractor_timeout(fake: Any, sleeps: Sleeps) -> None:
    fake.respond_with(lambda body: Reply(fault="hang"))
    settings = valves(fake, EXTRACTOR_TIMEOUT_SECONDS=0.3, EXTRACTOR_MAX_RETRIES=1)
    outcome = await vt._extract(page(), "g", settings, sleep=sleeps)
    assert outcome.kind == "excerpt"
    assert "Timeout" in outcome.summary
    assert len(fake.bodies) == 2


# -- configuration errors ----------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error", "valve"),
    [
        (401, "invalid api key " + KEY, "EXTRACTOR_API_KEY"),
        (403, "forbidden", "EXTRACTOR_API_KEY"),
        (404, "no such route", "EXTRACTOR_BASE_URL"),
        (400, "unknown model qwen-extractor", "EXTRACTOR_MODEL"),
        (405, "method not allowed", "EXTRACTOR_BASE_URL"),
    ],
)
async def test_config_errors_are_not_retried_and_name_the_valve(
    status: int, error: str, valve: str, fake: Any, sleeps: Sleeps
) -> None:
    fake.respond_with(lambda body: Reply(status=status, error=error))
    outcome = await vt._extract(
        page(), "g", valves(fake, EXTRACTOR_API_KEY=KEY), sleep=sleeps
    )
    assert outcome.kind == "excerpt"
    assert len(fake.bodies) == 1
    assert sleeps == []
    assert valve in outcome.summary
    assert f"HTTP {status}" in outcome.summary
    assert KEY not in outcome.summary


async def test_invalid_base_url_names_the_valve(sleeps: Sleeps) -> None:
    outcome = await vt._extract(
        page(), "g", valves(EXTRACTOR_BASE_URL="localhost:8000/v1"), sleep=sleeps
    )
    assert outcome.kind == "excerpt"
    assert "EXTRACTOR_BASE_URL" in outcome.summary
    assert sleeps == []


async def test_no_extractor_configured_returns_the_page_start() -> None:
    outcome = await vt._extract(page("p" * 10_000), "g", valves(RAW_EXCERPT_CHARS=600))
    assert outcome.kind == "excerpt"
    assert outcome.evidence == "p" * 600 + "\n[…]"
    assert outcome.summary.startswith(
        "No extractor model is configured (EXTRACTOR_BASE_URL valve)"
    )


# -- through the tool ------------------------------------------------------------------


async def test_valves_are_read_at_call_time_and_key_never_leaks(fake: Any) -> None:
    events: list[dict] = []
    fake.respond_with(lambda body: Reply(status=401, error="bad key " + KEY))
    tool = vt.Tools()
    with PageSite() as site:
        # Set after construction, as the lead's pipe does.
        tool.valves = tool.Valves(
            EXTRACTOR_BASE_URL=fake.base_url,
            EXTRACTOR_API_KEY=KEY,
            ALLOW_PRIVATE_URLS=True,
        )
        result = await tool.visit(
            url=site.url("/plain"), goal="g", __event_emitter__=events.append
        )
    assert len(fake.bodies) == 1
    assert "EXTRACTOR_API_KEY" in result
    assert "Plain facts" in result  # the page text is still given, as an excerpt
    assert KEY not in result
    assert KEY not in json.dumps(events)
    sources = [e for e in events if e["type"] == "source"]
    assert sources[0]["data"]["document"] == [
        "Plain facts: water boils at 100 C.\n\n[Read: whole document, 34 characters]"
    ]


async def test_a_lone_surrogate_in_the_goal_reaches_the_extractor_as_u_fffd(
    fake: Any,
) -> None:
    # The model may write half of a surrogate pair in its call ("\ud83d" in
    # JSON); json.loads makes it a lone surrogate, which UTF-8 cannot encode:
    # the extractor request failed to encode, every attempt, and the page was
    # lost ("the extractor gave no usable answer").
    fake.respond_with(lambda body: Reply(content=GOOD))
    goal = json.loads('"rocket \\ud83d launch"')
    tool = vt.Tools()
    with PageSite() as site:
        tool.valves = tool.Valves(
            EXTRACTOR_BASE_URL=fake.base_url, ALLOW_PRIVATE_URLS=True
        )
        url = site.url("/plain")
        result = await tool.visit(url=[url], goal=goal)
    (body,) = fake.bodies
    document = (
        f"Title: \n\nURL Source: {url}\n\n"
        "Markdown Content:\nPlain facts: water boils at 100 C."
    )
    assert body["messages"][0]["content"] == vt.EXTRACTOR_PROMPT.format(
        webpage_content=document, goal="rocket \ufffd launch"
    )
    assert result == (
        f"The useful information in {url} for user goal {goal} as follows: \n\n"
        "Evidence in page: \nE1\n\nSummary: \nS1"
    )
    assert result.ok
