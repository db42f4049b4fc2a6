"""Each tool says whether its call worked; the toolbox does not read the words.

The tools return `ToolResult`, a `str` (what Open WebUI and the model see)
that carries `ok`. The trace card of a failed call (a misconfigured search, a
visit whose every page failed) shows it as failed, and a result whose text
merely starts with "Error" is not taken for a failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import pytest

from tests.fakes.events import Events
from tests.fakes.pages import PageSite
from tests.fakes.searxng import FakeSearXNG, Script, result
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.toolbox import (
    MAX_PAPERS,
    Toolbox,
    ToolContext,
    outcome_of,
    page_read,
)
from tongyi_deepresearch_openwebui_pipeline.core.sources import PageRead, Paper
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import ToolCall
from tongyi_deepresearch_openwebui_pipeline.tools import (
    scholar_tool,
    search_tool,
    visit_tool,
)

TOOL_MODULES = [search_tool, scholar_tool, visit_tool]


@pytest.fixture(scope="module")
def site() -> Iterator[PageSite]:
    with PageSite() as pages:
        yield pages


def search_class(url: str) -> type:
    class LocalSearch(search_tool.Tools):
        class Valves(search_tool.Tools.Valves):
            SEARXNG_URL: str = url

    return LocalSearch


def visit_class() -> type:
    class LocalVisit(visit_tool.Tools):
        class Valves(visit_tool.Tools.Valves):
            ALLOW_PRIVATE_URLS: bool = True
            PAGE_LOADER: Literal["auto", "openwebui", "builtin"] = "builtin"
            # No extractor answers here: a page read is handed on as an excerpt
            # (at once: the refused connection is not tried again).
            EXTRACTOR_BASE_URL: str = "http://127.0.0.1:9/v1"
            EXTRACTOR_MODEL: str = "none"
            EXTRACTOR_MAX_RETRIES: int = 0

    return LocalVisit


async def run(classes: dict[str, type], name: str, **arguments: Any):
    toolbox = Toolbox(classes, ToolContext())
    return await toolbox.run(ToolCall(name, arguments))


# -- search ----------------------------------------------------------------


async def test_search_with_results_is_ok(searxng: FakeSearXNG) -> None:
    searxng.script("solar", results=[result("https://a.example/", "A", "about")])
    outcome = await run({"search": search_class(searxng.search_url)}, "search",
                        query=["solar"])  # fmt: skip
    assert outcome.ok, outcome.text
    assert "https://a.example/" in outcome.text


async def test_unconfigured_search_is_a_failure() -> None:
    # No SearXNG URL and no Open WebUI request: nothing to search with.
    outcome = await run({"search": search_tool.Tools}, "search", query=["solar"])
    assert not outcome.ok, outcome.text
    assert not outcome.text.startswith("Error")  # the old guess missed it


async def test_search_whose_every_query_failed_is_a_failure(
    searxng: FakeSearXNG,
) -> None:
    searxng.default = Script(status=500)
    outcome = await run({"search": search_class(searxng.search_url)}, "search",
                        query=["one", "two"])  # fmt: skip
    assert not outcome.ok, outcome.text


async def test_search_with_one_query_answered_is_ok(searxng: FakeSearXNG) -> None:
    searxng.default = Script(status=500)
    searxng.script("good", results=[result("https://b.example/", "B", "text")])
    outcome = await run({"search": search_class(searxng.search_url)}, "search",
                        query=["good", "bad"])  # fmt: skip
    assert outcome.ok, outcome.text


async def test_invalid_search_call_is_a_failure() -> None:
    outcome = await run({"search": search_tool.Tools}, "search", query=[])
    assert not outcome.ok, outcome.text


# -- google_scholar ----------------------------------------------------------


async def test_misconfigured_scholar_backend_is_a_failure() -> None:
    class Misconfigured(scholar_tool.Tools):
        class Valves(scholar_tool.Tools.Valves):
            BACKEND: str = "altavista"

    outcome = await run({"google_scholar": Misconfigured}, "google_scholar",
                        query=["graphene"])  # fmt: skip
    assert not outcome.ok, outcome.text
    assert "BACKEND" in outcome.text


# -- visit -------------------------------------------------------------------


async def test_visit_whose_every_page_failed_is_a_failure(site: PageSite) -> None:
    urls = [site.url("/missing-one"), site.url("/missing-two")]
    outcome = await run({"visit": visit_class()}, "visit", url=urls, goal="facts")
    assert not outcome.ok, outcome.text


async def test_visit_with_one_page_read_is_ok(site: PageSite) -> None:
    urls = [site.url("/plain"), site.url("/missing-one")]
    outcome = await run({"visit": visit_class()}, "visit", url=urls, goal="facts")
    assert outcome.ok, outcome.text
    assert "water boils" in outcome.text


async def test_invalid_visit_call_is_a_failure() -> None:
    outcome = await run({"visit": visit_class()}, "visit", url=[], goal="facts")
    assert not outcome.ok, outcome.text


# -- the seam ----------------------------------------------------------------


@pytest.mark.parametrize("module", TOOL_MODULES, ids=lambda m: m.__name__)
def test_a_tool_result_is_a_plain_string_to_open_webui(module: Any) -> None:
    text = module.ToolResult("Search failed: quota.", ok=False)
    assert text.ok is False
    assert isinstance(text, str)
    assert text == "Search failed: quota."
    assert json.dumps(text) == json.dumps("Search failed: quota.")
    assert module.ToolResult("fine", ok=True).ok is True


@pytest.mark.parametrize("module", TOOL_MODULES, ids=lambda m: m.__name__)
def test_tool_result_is_not_offered_to_open_webui_as_a_tool(module: Any) -> None:
    # Open WebUI 0.6 makes every public callable of `Tools` a tool.
    assert not hasattr(module.Tools, "ToolResult")


async def test_a_plain_string_is_not_judged_by_its_words() -> None:
    class Speaker:
        async def search(self, query: list[str]) -> str:
            return "Error bars overlap in the cited study."

    outcome = await run({"search": Speaker}, "search", query=["x"])
    assert outcome.ok
    assert outcome.text == "Error bars overlap in the cited study."


async def test_a_tool_that_says_it_failed_is_believed() -> None:
    class Failing:
        async def search(self, query: list[str]) -> str:
            return search_tool.ToolResult("Nothing could be searched.", ok=False)

    outcome = await run({"search": Failing}, "search", query=["x"])
    assert not outcome.ok
    assert type(outcome.text) is str  # the core gets a plain string


# -- sources travel in the result ------------------------------------------------


async def test_a_visit_returns_the_pages_it_read_in_the_order_asked(
    site: PageSite,
) -> None:
    read_second, failing, read_first = (
        site.url("/plain"),
        site.url("/status/404"),
        site.url("/article"),
    )
    outcome = await run(
        {"visit": visit_class()},
        "visit",
        url=[read_first, failing, read_second, read_first],
        goal="g",
    )
    assert outcome.ok
    urls = [page.url for page in outcome.pages]
    assert urls == [read_first, read_second]  # once each, the failed one left out
    first = outcome.pages[0]
    assert (first.title, first.goal) == ("Solar Panels & Efficiency", "g")
    assert first.evidence.startswith("# Solar panel efficiency in 2024")
    # What a call adds to the run's tallies comes from the tool catalog.
    assert outcome.counts == (("pages_requested", 4),)


async def test_a_search_reads_no_pages() -> None:
    outcome = await run({"search": search_tool.Tools}, "search", query=["a", "b"])
    assert outcome.pages == ()
    assert outcome.counts == (("searches", 2),)


# -- a tool's source becomes the core's page read, once ----------------------------

VISIT_SOURCE = {
    "source": {"name": "Solar", "url": "https://a.example/solar"},
    "document": ["Panels convert 22%.\n\n[Read: main content, 10 of 20 characters]"],
    "metadata": [
        {
            "source": "https://a.example/solar",
            "name": "Solar",
            "url": "https://a.example/solar",
            "final_url": "https://www.a.example/solar/",
            "redirects": ["https://a.example/solar?x=1", 7, ""],
            "goal": "efficiency",
            "summary": "Panels convert 22%.",
            "kept": "main content, 10 of 20 characters",
        }
    ],
}


def test_a_visit_source_becomes_a_page_read() -> None:
    assert page_read(VISIT_SOURCE) == PageRead(
        url="https://a.example/solar",
        title="Solar",
        evidence="Panels convert 22%.\n\n[Read: main content, 10 of 20 characters]",
        summary="Panels convert 22%.",
        final_url="https://www.a.example/solar/",
        redirects=("https://a.example/solar?x=1",),
        goal="efficiency",
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # The URL from metadata[0].url, else .source, else source.url; the
        # title from source.name, else metadata[0].name.
        (
            {"metadata": [{"source": "https://b.example/", "name": "B"}]},
            PageRead("https://b.example/", "B"),
        ),
        (
            {"source": {"url": "https://c.example/"}, "document": ["ev"]},
            PageRead("https://c.example/", evidence="ev"),
        ),
        # Shapes no tool of ours writes are read as far as they go.
        (
            {"source": {"url": "https://d.example/"}, "metadata": {"url": "x"}},
            PageRead("https://d.example/"),
        ),
        ({"source": {"url": "file:///etc/passwd"}}, None),
        ({"source": {"name": "no address"}, "document": ["ev"]}, None),
        ("https://e.example/", None),
    ],
)
def test_what_a_source_names_is_the_page_read(source: Any, expected: Any) -> None:
    assert page_read(source) == expected


async def test_a_result_keeps_only_the_pages_it_names() -> None:
    class Reader:
        async def search(self, query: list[str]) -> str:
            sources = (VISIT_SOURCE, {"source": {"url": "javascript:x"}}, "junk")
            return search_tool.ToolResult("read", ok=True, sources=sources)

    outcome = await run({"search": Reader}, "search", query=["x"])
    assert outcome.pages == (page_read(VISIT_SOURCE),)


async def test_sources_a_tool_only_emits_are_not_the_runs() -> None:
    # A tool that emits a source event but returns none read nothing for the
    # run: the relay forwards its status lines and drops its source events.
    from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.emitter import (
        EventRelay,
        SafeEmitter,
    )

    seen = Events()
    relay = EventRelay(SafeEmitter(seen), status_prefix="Rollout 1/3 · ")
    await relay({"type": "source", "data": {"source": {"url": "https://x.example"}}})
    await relay({"type": "status", "data": {"description": "Reading", "done": True}})
    assert seen == [
        {
            "type": "status",
            "data": {"description": "Rollout 1/3 · Reading", "done": False},
        }
    ]


def test_a_tools_papers_become_the_cores_records_within_caps() -> None:
    class Found(str):
        ok = True
        papers: object = ()

    good = {"url": "https://p.example/a", "title": "A", "authors": ["X", 3, " "]}
    found = Found("text")
    found.papers = [
        good,
        "not a record",
        {"url": "javascript:alert(1)", "title": "no page"},
        {"url": "https://p.example/" + "x" * 10_000, "title": "too long"},
        {"url": "https://p.example/b", "title": ["not text"], "year": 2021},
        *([good] * 1_000),
    ]
    outcome = outcome_of(found)
    assert outcome.papers[:2] == (
        Paper(url="https://p.example/a", title="A", authors=("X",)),
        Paper(url="https://p.example/b"),
    )
    # The first MAX_PAPERS records are read, whatever else the tool sent.
    assert len(outcome.papers) == MAX_PAPERS - 3
