"""Regenerate the root tool files from the package's tool modules.

`search_tool.py`, `scholar_tool.py` and `visit_tool.py` at the repository root
are what users paste into Open WebUI (Workspace > Tools). They are byte-identical
copies of `src/tongyi_deepresearch_openwebui_pipeline/tools/<same name>.py`,
which are self-contained Open WebUI Tools files. Edit the package modules, then
run this script.

Code the tools share is written once, in `tools/shared/<name>.py` (the part
after its `# --- snippet ---` line), and generated into every tool module that
holds a region for it (edit the shared file, not the region)::

    # --- shared: <name> (made from tools/shared/<name>.py) ---
    ...
    # --- end shared: <name> ---

Usage:
    python scripts/sync_root_files.py          # write the root copies
    python scripts/sync_root_files.py --check  # exit 1 if any copy differs
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TOOLS_PACKAGE_DIR = Path("src/tongyi_deepresearch_openwebui_pipeline/tools")
TOOL_FILE_NAMES = ("search_tool.py", "scholar_tool.py", "visit_tool.py")
SHARED_DIR = TOOLS_PACKAGE_DIR / "shared"
SNIPPET_MARK = "# --- snippet ---\n"
_MAX_DIFF_LINES = 40
_REGION = re.compile(
    r"^# --- shared: (?P<name>\w+) \(made from tools/shared/(?P=name)\.py\) ---\n"
    r"(?P<body>.*?)^# --- end shared: (?P=name) ---$",
    re.MULTILINE | re.DOTALL,
)


def snippet(root: Path, name: str) -> str:
    """The shared code called ``name``: its file after the snippet mark.

    Args:
        root: The repository root.
        name: The snippet's name (its file name without ``.py``).

    Returns:
        The code to place in a region, ending with two blank lines.

    Raises:
        FileNotFoundError: There is no such shared file.
        ValueError: The file has no snippet mark.
    """
    text = (root / SHARED_DIR / f"{name}.py").read_text(encoding="utf-8")
    _, mark, body = text.partition(SNIPPET_MARK)
    if not mark:
        raise ValueError(f"{SHARED_DIR}/{name}.py has no '{SNIPPET_MARK.strip()}'")
    # Two blank lines before the end mark, as ruff formats top-level code.
    return body.strip("\n") + "\n\n\n"


def with_shared_code(root: Path, text: str) -> str:
    """``text`` with every shared region regenerated from its snippet.

    Args:
        root: The repository root.
        text: A tool module's source.

    Returns:
        The source with each region's body replaced by its snippet.
    """

    def fill(match: re.Match[str]) -> str:
        body = snippet(root, match["name"])
        start = match.group(0)[: match.start("body") - match.start()]
        return f"{start}{body}# --- end shared: {match['name']} ---"

    return _REGION.sub(fill, text)


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
            continue
        text = source.read_text(encoding="utf-8")
        if with_shared_code(root, text) != text:
            problems.append(
                f"out of date: shared code in {source.relative_to(root)} differs "
                f"from {SHARED_DIR}\n"
            )
        if not copy.is_file():
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
        The package modules and root copies that were (re)written.

    Raises:
        FileNotFoundError: A package tool module does not exist.
    """
    written = []
    for source, copy in tool_file_pairs(root):
        text = source.read_text(encoding="utf-8")
        generated = with_shared_code(root, text)
        if generated != text:
            source.write_text(generated, encoding="utf-8")
            written.append(source)
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
