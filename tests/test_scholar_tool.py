"""Tests of the `google_scholar` Open WebUI tool against fake scholarly APIs.

Every backend is reached over real HTTP on 127.0.0.1. Golden strings follow the
reference format (tongyi-protocol.md §3 "google_scholar"). What it shares with
search (queries, events, the TLS context) is tested once for both in
test_tool_shared_snippets.py. Open WebUI's pieces are stand-ins installed
where the tool imports them from.
"""

from __future__ import annotations

from typing import Any

import pytest

from tongyi_deepresearch_openwebui_pipeline.tools.scholar_tool import ToolResult, Tools

from .fakes.events import Events
from .fakes.http import Response
from .fakes.scholarly import (
    ArxivEntry,
    FakeScholarly,
    Fault,
    openalex_work,
    s2_paper,
)
from .fakes.searxng import FakeSearXNG, OpenWebUIStandIn, result

NO_RESULTS = "No results found for '{}'. Try with a more general query."
HEADER = "A Google scholar for '{}' found {} results:\n\n## Scholar Results\n"
NOTE = (
    "\n\nNote: the scholarly database ({}) did not answer, so these are general "
    "web search results instead of scholarly records."
)


def tool_for(apis: FakeScholarly, **valves: Any) -> Tools:
    """A tool whose API URLs point at the fakes."""
    tool = Tools()
    tool.valves = Tools.Valves(
        OPENALEX_URL=apis.openalex_url,
        SEMANTIC_SCHOLAR_URL=apis.s2_url,
        ARXIV_URL=apis.arxiv_url,
        **valves,
    )
    return tool


# --- OpenAlex ------------------------------------------------------------------


ATTENTION = openalex_work(
    "Attention Is All You Need",
    year=2017,
    authors=("Ashish Vaswani", "Noam Shazeer", "Niki Parmar", "Jakob Uszkoreit"),
    venue="Advances in Neural Information Processing Systems",
    pdf="https://papers.example/attention.pdf",
    landing="https://doi.org/10.5555/attention",
    cited=120000,
    abstract="The dominant sequence transduction models are based on recurrent "
    "networks.",
)


async def test_openalex_full_record(apis: FakeScholarly) -> None:
    apis.openalex["transformers"] = [ATTENTION]
    text = await tool_for(apis).google_scholar(["transformers"])
    assert text == HEADER.format("transformers", 1) + (
        "1. [Attention Is All You Need](pdfUrl: https://papers.example/attention.pdf)"
        "\npublicationInfo: Ashish Vaswani, Noam Shazeer, Niki Parmar… - Advances in "
        "Neural Information Processing Systems, 2017"
        "\nDate published: 2017"
        "\ncitedBy: 120000"
        "\n"
        "\nThe dominant sequence transduction models are based on recurrent networks."
    )


async def test_openalex_request(apis: FakeScholarly) -> None:
    await tool_for(apis, RESULTS_PER_QUERY=7).google_scholar(["q"])
    (request,) = apis.requests_to("/works")
    assert request.query == {"search": ["q"], "per-page": ["7"]}


async def test_openalex_mailto_is_sent_when_set(apis: FakeScholarly) -> None:
    await tool_for(apis, OPENALEX_MAILTO=" me@lab.example ").google_scholar(["q"])
    assert apis.requests_to("/works")[0].query["mailto"] == ["me@lab.example"]


async def test_no_pdf_gives_no_available_link(apis: FakeScholarly) -> None:
    apis.openalex["q"] = [openalex_work("Closed Paper", year=2020, cited=3)]
    text = await tool_for(apis).google_scholar(["q"])
    assert text.endswith(
        "1. [Closed Paper](no available link)\npublicationInfo: 2020"
        "\nDate published: 2020\ncitedBy: 3\n"
    )


async def test_uncited_paper_shows_cited_by_zero(apis: FakeScholarly) -> None:
    apis.openalex["q"] = [openalex_work("New", authors=("A B",), cited=0)]
    text = await tool_for(apis).google_scholar(["q"])
    assert text.endswith(
        "1. [New](no available link)\npublicationInfo: A B\ncitedBy: 0\n"
    )


