"""Code the tools share (tools/shared/), tested once.

The shared modules are generated into each tool file, byte for byte
(`scripts/sync_root_files.py --check`). What a module does on its own is
tested here once, on the module itself; what a tool does with it (its query
handling, its events, its TLS context) is tested once, parametrised over the
search tools, each against its fake backend over real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.fakes.events import Events
from tests.fakes.scholarly import FakeScholarly, Fault
from tests.fakes.searxng import FakeSearXNG, Script
from tongyi_deepresearch_openwebui_pipeline.tools import scholar_tool, search_tool
from tongyi_deepresearch_openwebui_pipeline.tools.shared import safe_http

NO_RESULTS = "No results found for '{}'. Try with a more general query."
SEPARATOR = "\n=======\n"


@dataclass(frozen=True)
class SearchTool:
    """One of the search tools, set up against its fake backend."""

    module: ModuleType
    method: str
    invalid: str  # the reference's text for a call without valid queries
    failed: str  # the text for a query its backend answered with HTTP 500

    def make(self, backends: Backends, **valves: Any) -> Any:
        """The tool, searching its fake backend."""
        tool = self.module.Tools()
        if self.module is search_tool:
            valves["SEARXNG_URL"] = backends.searxng.search_url
        else:
            valves["OPENALEX_URL"] = backends.apis.openalex_url
        tool.valves = tool.Valves(**valves)
        return tool

    async def call(self, tool: Any, query: Any, **reserved: Any) -> Any:
        """The tool's one method, as Open WebUI calls it (its `ToolResult`)."""
        return await getattr(tool, self.method)(query, **reserved)


@dataclass(frozen=True)
class Backends:
    """The fake backends: SearXNG (search) and the scholarly APIs (scholar)."""

    searxng: FakeSearXNG
    apis: FakeScholarly

    def queries(self, tool: SearchTool) -> list[str]:
        """The queries `tool`'s backend was asked, in arrival order."""
        if tool.module is search_tool:
            return self.searxng.queries()
        return [r.query["search"][0] for r in self.apis.requests_to("/works")]

    def requests(self) -> list[Any]:
        """Every request either backend received."""
        return [*self.searxng.requests, *self.apis.server.requests]

    def fail(self, tool: SearchTool) -> None:
        """Make `tool`'s backend answer every query with HTTP 500."""
        if tool.module is search_tool:
            self.searxng.default = Script(status=500)
        else:
            self.apis.faults["openalex"] = Fault(status=500)


SEARCH = SearchTool(
    search_tool,
    "search",
    "[Search] Invalid request format: "
    "Input must be a JSON object containing 'query' field",
    "Search failed for '{}': the search engine answered HTTP 500. "
    "Please try again later.",
)
SCHOLAR = SearchTool(
    scholar_tool,
    "google_scholar",
    "[google_scholar] Invalid request format: "
    "Input must be a JSON object containing 'query' field",
    "Scholar search failed for '{}': the service answered HTTP 500. "
    "Please try again later.",
)


@pytest.fixture(params=[SEARCH, SCHOLAR], ids=["search", "google_scholar"])
def tool(request: pytest.FixtureRequest) -> SearchTool:
    """Each search tool in turn."""
    return request.param


@pytest.fixture
def backends(searxng: FakeSearXNG, apis: FakeScholarly) -> Backends:
    """The fake backends, fresh for the test."""
    return Backends(searxng, apis)


# --- queries (search_common.py) ------------------------------------------------------


async def test_extra_queries_are_named_in_a_note(
    tool: SearchTool, backends: Backends
) -> None:
    made = tool.make(backends, MAX_QUERIES_PER_SEARCH=2)
    text = await tool.call(made, ["one", "two", "three", "four"])
    assert sorted(backends.queries(tool)) == ["one", "two"]
    assert text == (
        NO_RESULTS.format("one") + SEPARATOR + NO_RESULTS.format("two") + "\n\n"
        "Note: only the first 2 queries of this call were searched (limit per "
        "call). Not searched: 'three', 'four'. "
        "Call the tool again with these queries if you still need them."
    )


async def test_no_note_when_within_the_limit(
    tool: SearchTool, backends: Backends
) -> None:
    made = tool.make(backends, MAX_QUERIES_PER_SEARCH=2)
    text = await tool.call(made, ["one", "two"])
    assert text == NO_RESULTS.format("one") + SEPARATOR + NO_RESULTS.format("two")


