"""The tools the loop can call, found once and run per chat.

Each tool is defined once, in `catalog.CATALOG`. A tool that is a module of
this package is found by importing it from the installed package (the pipe
itself runs from it, so it is always there) and run as a fresh ``Tools()``
per call, with the admin's valves when the tool is installed in Open WebUI
and the reserved arguments its definition names; handlers (files, Jupyter)
are built for the chat. Where a tool's valves may take the pipe's own model
server (`ToolModule.model_server`: the visit tool's extractor),
`SharedEndpoint` fills them in, so a single API key in the pipe is enough,
and hands the pipe's key only to that server.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from ...core.events import ToolOutcome
from ...core.sources import PageRead, Paper, is_page_url
from ...core.toolcalls import SCHEMAS, CallError, ToolCall, check_arguments
from .. import secrets
from .catalog import CATALOG, call_tallies, tool_modules, tool_named
from .tooldef import Handler, ToolDef, ToolModule

__all__ = ["TOOL_MODULES", "Handler", "ToolModule"]

log = logging.getLogger(__name__)

PACKAGE = "tongyi_deepresearch_openwebui_pipeline"

TOOL_MODULES: dict[str, ToolModule] = tool_modules()


def _tools_class(module: Any, method: str) -> type | None:
    cls = getattr(module, "Tools", None)
    if isinstance(cls, type) and callable(getattr(cls, method, None)):
        return cls
    return None


def _from_package(spec: ToolModule) -> type | None:
    try:
        module = importlib.import_module(f"{PACKAGE}.tools.{spec.module}")
    except ImportError:
        log.warning("the %s tool module cannot be imported", spec.name, exc_info=True)
        return None
    return _tools_class(module, spec.method)


class ToolResolver:
    """Finds each tool's class once per process (then serves it from cache)."""

    def __init__(self, classes: Mapping[str, type | None] | None = None) -> None:
        """Find classes in the installed package.

        Args:
            classes: Known classes by tool name, used as resolved (a test seam).
        """
        self._cache: dict[str, type | None] = dict(classes or {})
        self._lock = asyncio.Lock()

    async def resolve(self, spec: ToolModule) -> type | None:
        """The ``Tools`` class for ``spec``, or None when none can be found."""
        if spec.name in self._cache:
            return self._cache[spec.name]
        async with self._lock:
            if spec.name not in self._cache:
                self._cache[spec.name] = _from_package(spec)
        return self._cache[spec.name]


def _endpoint_identity(url: str) -> tuple[str, str, int | None, str] | None:
    """What makes two base URLs the same server (credentials left out)."""
    bare = secrets.split_userinfo(url.strip())[0]
    try:
        parts = urlsplit(bare)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    return (parts.scheme.lower(), host, port, parts.path.rstrip("/"))


@dataclass(frozen=True)
class SharedEndpoint:
    """The pipe's model server, offered to a tool's own endpoint valves.

    The pipe's key (and credentials in its URL) go only to the pipe's server:

    - the tool's URL valve is empty → URL, key and model come from the pipe
      (each only where the admin left that valve empty);
    - the tool's URL is the pipe's server (credentials, case and trailing
      slash aside) → an empty key and model valve are filled, and the URL
      gains the pipe's URL credentials when it has none of its own;
    - any other URL → nothing is filled: that server never sees the pipe's
      key, and an empty key valve there means no key.
    """

    url_valve: str
    key_valve: str
    model_valve: str
    base_url: str
    api_key: str = ""
    model: str = ""

    def fill(self, values: dict[str, Any], defaults: Mapping[str, Any]) -> None:
        """Fill ``values`` (the admin's) in place; ``defaults`` are the class's."""

        def current(name: str) -> str:
            value = values.get(name, defaults.get(name))
            return value.strip() if isinstance(value, str) else ""

        url = current(self.url_valve)
        if url and _endpoint_identity(url) != _endpoint_identity(self.base_url):
            return  # another server: none of the pipe's credentials
        has_own_credentials = url and secrets.split_userinfo(url)[1:] != ("", "")
        if not has_own_credentials:
            values[self.url_valve] = self.base_url
        if not current(self.key_valve) and self.api_key:
            values[self.key_valve] = self.api_key
        if not current(self.model_valve) and self.model:
            values[self.model_valve] = self.model


