"""The tool texts, exactly as the lab's tools write them.

The reference agent's `search` and `google_scholar` tools (Serper behind
them) and its loop's unknown-tool error write texts the model was trained
on. Their templates are kept as test data in
``tests/fixtures/lab/tool_texts.json`` (see the NOTICE there); these tests
fill them as the lab's code does and compare what this project writes with
them, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import (
    CallError,
    ToolCall,
    check_call,
)
from tongyi_deepresearch_openwebui_pipeline.tools.scholar_tool import (
    Tools as ScholarTools,
)
from tongyi_deepresearch_openwebui_pipeline.tools.search_tool import (
    Tools as SearchTools,
)

from .fakes.scholarly import FakeScholarly, openalex_work
from .fakes.searxng import FakeSearXNG, result

LAB = json.loads(
    (Path(__file__).parent / "fixtures/lab/tool_texts.json").read_text("utf-8")
)
SEARCH = LAB["search"]
SCHOLAR = LAB["scholar"]


def search_tool(server: FakeSearXNG) -> SearchTools:
    tool = SearchTools()
    tool.valves = SearchTools.Valves(SEARXNG_URL=server.search_url)
    return tool


def scholar_tool(apis: FakeScholarly) -> ScholarTools:
    tool = ScholarTools()
    tool.valves = ScholarTools.Valves(
        OPENALEX_URL=apis.openalex_url,
        SEMANTIC_SCHOLAR_URL=apis.s2_url,
        ARXIV_URL=apis.arxiv_url,
    )
    return tool


async def test_searxng_result_carries_the_labs_source_line(
    searxng: FakeSearXNG,
) -> None:
    searxng.script(
        "q",
        results=[
            result(
                "https://www.site.example/a",
                "Title",
                "Snippet.",
                published="2025-05-19T00:00:00",
            )
        ],
    )
    entry = SEARCH["entry"].format(
        idx=1,
        title="Title",
        link="https://www.site.example/a",
        date_published=SEARCH["date_published"].format(date="May 19, 2025"),
        source=SEARCH["source"].format(source="site.example"),
        snippet=SEARCH["snippet"].format(snippet="Snippet."),
    )
    expected = SEARCH["header"].format(query="q", count=1) + entry
    assert await search_tool(searxng).search(["q"]) == expected


async def test_zero_citations_keep_the_labs_cited_by_line(
    apis: FakeScholarly,
) -> None:
    apis.openalex["q"] = [openalex_work("New", year=2025, cited=0)]
    entry = SCHOLAR["entry"].format(
        idx=1,
        title="New",
        link_info=SCHOLAR["link_info_without_pdf"],
        publicationInfo=SCHOLAR["publicationInfo"].format(publicationInfo="2025"),
        date_published=SCHOLAR["date_published"].format(year="2025"),
        citedBy=SCHOLAR["citedBy"].format(citedBy="0"),
        snippet="",
    )
    expected = SCHOLAR["header"].format(query="q", count=1) + entry
    assert await scholar_tool(apis).google_scholar(["q"]) == expected


async def test_search_without_results_writes_the_labs_text(
    searxng: FakeSearXNG,
) -> None:
    searxng.script("nothing", results=[])
    expected = SEARCH["no_results"].format(query="nothing")
    assert await search_tool(searxng).search(["nothing"]) == expected


async def test_scholar_without_results_writes_the_labs_text(
    apis: FakeScholarly,
) -> None:
    apis.openalex["nothing"] = []
    expected = SCHOLAR["no_results"].format(query="nothing")
    assert await scholar_tool(apis).google_scholar(["nothing"]) == expected


def test_unknown_tool_writes_the_labs_error() -> None:
    outcome = check_call(ToolCall("browse", {}), ["search", "visit"])
    assert isinstance(outcome, CallError)
    assert outcome.message == LAB["unknown_tool"].format(tool_name="browse")
