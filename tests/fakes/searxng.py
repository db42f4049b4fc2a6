"""A fake SearXNG instance (JSON API) over real HTTP on 127.0.0.1.

`GET /search?q=...&format=json` answers with SearXNG's JSON shape
(`{"query", "results": [{"url", "title", "content", "score", "publishedDate"}]}`).
Per query, a test can script the results, an HTTP error, garbage (raw bytes, or
a stream of chunks, with extra headers such as Content-Encoding), or a request
that never answers (released when the server stops). `gather(n)` makes the
server hold every request until `n` of them are in flight at once: a client
that searches one query after another never gets there, and its requests fail
with HTTP 504 after a short wait instead of hanging the test.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from .http import LocalServer, Request, Response


@dataclass
class Script:
    """What the fake answers for one query."""

    results: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    raw: bytes | Iterable[bytes] | None = None
    hang: bool = False
    headers: dict[str, str] = field(default_factory=dict)


def result(
    url: str,
    title: str | None = "",
    content: str | None = "",
    score: float = 1.0,
    published: str | None = None,
) -> dict[str, Any]:
    """One SearXNG result entry."""
    entry: dict[str, Any] = {"url": url, "title": title, "content": content}
    entry["score"] = score
    entry["engine"] = "fake"
    if published is not None:
        entry["publishedDate"] = published
    return entry


class FakeSearXNG(LocalServer):
    """SearXNG's `/search` JSON endpoint with scripted answers."""

    def __init__(self) -> None:
        """Create the fake (not started)."""
        super().__init__({"/search": self._search})
        self._count_lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget scripts and recorded requests (reuse one server across tests)."""
        self.scripts: dict[str, Script] = {}
        self.default = Script()
        self._barrier: threading.Barrier | None = None
        self.max_in_flight = 0
        self._in_flight = 0
        with self._lock:
            self.requests.clear()

    def __enter__(self) -> FakeSearXNG:
        """Start serving."""
        self.start()
        return self

    @property
    def search_url(self) -> str:
        """The URL to put in the SEARXNG_URL valve."""
        return self.url("/search")

    def script(self, query: str, **kwargs: Any) -> None:
        """Script the answer for one query."""
        self.scripts[query] = Script(**kwargs)

    def gather(self, parties: int, wait_seconds: float = 5.0) -> None:
        """Hold each request until `parties` requests are in flight together."""
        self._barrier = threading.Barrier(parties, timeout=wait_seconds)

    def queries(self) -> list[str]:
        """The `q` parameter of every request, in arrival order."""
        return [r.query.get("q", [""])[0] for r in self.requests]

    def _search(self, request: Request) -> Response:
        query = request.query.get("q", [""])[0]
        with self._count_lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            return self._answer(request, query)
        finally:
            with self._count_lock:
                self._in_flight -= 1

    def _answer(self, request: Request, query: str) -> Response:
        if request.query.get("format") != ["json"]:
            return Response.text("format not allowed", 403)
        if self._barrier is not None:
            try:
                self._barrier.wait()
            except threading.BrokenBarrierError:
                return Response.text("queries did not arrive together", 504)
        script = self.scripts.get(query, self.default)
        if script.hang:
            self.wait_forever()
            return Response.text("stopped", 503)
        if script.raw is not None:
            headers = {"Content-Type": "application/json", **script.headers}
            return Response(script.status, headers, script.raw)
        if script.status != 200:
            return Response.text("engine error", script.status)
        return Response.json({"query": query, "results": script.results})


# --- Open WebUI stand-ins -------------------------------------------------
#
# The tools reach Open WebUI only through `_import_openwebui()`, which returns
# `search_web`, the config store (0.11+), `UserModel` and the retrieval config
# keys. `OpenWebUIStandIn` provides those pieces with each version's calling
# convention, and its `search_web` really queries a SearXNG URL over HTTP, as
# Open WebUI's own "searxng" engine does. `install` puts them where the tools
# import them from (``sys.modules``), so no private name of a tool is patched.

SEARXNG_MISSING = "No SEARXNG_QUERY_URL found in environment variables"
ENGINE_MISSING = "No search engine API key found in environment variables"


@dataclass
class SearchResult:
    """Open WebUI's `SearchResult` (link, optional title and snippet)."""

    link: str
    title: str | None
    snippet: str | None


