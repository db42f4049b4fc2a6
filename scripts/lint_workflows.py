"""Check that every repository script a GitHub workflow refers to exists.

actionlint and the JSON schema check the workflow language; neither knows this
repository. This check finds every `scripts/...` and `.ci/...` path mentioned in
a workflow (in `run:` commands, `hashFiles(...)`, anywhere) and fails when one
does not exist, so a renamed script cannot silently break CI or a release.

Usage: python scripts/lint_workflows.py [--root DIR] WORKFLOW.yml...
Standard library only (it runs in the linters' own virtual environment).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# A path into scripts/ or .ci/, not preceded by a character that would make it
# part of a longer path or word (e.g. "my-scripts/x" or "a/scripts/x").
_REPO_PATH = re.compile(r"(?<![\w/.-])(?:\./)?((?:scripts|\.ci)/[\w.-]+(?:/[\w.-]+)*)")


def referenced_paths(workflow_text: str) -> list[tuple[int, str]]:
    """Find the repository paths a workflow mentions.

    Args:
        workflow_text: The workflow file's text.

    Returns:
        (line number, path) pairs in order of appearance; trailing dots are
        dropped so a path at the end of a sentence still counts.
    """
    found: list[tuple[int, str]] = []
    for number, line in enumerate(workflow_text.splitlines(), start=1):
        for match in _REPO_PATH.finditer(line):
            found.append((number, match.group(1).rstrip(".")))
    return found


def missing_paths(workflow: Path, root: Path) -> list[str]:
    """List the problems of one workflow: referenced paths that do not exist.

    Args:
        workflow: The workflow file.
        root: The repository root the paths are relative to.

    Returns:
        One "file:line: message" string per missing path.
    """
    problems = []
    for line_number, path in referenced_paths(workflow.read_text(encoding="utf-8")):
        if not (root / path).exists():
            problems.append(
                f"{workflow}:{line_number}: refers to {path}, which does not exist"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    """Run the check over the given workflow files.

    Args:
        argv: Command-line arguments (defaults to sys.argv[1:]).

    Returns:
        0 when every referenced path exists, 1 otherwise.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO_ROOT)
    parser.add_argument("workflows", nargs="+", type=Path)
    args = parser.parse_args(argv)
    problems: list[str] = []
    for workflow in args.workflows:
        problems.extend(missing_paths(workflow, args.root))
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
