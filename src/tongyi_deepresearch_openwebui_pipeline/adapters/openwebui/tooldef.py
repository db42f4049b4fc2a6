"""What a tool's definition is made of: the types `catalog.CATALOG` is written in.

A module of its own, below both the catalog and the handlers it lists
(``files.py``, ``code.py``): each imports these types, and the catalog imports
the handlers, so nothing imports in a circle.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...core.events import ToolOutcome
from ...core.toolcalls import CALL_EXAMPLES, ArgumentSchema, ToolCall, argument_schema

#: A tool run inside the pipe: a validated call in, the tool's outcome out.
Handler = Callable[[ToolCall], Awaitable[ToolOutcome]]
#: What one call adds to the run's tallies: (tally, count) pairs.
Tallies = tuple[tuple[str, int], ...]

#: The reserved arguments a tool module may take, each the chat's own value
#: (`toolbox.ToolContext`); Open WebUI passes the same names to its tools.
RESERVED_ARGUMENTS = ("__request__", "__user__", "__event_emitter__", "__chat_id__")
#: The reserved arguments every tool module gets.
COMMON_RESERVED = ("__request__", "__user__", "__event_emitter__")


@dataclass(frozen=True)
class ModelServerValves:
    """A tool's valves that may take the research model's server.

    When the admin leaves the URL valve empty, or names the research model's
    own server there, the pipe fills these in (`toolbox.SharedEndpoint`), so
    one key in the pipe is enough; another server never gets the pipe's key.
    """

    url: str
    key: str
    model: str


@dataclass(frozen=True)
class RunnerRequirement:
    """A runner setting the tool cannot run without (the runner will not start).

    The runner says: "{problem}: set {setting} (its flag, environment
    variable and config entry) to {wanted}, or {the tool's switch}=false to
    research without {without}".
    """

    setting: str
    problem: str
    wanted: str
    without: str


@dataclass(frozen=True)
class RunnerValves:
    """The tool's valves when the headless runner runs it (no Open WebUI)."""

    #: Valves given a fixed value there (valve, value).
    fixed: tuple[tuple[str, Any], ...] = ()
    #: Valves that take the runner's setting of the same name (`RunnerOptions`).
    settings: tuple[str, ...] = ()
    #: A setting the runner must have while the tool is on.
    required: RunnerRequirement | None = None


@dataclass(frozen=True)
class ToolModule:
    """An Open WebUI tool module of this package (installed into the registry)."""

    #: The name the model calls.
    name: str
    #: The module's file name in ``tools/`` without ``.py`` (also the root copy's).
    module: str
    #: The ``Tools`` method that runs a call.
    method: str
    #: Its id in Open WebUI's tool registry (the file's frontmatter ``id``).
    registry_id: str
    #: The reserved arguments its method is passed (of `RESERVED_ARGUMENTS`).
    reserved: tuple[str, ...] = COMMON_RESERVED
    #: Its valves that may take the research model's server (None: none).
    model_server: ModelServerValves | None = None
    #: Its valves in the headless runner.
    runner: RunnerValves = RunnerValves()

    def __post_init__(self) -> None:
        """Refuse reserved arguments no chat can give."""
        unknown = sorted(set(self.reserved) - set(RESERVED_ARGUMENTS))
        if unknown:
            raise ValueError(f"{self.name}: no such reserved argument {unknown[0]}")


@dataclass(frozen=True)
class ChatFacts:
    """What a handler is built from: the chat's request, user and files."""

    request: Any = None
    user: Mapping[str, Any] | None = None
    files: tuple[Mapping[str, Any], ...] = ()


HandlerBuilder = Callable[[ChatFacts], Awaitable[Handler | None]]


def no_tallies(_arguments: Mapping[str, Any]) -> Tallies:
    """A call that adds nothing to the run's tallies."""
    return ()


@dataclass(frozen=True)
class ToolDef:
    """One tool, whole."""

    #: The name the model calls.
    name: str
    #: Its line in the system prompt (the reference bytes for the model's
    #: own); its JSON schema is what the tool's calls are checked against.
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
    tallies: Callable[[Mapping[str, Any]], Tallies] = no_tallies
    #: What the question starts with while the tool is offered ("": nothing).
    question_note: Callable[[ChatFacts], str] | None = None
    #: A valid call, shown with an argument error (default: the reference
    #: tool's, `core.toolcalls.CALL_EXAMPLES`).
    call_example: str = ""

    def __post_init__(self) -> None:
        """Read the schema now: a line it cannot read fails here, not a call."""
        _ = self.schema

    @property
    def schema(self) -> ArgumentSchema:
        """Its calls' argument schema, read from its prompt line (once)."""
        example = self.call_example or CALL_EXAMPLES.get(self.name, "")
        return argument_schema(self.prompt_line, example)
