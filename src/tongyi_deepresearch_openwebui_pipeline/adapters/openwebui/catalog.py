"""Every tool the model can call, each defined in one place.

A `ToolDef` is all the pipe knows of a tool: the name the model calls, its
line in the system prompt, the valve that offers it, how it runs (an Open
WebUI tool module the pipe installs, or a handler built for the chat), what
the status line says while it runs, and what its calls add to the run's
tallies. The pipe's valves, the system prompt, the toolbox, the registry
install, the status lines and the counters all read `CATALOG`.

Adding a tool: write it (a module in ``tools/`` or a handler here in
``adapters/openwebui/``), then add its `ToolDef` to `CATALOG`, in the order
its line comes in the model's prompt. Nothing else changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...core.events import ToolOutcome
from ...core.prompts import TOOL_LINES
from ...core.toolcalls import ToolCall

Handler = Callable[[ToolCall], Awaitable[ToolOutcome]]
Tallies = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class ToolModule:
    """An Open WebUI tool module of this package (installed into the registry)."""

    name: str
    module: str
    method: str
    registry_id: str


@dataclass(frozen=True)
class ChatFacts:
    """What a handler is built from: the chat's request, user and files."""

    request: Any = None
    user: Mapping[str, Any] | None = None
    files: tuple[Mapping[str, Any], ...] = ()


HandlerBuilder = Callable[[ChatFacts], Awaitable[Handler | None]]


def _no_tallies(_arguments: Mapping[str, Any]) -> Tallies:
    return ()


@dataclass(frozen=True)
class ToolDef:
    """One tool, whole."""

    #: The name the model calls.
    name: str
    #: Its line in the system prompt (the reference bytes for the model's own).
    prompt_line: str
    #: The pipe valve that offers it, and that valve's description.
    valve: str
    valve_description: str
    #: The status line while it runs, from the call's arguments.
    status: Callable[[Mapping[str, Any]], str]
    #: How it runs: a module of ``tools/`` ...
    module: ToolModule | None = None
    #: ... or a handler built for the chat (None when it cannot run there).
    handler: HandlerBuilder | None = None
    #: What a call adds to the run's tallies (`core.loop.TALLIES`).
    tallies: Callable[[Mapping[str, Any]], Tallies] = _no_tallies


def _items(arguments: Mapping[str, Any], key: str) -> list[str]:
    value = arguments.get(key)
    values = value if isinstance(value, list) else [value] if value else []
    return [str(item) for item in values]


def _counting(key: str, tally: str) -> Callable[[Mapping[str, Any]], Tallies]:
    def tallies(arguments: Mapping[str, Any]) -> Tallies:
        return ((tally, len(_items(arguments, key))),)

    return tallies


async def _parse_file(chat: ChatFacts) -> Handler | None:
    from .files import build_parse_file_handler  # noqa: PLC0415  (import cycle)

    return build_parse_file_handler(chat.files, chat.request, chat.user)


async def _python(chat: ChatFacts) -> Handler | None:
    from .code import build_python_handler  # noqa: PLC0415  (import cycle)

    return await build_python_handler(chat.request, chat.user)


CATALOG: tuple[ToolDef, ...] = (
    ToolDef(
        name="search",
        prompt_line=TOOL_LINES["search"],
        valve="SEARCH_ENABLED",
        valve_description="Offer the search tool.",
        status=lambda a: "Searching: " + " · ".join(_items(a, "query")),
        module=ToolModule("search", "search_tool", "search", "deepresearch_search"),
        tallies=_counting("query", "searches"),
    ),
    ToolDef(
        name="visit",
        prompt_line=TOOL_LINES["visit"],
        valve="VISIT_ENABLED",
        valve_description="Offer the visit tool.",
        status=lambda a: "Reading: " + " · ".join(_items(a, "url")),
        module=ToolModule("visit", "visit_tool", "visit", "deepresearch_visit"),
        tallies=_counting("url", "pages_requested"),
    ),
    ToolDef(
        name="PythonInterpreter",
        prompt_line=TOOL_LINES["PythonInterpreter"],
        valve="PYTHON_ENABLED",
        valve_description=(
            "Offer PythonInterpreter when Open WebUI's code interpreter is set "
            "to Jupyter (Admin Settings → Code Execution)."
        ),
        status=lambda _a: "Running Python code",
        handler=_python,
    ),
    ToolDef(
        name="google_scholar",
        prompt_line=TOOL_LINES["google_scholar"],
        valve="SCHOLAR_ENABLED",
        valve_description="Offer the google_scholar tool.",
        status=lambda a: (
            "Searching scholarly sources: " + " · ".join(_items(a, "query"))
        ),
        module=ToolModule(
            "google_scholar", "scholar_tool", "google_scholar", "deepresearch_scholar"
        ),
        tallies=_counting("query", "searches"),
    ),
    ToolDef(
        name="parse_file",
        prompt_line=TOOL_LINES["parse_file"],
        valve="PARSE_FILE_ENABLED",
        valve_description="Offer parse_file when the user attached files to the chat.",
        status=lambda a: "Reading files: " + ", ".join(_items(a, "files")),
        handler=_parse_file,
    ),
)

BY_NAME: dict[str, ToolDef] = {tool.name: tool for tool in CATALOG}


def tool_modules() -> dict[str, ToolModule]:
    """The tools that are modules of this package, by the name the model calls."""
    return {tool.name: tool.module for tool in CATALOG if tool.module is not None}


def describe_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The status line while a call runs."""
    tool = BY_NAME.get(name)
    return tool.status(arguments) if tool else f"Calling {name or 'a tool'}"


def call_tallies(name: str, arguments: Mapping[str, Any]) -> Tallies:
    """What one call of `name` adds to the run's tallies."""
    tool = BY_NAME.get(name)
    return tool.tallies(arguments) if tool else ()
