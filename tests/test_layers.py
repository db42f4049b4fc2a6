"""The layers import downwards only: pipes → adapters, engine → core.

Every module of the package is parsed (not imported) and each of its imports
resolved to the layer it names; an import against the arrows in AGENTS.md's
diagram fails here with the module and line. Within a layer, no modules
import each other in a circle (imports inside functions count too).
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path
from typing import Any

import pytest

PACKAGE = (
    Path(__file__).resolve().parents[1] / "src/tongyi_deepresearch_openwebui_pipeline"
)
NAME = PACKAGE.name
#: Which layers each layer may import (itself always).
ALLOWED = {
    "core": set(),
    "engine": {"core"},
    "adapters": {"core"},
    # One way to open a run for both front ends: it assembles the others.
    "session": {"core", "engine", "adapters"},
    "pipes": {"core", "engine", "adapters", "session"},
    # The two front ends share what they both need through the lower layers
    # (session/, adapters/openwebui/valves.py, core/phrasing.py), never each
    # other.
    "runner": {"core", "engine", "adapters", "session"},
    "tools": set(),
}


def layer_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0]


def _package_of(path: Path) -> tuple[str, ...]:
    """The dotted package ``path`` sits in, as parts (``(NAME, "core")``)."""
    return path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]


def imported_names(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in ``path``, lazy ones included.

    A relative import is resolved against the module's package;
    ``from X import Y`` gives ``X.Y`` (Y may be a module or a name in X).
    """
    package = _package_of(path)
    text = path.read_text(encoding="utf-8") if source is None else source
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (node.module or "").split(".") if node.module else []
            if node.level:
                base = [*package[: len(package) - node.level + 1], *base]
            found += [
                (node.lineno, ".".join([*base, alias.name])) for alias in node.names
            ]
    return found


def imported_layers(path: Path) -> list[tuple[int, str]]:
    """(line, layer) of each import of the package's own modules."""
    found = []
    for line, name in imported_names(path):
        parts = name.split(".")
        if parts[0] == NAME and len(parts) > 1 and parts[1] in ALLOWED:
            found.append((line, parts[1]))
    return found


MODULES = sorted(
    p for p in PACKAGE.rglob("*.py") if len(p.relative_to(PACKAGE).parts) > 1
)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down_the_layers(path: Path) -> None:
    layer = layer_of(path)
    wrong = [
        f"line {line}: {layer} imports {target}"
        for line, target in imported_layers(path)
        if target != layer and target not in ALLOWED[layer]
    ]
    assert not wrong, wrong


def test_the_check_sees_relative_imports() -> None:
    # The pipe imports all four lower layers: the parser must find them.
    found = {layer for _, layer in imported_layers(PACKAGE / "pipes" / "pipe.py")}
    assert found == {"core", "engine", "adapters", "session"}
    # The run engine imports the core and its own layer's checkpoints.
    engine = {layer for _, layer in imported_layers(PACKAGE / "engine" / "runs.py")}
    assert engine == {"core", "engine"}


def test_the_runner_validates_with_the_valves_the_pipe_serves(tmp_path: Path) -> None:
    from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.valves import (
        Valves,
    )
    from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe
    from tongyi_deepresearch_openwebui_pipeline.runner.settings import (
        VALVE_NAMES,
        load_settings,
    )

    assert Pipe.Valves is Valves
    assert frozenset(Valves.model_fields) == VALVE_NAMES
    env = {"XDG_CONFIG_HOME": str(tmp_path), "TDR_MAX_TOOL_ROUNDS": "7"}
    settings = load_settings({}, env)
    assert type(settings.valves) is Valves
    assert settings.valves.MAX_TOOL_ROUNDS == 7


# -- each tool is defined once ----------------------------------------------------


def test_the_catalog_follows_the_reference_prompt_order() -> None:
    import datetime as dt

    from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.catalog import (
        CATALOG,
    )
    from tongyi_deepresearch_openwebui_pipeline.core.prompts import (
        ALL_TOOLS,
        TOOL_LINES,
        build_system_prompt,
        system_prompt_with,
    )

    assert [tool.name for tool in CATALOG] == list(ALL_TOOLS)
    assert [tool.prompt_line for tool in CATALOG] == [TOOL_LINES[n] for n in ALL_TOOLS]
    today = dt.date(2026, 11, 24)
    lines = [tool.prompt_line for tool in CATALOG]
    assert system_prompt_with(lines, today) == build_system_prompt(ALL_TOOLS, today)


