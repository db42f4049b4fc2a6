"""The layers import downwards only: pipes → adapters, engine → core.

Every module of the package is parsed (not imported) and each of its imports
resolved to the layer it names; an import against the arrows in AGENTS.md's
diagram fails here with the module and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

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
    "pipes": {"core", "engine", "adapters"},
    "tools": set(),
}


def layer_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0]


def imported_layers(path: Path) -> list[tuple[int, str]]:
    """(line, layer) of each import of the package's own modules."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                names = [".".join([*base, *(node.module or "").split(".")])]
                if not node.module:
                    names = [".".join([*base, alias.name]) for alias in node.names]
            elif node.module:
                names = [node.module]
        else:
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.strip(".").split(".")
            if parts[0] == NAME and len(parts) > 1 and parts[1] in ALLOWED:
                found.append((node.lineno, parts[1]))
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
    # The pipe imports all three lower layers: the parser must find them.
    found = {layer for _, layer in imported_layers(PACKAGE / "pipes" / "pipe.py")}
    assert found == {"core", "engine", "adapters"}
    engine = {layer for _, layer in imported_layers(PACKAGE / "engine" / "runs.py")}
    assert engine == {"core"}
