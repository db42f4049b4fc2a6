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
from dataclasses import dataclass
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
    "ToolChoice",
    "ToolDef",
    "ToolModule",
    "call_tallies",
    "choice_notes",
    "choose_tools",
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


#: Most tool ids a request's selection is read for (the rest are ignored).
MAX_SELECTED_TOOLS = 64
#: Longest tool id kept of a selection (a longer one is nobody's).
MAX_TOOL_ID_CHARS = 200


@dataclass(frozen=True)
class ToolChoice:
    """The tools one research may use, and what the chat asked for in vain."""

    #: The tools offered to the model, in the catalog's order.
    tools: tuple[ToolDef, ...]
    #: Selected tools the model was not trained on (not offered).
    foreign: tuple[str, ...] = ()
    #: Selected tools of this project that the admin switched off.
    switched_off: tuple[str, ...] = ()


def choose_tools(
    offered: Sequence[ToolDef],
    selected: object,
    catalog: Sequence[ToolDef] = CATALOG,
) -> ToolChoice:
    """The tools of one research: the admin's (`offered`), narrowed by a chat.

    ``selected`` is what the chat (or an API request) selected: Open WebUI's
    ``tool_ids``, or the runner's tool names; a tool module matches by its
    registry id or by the name the model calls. When it names any tool
    module of this project, the research uses exactly those of them the
    admin offers; the tools that are not modules (PythonInterpreter,
    parse_file) cannot be selected in a chat and keep their own conditions
    (the admin's code execution, the chat's attached files). With none of
    ours selected, the admin's choice holds. Anything that is not a list of
    text is no selection.
    """
    ids = selected_ids(selected)
    by_id = {
        key: tool
        for tool in catalog
        if tool.module is not None
        for key in (tool.module.registry_id, tool.name)
    }
    ours = {by_id[i].name for i in ids if i in by_id}
    foreign = tuple(dict.fromkeys(i for i in ids if i not in by_id))
    if not ours:
        return ToolChoice(tuple(offered), foreign)
    tools = tuple(t for t in offered if t.module is None or t.name in ours)
    kept = {t.name for t in tools}
    off = tuple(t.name for t in catalog if t.name in ours and t.name not in kept)
    return ToolChoice(tools, foreign, off)


def selected_ids(selected: object) -> list[str]:
    """The tool ids of a selection that are read (capped; text only)."""
    if not isinstance(selected, list | tuple):
        return []
    ids = (
        item.strip() for item in selected[:MAX_SELECTED_TOOLS] if isinstance(item, str)
    )
    return [i for i in ids if i and len(i) <= MAX_TOOL_ID_CHARS]


#: Most selected names a note lists (then "and N more").
NOTE_NAMES = 5


def choice_notes(choice: ToolChoice) -> list[str]:
    """What the chat is told of its selection that the research does not follow."""
    notes = []
    if choice.foreign:
        notes.append(
            "Not offered to the research model (it was not trained on them): "
            + _names(choice.foreign)
        )
    if choice.switched_off:
        notes.append(
            "Switched off by the administrator: " + _names(choice.switched_off)
        )
    return notes


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(name[:60] for name in names[:NOTE_NAMES])
    more = len(names) - NOTE_NAMES
    return shown + (f" and {more} more" if more > 0 else "")