def test_each_tool_switch_is_a_pipe_valve_from_the_catalog() -> None:
    from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.catalog import (
        CATALOG,
    )
    from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe

    fields = Pipe.Valves.model_fields
    for tool in CATALOG:
        assert fields[tool.valve].default is True
        assert fields[tool.valve].description == tool.valve_description
    switches: dict[str, Any] = {CATALOG[0].valve: False}
    off = Pipe.Valves(**switches)
    assert getattr(off, CATALOG[0].valve) is False


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("search", {"query": ["a", "b"]}),
        ("google_scholar", {"query": ["c"]}),
        ("visit", {"url": ["https://example.org/"], "goal": "g"}),
        ("parse_file", {"files": ["a.txt", "b.pdf"]}),
        ("PythonInterpreter", {}),
        # A call that failed its check keeps the model's arguments as written.
        ("visit", {"url": 5, "goal": "g"}),
        ("search", {"query": "one string"}),
        ("no_such_tool", {}),
    ],
)
def test_both_front_ends_describe_a_call_by_its_catalog_entry(
    name: str, arguments: dict[str, Any]
) -> None:
    from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.catalog import (
        describe_call,
    )
    from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.render import (
        ChatRenderer,
        Display,
    )
    from tongyi_deepresearch_openwebui_pipeline.core.events import (
        RoundStarted,
        ToolCallStarted,
    )
    from tongyi_deepresearch_openwebui_pipeline.runner.render import (
        TerminalRenderer,
    )

    line = describe_call(name, arguments)
    chat = ChatRenderer(Display())
    terminal = TerminalRenderer()
    chat.render(RoundStarted(2, 9))
    terminal.render(RoundStarted(2, 9))
    event = ToolCallStarted(0, name, arguments)
    statuses = [payload["data"]["description"] for payload in chat.render(event).events]
    assert statuses == [f"Round 2/9 · {line}"]
    assert terminal.render(event) == f"  → {line}\n"


# -- no import circles ------------------------------------------------------------


def module_name(path: Path) -> str:
    """The dotted name of a module of the package (a package is its ``__init__``)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


ALL_MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    """The package's modules that ``path`` imports, at the top or inside a function.

    ``from X import Y`` counts as importing the module ``X.Y`` when there is
    one, else the module ``X``.
    """
    found: set[str] = set()
    for _, name in imported_names(path, source):
        parts = name.split(".")
        while parts and ".".join(parts) not in ALL_MODULES:
            parts.pop()
        if parts:
            found.add(".".join(parts))
    found.discard(module_name(path))
    return found


def import_circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of imports in ``graph`` (module -> modules it imports), or []."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return []


def test_no_module_of_the_package_imports_in_a_circle() -> None:
    graph = {name: imported_modules(path) for name, path in ALL_MODULES.items()}
    circle = import_circle(graph)
    assert not circle, " -> ".join(name.removeprefix(NAME + ".") for name in circle)


def test_the_circle_check_sees_a_lazy_import_closing_a_circle() -> None:
    # What catalog.py did: a handler module imported inside a function, that
    # module importing the toolbox, the toolbox importing the catalog.
    openwebui = PACKAGE / "adapters" / "openwebui"
    lazy = "async def build():\n    from .files import handler\n"
    graph = {name: imported_modules(path) for name, path in ALL_MODULES.items()}
    catalog = module_name(openwebui / "catalog.py")
    files = module_name(openwebui / "files.py")
    toolbox = module_name(openwebui / "toolbox.py")
    graph[catalog] = imported_modules(openwebui / "catalog.py", lazy)
    graph[files] = {toolbox}
    graph[toolbox] = {catalog}
    circle = import_circle(graph)
    assert set(circle) == {catalog, files, toolbox}


# -- the terminal renders for itself --------------------------------------------------


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for name in graph.get(todo.pop(), set()) - seen:
            seen.add(name)
            todo.append(name)
    return seen


def test_the_runner_reaches_no_open_webui_renderer() -> None:
    # The terminal lays a run out itself (runner/render.py, runner/results.py):
    # no runner module imports the chat's renderer, not even through another.
    graph = {name: imported_modules(path) for name, path in ALL_MODULES.items()}
    chat_renderer = module_name(PACKAGE / "adapters" / "openwebui" / "render.py")
    runner = [name for name in graph if name.startswith(f"{NAME}.runner")]
    assert len(runner) > 5
    reaching = [name for name in runner if chat_renderer in reachable(graph, name)]
    assert reaching == []