async def test_publication_info_without_authors(apis: FakeScholarly) -> None:
    apis.openalex["q"] = [openalex_work("T", year=2001, venue="Nature")]
    text = await tool_for(apis).google_scholar(["q"])
    assert "\npublicationInfo: Nature, 2001\n" in text


async def test_bare_record_has_title_only(apis: FakeScholarly) -> None:
    apis.openalex["q"] = [openalex_work("Only a title")]
    text = await tool_for(apis).google_scholar(["q"])
    assert text == HEADER.format("q", 1) + (
        "1. [Only a title](no available link)\ncitedBy: 0\n"
    )


async def test_long_abstract_is_cut_at_a_word(apis: FakeScholarly) -> None:
    abstract = " ".join(f"word{i}" for i in range(200))
    apis.openalex["q"] = [openalex_work("T", abstract=abstract)]
    text = await tool_for(apis).google_scholar(["q"])
    snippet = text.split("\n\n")[-1]
    assert snippet.endswith(" …")
    assert len(snippet) <= 302
    assert abstract.startswith(snippet[:-2])


async def test_abstract_words_are_put_back_in_order(apis: FakeScholarly) -> None:
    apis.openalex["q"] = [openalex_work("T", abstract="the cat saw the dog")]
    text = await tool_for(apis).google_scholar(["q"])
    assert text.endswith("\n\nthe cat saw the dog")


async def test_records_without_title_are_dropped(apis: FakeScholarly) -> None:
    apis.openalex["q"] = [openalex_work(None), openalex_work("Kept")]
    text = await tool_for(apis).google_scholar(["q"])
    assert text == HEADER.format("q", 1) + "1. [Kept](no available link)\ncitedBy: 0\n"


async def test_zero_papers_give_the_no_results_text(apis: FakeScholarly) -> None:
    text = await tool_for(apis).google_scholar(["nothing"])
    assert text == NO_RESULTS.format("nothing")


async def test_unicode_query_and_record(apis: FakeScholarly) -> None:
    query = "深度学习 综述 🤖"
    apis.openalex[query] = [
        openalex_work("深度学习综述 🧠", authors=("张三", "李四"), year=2019, cited=42)
    ]
    text = await tool_for(apis).google_scholar([query])
    assert text == HEADER.format(query, 1) + (
        "1. [深度学习综述 🧠](no available link)\npublicationInfo: 张三, 李四 - 2019"
        "\nDate published: 2019\ncitedBy: 42\n"
    )


# --- Semantic Scholar ----------------------------------------------------------


async def test_semantic_scholar_record(apis: FakeScholarly) -> None:
    apis.s2["q"] = [
        s2_paper(
            "BERT",
            year=2019,
            authors=("Jacob Devlin", "Ming-Wei Chang"),
            venue="NAACL",
            pdf="https://s2.example/bert.pdf",
            cited=90000,
            abstract="We introduce a new language representation model.",
        )
    ]
    text = await tool_for(apis, BACKEND="semantic_scholar").google_scholar(["q"])
    assert text == HEADER.format("q", 1) + (
        "1. [BERT](pdfUrl: https://s2.example/bert.pdf)"
        "\npublicationInfo: Jacob Devlin, Ming-Wei Chang - NAACL, 2019"
        "\nDate published: 2019\ncitedBy: 90000\n"
        "\nWe introduce a new language representation model."
    )
    (request,) = apis.requests_to("/graph/v1/paper/search")
    assert request.query["query"] == ["q"]
    assert request.query["limit"] == ["10"]
    assert {"title", "abstract", "openAccessPdf", "citationCount"} <= set(
        request.query["fields"][0].split(",")
    )


