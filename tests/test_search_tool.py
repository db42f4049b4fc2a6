"""Tests of the `search` Open WebUI tool against a fake SearXNG over real HTTP.

Golden strings follow the reference formats (tongyi-protocol.md §3 "search").
What it shares with google_scholar (queries, events, the TLS context) is
tested once for both in test_tool_shared_snippets.py. Open WebUI's pieces
are stand-ins installed where the tool imports them from.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from tongyi_deepresearch_openwebui_pipeline.tools import search_tool
from tongyi_deepresearch_openwebui_pipeline.tools.search_tool import Tools

from .fakes.events import Events
from .fakes.searxng import FakeSearXNG, OpenWebUIStandIn, result

USER = {"id": "u1", "email": "a@example.com", "name": "Ann", "role": "user"}
NO_RESULTS = "No results found for '{}'. Try with a more general query."


def direct_tool(server: FakeSearXNG, **valves: Any) -> Tools:
    """A tool that searches the fake SearXNG directly."""
    tool = Tools()
    tool.valves = Tools.Valves(SEARXNG_URL=server.search_url, **valves)
    return tool


# --- one result, field by field ------------------------------------------------


async def test_title_and_link_only(searxng: FakeSearXNG) -> None:
    searxng.script("q", results=[result("https://a.example/x", "Title A", None)])
    text = await direct_tool(searxng).search(["q"])
    assert text == (
        "A Google search for 'q' found 1 results:\n\n## Web Results\n"
        "1. [Title A](https://a.example/x)\nSource: a.example\n"
    )


async def test_snippet_follows_a_blank_line(searxng: FakeSearXNG) -> None:
    searxng.script("q", results=[result("https://a.example", "A", "Snippet text.")])
    text = await direct_tool(searxng).search(["q"])
    assert text.endswith(
        "1. [A](https://a.example)\nSource: a.example\n\nSnippet text."
    )


async def test_empty_or_blank_snippet_is_left_out(searxng: FakeSearXNG) -> None:
    searxng.script(
        "q",
        results=[
            result("https://a.example", "A", "", score=2),
            result("https://b.example", "B", "   ", score=1),
        ],
    )
    text = await direct_tool(searxng).search(["q"])
    assert text.endswith(
        "1. [A](https://a.example)\nSource: a.example\n\n\n"
        "2. [B](https://b.example)\nSource: b.example\n"
    )


async def test_date_published_in_googles_style(searxng: FakeSearXNG) -> None:
    searxng.script(
        "q",
        results=[
            result("https://a.example", "A", "S", published="2025-05-09T10:00:00")
        ],
    )
    text = await direct_tool(searxng).search(["q"])
    assert text.endswith(
        "1. [A](https://a.example)\nDate published: May 9, 2025\nSource: a.example\n\nS"
    )


async def test_unparsable_date_is_shown_as_given(searxng: FakeSearXNG) -> None:
    searxng.script(
        "q", results=[result("https://a.example", "A", None, published="last week")]
    )
    text = await direct_tool(searxng).search(["q"])
    assert text.endswith(
        "1. [A](https://a.example)\nDate published: last week\nSource: a.example\n"
    )


def test_source_line_sits_between_date_and_snippet() -> None:
    hit = search_tool._Hit("T", "https://t.example", "Snip", "Dec 18, 2024", "Facebook")
    assert search_tool._format_hit(3, hit) == (
        "3. [T](https://t.example)\nDate published: Dec 18, 2024"
        "\nSource: Facebook\n\nSnip"
    )


def test_source_without_date() -> None:
    hit = search_tool._Hit("T", "https://t.example", source="C2ER")
    assert (
        search_tool._format_hit(1, hit) == "1. [T](https://t.example)\nSource: C2ER\n"
    )


async def test_missing_title_shows_the_link(searxng: FakeSearXNG) -> None:
    searxng.script("q", results=[result("https://a.example/p", None, "S")])
    text = await direct_tool(searxng).search(["q"])
    assert text.endswith(
        "1. [https://a.example/p](https://a.example/p)\nSource: a.example\n\nS"
    )


async def test_line_breaks_in_a_title_are_collapsed(searxng: FakeSearXNG) -> None:
    searxng.script("q", results=[result("https://a.example", "Two\nlines  here", None)])
    text = await direct_tool(searxng).search(["q"])
    assert text.endswith("1. [Two lines here](https://a.example)\nSource: a.example\n")


async def test_results_without_link_are_dropped(searxng: FakeSearXNG) -> None:
    searxng.script(
        "q",
        results=[result("", "No link", "x", score=3), result("https://b.example", "B")],
    )
    text = await direct_tool(searxng).search(["q"])
    assert text == (
        "A Google search for 'q' found 1 results:\n\n## Web Results\n"
        "1. [B](https://b.example)\nSource: b.example\n"
    )


async def test_video_text_is_removed(searxng: FakeSearXNG) -> None:
    snippet = "Your browser can't play this video. Learn more about cats."
    searxng.script("q", results=[result("https://v.example", "Cats", snippet)])
    text = await direct_tool(searxng).search(["q"])
    assert "play this video" not in text
    assert text.endswith(
        "1. [Cats](https://v.example)\nSource: v.example\n\n Learn more about cats."
    )


async def test_results_are_ranked_by_score(searxng: FakeSearXNG) -> None:
    searxng.script(
        "q",
        results=[
            result("https://low.example", "Low", score=0.5),
            result("https://high.example", "High", score=9),
        ],
    )
    text = await direct_tool(searxng).search(["q"])
    assert text.index("1. [High]") < text.index("2. [Low]")


async def test_results_per_query_cuts_the_list(searxng: FakeSearXNG) -> None:
    searxng.default.results = [
        result(f"https://r{i}.example", f"R{i}", score=20 - i) for i in range(12)
    ]
    text = await direct_tool(searxng, RESULTS_PER_QUERY=2).search(["q"])
    assert text.startswith("A Google search for 'q' found 2 results:")
    assert "3. [" not in text


async def test_default_shows_ten_results(searxng: FakeSearXNG) -> None:
    searxng.default.results = [
        result(f"https://r{i}.example", f"R{i}", score=20 - i) for i in range(12)
    ]
    text = await direct_tool(searxng).search(["q"])
    assert text.startswith("A Google search for 'q' found 10 results:")
    assert "10. [R9](https://r9.example)\n" in text
    assert "11. [" not in text


async def test_zero_results_give_the_no_results_text(searxng: FakeSearXNG) -> None:
    # Decision (documented in the module): an empty result list gets the
    # reference's no-results text, not "found 0 results" with nothing after it,
    # because Open WebUI engines also return [] for swallowed errors.
    searxng.script("nothing here", results=[])
    text = await direct_tool(searxng).search(["nothing here"])
    assert text == NO_RESULTS.format("nothing here")


async def test_unicode_queries_and_results(searxng: FakeSearXNG) -> None:
    query = "量子计算 最新进展 🚀"
    searxng.script(
        query,
        results=[result("https://zh.example/页面", "量子 🧪 标题", "摘要：进展 ✅")],
    )
    text = await direct_tool(searxng).search([query])
    assert searxng.queries() == [query]
    assert text == (
        f"A Google search for '{query}' found 1 results:\n\n## Web Results\n"
        "1. [量子 🧪 标题](https://zh.example/页面)\nSource: zh.example"
        "\n\n摘要：进展 ✅"
    )


# --- several queries -------------------------------------------------------------


async def test_blocks_are_joined_by_the_separator(searxng: FakeSearXNG) -> None:
    searxng.script("a", results=[result("https://a.example", "A", "sa")])
    searxng.script("b", results=[])
    text = await direct_tool(searxng).search(["a", "b"])
    assert text == (
        "A Google search for 'a' found 1 results:\n\n## Web Results\n"
        "1. [A](https://a.example)\nSource: a.example\n\nsa"
        "\n=======\n" + NO_RESULTS.format("b")
    )


async def test_one_failing_query_does_not_sink_the_others(
    searxng: FakeSearXNG,
) -> None:
    searxng.script("ok1", results=[result("https://1.example", "One")])
    searxng.script("broken", status=500)
    searxng.script("ok2", results=[result("https://2.example", "Two")])
    text = await direct_tool(searxng).search(["ok1", "broken", "ok2"])
    assert text.split("\n=======\n") == [
        "A Google search for 'ok1' found 1 results:\n\n## Web Results\n"
        "1. [One](https://1.example)\nSource: 1.example\n",
        "Search failed for 'broken': the search engine answered HTTP 500. "
        "Please try again later.",
        "A Google search for 'ok2' found 1 results:\n\n## Web Results\n"
        "1. [Two](https://2.example)\nSource: 2.example\n",
    ]


async def test_unreadable_answer_is_a_clear_error(searxng: FakeSearXNG) -> None:
    searxng.script("q", raw=b"<html>not json</html>")
    text = await direct_tool(searxng).search(["q"])
    assert text == (
        "Search failed for 'q': the search engine sent an answer that could not "
        "be read. Please try again later."
    )


async def test_timeout_gives_the_reference_text(searxng: FakeSearXNG) -> None:
    searxng.script("slow", hang=True)
    searxng.script("fast", results=[])
    tool = direct_tool(searxng, QUERY_TIMEOUT_SECONDS=0.5)
    text = await tool.search(["slow", "fast"])
    assert text == (
        "Google search Timeout, return None, Please try again later."
        "\n=======\n" + NO_RESULTS.format("fast")
    )


async def test_unreachable_searxng_is_a_clear_error() -> None:
    with FakeSearXNG() as server:
        url = server.search_url
    tool = Tools()
    tool.valves = Tools.Valves(SEARXNG_URL=url)
    text = await tool.search(["q"])
    assert text == (
        "Search failed for 'q': the search engine could not be reached. "
        "Please try again later."
    )


async def test_searxng_credentials_never_reach_the_output(searxng: FakeSearXNG) -> None:
    searxng.script("q", status=502)
    tool = Tools()
    secret_url = f"http://admin:s3cr3t-pw@127.0.0.1:{searxng.port}/search"
    tool.valves = Tools.Valves(SEARXNG_URL=secret_url)
    events = Events()
    text = await tool.search(["q"], __event_emitter__=events)
    assert "HTTP 502" in text
    assert "s3cr3t" not in text
    assert all("s3cr3t" not in str(e) for e in events)
    assert searxng.requests[0].headers["authorization"].startswith("Basic ")


async def test_legacy_searxng_url_with_query_placeholder(searxng: FakeSearXNG) -> None:
    tool = Tools()
    tool.valves = Tools.Valves(SEARXNG_URL=searxng.search_url + "?q=<query>")
    await tool.search(["x"])
    assert searxng.requests[0].query == {"q": ["x"], "format": ["json"]}


# --- concurrency -----------------------------------------------------------------


async def test_queries_of_one_call_run_concurrently(searxng: FakeSearXNG) -> None:
    searxng.gather(3, wait_seconds=5)
    for name in ("a", "b", "c"):
        searxng.script(name, results=[result(f"https://{name}.example", name)])
    text = await direct_tool(searxng).search(["a", "b", "c"])
    assert searxng.max_in_flight == 3
    assert [block.split("\n")[0] for block in text.split("\n=======\n")] == [
        f"A Google search for '{n}' found 1 results:" for n in ("a", "b", "c")
    ]


async def test_concurrency_valve_bounds_the_queries(searxng: FakeSearXNG) -> None:
    # With one query at a time the fake's gathering never completes: every
    # query reports the failure instead of the test hanging.
    searxng.gather(2, wait_seconds=0.3)
    text = await direct_tool(searxng, CONCURRENT_QUERIES=1).search(["a", "b"])
    assert searxng.max_in_flight == 1
    assert text.count("HTTP 504") == 2


# --- valves ----------------------------------------------------------------------


async def test_bad_valve_values_are_clamped(searxng: FakeSearXNG) -> None:
    tool = direct_tool(
        searxng,
        MAX_QUERIES_PER_SEARCH=0,
        RESULTS_PER_QUERY=-3,
        CONCURRENT_QUERIES=-1,
        QUERY_TIMEOUT_SECONDS=-5,
    )
    searxng.default.results = [
        result("https://1.example", "1", score=2),
        result("https://2.example", "2", score=1),
    ]
    text = await tool.search(["a", "b"])
    assert searxng.queries() == ["a"]
    assert text.startswith("A Google search for 'a' found 1 results:")
    assert "Not searched: 'b'." in text


async def test_invalid_searxng_url_is_explained() -> None:
    tool = Tools()
    tool.valves = Tools.Valves(SEARXNG_URL="ftp://files.example/search")
    events = Events()
    text = await tool.search(["q"], __event_emitter__=events)
    assert text == search_tool.BAD_SEARXNG_URL_TEXT
    assert events.descriptions()[-1] == text


async def test_without_open_webui_or_searxng_the_model_is_told() -> None:
    events = Events()
    text = await Tools().search(["q"], __event_emitter__=events)
    assert text == (
        "Web search is not available: the search tool is running outside Open "
        "WebUI and its SEARXNG_URL valve is empty. Set SEARXNG_URL to a SearXNG "
        "instance with the JSON output format enabled."
    )
    assert events[-1]["data"] == {"description": text, "done": True}


def test_valves_are_documented() -> None:
    for name, info in Tools.Valves.model_fields.items():
        assert info.description, name


# --- status events ---------------------------------------------------------------


async def test_status_events(searxng: FakeSearXNG) -> None:
    searxng.script(
        "a",
        results=[
            result("https://a1.example", "A1", score=2),
            result("https://a2.example", None, score=1),
        ],
    )
    searxng.script("b", status=500)
    events = Events()
    await direct_tool(searxng).search(["a", "b"], __event_emitter__=events)
    assert events[0] == {
        "type": "status",
        "data": {"description": "Searching: a · b", "done": False},
    }
    by_query = {e["data"].get("query"): e["data"] for e in events[1:]}
    assert by_query["a"] == {
        "action": "web_search",
        "description": "Searched {{count}} sites",
        "query": "a",
        "urls": ["https://a1.example", "https://a2.example"],
        "items": [
            {"title": "A1", "link": "https://a1.example"},
            {"title": "https://a2.example", "link": "https://a2.example"},
        ],
        "done": True,
    }
    assert by_query[None] == {
        "description": "Search failed for 'b': the search engine answered HTTP 500. "
        "Please try again later.",
        "done": True,
    }
    assert len(events) == 3


# --- Open WebUI versions (search_web / config seams) ---------------------------


def use_openwebui(
    monkeypatch: pytest.MonkeyPatch,
    standin: OpenWebUIStandIn | None,
    pieces: SimpleNamespace | None = None,
) -> None:
    """Make `standin` the Open WebUI the tool imports (None: not installed)."""
    if standin is not None:
        standin.install(monkeypatch, pieces)
        return
    for name in [n for n in sys.modules if n.split(".")[0] == "open_webui"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "open_webui", None)  # its import fails


@pytest.mark.parametrize("version", ["0.6", "0.11", "0.12"])
async def test_open_webui_search_per_version(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    searxng.script(
        "q",
        results=[
            result("https://a.example", "A", "sa", score=3),
            result("https://b.example", "B", None, score=2),
        ],
    )
    standin = OpenWebUIStandIn(version, searxng.search_url, result_count=10)
    use_openwebui(monkeypatch, standin)
    text = await Tools().search(["q"], __request__=standin.request, __user__=USER)
    assert text == (
        "A Google search for 'q' found 2 results:\n\n## Web Results\n"
        "1. [A](https://a.example)\n\nsa\n\n2. [B](https://b.example)\n"
    )
    (call,) = standin.calls
    assert call["engine"] == "searxng"
    assert call["user"].id == "u1"
    assert call["user"].role == "user"


async def test_sync_search_web_runs_off_the_event_loop(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin = OpenWebUIStandIn("0.6", searxng.search_url)
    use_openwebui(monkeypatch, standin)
    await Tools().search(["q"], __request__=standin.request, __user__=USER)
    assert standin.calls[0]["thread"] != threading.current_thread().name
    assert standin.config_reads == []


async def test_011_reads_config_from_the_store(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin = OpenWebUIStandIn("0.11", searxng.search_url)
    use_openwebui(monkeypatch, standin)
    await Tools().search(["q"], __request__=standin.request, __user__=USER)
    assert standin.config_reads == [("web.search.enable", "web.search.engine")]
    assert standin.calls[0]["config"] is None


async def test_011_engine_error_is_logged_with_message_and_traceback(
    searxng: FakeSearXNG,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Open WebUI 0.11.4's REST config update writes every web field, so a
    # partial update stores SEARXNG_LANGUAGE as null; its searxng engine then
    # fails on `None.strip()` inside search_web, out of the tool's reach.
    standin = OpenWebUIStandIn("0.11", searxng.search_url)
    standin.values["web.search.searxng_language"] = None
    use_openwebui(monkeypatch, standin)
    caplog.set_level("DEBUG", logger=search_tool.log.name)

    text = await Tools().search(["q"], __request__=standin.request, __user__=USER)

    assert text == (
        "Search failed for 'q': unexpected error (AttributeError). "
        "Please try again later."
    )
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert warning.getMessage() == (
        "search failed for a query: AttributeError: "
        "'NoneType' object has no attribute 'strip'"
    )
    (debug,) = [r for r in caplog.records if r.levelname == "DEBUG"]
    assert "in search_web_011" in debug.getMessage()
    assert debug.exc_info is None  # rebuilt from frames, not the raw exception


async def test_failure_logs_carry_no_secrets(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    standin = OpenWebUIStandIn("0.11", "http://127.0.0.1:9/search")

    async def leaky_search_web(request: Any, engine: str, query: str, user=None):
        raise RuntimeError(
            "GET https://me:pw-123@engine.example/s?q=x&key=sk-LEAK1 failed; "
            "headers {'Authorization': 'Bearer sk-LEAK2'} api_key=sk-LEAK3"
        )

    namespace = standin.namespace()
    namespace.search_web = leaky_search_web
    use_openwebui(monkeypatch, standin, namespace)
    caplog.set_level("DEBUG", logger=search_tool.log.name)

    text = await Tools().search(["q"], __request__=standin.request, __user__=USER)

    assert "unexpected error (RuntimeError)" in text
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "https://engine.example/s failed" in logged
    assert "in leaky_search_web" in logged
    for secret in ("pw-123", "sk-LEAK1", "sk-LEAK2", "sk-LEAK3"):
        assert secret not in logged
        assert secret not in text


async def test_012_passes_config_with_the_result_count(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch
) -> None:
    searxng.default.results = [
        result(f"https://r{i}.example", f"R{i}", score=20 - i) for i in range(8)
    ]
    standin = OpenWebUIStandIn("0.12", searxng.search_url, result_count=3)
    use_openwebui(monkeypatch, standin)
    tool = Tools()
    tool.valves = Tools.Valves(RESULTS_PER_QUERY=6)
    text = await tool.search(["q"], __request__=standin.request, __user__=USER)
    config = standin.calls[0]["config"]
    assert config["web.search.result_count"] == 6
    assert config["web.search.searxng_query_url"] == searxng.search_url
    assert standin.values["web.search.result_count"] == 3  # shared config untouched
    assert text.startswith("A Google search for 'q' found 6 results:")


async def test_older_versions_cut_to_results_per_query(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch
) -> None:
    searxng.default.results = [
        result(f"https://r{i}.example", f"R{i}", score=20 - i) for i in range(8)
    ]
    standin = OpenWebUIStandIn("0.6", searxng.search_url, result_count=8)
    use_openwebui(monkeypatch, standin)
    tool = Tools()
    tool.valves = Tools.Valves(RESULTS_PER_QUERY=4)
    text = await tool.search(["q"], __request__=standin.request)
    assert text.startswith("A Google search for 'q' found 4 results:")
    assert standin.calls[0]["user"] is None


@pytest.mark.parametrize("version", ["0.6", "0.11", "0.12"])
async def test_open_webui_queries_run_concurrently(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    searxng.gather(3, wait_seconds=5)
    standin = OpenWebUIStandIn(version, searxng.search_url)
    use_openwebui(monkeypatch, standin)
    text = await Tools().search(["a", "b", "c"], __request__=standin.request)
    assert searxng.max_in_flight == 3
    assert text.count("No results found") == 3


@pytest.mark.parametrize("version", ["0.6", "0.11", "0.12"])
async def test_disabled_web_search_is_explained(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    standin = OpenWebUIStandIn(version, searxng.search_url, enabled=False)
    use_openwebui(monkeypatch, standin)
    events = Events()
    text = await Tools().search(
        ["q"], __request__=standin.request, __event_emitter__=events
    )
    assert text == (
        "Web search is not enabled in Open WebUI, so the search tool cannot run. "
        "An administrator can enable and configure it in Admin Settings → Web "
        "Search. Continue with what you already know or with other tools."
    )
    assert events[-1]["data"] == {"description": text, "done": True}
    assert standin.calls == []
    assert searxng.requests == []


UNCONFIGURED = (
    "Web search is not configured in Open WebUI (no working search engine is set "
    "up), so the search tool cannot run. An administrator can configure it in "
    "Admin Settings → Web Search. Continue with what you already know or with "
    "other tools."
)


@pytest.mark.parametrize("version", ["0.6", "0.11", "0.12"])
async def test_no_engine_is_explained(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    standin = OpenWebUIStandIn(version, searxng.search_url, engine="")
    use_openwebui(monkeypatch, standin)
    events = Events()
    text = await Tools().search(
        ["q"], __request__=standin.request, __event_emitter__=events
    )
    assert text == UNCONFIGURED
    assert events.descriptions()[-1] == UNCONFIGURED
    assert standin.calls == []


@pytest.mark.parametrize("version", ["0.6", "0.11", "0.12"])
async def test_engine_missing_its_settings_is_explained(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    standin = OpenWebUIStandIn(version, "")
    use_openwebui(monkeypatch, standin)
    events = Events()
    text = await Tools().search(
        ["a", "b"], __request__=standin.request, __event_emitter__=events
    )
    assert text == UNCONFIGURED
    assert len(standin.calls) == 2
    assert events.descriptions() == ["Searching: a · b", UNCONFIGURED]


async def test_search_engine_valve_overrides_the_admin_engine(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin = OpenWebUIStandIn("0.12", searxng.search_url, engine="brave")
    use_openwebui(monkeypatch, standin)
    tool = Tools()
    tool.valves = Tools.Valves(SEARCH_ENGINE="searxng")
    text = await tool.search(["q"], __request__=standin.request)
    assert standin.calls[0]["engine"] == "searxng"
    assert text == NO_RESULTS.format("q")


async def test_searxng_valve_wins_over_open_webui(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin = OpenWebUIStandIn("0.12", "", enabled=False)
    use_openwebui(monkeypatch, standin)
    tool = direct_tool(searxng)
    text = await tool.search(["q"], __request__=standin.request)
    assert text == NO_RESULTS.format("q")
    assert standin.calls == []
    assert searxng.queries() == ["q"]


async def test_request_without_open_webui_installed_uses_searxng_or_explains(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_openwebui(monkeypatch, None)
    request = object()
    assert await Tools().search(["q"], __request__=request) == (
        search_tool.NO_BACKEND_TEXT
    )


async def test_settings_read_failure_is_a_clear_message(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin = OpenWebUIStandIn("0.12", searxng.search_url)
    namespace = standin.namespace()

    async def broken_get_many(*_keys: str) -> dict:
        raise OSError("database is locked")

    namespace.config_store.get_many = broken_get_many
    use_openwebui(monkeypatch, standin, namespace)
    text = await Tools().search(["q"], __request__=standin.request)
    assert text == (
        "Web search failed: Open WebUI's web search settings could not be read. "
        "Please try again later."
    )


async def test_open_webui_timeout_per_query(monkeypatch: pytest.MonkeyPatch) -> None:
    release = asyncio.Event()
    standin = OpenWebUIStandIn("0.12", "http://unused.invalid/search")
    namespace = standin.namespace()

    async def search_web(
        request: Any, engine: str, query: str, user: Any = None, *, config: Any = None
    ) -> list:
        if query == "slow":
            await release.wait()
        return [{"link": f"https://{query}.example", "title": query, "snippet": None}]

    namespace.search_web = search_web
    use_openwebui(monkeypatch, standin, namespace)
    tool = Tools()
    tool.valves = Tools.Valves(QUERY_TIMEOUT_SECONDS=0.3)
    text = await tool.search(["slow", "fast"], __request__=standin.request)
    release.set()
    assert text == (
        "Google search Timeout, return None, Please try again later.\n=======\n"
        "A Google search for 'fast' found 1 results:\n\n## Web Results\n"
        "1. [fast](https://fast.example)\n"
    )


class KeyErrorConfig:
    """An AppConfig that raises KeyError for names it does not hold."""

    def __init__(self, **values: Any) -> None:
        self._values = values

    def __getattr__(self, name: str) -> Any:
        return self.__dict__["_values"][name]


async def test_app_config_raising_key_error_and_old_names(
    searxng: FakeSearXNG, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin = OpenWebUIStandIn("0.6", searxng.search_url)
    use_openwebui(monkeypatch, standin)
    standin.request.app.state.config = KeyErrorConfig(
        ENABLE_RAG_WEB_SEARCH=True,
        RAG_WEB_SEARCH_ENGINE="searxng",
        SEARXNG_QUERY_URL=searxng.search_url,
        WEB_SEARCH_RESULT_COUNT=3,
    )
    text = await Tools().search(["q"], __request__=standin.request)
    assert text == NO_RESULTS.format("q")
    assert standin.calls[0]["engine"] == "searxng"
