"""Every tool the model can call, each defined in one place.

A `ToolDef` is all the front ends know of a tool: the name the model calls;
its line in the system prompt, whose JSON schema is what its calls are checked
against (`core.toolcalls.argument_schema`); the valve that offers it; how it
runs (an Open WebUI tool module the pipe installs, with the reserved
arguments it takes, the valves that may take the research model's server and
its valves in the headless runner; or a handler built for the chat); what the
question starts with while it is offered; what the status line says while it
runs; and what its calls add to the run's tallies. The pipe's valves, the
system prompt, the argument checks, the toolbox, the registry install, the
runner's tool settings, the status lines, the counters and the scripts
(`tool_modules`) all read `CATALOG`.

Adding a tool: write it (a module in ``tools/`` or a handler in
``adapters/openwebui/``), then add its `ToolDef` to `CATALOG`, in the order
its line comes in the model's prompt. No other code changes
(``tests/test_tool_definition.py`` adds one and follows it through). A module
also ships as a file users paste: make its root copy
(``scripts/sync_root_files.py``) and its README valve table
(``scripts/valves_doc.py --write``, after adding the table's markers).

The model only knows the tools of `core.prompts.TOOL_LINES` (the loop checks
their calls against those lines). A tool with a line of its own changes the
prompt the model was trained on; its calls are checked by the toolbox against
its line, in the same words, with its `ToolDef.call_example`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ...core.prompts import TOOL_LINES
from .code import build_python_handler
from .files import build_parse_file_handler, uploaded_files_note
from .tooldef import (
    COMMON_RESERVED,
    ChatFacts,
    Handler,
    HandlerBuilder,
    ModelServerValves,
    RunnerRequirement,
    RunnerValves,
    Tallies,
    ToolDef,
    ToolModule,
)

__all__ = [
    "CATALOG",
    "ChatFacts",
    "Handler",
    "HandlerBuilder",
    "ToolDef",
    "ToolModule",
    "call_tallies",
    "describe_call",
    "prompt_lines",
    "question_note",
    "tool_modules",
    "tool_named",
]


def _items(arguments: Mapping[str, Any], key: str) -> list[str]:
    value = arguments.get(key)
    values = value if isinstance(value, list) else [value] if value else []
    return [str(item) for item in values]


def _counting(key: str, tally: str) -> Callable[[Mapping[str, Any]], Tallies]:
    def tallies(arguments: Mapping[str, Any]) -> Tallies:
        return ((tally, len(_items(arguments, key))),)

    return tallies


async def _parse_file(chat: ChatFacts) -> Handler | None:
    return build_parse_file_handler(chat.files, chat.request, chat.user)


async def _python(chat: ChatFacts) -> Handler | None:
    return await build_python_handler(chat.request, chat.user)


def _uploaded_files(chat: ChatFacts) -> str:
    # The model was trained to find the attachments' names before the question.
    return uploaded_files_note(chat.files)


#: Where search and the scholar tool's web fallback search outside Open WebUI.
_SEARXNG = ("SEARXNG_URL",)

CATALOG: tuple[ToolDef, ...] = (
    ToolDef(
        name="search",
        prompt_line=TOOL_LINES["search"],
        valve="SEARCH_ENABLED",
        valve_description="Offer the search tool.",
        status=lambda a: "Searching: " + " · ".join(_items(a, "query")),
        module=ToolModule(
            "search",
            "search_tool",
            "search",
            "deepresearch_search",
            runner=RunnerValves(
                settings=_SEARXNG,
                required=RunnerRequirement(
                    setting="SEARXNG_URL",
                    problem="no search engine configured",
                    wanted="a SearXNG search URL with the JSON format enabled",
                    without="web search",
                ),
            ),
        ),
        tallies=_counting("query", "searches"),
    ),
    ToolDef(
        name="visit",
        prompt_line=TOOL_LINES["visit"],
        valve="VISIT_ENABLED",
        valve_description="Offer the visit tool.",
        status=lambda a: "Reading: " + " · ".join(_items(a, "url")),
        module=ToolModule(
            "visit",
            "visit_tool",
            "visit",
            "deepresearch_visit",
            # The page cache is kept per chat.
            reserved=(*COMMON_RESERVED, "__chat_id__"),
            # The extractor is, by default, the research model itself.
            model_server=ModelServerValves(
                url="EXTRACTOR_BASE_URL",
                key="EXTRACTOR_API_KEY",
                model="EXTRACTOR_MODEL",
            ),
            # Without Open WebUI, pages are read with the tool's own fetcher.
            runner=RunnerValves(
                fixed=(("PAGE_LOADER", "builtin"),),
                settings=("ALLOW_PRIVATE_URLS",),
            ),
        ),
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
            "google_scholar",
            "scholar_tool",
            "google_scholar",
            "deepresearch_scholar",
            runner=RunnerValves(settings=_SEARXNG),
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
        question_note=_uploaded_files,
    ),
)


def tool_named(name: str, catalog: Sequence[ToolDef] = CATALOG) -> ToolDef | None:
    """The tool the model calls `name` (None: no such tool)."""
    return next((tool for tool in catalog if tool.name == name), None)


def tool_modules(catalog: Sequence[ToolDef] = CATALOG) -> dict[str, ToolModule]:
    """The tools that are modules of this package, by the name the model calls.

    The one list of the tool modules: the registry install, the runner's
    ``[tools.<name>]`` tables and the scripts (release assets, README's valve
    tables, the root copies) read it.
    """
    return {tool.name: tool.module for tool in catalog if tool.module is not None}


def prompt_lines(
    offered: Iterable[str], catalog: Sequence[ToolDef] = CATALOG
) -> list[str]:
    """The prompt lines of the tools `offered`, in the prompt's order."""
    names = set(offered)
    return [tool.prompt_line for tool in catalog if tool.name in names]


def question_note(
    offered: Iterable[str], chat: ChatFacts, catalog: Sequence[ToolDef] = CATALOG
) -> str:
    """What the question starts with, for the tools `offered` ("" for none)."""
    names = set(offered)
    return "".join(
        tool.question_note(chat)
        for tool in catalog
        if tool.name in names and tool.question_note is not None
    )


def describe_call(
    name: str, arguments: Mapping[str, Any], catalog: Sequence[ToolDef] = CATALOG
) -> str:
    """The status line while a call runs."""
    tool = tool_named(name, catalog)
    return tool.status(arguments) if tool else f"Calling {name or 'a tool'}"


def call_tallies(
    name: str, arguments: Mapping[str, Any], catalog: Sequence[ToolDef] = CATALOG
) -> Tallies:
    """What one call of `name` adds to the run's tallies."""
    tool = tool_named(name, catalog)
    return tool.tallies(arguments) if tool else ()
