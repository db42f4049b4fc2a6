"""The pipe with the real search and visit tools, over real local HTTP.

The model, the extractor (the same fake OpenAI-compatible server: the pipe
hands its own endpoint to the visit tool), SearXNG and the web pages all run on
127.0.0.1. The SSRF suite drives hostile URLs through the pipe, with the visit
tool's resolver and HTTP client replaced by recording stubs so that a missing
check fails the test instead of sending a packet.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
import pytest

from tests.fakes.chat import drive
from tests.fakes.openai_server import FakeOpenAI, Reply, answer, tool_call
from tests.fakes.pages import FakeResolver, PageSite, RoutingTransport
from tests.fakes.searxng import FakeSearXNG, result
from tests.test_visit_safety import REFUSED_URLS, RESOLVER_TABLE
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.toolbox import (
    ToolResolver,
)
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe
from tongyi_deepresearch_openwebui_pipeline.tools import search_tool, visit_tool

QUESTION = [
    {"role": "user", "content": "What does the article say about photosynthesis?"}
]


def local_tools(searxng_url: str, allow_private: bool) -> dict[str, type]:
    class LocalSearch(search_tool.Tools):
        class Valves(search_tool.Tools.Valves):
            SEARXNG_URL: str = searxng_url

    class LocalVisit(visit_tool.Tools):
        class Valves(visit_tool.Tools.Valves):
            ALLOW_PRIVATE_URLS: bool = allow_private
            PAGE_LOADER: Literal["auto", "openwebui", "builtin"] = "builtin"

    return {"search": LocalSearch, "visit": LocalVisit}


def make_pipe(fake: FakeOpenAI, classes: dict[str, type], **valves: Any) -> Pipe:
    pipe = Pipe(tool_resolver=ToolResolver(classes={**classes, "google_scholar": None}))
    pipe.valves = pipe.Valves(API_BASE_URL=fake.base_url, MODEL_ID=fake.model, **valves)
    return pipe


EVIDENCE = {
    "rational": "The page explains photosynthesis.",
    "evidence": "Photosynthesis converts light into chemical energy.",
    "summary": "Light becomes chemical energy.",
}


def router(turns: list[Reply], extractions: list[dict[str, Any]]):
    def route(body: dict[str, Any]) -> Reply:
        if not body.get("stream"):  # the visit tool's extractor call
            extractions.append(body)
            return Reply(content=json.dumps(EVIDENCE))
        return turns.pop(0)

    return route


async def test_search_visit_answer_with_real_tools():
    with FakeSearXNG() as engine, PageSite() as site, FakeOpenAI() as fake:
        article = site.url("/article")
        engine.script(
            "photosynthesis",
            results=[
                result(
                    article, "Plant Biology Notes", "How plants turn light into energy."
                ),
            ],
        )
        turns = [
            Reply(
                reasoning="Search first.",
                content=tool_call("search", {"query": ["photosynthesis"]}),
            ),
            Reply(
                reasoning="Read it.",
                content=tool_call(
                    "visit", {"url": [article], "goal": "what photosynthesis does"}
                ),
            ),
            Reply(
                reasoning="Done.",
                content=answer(
                    f"It converts light into chemical energy ([notes]({article}))."
                ),
                style="reasoning_content",
            ),
        ]
        extractions: list[dict[str, Any]] = []
        fake.respond_with(router(turns, extractions))
        pipe = make_pipe(
            fake, local_tools(engine.url("/search"), allow_private=True), API_KEY=""
        )
        turn = await drive(pipe, QUESTION)
        bodies = [b for b in fake.bodies if b.get("stream")]
    text, events = turn.text, turn.events

    search_result = bodies[1]["messages"][-1]["content"]
    assert search_result == (
        "<tool_response>\nA Google search for 'photosynthesis' found 1 results:\n\n"
        f"## Web Results\n1. [Plant Biology Notes]({article})\nSource: 127.0.0.1\n\n"
        "How plants turn light into energy.\n</tool_response>"
    )
    visit_result = bodies[2]["messages"][-1]["content"]
    assert visit_result == (
        f"<tool_response>\nThe useful information in {article} for user goal "
        "what photosynthesis does as follows: \n\n"
        f"Evidence in page: \n{EVIDENCE['evidence']}\n\n"
        f"Summary: \n{EVIDENCE['summary']}\n</tool_response>"
    )
    # The extractor got the reference prompt from the pipe's own endpoint and model.
    assert len(extractions) == 1
    prompt = extractions[0]["messages"][0]["content"]
    assert prompt.startswith("Please process the following webpage content")
    assert extractions[0]["model"] == fake.model
    # The page read became source 1 and the answer cites it.
    sources = [e for e in events if e["type"] == "source"]
    assert [s["data"]["metadata"][0]["source"] for s in sources] == [article]
    # The card: the evidence, and how much of the page the extractor read (the
    # fixture is all article, so the whole page).
    (card,) = sources[0]["data"]["document"]
    assert card.startswith(f"{EVIDENCE['evidence']}\n\n[Read: whole page, ")
    assert turn.answer == (
        f"It converts light into chemical energy ([notes]({article}) [1])."
    )
    assert turn.ending.startswith("Done: the model gave its answer · 3 rounds · ")
    searched = [
        e
        for e in events
        if e["type"] == "status" and e["data"].get("action") == "web_search"
    ]
    assert searched and searched[0]["data"]["urls"] == [article]
    assert (
        "- Searches: 1" in text
        and "- Pages read: 1 of 1 requested (1 cited as sources)" in text
    )


HOSTILE = [
    "http://169.254.169.254/latest/meta-data/",
    "http://[::ffff:127.0.0.1]/",
    "http://2130706433/",
    "http://10.0.0.1/admin",
    "http://metadata.example/",
]


@pytest.fixture
def recording_network(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    resolver = FakeResolver(
        {"metadata.example": ["169.254.169.254"], "localhost": ["127.0.0.1"]}
    )
    transport = RoutingTransport(allowed=())
    monkeypatch.setattr(visit_tool, "_resolve", resolver)
    monkeypatch.setattr(
        visit_tool,
        "_http_client",
        lambda verify, timeout: httpx.AsyncClient(transport=transport, timeout=timeout),
    )
    visit_tool._PAGE_CACHE.clear()
    return {"resolver": resolver, "transport": transport}


async def test_ssrf_through_the_pipe_sends_nothing(recording_network):
    with PageSite() as site, FakeOpenAI() as fake:
        local_page = site.url("/article")  # a real loopback server: must not be read
        urls = [*HOSTILE, local_page]
        turns = [
            Reply(content=tool_call("visit", {"url": urls[:5], "goal": "secrets"})),
            Reply(content=tool_call("visit", {"url": urls[5:], "goal": "secrets"})),
            Reply(content=answer("Nothing could be read.")),
        ]
        fake.respond_with(router(turns, []))
        pipe = make_pipe(
            fake, local_tools("http://127.0.0.1:9/search", allow_private=False)
        )
        text, _, events = await drive(pipe, QUESTION)
        results = [
            b["messages"][-1]["content"] for b in fake.bodies[1:] if b.get("stream")
        ]
        assert site.hits("/article") == 0
    assert recording_network["transport"].requests == []
    failure = "The provided webpage content could not be accessed."
    for url in urls:
        assert any(f"The useful information in {url} " in r for r in results)
    assert all(r.count(failure) >= 1 for r in results)
    assert not [e for e in events if e["type"] == "source"]
    assert "Nothing could be read." in text
    assert "- Pages read: 0 of 6 requested (0 cited as sources)" in text


async def test_redirect_to_private_address_is_refused_at_the_hop(recording_network):
    # news.example resolves to a public address; the page redirects to the
    # metadata service, which must be refused before any connection to it.
    with PageSite() as site, FakeOpenAI() as fake:
        recording_network["resolver"].table["news.example"] = ["93.184.215.14"]
        recording_network["transport"].allowed = {"93.184.215.14"}
        url = f"http://news.example:{site.port}/redirect-private"
        turns = [
            Reply(content=tool_call("visit", {"url": [url], "goal": "g"})),
            Reply(content=answer("ok")),
        ]
        fake.respond_with(router(turns, []))
        pipe = make_pipe(
            fake, local_tools("http://127.0.0.1:9/search", allow_private=False)
        )
        await drive(pipe, QUESTION)
        assert site.hits("/redirect-private") == 1
    blocked = recording_network["transport"].blocked
    assert blocked == []
    hosts = [r.url.host for r in recording_network["transport"].requests]
    assert "169.254.169.254" not in hosts


@pytest.mark.parametrize("url", REFUSED_URLS)
async def test_every_refused_address_form_through_the_pipe(url, recording_network):
    recording_network["resolver"].table.update(RESOLVER_TABLE)
    with FakeOpenAI() as fake:
        turns = [
            Reply(content=tool_call("visit", {"url": [url], "goal": "secrets"})),
            Reply(content=answer("Nothing could be read.")),
        ]
        fake.respond_with(router(turns, []))
        pipe = make_pipe(fake, local_tools("http://127.0.0.1:9/search", False))
        text, _, events = await drive(pipe, QUESTION)
        result = [b for b in fake.bodies if b.get("stream")][1]["messages"][-1]
    assert recording_network["transport"].requests == []
    assert "The provided webpage content could not be accessed." in result["content"]
    assert not [e for e in events if e["type"] == "source"]
    assert "Nothing could be read." in text


async def test_an_unconfigured_search_shows_a_failed_card():
    # Outside Open WebUI with no SEARXNG_URL the search tool cannot search; its
    # text does not start with "Error", and the card must still say it failed.
    with FakeOpenAI() as fake:
        fake.respond_with(
            router(
                [
                    Reply(content=tool_call("search", {"query": ["photosynthesis"]})),
                    Reply(content=answer("No search was possible.")),
                ],
                [],
            )
        )
        pipe = make_pipe(fake, {"search": search_tool.Tools}, API_KEY="")
        text, _, _ = await drive(pipe, QUESTION)

    card = text[text.index('<details type="tool_calls"') :]
    card = card[: card.index("</details>")]
    assert 'name="search"' in card
    assert "SEARXNG_URL" in card
    assert "&quot;error&quot;" in card  # shown as a failure, not as a result


async def test_a_too_long_refusal_still_ends_with_an_answer():
    # vLLM refuses round 2 for its length; with the reference strategy the
    # pipe makes room, asks for the answer, and says what happened and how to
    # serve more context (consolidating instead: tests/test_consolidation.py).
    with PageSite() as site, FakeOpenAI() as fake:
        article = site.url("/article")
        turns = [
            Reply(content=tool_call("visit", {"url": [article], "goal": "g"})),
            Reply(
                status=400,
                error="This model's maximum context length is 16384 tokens. However, "
                "you requested 30000 tokens (20000 in the messages, 10000 in the "
                "completion).",
            ),
            Reply(content=answer("Answer from what fits.")),
        ]
        fake.respond_with(router(turns, []))
        pipe = make_pipe(
            fake,
            local_tools("", allow_private=True),
            API_KEY="",
            CONTEXT_STRATEGY="wrap_up",
        )
        text, _, _ = await drive(pipe, QUESTION)
        wrap_up = [b for b in fake.bodies if b.get("stream")][-1]

    assert "Answer from what fits." in text
    assert "16,384 tokens" in text and "max-model-len" in text
    assert "maximum context length" in wrap_up["messages"][-1]["content"] or (
        "You have now reached the maximum context length"
        in wrap_up["messages"][-1]["content"]
    )