async def test_semantic_scholar_arxiv_id_gives_a_pdf(apis: FakeScholarly) -> None:
    apis.s2["q"] = [s2_paper("P", arxiv="1810.04805", journal="ArXiv")]
    text = await tool_for(apis, BACKEND="semantic_scholar").google_scholar(["q"])
    assert text.endswith(
        "1. [P](pdfUrl: https://arxiv.org/pdf/1810.04805)\npublicationInfo: ArXiv"
        "\ncitedBy: 0\n"
    )


# --- arXiv ---------------------------------------------------------------------


async def test_arxiv_record(apis: FakeScholarly) -> None:
    apis.arxiv["attention transformer"] = [
        ArxivEntry(
            "1706.03762v7",
            "Attention Is All\n  You Need",
            summary="The dominant sequence\n  transduction models.",
            authors=("Ashish Vaswani", "Noam Shazeer"),
        )
    ]
    tool = tool_for(apis, BACKEND="arxiv")
    text = await tool.google_scholar(["attention transformer"])
    assert text == HEADER.format("attention transformer", 1) + (
        "1. [Attention Is All You Need](pdfUrl: http://arxiv.org/pdf/1706.03762v7)"
        "\npublicationInfo: Ashish Vaswani, Noam Shazeer - arXiv preprint "
        "arXiv:1706.03762, 2017"
        "\nDate published: 2017\n"
        "\nThe dominant sequence transduction models."
    )
    (request,) = apis.requests_to("/api/query")
    assert request.query == {
        "search_query": ["all:attention AND all:transformer"],
        "start": ["0"],
        "max_results": ["10"],
    }


async def test_arxiv_journal_ref_and_missing_pdf(apis: FakeScholarly) -> None:
    apis.arxiv["q"] = [
        ArxivEntry(
            "2101.00001v1", "T", journal_ref="Phys. Rev. D 1 (2021)", with_pdf=False
        )
    ]
    text = await tool_for(apis, BACKEND="arxiv").google_scholar(["q"])
    assert text.endswith(
        "1. [T](no available link)\npublicationInfo: Phys. Rev. D 1 (2021), 2017"
        "\nDate published: 2017\n"
    )


async def test_arxiv_query_without_words_finds_nothing(apis: FakeScholarly) -> None:
    text = await tool_for(apis, BACKEND="arxiv").google_scholar(["?!"])
    assert text == NO_RESULTS.format("?!")
    assert apis.requests_to("/api/query") == []


async def test_arxiv_doctype_is_refused(apis: FakeScholarly) -> None:
    # More hostile feeds (every entity trick, in several encodings) are in
    # test_hostile_backends.py; the parser is stdlib expat, with or without
    # defusedxml installed.
    bomb = (
        b'<?xml version="1.0"?><!DOCTYPE feed [<!ENTITY a "aaaaaaaa">'
        b'<!ENTITY b "&a;&a;&a;&a;">]><feed xmlns="http://www.w3.org/2005/Atom">'
        b"<entry><title>&b;</title></entry></feed>"
    )
    apis.faults["arxiv"] = Fault(status=200, raw=bomb)
    text = await tool_for(apis, BACKEND="arxiv").google_scholar(["q"])
    assert text == (
        "Scholar search failed for 'q': the service sent an answer that could not "
        "be read. Please try again later."
    )


async def test_malformed_xml_is_a_clear_error(apis: FakeScholarly) -> None:
    apis.faults["arxiv"] = Fault(status=200, raw=b"<feed><entry>")
    text = await tool_for(apis, BACKEND="arxiv").google_scholar(["q"])
    assert "could not be read" in text


# --- failures and the web fallback ---------------------------------------------


async def test_api_failure_without_web_search_is_a_clear_error(
    apis: FakeScholarly,
) -> None:
    apis.faults["openalex"] = Fault(status=500)
    text = await tool_for(apis).google_scholar(["q"])
    assert text == (
        "Scholar search failed for 'q': the service answered HTTP 500. "
        "Please try again later."
    )