@dataclass
class ToolContext:
    """Per-chat values handed to the tools."""

    request: Any = None
    user: dict[str, Any] | None = None
    chat_id: str | None = None
    emitter: Callable[[dict[str, Any]], Awaitable[None]] | None = None
    #: The pipe's model server, offered to a tool's endpoint valves (by tool).
    shared_endpoints: Mapping[str, SharedEndpoint] = field(default_factory=dict)

    def reserved_arguments(self) -> dict[str, Any]:
        """Each reserved argument a tool may take (`tooldef.RESERVED_ARGUMENTS`)."""
        return {
            "__request__": self.request,
            "__user__": self.user,
            "__event_emitter__": self.emitter,
            "__chat_id__": self.chat_id,
        }


class Toolbox:
    """`ToolPort` over the resolved tool classes and built-in handlers."""

    def __init__(
        self,
        classes: Mapping[str, type],
        context: ToolContext,
        admin_valves: Mapping[str, Mapping[str, Any]] | None = None,
        handlers: Mapping[str, Handler] | None = None,
        timeout_seconds: float = 900.0,
        *,
        catalog: Sequence[ToolDef] = CATALOG,
    ) -> None:
        """Offer ``classes`` (by tool name) plus ``handlers`` (e.g. parse_file).

        ``catalog`` holds the definition of every tool offered.
        """
        self._classes = dict(classes)
        self._context = context
        self._admin_valves = dict(admin_valves or {})
        self._handlers = dict(handlers or {})
        self._timeout = timeout_seconds
        self._catalog = tuple(catalog)
        self._modules = tool_modules(self._catalog)

    def with_emitter(
        self, emitter: Callable[[dict[str, Any]], Awaitable[None]]
    ) -> Toolbox:
        """The same tools, their events going to ``emitter`` (a heavy run's rollout)."""
        return Toolbox(
            self._classes,
            replace(self._context, emitter=emitter),
            self._admin_valves,
            self._handlers,
            self._timeout,
            catalog=self._catalog,
        )

    def available(self) -> list[str]:
        """Tool names the model may call in this run."""
        return [*self._classes, *self._handlers]

    def _instance(self, name: str) -> Any:
        cls = self._classes[name]
        instance = cls()
        valves_cls = getattr(cls, "Valves", None)
        if valves_cls is None:
            return instance
        values: dict[str, Any] = {
            key: value
            for key, value in (self._admin_valves.get(name) or {}).items()
            if value is not None
        }
        endpoint = self._context.shared_endpoints.get(name)
        if endpoint is not None:
            fields = getattr(valves_cls, "model_fields", {}) or {}
            defaults = {
                key: getattr(info, "default", None) for key, info in fields.items()
            }
            if endpoint.url_valve in fields:
                endpoint.fill(values, defaults)
        try:
            instance.valves = valves_cls(**values)
        except Exception as error:
            log.warning("invalid valves for %s (%s); using defaults", name, error)
            instance.valves = valves_cls()
        return instance

    async def run(self, call: ToolCall) -> ToolOutcome:
        """Run one validated call with a time limit."""
        checked = self._checked(call)
        if isinstance(checked, CallError):
            return ToolOutcome(checked.message, ok=False)
        outcome = await self._run_in_time(checked)
        counts = call_tallies(checked.name, checked.arguments, self._catalog)
        return replace(outcome, counts=counts)

    async def _run_in_time(self, call: ToolCall) -> ToolOutcome:
        try:
            async with asyncio.timeout(self._timeout):
                return await self._dispatch(call)
        except TimeoutError:
            return ToolOutcome(
                f"Error: the {call.name} tool did not finish within "
                f"{self._timeout:.0f} seconds. Try fewer queries or URLs.",
                ok=False,
            )

    def _checked(self, call: ToolCall) -> ToolCall | CallError:
        """``call`` checked against its tool's prompt line.

        The loop has checked the calls of the model's own tools against
        their lines (`core.toolcalls.SCHEMAS`); a tool with a line of its
        own is checked here, in the same words.
        """
        tool = tool_named(call.name, self._catalog)
        if tool is None or SCHEMAS.get(call.name) == tool.schema:
            return call
        return check_arguments(call, tool.schema)

    async def _dispatch(self, call: ToolCall) -> ToolOutcome:
        if call.name in self._handlers:
            return await self._handlers[call.name](call)
        spec = self._modules[call.name]
        method = getattr(self._instance(call.name), spec.method)
        reserved = self._context.reserved_arguments()
        accepted = inspect.signature(method).parameters
        # The model may add arguments the tool does not take; drop them.
        arguments = {k: v for k, v in call.arguments.items() if k in accepted}
        kwargs = {name: reserved[name] for name in spec.reserved if name in accepted}
        return outcome_of(await method(**arguments, **kwargs))


