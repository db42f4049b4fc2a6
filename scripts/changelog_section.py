"""Print the CHANGELOG.md section of one version (the GitHub release notes).

The changelog follows Keep a Changelog: each release is a level-2 heading
`## [1.2.3] - 2026-11-22`, and link definitions (`[1.2.3]: https://...`) may
close the file. The section is everything between the version's heading and
the next level-2 heading, without the heading itself and without trailing link
definitions.

Usage: python scripts/changelog_section.py VERSION [--changelog PATH]
VERSION may carry the tag's `v` prefix (v0.1.0). Exits 1 when the section is
missing or empty.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
_HEADING = re.compile(r"^##\s+\[(?P<name>[^\]]+)\]")
_LINK_DEFINITION = re.compile(r"^\[[^\]]+\]:\s*\S+")


class ChangelogError(Exception):
    """The changelog has no usable section for the requested version."""


def normalize_version(version: str) -> str:
    """Strip a tag's `v` prefix and surrounding whitespace.

    Args:
        version: A version or tag such as "0.1.0" or "v0.1.0".

    Returns:
        The bare version.
    """
    version = version.strip()
    if version[:1] in {"v", "V"} and version[1:2].isdigit():
        return version[1:]
    return version


def changelog_section(text: str, version: str) -> str:
    """Extract the body of a version's section.

    Args:
        text: The changelog's text.
        version: The version to find (a `v` prefix is ignored).

    Returns:
        The section's body, stripped of surrounding blank lines.

    Raises:
        ChangelogError: The version has no section, or the section is empty.
    """
    wanted = normalize_version(version)
    body: list[str] | None = None
    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading:
            if body is not None:
                break
            if heading.group("name").strip() == wanted:
                body = []
            continue
        if body is not None:
            body.append(line)
    if body is None:
        raise ChangelogError(f"no '## [{wanted}]' section in the changelog")
    while body and (not body[-1].strip() or _LINK_DEFINITION.match(body[-1])):
        body.pop()
    section = "\n".join(body).strip("\n")
    if not section.strip():
        raise ChangelogError(f"the '## [{wanted}]' section of the changelog is empty")
    return section + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the requested section.

    Args:
        argv: Command-line arguments (defaults to sys.argv[1:]).

    Returns:
        0 on success, 1 when the section is missing or empty.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("version", help="version or tag, e.g. 0.1.0 or v0.1.0")
    parser.add_argument(
        "--changelog",
        type=Path,
        default=REPO_ROOT / "CHANGELOG.md",
        help="file to read",
    )
    args = parser.parse_args(argv)
    try:
        section = changelog_section(
            args.changelog.read_text(encoding="utf-8"), args.version
        )
    except (ChangelogError, OSError) as error:
        print(f"{args.changelog}: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
