"""Generate the pasteable tool files from the modules they are written in.

`search_tool.py`, `scholar_tool.py` and `visit_tool.py` at the repository root
are what users paste into Open WebUI (Workspace > Tools): one self-contained
file each. They are byte-identical copies of
`src/tongyi_deepresearch_openwebui_pipeline/tools/<same name>.py`, which hold
the tool's frontmatter, imports and `Tools` class, and regions generated from
the modules the tool is written in:

- `tools/shared/<name>.py`: code two or three tools share;
- `tools/<tool>/<name>.py`: one tool's parts (the visit tool's in
  `tools/visit/`).

Each such module is a real module (its imports above its `# --- snippet ---`
line are for linters and type checkers); a region holds either its code (the
part after the snippet mark) or its whole source as a string constant (the
visit tool sends the source of `tools/visit/convert.py` to its converter
process as that process's program)::

    # --- shared: <name> (made from tools/<folder>/<name>.py) ---
    ...the module's code after its snippet mark...
    # --- end shared: <name> ---

    # --- source: <name> (made from tools/<folder>/<name>.py) ---
    _<NAME>_SOURCE = r'''
    ...the module's whole source...'''.removeprefix(<the line break>)
    # --- end source: <name> ---

Edit the modules, not the regions, then run this script; `--check` also fails
when a module is made into no tool file (it would be dead code).

Usage:
    python scripts/sync_root_files.py          # write the tool files and copies
    python scripts/sync_root_files.py --check  # exit 1 if anything differs
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
SNIPPET_MARK = "# --- snippet ---\n"
_MAX_DIFF_LINES = 40
_REGION = re.compile(
    r"^# --- (?P<kind>shared|source): (?P<name>\w+) "
    r"\(made from (?P<path>tools/\w+/(?P=name)\.py)\) ---\n"
    r"(?P<body>.*?)^# --- end (?P=kind): (?P=name) ---$",
    re.MULTILINE | re.DOTALL,
)
# A raw triple-quoted string holds any source but one with these in it.
_RAW_STRING_END = "'''"
_REGION_LINE = re.compile(r"^# --- (end )?(shared|source): ", re.MULTILINE)


def module_path(root: Path, path: str) -> Path:
    """The file a region names, e.g. ``tools/visit/convert.py``.

    Args:
        root: The repository root.
        path: The path the region names, from the tools package's parent.

    Returns:
        The module's file.
    """
    return root / TOOLS_PACKAGE_DIR.parent / path


def snippet(root: Path, path: str) -> str:
    """The code of a module: its file after the snippet mark.

    Args:
        root: The repository root.
        path: The module, as a region names it (``tools/shared/<name>.py``).

    Returns:
        The code to place in a region, ending with two blank lines.

    Raises:
        FileNotFoundError: There is no such module.
        ValueError: The module has no snippet mark.
    """
    text = module_path(root, path).read_text(encoding="utf-8")
    _, mark, body = text.partition(SNIPPET_MARK)
    if not mark:
        raise ValueError(f"{path} has no '{SNIPPET_MARK.strip()}'")
    # Two blank lines before the end mark, as ruff formats top-level code.
    return body.strip("\n") + "\n\n\n"


def source_constant(root: Path, name: str, path: str) -> str:
    """A module's whole source as the constant ``_<NAME>_SOURCE``.

    Args:
        root: The repository root.
        name: The module's name (its file name without ``.py``).
        path: The module, as a region names it.

    Returns:
        The assignment to place in a region, ending with two blank lines.

    Raises:
        FileNotFoundError: There is no such module.
        ValueError: The source cannot be written as a raw string.
    """
    text = module_path(root, path).read_text(encoding="utf-8")
    if _RAW_STRING_END in text or text.endswith("\\"):
        raise ValueError(f"{path} holds ''' or ends with '\\': no raw string can")
    if _REGION_LINE.search(text):
        raise ValueError(f"{path} holds a region line: it would end its own region")
    # The string opens with a line break (taken off again): the module's first
    # line then keeps its length, which the line-length check holds it to.
    opened = f"_{name.upper()}_SOURCE = r'''\n{text}'''.removeprefix(\"\\n\")"
    return opened + "\n\n\n"


def with_shared_code(root: Path, text: str) -> str:
    """``text`` with every region regenerated from its module.

    Args:
        root: The repository root.
        text: A tool module's source.

    Returns:
        The source with each region's body made again from its module.
    """

    def fill(match: re.Match[str]) -> str:
        if match["kind"] == "source":
            return _region_with(
                match, source_constant(root, match["name"], match["path"])
            )
        return _region_with(match, snippet(root, match["path"]))

    return _REGION.sub(fill, text)


def region_modules(text: str) -> list[str]:
    """The modules a tool file's regions are made from (``tools/…/<name>.py``).

    Args:
        text: A tool module's source.

    Returns:
        Each module a region names, in the order of the regions.
    """
    return [match["path"] for match in _REGION.finditer(text)]


def without_regions(text: str) -> str:
    """A tool file's own part: ``text`` with every region's body left out.

    Args:
        text: A tool module's source.

    Returns:
        The source with each region reduced to its two marker lines.
    """
    return _REGION.sub(lambda match: _region_with(match, ""), text)


def _region_with(match: re.Match[str], body: str) -> str:
    """The region ``match`` found, holding ``body`` between its marker lines."""
    start = match.group(0)[: match.start("body") - match.start()]
    return f"{start}{body}# --- end {match['kind']}: {match['name']} ---"


def tool_file_pairs(root: Path) -> list[tuple[Path, Path]]:
    """List (package module, root copy) pairs.

    Args:
        root: The repository root.

    Returns:
        One pair per tool file, package module first.
    """
    return [(root / TOOLS_PACKAGE_DIR / name, root / name) for name in TOOL_FILE_NAMES]


def authored_modules(root: Path) -> list[Path]:
    """The modules tool files are made from: every module in a tools subfolder.

    Args:
        root: The repository root.

    Returns:
        Each ``tools/<folder>/<name>.py`` but the folders' ``__init__.py``.
    """
    tools = root / TOOLS_PACKAGE_DIR
    return sorted(path for path in tools.glob("*/*.py") if path.name != "__init__.py")


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


def _stale_regions(root: Path, text: str) -> list[str]:
    """The modules whose regions in ``text`` differ from what they make."""
    stale = []
    for match in _REGION.finditer(text):
        try:
            current = with_shared_code(root, match.group(0)) == match.group(0)
        except (OSError, ValueError) as error:  # no such module, no snippet mark
            stale.append(f"{match['path']} ({error})")
            continue
        if not current:
            stale.append(match["path"])
    return stale


def check(root: Path) -> list[str]:
    """Compare every tool file with its modules and its root copy.

    Args:
        root: The repository root.

    Returns:
        One message per problem (missing module, a region that differs from
        its module, a module made into no tool file, a missing or different
        copy).
    """
    problems = []
    used: set[Path] = set()
    for source, copy in tool_file_pairs(root):
        if not source.is_file():
            problems.append(f"missing package module: {source.relative_to(root)}\n")
            continue
        text = source.read_text(encoding="utf-8")
        used |= {module_path(root, path) for path in region_modules(text)}
        stale = _stale_regions(root, text)
        if stale:
            problems.append(
                f"out of date: shared code in {source.relative_to(root)} differs "
                f"from {', '.join(stale)}\n"
            )
        if not copy.is_file():
            problems.append(f"missing root copy: {copy.relative_to(root)}\n")
        elif source.read_bytes() != copy.read_bytes():
            problems.append(
                f"out of sync: {copy.relative_to(root)} differs from "
                f"{source.relative_to(root)}\n{_diff_hint(source, copy)}"
            )
    for module in authored_modules(root):
        if module not in used:
            problems.append(
                f"unused module: {module.relative_to(root)} is made into no tool "
                "file (add a region for it or delete it)\n"
            )
    return problems


def sync(root: Path) -> list[Path]:
    """Regenerate each tool file's regions, then copy it over its root copy.

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