def outcome_of(result: Any) -> ToolOutcome:
    """What a tool returned, judged by the tool itself.

    Our tools return a `str` that carries ``ok`` and ``sources`` (their
    ``ToolResult``). A result without ``ok`` counts as a success: its words
    are the model's to read, not ours to guess from (a page may well begin
    with "Error"). Its sources become the core's `PageRead`s here, once.
    """
    ok = getattr(result, "ok", True)
    sources = getattr(result, "sources", ())
    papers = getattr(result, "papers", ())
    text = str.__str__(result) if isinstance(result, str) else str(result)
    return ToolOutcome(
        text,
        ok=ok if isinstance(ok, bool) else True,
        pages=tuple(
            page
            for source in (sources if isinstance(sources, tuple | list) else ())
            if (page := page_read(source)) is not None
        ),
        papers=tuple(
            paper
            for record in (papers if isinstance(papers, tuple | list) else ())[
                :MAX_PAPERS
            ]
            if (paper := paper_found(record)) is not None
        ),
    )


#: Most scholarly records kept of one call (a scholar call finds ~10 a query).
MAX_PAPERS = 200
#: Longest text kept of a record's field.
PAPER_FIELD_CHARS = 1000
#: Most authors kept of a record.
PAPER_AUTHORS = 50


def paper_found(data: Any) -> Paper | None:
    """A scholarly record from the scholar tool's ``papers`` (None: no page URL)."""
    if not isinstance(data, Mapping):
        return None
    url = _text(data.get("url"))
    if len(url) > PAPER_FIELD_CHARS * 4 or not is_page_url(url):
        return None
    authors = data.get("authors")
    return Paper(
        url=url,
        title=_field(data.get("title")),
        pdf=pdf
        if len(pdf := _text(data.get("pdf"))) <= PAPER_FIELD_CHARS * 4
        and is_page_url(pdf)
        else "",
        authors=tuple(
            _field(name)
            for name in (authors if isinstance(authors, list | tuple) else ())[
                :PAPER_AUTHORS
            ]
            if isinstance(name, str) and name.strip()
        ),
        year=_field(data.get("year"))[:32],
        venue=_field(data.get("venue")),
        doi=_field(data.get("doi"))[:256],
    )


def _field(value: Any) -> str:
    return value[:PAPER_FIELD_CHARS] if isinstance(value, str) else ""


def page_read(data: Any) -> PageRead | None:
    """The page a tool read, from its source (an Open WebUI source event's ``data``).

    The tool names the page in ``metadata[0]`` (``url``, else ``source``) or in
    ``source.url``, its title in ``source.name`` (else ``metadata[0].name``) and
    the evidence it found as ``document[0]``; ``metadata[0]`` may add the
    ``summary``, the ``final_url`` and ``redirects`` it was reached by, and
    the ``goal``. None when ``data`` names no http(s) page.
    """
    if not isinstance(data, Mapping):
        return None
    source = _mapping(data.get("source"))
    metadata = _mapping(_first(data.get("metadata")))
    url = str(metadata.get("url") or metadata.get("source") or source.get("url") or "")
    if not is_page_url(url):
        return None
    evidence = _first(data.get("document"))
    redirects = metadata.get("redirects")
    return PageRead(
        url=url,
        title=str(source.get("name") or metadata.get("name") or ""),
        evidence="" if evidence is None else str(evidence),
        summary=str(metadata.get("summary") or ""),
        final_url=_text(metadata.get("final_url")),
        redirects=tuple(
            address
            for address in (redirects if isinstance(redirects, list | tuple) else ())
            if isinstance(address, str) and address
        ),
        goal=_text(metadata.get("goal")),
    )


def _first(value: Any) -> Any:
    """A list's first item (None for an empty list or anything else)."""
    return value[0] if isinstance(value, list | tuple) and value else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
