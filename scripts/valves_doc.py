"""Print (or check) README's valve tables from the Valves classes themselves.

    python scripts/valves_doc.py          # print the tables
    python scripts/valves_doc.py --write  # rewrite them in README.md
    python scripts/valves_doc.py --check  # exit 1 when README.md is out of date

README holds each table between ``<!-- valves:NAME -->`` and
``<!-- /valves:NAME -->`` markers, so the documentation cannot drift from the
code: tests/test_docs.py runs ``--check``.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PACKAGE = "tongyi_deepresearch_openwebui_pipeline"


def _tool_tables() -> dict[str, tuple[str, str]]:
    """One table per tool module of the catalog, named by its file (``search``).

    The tool list is the catalog's (`catalog.tool_modules`), read from this
    checkout's ``src``.
    """
    sys.path.insert(0, str(ROOT / "src"))
    catalog = importlib.import_module(f"{PACKAGE}.adapters.openwebui.catalog")
    return {
        spec.module.removesuffix("_tool"): (
            f"{PACKAGE}.tools.{spec.module}",
            "Tools.Valves",
        )
        for spec in catalog.tool_modules().values()
    }


TABLES: dict[str, tuple[str, str]] = {
    "pipe": (f"{PACKAGE}.pipes.pipe", "Pipe.Valves"),
    "user": (f"{PACKAGE}.pipes.pipe", "Pipe.UserValves"),
    **_tool_tables(),
}


def _resolve(module_name: str, dotted: str) -> Any:
    obj: Any = importlib.import_module(module_name)
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _default(value: Any) -> str:
    if value == "":
        return '`""`'
    text = repr(value) if not isinstance(value, str) else value
    return f"`{text}`"


def table(name: str) -> str:
    """The markdown table of one Valves class."""
    module_name, dotted = TABLES[name]
    valves = _resolve(module_name, dotted)
    rows = ["| Valve | Default | What it does |", "|---|---|---|"]
    for field_name, field in valves.model_fields.items():
        description = " ".join((field.description or "").split()).replace("|", "\\|")
        rows.append(f"| `{field_name}` | {_default(field.default)} | {description} |")
    return "\n".join(rows)


def _marker(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- valves:{name} -->\n)(.*?)\n?(<!-- /valves:{name} -->)", re.DOTALL
    )


def render(readme: str) -> str:
    """README with every valve table regenerated."""
    for name in TABLES:
        readme = _marker(name).sub(
            lambda m, n=name: m.group(1) + table(n) + "\n" + m.group(3), readme
        )
    return readme


def main() -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if not (args.write or args.check):
        for name in TABLES:
            print(f"<!-- valves:{name} -->\n{table(name)}\n<!-- /valves:{name} -->\n")
        return 0
    current = README.read_text(encoding="utf-8")
    missing = [name for name in TABLES if not _marker(name).search(current)]
    if missing:
        print(f"README.md lacks valve table markers for: {', '.join(missing)}")
        return 1
    updated = render(current)
    if args.write:
        README.write_text(updated, encoding="utf-8")
        return 0
    if updated != current:
        print(
            "README.md valve tables are out of date: "
            "run python scripts/valves_doc.py --write"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