async def test_duplicate_queries_are_searched_once(
    tool: SearchTool, backends: Backends
) -> None:
    text = await tool.call(tool.make(backends), ["a", " a ", "b", "a", ""])
    assert sorted(backends.queries(tool)) == ["a", "b"]
    assert text == NO_RESULTS.format("a") + SEPARATOR + NO_RESULTS.format("b")


async def test_a_bare_string_query_is_accepted(
    tool: SearchTool, backends: Backends
) -> None:
    text = await tool.call(tool.make(backends), "  solo  ")
    assert backends.queries(tool) == ["solo"]
    assert text == NO_RESULTS.format("solo")


@pytest.mark.parametrize(
    "query",
    [None, [], [""], ["  ", ""], [1], [3], ["ok", 2], {"query": "x"},
     {"query": ["x"]}, 7, 1.5, "", "  "],
)  # fmt: skip
async def test_invalid_query_gets_the_reference_text(
    query: Any, tool: SearchTool, backends: Backends
) -> None:
    text = await tool.call(tool.make(backends), query)
    assert text == tool.invalid
    assert text.ok is False
    assert backends.requests() == []


# --- events (events.py) -------------------------------------------------------------


@pytest.mark.parametrize("backend", ["answers", "fails"])
async def test_a_failing_emitter_does_not_stop_the_search(
    backend: str, tool: SearchTool, backends: Backends
) -> None:
    if backend == "fails":
        backends.fail(tool)
    events = Events()
    expected = await tool.call(tool.make(backends), ["q"], __event_emitter__=events)
    assert len(events) == 2  # searching, then what was found (or the failure)

    async def broken(_event: dict) -> None:
        raise RuntimeError("socket gone")

    text = await tool.call(tool.make(backends), ["q"], __event_emitter__=broken)
    found = NO_RESULTS if backend == "answers" else tool.failed
    assert text == expected == found.format("q")


async def test_a_sync_emitter_is_accepted(tool: SearchTool, backends: Backends) -> None:
    seen: list[dict] = []
    await tool.call(tool.make(backends), ["q"], __event_emitter__=seen.append)
    events = Events()
    await tool.call(tool.make(backends), ["q"], __event_emitter__=events)
    assert seen == list(events)
    assert len(seen) == 2  # searching, then what was found


# --- TLS contexts (safe_http.py) ----------------------------------------------------


async def test_calls_share_one_tls_context(
    tool: SearchTool, backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    await tool.call(tool.make(backends), ["warm up"])
    built: list[str] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        built.append("context")
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    for number in range(3):
        text = await tool.call(tool.make(backends), [f"q{number}", "other"])
        assert text.startswith(NO_RESULTS.format(f"q{number}"))
    assert built == []  # loading CA certificates is slow blocking work
    (context,) = tool.module._SSL_CONTEXTS  # the process's: certificates checked
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname is True


class ThreadsOf:
    """A context factory (httpx's) recording the thread of each call."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def __call__(self, verify: bool) -> ssl.SSLContext:
        self.threads.append(threading.current_thread())
        return httpx.create_ssl_context(verify=verify)


async def test_a_context_is_built_once_off_the_event_loop() -> None:
    create = ThreadsOf()
    contexts = safe_http._TlsContexts(create)
    # Calls that start together all wait for the one context being built.
    first, *others = await asyncio.gather(
        *(safe_http._ssl_context(True, contexts) for _ in range(3))
    )
    assert all(context is first for context in others)
    assert await safe_http._ssl_context(True, contexts) is first
    assert len(create.threads) == 1
    assert create.threads[0] is not threading.main_thread()
    assert (first.verify_mode, first.check_hostname) == (ssl.CERT_REQUIRED, True)


async def test_each_verify_setting_has_its_own_context() -> None:
    create = ThreadsOf()
    contexts = safe_http._TlsContexts(create)
    verified = await safe_http._ssl_context(True, contexts)
    unverified = await safe_http._ssl_context(False, contexts)
    assert unverified is not verified
    assert (unverified.verify_mode, unverified.check_hostname) == (
        ssl.CERT_NONE,
        False,
    )
    assert list(contexts) == [verified, unverified]
    assert (contexts[True], contexts[False]) == (verified, unverified)
    assert len(create.threads) == 2
    assert threading.main_thread() not in create.threads