async def test_api_timeout_without_web_search(apis: FakeScholarly) -> None:
    apis.faults["openalex"] = Fault(hang=True)
    text = await tool_for(apis, QUERY_TIMEOUT_SECONDS=0.5).google_scholar(["q"])
    assert text == "Google Scholar Timeout, return None, Please try again later."


async def test_api_failure_falls_back_to_searxng(
    apis: FakeScholarly, searxng: FakeSearXNG
) -> None:
    apis.faults["openalex"] = Fault(status=503)
    searxng.script(
        "academic research: graphene",
        results=[
            result(
                "https://journal.example/graphene", "Graphene review", "About it.", 2
            ),
            result("https://lab.example/paper.PDF", "Graphene PDF", None, 1),
        ],
    )
    tool = tool_for(apis, SEARXNG_URL=searxng.search_url)
    text = await tool.google_scholar(["graphene"])
    assert searxng.queries() == ["academic research: graphene"]
    assert text == HEADER.format("graphene", 2) + (
        "1. [Graphene review](no available link)"
        "\npublicationInfo: https://journal.example/graphene\n\nAbout it."
        "\n\n2. [Graphene PDF](pdfUrl: https://lab.example/paper.PDF)"
        "\npublicationInfo: https://lab.example/paper.PDF\n"
    ) + NOTE.format("OpenAlex")


async def test_timeout_falls_back_to_web(
    apis: FakeScholarly, searxng: FakeSearXNG
) -> None:
    apis.faults["s2"] = Fault(hang=True)
    tool = tool_for(
        apis,
        BACKEND="semantic_scholar",
        SEARXNG_URL=searxng.search_url,
        QUERY_TIMEOUT_SECONDS=0.5,
    )
    text = await tool.google_scholar(["q"])
    assert text == NO_RESULTS.format("q") + NOTE.format("Semantic Scholar")


async def test_fallback_through_open_webui(
    apis: FakeScholarly, searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch
) -> None:
    apis.faults["arxiv"] = Fault(status=429)
    searxng.script(
        "academic research: q", results=[result("https://w.example", "W", "s")]
    )
    standin = OpenWebUIStandIn("0.12", searxng.search_url)
    standin.install(monkeypatch)
    user = {"id": "u9", "email": "u@example.com", "name": "U", "role": "user"}
    tool = tool_for(apis, BACKEND="arxiv")
    text = await tool.google_scholar(["q"], __request__=standin.request, __user__=user)
    assert text == HEADER.format("q", 1) + (
        "1. [W](no available link)\npublicationInfo: https://w.example\n\ns"
    ) + NOTE.format("arXiv")
    assert standin.calls[0]["query"] == "academic research: q"
    assert standin.calls[0]["user"].id == "u9"
    assert standin.calls[0]["config"]["web.search.result_count"] == 10


async def test_fallback_failure_reports_the_scholarly_error(
    apis: FakeScholarly, searxng: FakeSearXNG
) -> None:
    apis.faults["openalex"] = Fault(status=500)
    searxng.script("academic research: q", status=502)
    tool = tool_for(apis, SEARXNG_URL=searxng.search_url)
    text = await tool.google_scholar(["q"])
    assert text == (
        "Scholar search failed for 'q': the service answered HTTP 500. "
        "Please try again later."
    )


async def test_bad_api_url_valve_is_explained(apis: FakeScholarly) -> None:
    tool = tool_for(apis)
    tool.valves.OPENALEX_URL = "file:///etc/passwd"
    text = await tool.google_scholar(["q"])
    assert text == (
        "Scholar search failed for 'q': the tool's API URL setting is not a valid "
        "http(s) URL. Please try again later."
    )


async def test_one_failing_query_does_not_sink_the_others(
    apis: FakeScholarly,
) -> None:
    apis.openalex["good"] = [openalex_work("G")]
    original = apis.server.routes["/works"]

    def route(request: Any) -> Response:
        if request.query.get("search") == ["bad"]:
            return Response.text("boom", 500)
        return original(request)

    apis.server.routes["/works"] = route
    text = await tool_for(apis).google_scholar(["good", "bad"])
    assert text == (
        HEADER.format("good", 1) + "1. [G](no available link)\ncitedBy: 0\n"
        "\n=======\n"
        "Scholar search failed for 'bad': the service answered HTTP 500. "
        "Please try again later."
    )


