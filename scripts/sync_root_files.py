"""Regenerate the root tool files from the package's tool modules.

`search_tool.py`, `scholar_tool.py` and `visit_tool.py` at the repository root
are what users paste into Open WebUI (Workspace > Tools). They are byte-identical
copies of `src/tongyi_deepresearch_openwebui_pipeline/tools/<same name>.py`,
which are self-contained Open WebUI Tools files. Edit the package modules, then
run this script.

Usage:
    python scripts/sync_root_files.py          # write the root copies
    python scripts/sync_root_files.py --check  # exit 1 if any copy differs
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TOOLS_PACKAGE_DIR = Path("src/tongyi_deepresearch_openwebui_pipeline/tools")
TOOL_FILE_NAMES = ("search_tool.py", "scholar_tool.py", "visit_tool.py")
_MAX_DIFF_LINES = 40


def tool_file_pairs(root: Path) -> list[tuple[Path, Path]]:
    """List (package module, root copy) pairs.

    Args:
        root: The repository root.

    Returns:
        One pair per tool file, package module first.
    """
    return [(root / TOOLS_PACKAGE_DIR / name, root / name) for name in TOOL_FILE_NAMES]


def _diff_hint(source: Path, copy: Path) -> str:
    """Show the first lines of a unified diff from the copy to the source."""
    old = copy.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    new = source.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    diff = list(difflib.unified_diff(old, new, str(copy), str(source)))
    if not diff:
        # Same text, different bytes (line endings, encoding).
        return "  (same text, different bytes: line endings or encoding)\n"
    shown = "".join(diff[:_MAX_DIFF_LINES])
    if len(diff) > _MAX_DIFF_LINES:
        shown += f"  ... {len(diff) - _MAX_DIFF_LINES} more diff lines\n"
    return shown


def check(root: Path) -> list[str]:
    """Compare every root copy with its package module.

    Args:
        root: The repository root.

    Returns:
        One message per problem (missing module, missing or different copy).
    """
    problems = []
    for source, copy in tool_file_pairs(root):
        if not source.is_file():
            problems.append(f"missing package module: {source.relative_to(root)}\n")
        elif not copy.is_file():
            problems.append(f"missing root copy: {copy.relative_to(root)}\n")
        elif source.read_bytes() != copy.read_bytes():
            problems.append(
                f"out of sync: {copy.relative_to(root)} differs from "
                f"{source.relative_to(root)}\n{_diff_hint(source, copy)}"
            )
    return problems


def sync(root: Path) -> list[Path]:
    """Copy each package module over its root copy when they differ.

    Args:
        root: The repository root.

    Returns:
        The root copies that were (re)written.

    Raises:
        FileNotFoundError: A package tool module does not exist.
    """
    written = []
    for source, copy in tool_file_pairs(root):
        content = source.read_bytes()
        if not copy.is_file() or copy.read_bytes() != content:
            copy.write_bytes(content)
            written.append(copy)
    return written


def main(argv: list[str] | None = None) -> int:
    """Run the sync or the check.

    Args:
        argv: Command-line arguments (defaults to sys.argv[1:]).

    Returns:
        The exit status: 0 when in sync (or synced), 1 otherwise.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="only check; exit 1 if out of sync"
    )
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    if args.check:
        problems = check(root)
        for problem in problems:
            print(problem, end="")
        if problems:
            print(
                "Run `python scripts/sync_root_files.py` to regenerate the root files."
            )
            return 1
        print("root tool files are in sync with the package modules")
        return 0
    try:
        written = sync(root)
    except FileNotFoundError as error:
        print(f"missing package module: {error.filename}")
        return 1
    for path in written:
        print(f"wrote {path.relative_to(root)}")
    if not written:
        print("root tool files were already in sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