class UserModel(BaseModel):
    """The fields of Open WebUI's `UserModel` the tools rely on."""

    id: str
    email: str
    name: str
    role: str = "pending"


class _State:
    """Starlette's `app.state`: a missing attribute raises AttributeError."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


class OpenWebUIStandIn:
    """Open WebUI's search pieces for one version family.

    - ``"0.6"``: sync ``search_web(request, engine, query, user=None)``; settings
      on ``request.app.state.config`` (0.6.x and 0.8.x).
    - ``"0.11"``: async ``search_web(request, engine, query, user=None)``;
      settings from ``await Config.get_many(...)``; no ``app.state.config``.
    - ``"0.12"``: like 0.11 plus a keyword-only ``config=`` dict.
    """

    def __init__(
        self,
        version: str,
        searxng_url: str,
        *,
        enabled: bool = True,
        engine: str = "searxng",
        result_count: int = 3,
    ) -> None:
        """Configure the stand-in like an admin would in Admin Settings."""
        self.version = version
        self.values: dict[str, Any] = {
            "web.search.enable": enabled,
            "web.search.engine": engine,
            "web.search.result_count": result_count,
            "web.search.searxng_query_url": searxng_url,
            "web.search.domain.filter_list": [],
        }
        self.calls: list[dict[str, Any]] = []
        self.config_reads: list[tuple[str, ...]] = []
        self.request = self._request()

    def _request(self) -> Any:
        """A request whose `app.state` looks like this version's."""
        if self.version == "0.6":
            config = SimpleNamespace(
                ENABLE_WEB_SEARCH=self.values["web.search.enable"],
                WEB_SEARCH_ENGINE=self.values["web.search.engine"],
                WEB_SEARCH_RESULT_COUNT=self.values["web.search.result_count"],
                SEARXNG_QUERY_URL=self.values["web.search.searxng_query_url"],
            )
            state = _State(config=config)
        else:
            state = _State(MODELS={})
        return SimpleNamespace(app=SimpleNamespace(state=state))

    def namespace(self) -> SimpleNamespace:
        """What `_import_openwebui()` returns inside this version."""
        store = None if self.version == "0.6" else self._config_store()
        keys = None
        if self.version == "0.12":
            keys = {k.split(".")[-1].upper(): k for k in self.values}
        return SimpleNamespace(
            search_web=self._search_web(),
            config_store=store,
            user_model=UserModel,
            config_keys=keys,
        )

    def install(
        self, monkeypatch: pytest.MonkeyPatch, pieces: SimpleNamespace | None = None
    ) -> SimpleNamespace:
        """Make this version's Open WebUI importable (``monkeypatch`` undoes it).

        The modules the tools import inside Open WebUI go into ``sys.modules``:
        ``open_webui.routers.retrieval`` (``search_web``; on 0.12 also
        ``RETRIEVAL_CONFIG_KEYS``), ``open_webui.models.users``
        (``UserModel``) and, from 0.11, ``open_webui.models.config``
        (``Config``). Any Open WebUI modules already imported are set aside.

        Args:
            monkeypatch: Undoes the change when the test ends.
            pieces: What to install (default: `namespace`); a test may swap
                one, e.g. a ``search_web`` that fails.

        Returns:
            The pieces installed.
        """
        pieces = pieces or self.namespace()
        keys = (
            {}
            if pieces.config_keys is None
            else {"RETRIEVAL_CONFIG_KEYS": pieces.config_keys}
        )
        retrieval = _module(
            "open_webui.routers.retrieval", search_web=pieces.search_web, **keys
        )
        users = _module("open_webui.models.users", UserModel=pieces.user_model)
        installed = [retrieval, users]
        if pieces.config_store is not None:  # 0.11+
            installed.append(
                _module("open_webui.models.config", Config=pieces.config_store)
            )
        for name in [n for n in sys.modules if n.split(".")[0] == "open_webui"]:
            monkeypatch.delitem(sys.modules, name)
        for package in ("open_webui", "open_webui.routers", "open_webui.models"):
            monkeypatch.setitem(sys.modules, package, _package(package, installed))
        for module in installed:
            monkeypatch.setitem(sys.modules, module.__name__, module)
        return pieces

    def _config_store(self) -> Any:
        values = self.values
        reads = self.config_reads

        class Config:
            @staticmethod
            async def get(key: str, default: Any = None) -> Any:
                reads.append((key,))
                return values.get(key, default)

            @staticmethod
            async def get_many(*keys: str) -> dict:
                reads.append(keys)
                return {key: values[key] for key in keys if key in values}

        return Config

    def _search_web(self) -> Callable[..., Any]:
        standin = self

        if self.version == "0.6":

            def search_web(request: Any, engine: str, query: str, user: Any = None):
                config = request.app.state.config
                settings = {
                    "web.search.searxng_query_url": config.SEARXNG_QUERY_URL,
                    "web.search.result_count": config.WEB_SEARCH_RESULT_COUNT,
                }
                standin._record(engine, query, user, None)
                return standin._search_sync(engine, query, settings)

            return search_web

        if self.version == "0.11":

            async def search_web_011(request: Any, engine: str, query: str, user=None):
                standin._record(engine, query, user, None)
                settings = dict(standin.values)
                # 0.11.4 strips the stored language unguarded; a null (what a
                # partial REST config update stores) raises AttributeError.
                language = settings.get("web.search.searxng_language", "all")
                settings["web.search.searxng_language"] = language.strip()
                return await asyncio.to_thread(
                    standin._search_sync, engine, query, settings
                )

            return search_web_011

        async def search_web_012(
            request: Any,
            engine: str,
            query: str,
            user: Any = None,
            *,
            config: dict | None = None,
        ):
            standin._record(engine, query, user, config)
            settings = config if config is not None else dict(standin.values)
            return await asyncio.to_thread(
                standin._search_sync, engine, query, settings
            )

        return search_web_012

    def _record(self, engine: str, query: str, user: Any, config: Any) -> None:
        self.calls.append(
            {
                "engine": engine,
                "query": query,
                "user": user,
                "config": config,
                "thread": threading.current_thread().name,
            }
        )

    @staticmethod
    def _search_sync(engine: str, query: str, settings: dict) -> list[SearchResult]:
        if engine != "searxng":
            raise RuntimeError(ENGINE_MISSING)
        url = settings["web.search.searxng_query_url"]
        if not url:
            raise RuntimeError(SEARXNG_MISSING)
        response = httpx.get(url, params={"q": query, "format": "json"}, timeout=10)
        response.raise_for_status()
        ranked = sorted(
            response.json().get("results", []),
            key=lambda r: r.get("score", 0),
            reverse=True,
        )
        return [
            SearchResult(r.get("url", ""), r.get("title"), r.get("content"))
            for r in ranked[: settings["web.search.result_count"]]
        ]


def _module(name: str, **attributes: Any) -> ModuleType:
    """A module named ``name`` holding ``attributes``."""
    module = ModuleType(name)
    module.__dict__.update(attributes)
    return module


def _package(name: str, modules: list[ModuleType]) -> ModuleType:
    """A package whose submodules are those of ``modules`` directly under it.

    Any other submodule cannot be imported (its import fails as it would
    where Open WebUI lacks it).
    """
    package = _module(name)
    package.__path__ = []
    prefix = f"{name}."
    for module in modules:
        child = module.__name__.removeprefix(prefix)
        if module.__name__.startswith(prefix) and "." not in child:
            package.__dict__[child] = module
    return package