# --- the "web" backend ----------------------------------------------------------


async def test_web_backend_has_no_fallback_note(searxng: FakeSearXNG) -> None:
    searxng.script(
        "academic research: q", results=[result("https://w.example/a.pdf", "A", "s")]
    )
    tool = Tools()
    tool.valves = Tools.Valves(BACKEND="web", SEARXNG_URL=searxng.search_url)
    text = await tool.google_scholar(["q"])
    assert text == HEADER.format("q", 1) + (
        "1. [A](pdfUrl: https://w.example/a.pdf)"
        "\npublicationInfo: https://w.example/a.pdf\n\ns"
    )


async def test_web_backend_without_any_engine() -> None:
    tool = Tools()
    tool.valves = Tools.Valves(BACKEND="web")
    events = Events()
    text = await tool.google_scholar(["q"], __event_emitter__=events)
    assert text == (
        "Web search is not available to the google_scholar tool: it is running "
        "outside Open WebUI and its SEARXNG_URL valve is empty."
    )
    assert events[-1]["data"] == {"description": text, "done": True}


@pytest.mark.parametrize("version", ["0.6", "0.11", "0.12"])
async def test_web_backend_with_web_search_disabled(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    standin = OpenWebUIStandIn(version, "http://unused.invalid", enabled=False)
    standin.install(monkeypatch)
    tool = Tools()
    tool.valves = Tools.Valves(BACKEND="web")
    text = await tool.google_scholar(["q"], __request__=standin.request)
    assert text == (
        "Web search is not enabled in Open WebUI, so the google_scholar tool cannot "
        "use it. An administrator can enable it in Admin Settings → Web Search."
    )
    assert standin.calls == []


@pytest.mark.parametrize("version", ["0.6", "0.11", "0.12"])
async def test_web_backend_per_open_webui_version(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    searxng.script("academic research: q", results=[result("https://w.example", "W")])
    standin = OpenWebUIStandIn(version, searxng.search_url)
    standin.install(monkeypatch)
    tool = Tools()
    tool.valves = Tools.Valves(BACKEND="web")
    text = await tool.google_scholar(["q"], __request__=standin.request)
    assert text == HEADER.format("q", 1) + (
        "1. [W](no available link)\npublicationInfo: https://w.example\n"
    )


async def test_web_backend_engine_without_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    standin = OpenWebUIStandIn("0.11", "")
    standin.install(monkeypatch)
    tool = Tools()
    tool.valves = Tools.Valves(BACKEND="web")
    text = await tool.google_scholar(["q"], __request__=standin.request)
    assert text == (
        "Web search is not configured in Open WebUI (no working search engine is set "
        "up), so the google_scholar tool cannot use it. An administrator can "
        "configure it in Admin Settings → Web Search."
    )


# --- input, queries, valves -----------------------------------------------------


async def test_queries_run_concurrently(apis: FakeScholarly) -> None:
    apis.gather(3, wait_seconds=5)
    for name in ("a", "b", "c"):
        apis.openalex[name] = [openalex_work(name.upper())]
    text = await tool_for(apis).google_scholar(["a", "b", "c"])
    assert [block.split("\n")[-3] for block in text.split("\n=======\n")] == [
        "1. [A](no available link)",
        "1. [B](no available link)",
        "1. [C](no available link)",
    ]


async def test_concurrency_valve_is_respected(apis: FakeScholarly) -> None:
    apis.gather(2, wait_seconds=0.3)
    text = await tool_for(apis, CONCURRENT_QUERIES=1).google_scholar(["a", "b"])
    assert text.count("HTTP 504") == 2


async def test_results_per_query_is_capped(apis: FakeScholarly) -> None:
    await tool_for(apis, RESULTS_PER_QUERY=5000).google_scholar(["q"])
    assert apis.requests_to("/works")[0].query["per-page"] == ["100"]


async def test_unknown_backend_is_explained(apis: FakeScholarly) -> None:
    text = await tool_for(apis, BACKEND="scopus").google_scholar(["q"])
    assert text == (
        "The google_scholar tool is misconfigured: its BACKEND valve must be one of "
        "openalex, semantic_scholar, arxiv, web. Ask an administrator to fix it."
    )


def test_valves_are_documented() -> None:
    for name, info in Tools.Valves.model_fields.items():
        assert info.description, name
    extra = Tools.Valves.model_fields["BACKEND"].json_schema_extra
    assert extra == {
        "input": {
            "type": "select",
            "options": ["openalex", "semantic_scholar", "arxiv", "web"],
        }
    }


# --- status events ----------------------------------------------------------------


async def test_status_events(apis: FakeScholarly) -> None:
    apis.openalex["a"] = [
        ATTENTION,
        openalex_work("No PDF", landing="https://doi.org/10.1/x"),
        openalex_work("Nothing"),
    ]
    events = Events()
    await tool_for(apis).google_scholar(["a"], __event_emitter__=events)
    assert events[0]["data"] == {
        "description": "Searching papers: a",
        "done": False,
    }
    assert events[1]["data"] == {
        "action": "web_search",
        "description": "Found {{count}} papers",
        "query": "a",
        "urls": [
            "https://papers.example/attention.pdf",
            "https://doi.org/10.1/x",
            "https://openalex.org/W1",
        ],
        "items": [
            {
                "title": "Attention Is All You Need",
                "link": "https://papers.example/attention.pdf",
            },
            {"title": "No PDF", "link": "https://doi.org/10.1/x"},
            {"title": "Nothing", "link": "https://openalex.org/W1"},
        ],
        "done": True,
    }


async def test_error_status(apis: FakeScholarly) -> None:
    apis.faults["openalex"] = Fault(status=500)
    events = Events()
    text = await tool_for(apis).google_scholar(["q"], __event_emitter__=events)
    assert text == (
        "Scholar search failed for 'q': the service answered HTTP 500. "
        "Please try again later."
    )
    assert events[-1]["data"] == {"description": text, "done": True}


# --- the records behind the text (for the exports) -------------------------------


async def test_each_paper_found_is_kept_with_its_doi_authors_and_venue(
    apis: FakeScholarly,
) -> None:
    apis.openalex["transformers"] = [
        openalex_work(
            "Attention Is All You Need",
            year=2017,
            authors=("Ashish Vaswani", "Noam Shazeer"),
            venue="NeurIPS",
            landing="https://papers.example/attention",
            doi="https://doi.org/10.5555/Attention.2017",
        )
    ]
    result = await tool_for(apis).google_scholar(["transformers"])
    assert isinstance(result, ToolResult)
    assert result.papers == (
        {
            "title": "Attention Is All You Need",
            "url": "https://papers.example/attention",
            "pdf": "",
            "authors": ["Ashish Vaswani", "Noam Shazeer"],
            "year": "2017",
            "venue": "NeurIPS",
            "doi": "10.5555/Attention.2017",
        },
    )


async def test_a_semantic_scholar_paper_s_doi_comes_from_its_external_ids(
    apis: FakeScholarly,
) -> None:
    apis.s2["q"] = [s2_paper("BERT", doi="10.18653/v1/N19-1423")]
    result = await tool_for(apis, BACKEND="semantic_scholar").google_scholar(["q"])
    assert isinstance(result, ToolResult)
    assert [paper["doi"] for paper in result.papers] == ["10.18653/v1/N19-1423"]


async def test_a_doi_field_that_is_no_doi_is_left_out(apis: FakeScholarly) -> None:
    apis.openalex["q"] = [openalex_work("T", doi="not a doi <script>")]
    result = await tool_for(apis).google_scholar(["q"])
    assert isinstance(result, ToolResult)
    assert [paper["doi"] for paper in result.papers] == [""]
