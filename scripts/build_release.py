"""Build and check the six release assets.

Assets (in `dist/` by default):
  * the wheel and the sdist, built with `python -m build` (hatchling);
  * `tongyi_deepresearch_pipe.py`, the checkout's file with one line changed:
    `_RELEASE_WHEEL = ""` becomes `_RELEASE_WHEEL = "<URL of this release's
    wheel on GitHub>"`, so that the pasted file pip-installs exactly that wheel
    when the package is missing or older (and Open WebUI allows pip installs).
    The file has no frontmatter `requirements:` (Open WebUI 0.6 would run pip
    on it at every load, which fails offline even with the wheel installed);
  * `search_tool.py`, `scholar_tool.py`, `visit_tool.py`, copied as they are.

The GitHub repository is `$GITHUB_REPOSITORY` when set, else the owner/name of
`[project.urls] Repository` in pyproject.toml.

Usage:
    python scripts/build_release.py [--out-dir DIR] [--tag vX.Y.Z] [--repo OWNER/NAME]
    python scripts/build_release.py --check [--out-dir DIR] [--repo OWNER/NAME]

Building prints the six asset paths on stdout, one per line (logs go to
stderr), after checking them. `--check` only checks assets built before.
`--tag` makes the build fail unless the tag is `v<project version>`.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tongyi_deepresearch_openwebui_pipeline"
PIPE_FILE = "tongyi_deepresearch_pipe.py"


def _tool_files() -> tuple[str, ...]:
    """The pasted tool files: one per tool module of the catalog.

    The tool list is the catalog's (`catalog.tool_modules`), read from this
    checkout's ``src`` (the package imports only the standard library there).
    """
    sys.path.insert(0, str(REPO_ROOT / "src"))
    catalog = importlib.import_module(f"{PACKAGE}.adapters.openwebui.catalog")
    return tuple(f"{spec.module}.py" for spec in catalog.tool_modules().values())


TOOL_FILES = _tool_files()
ROOT_FILES = (PIPE_FILE, *TOOL_FILES)

# Frontmatter keys every pasted file must declare, and the ones Open WebUI knows.
REQUIRED_KEYS = frozenset(
    {
        "id",
        "title",
        "author",
        "author_url",
        "version",
        "license",
        "description",
        "required_open_webui_version",
    }
)
KNOWN_KEYS = REQUIRED_KEYS | {"funding_url", "requirements"}

# Open WebUI rewrites these with a plain str.replace over the whole source.
REPLACED_IMPORT_PREFIXES = ("from utils", "from apps", "from main", "from config")

_FRONTMATTER_LINE = re.compile(r"^\s*([a-z_]+):\s*(.*)\s*$", re.IGNORECASE)
_GITHUB_URL = re.compile(
    r"^https://github\.com/(?P<slug>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?)(?:\.git)?/?$"
)


class ReleaseError(Exception):
    """The release cannot be built as asked."""


@dataclass(frozen=True)
class Project:
    """What the release is made of, read from the checkout."""

    root: Path
    name: str
    version: str
    dependencies: tuple[str, ...]
    repository_url: str

    @property
    def distribution(self) -> str:
        """The project name as wheel and sdist file names spell it."""
        return re.sub(r"[-_.]+", "_", self.name).lower()

    @property
    def wheel_name(self) -> str:
        """The wheel's file name (pure Python, any platform)."""
        return f"{self.distribution}-{self.version}-py3-none-any.whl"

    @property
    def sdist_name(self) -> str:
        """The sdist's file name."""
        return f"{self.distribution}-{self.version}.tar.gz"

    def asset_names(self) -> list[str]:
        """The six asset file names, wheel and sdist first."""
        return [self.wheel_name, self.sdist_name, *ROOT_FILES]


def read_project(root: Path) -> Project:
    """Read name, version, dependencies and repository URL of the checkout.

    Args:
        root: The repository root.

    Returns:
        The project description.

    Raises:
        ReleaseError: pyproject.toml and `__version__` disagree.
    """
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    project = pyproject["project"]
    package_version = read_package_version(root)
    if package_version != project["version"]:
        raise ReleaseError(
            f"pyproject.toml says version {project['version']} but "
            f"{PACKAGE}.__version__ is {package_version}"
        )
    return Project(
        root=root,
        name=project["name"],
        version=project["version"],
        dependencies=tuple(project.get("dependencies", ())),
        repository_url=project.get("urls", {}).get("Repository", ""),
    )


def read_package_version(root: Path) -> str:
    """Read `__version__` from the package's `__init__.py` without importing it.

    Args:
        root: The repository root.

    Returns:
        The version string.

    Raises:
        ReleaseError: There is no literal `__version__ = "..."` assignment.
    """
    init = root / "src" / PACKAGE / "__init__.py"
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and any(
                isinstance(target, ast.Name) and target.id == "__version__"
                for target in node.targets
            )
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise ReleaseError(f"no __version__ = '...' in {init}")


def repository_slug(project: Project, explicit: str | None = None) -> str:
    """Decide which GitHub repository the release lives in.

    Args:
        project: The project (its Repository URL is the fallback).
        explicit: An owner/name given on the command line, if any.

    Returns:
        "owner/name": `explicit`, else `$GITHUB_REPOSITORY`, else the owner/name
        of `[project.urls] Repository`.

    Raises:
        ReleaseError: No usable repository was found.
    """
    slug = explicit or os.environ.get("GITHUB_REPOSITORY", "").strip()
    if not slug:
        match = _GITHUB_URL.match(project.repository_url.strip())
        if not match:
            raise ReleaseError(
                "cannot tell the GitHub repository: set GITHUB_REPOSITORY or "
                "[project.urls] Repository = 'https://github.com/OWNER/NAME'"
            )
        slug = match.group("slug")
    if slug.count("/") != 1 or not all(slug.split("/")):
        raise ReleaseError(f"not an owner/name GitHub repository: {slug!r}")
    return slug


def release_wheel_url(project: Project, slug: str) -> str:
    """The URL of this release's wheel on GitHub (the pipe's `_RELEASE_WHEEL`).

    Args:
        project: The project.
        slug: The GitHub owner/name.

    Returns:
        `https://github.com/OWNER/NAME/releases/download/vX.Y.Z/<wheel>`.
    """
    return (
        f"https://github.com/{slug}/releases/download/"
        f"v{project.version}/{project.wheel_name}"
    )


def frontmatter_block(text: str) -> list[str] | None:
    """Return the frontmatter lines as Open WebUI's parser delimits them.

    Args:
        text: A Python source file's text.

    Returns:
        The lines after the bare opening `\"\"\"` up to (not including) the
        first line containing `\"\"\"`, or None when the file does not start
        with a bare `\"\"\"` line.
    """
    lines = text.splitlines()
    if not lines or lines[0].strip() != '"""':
        return None
    block = []
    for line in lines[1:]:
        if '"""' in line:
            break
        block.append(line)
    return block


def parse_frontmatter(text: str) -> dict[str, str]:
    """Parse frontmatter exactly as Open WebUI does (`extract_frontmatter`).

    Args:
        text: A Python source file's text.

    Returns:
        The key/value pairs (empty when there is no frontmatter).
    """
    result: dict[str, str] = {}
    for line in frontmatter_block(text) or []:
        match = _FRONTMATTER_LINE.match(line)
        if match:
            result[match.group(1).strip()] = match.group(2).strip()
    return result


def frontmatter_problems(text: str, version: str) -> list[str]:
    """Find what would make Open WebUI read a file's frontmatter wrongly.

    Args:
        text: The file's text.
        version: The version every file must declare.

    Returns:
        Human-readable problems (empty when fine).
    """
    block = frontmatter_block(text)
    if block is None:
        return ['does not start with a bare """ line (Open WebUI sees no frontmatter)']
    problems = []
    seen: set[str] = set()
    for line in block:
        if not line.strip():
            continue
        match = re.fullmatch(r"([a-z_]+):(?: (\S.*))?", line.rstrip())
        # Only `requirements:` may be empty (nothing for Open WebUI to install).
        if not match or (match.group(2) is None and match.group(1) != "requirements"):
            problems.append(
                f"frontmatter line is not a single-line `key: value`: {line!r}"
            )
            continue
        key = match.group(1)
        if key not in KNOWN_KEYS:
            problems.append(f"unknown frontmatter key {key!r}")
        if key in seen:
            problems.append(f"duplicate frontmatter key {key!r}")
        seen.add(key)
    meta = parse_frontmatter(text)
    problems.extend(
        f"frontmatter lacks {key!r}" for key in sorted(REQUIRED_KEYS - meta.keys())
    )
    if meta.get("version", version) != version:
        problems.append(f"frontmatter version {meta['version']} is not {version}")
    problems.extend(
        f"frontmatter {key!r} is a YAML block scalar (Open WebUI reads {value!r})"
        for key, value in meta.items()
        if value in {">", "|", ">-", "|-"}
    )
    return problems


def replaced_import_problems(text: str) -> list[str]:
    """Find the substrings Open WebUI's `replace_imports` would rewrite.

    Args:
        text: The file's text.

    Returns:
        One message per offending substring.
    """
    return [
        f"contains {prefix!r}, which Open WebUI rewrites"
        for prefix in REPLACED_IMPORT_PREFIXES
        if prefix in text
    ]


# The pipe file's module-level constants the release build writes or checks.
_CONSTANT_LINE = re.compile(
    r'^(?P<name>_VERSION|_RELEASE_WHEEL) = "(?P<value>[^"\\]*)"$'
)
_CHECKOUT_WHEEL_LINE = '_RELEASE_WHEEL = ""'


def pipe_constants(text: str) -> dict[str, list[str]]:
    """Find the pipe file's `_VERSION = "..."` and `_RELEASE_WHEEL = "..."` lines.

    Args:
        text: The pipe file's text.

    Returns:
        For each of the two names, the values of its lines (one line each in a
        well-formed file).
    """
    found: dict[str, list[str]] = {"_VERSION": [], "_RELEASE_WHEEL": []}
    for line in text.splitlines():
        match = _CONSTANT_LINE.match(line)
        if match:
            found[match.group("name")].append(match.group("value"))
    return found


def with_release_wheel(text: str, url: str) -> str:
    """Write a wheel URL into the pipe file's `_RELEASE_WHEEL = ""` line.

    Args:
        text: The checkout's pipe file.
        url: The release wheel's URL.

    Returns:
        The text with that one line changed and nothing else.

    Raises:
        ReleaseError: The file has not exactly one `_RELEASE_WHEEL = ""` line,
            or the URL cannot stand in a plain string literal.
    """
    if not re.fullmatch(r"https://[^\s\"\\]+\.whl", url):
        raise ReleaseError(f"not a wheel URL for {PIPE_FILE}: {url!r}")
    lines = text.splitlines(keepends=True)
    indexes = [
        index
        for index, line in enumerate(lines)
        if line.rstrip("\r\n") == _CHECKOUT_WHEEL_LINE
    ]
    if len(indexes) != 1:
        raise ReleaseError(
            f"{PIPE_FILE} needs exactly one `{_CHECKOUT_WHEEL_LINE}` line "
            f"(found {len(indexes)})"
        )
    line = lines[indexes[0]]
    ending = line[len(line.rstrip("\r\n")) :]
    lines[indexes[0]] = f'_RELEASE_WHEEL = "{url}"{ending}'
    return "".join(lines)


def pipe_problems(text: str, version: str, wheel_url: str) -> list[str]:
    """Check the pipe file's install contract.

    Args:
        text: The pipe file's text (checkout or release asset).
        version: The project version.
        wheel_url: What `_RELEASE_WHEEL` must hold ("" in the checkout).

    Returns:
        Human-readable problems (empty when fine): a non-empty frontmatter
        `requirements:` (Open WebUI would pip-install it at every load), and
        `_VERSION` or `_RELEASE_WHEEL` missing, repeated or not as expected.
    """
    problems = []
    requirements = parse_frontmatter(text).get("requirements", "")
    if requirements:
        problems.append(
            f"frontmatter requirements is {requirements!r}: Open WebUI would "
            "pip-install it at every load (the file installs its wheel itself)"
        )
    expected = {"_VERSION": version, "_RELEASE_WHEEL": wheel_url}
    constants = pipe_constants(text)
    for name, values in constants.items():
        if len(values) != 1:
            problems.append(
                f'needs exactly one `{name} = "..."` line (found {len(values)})'
            )
        elif values[0] != expected[name]:
            problems.append(f"{name} is {values[0]!r}, not {expected[name]!r}")
    meta_version = parse_frontmatter(text).get("version")
    if constants["_VERSION"] and constants["_VERSION"][0] != meta_version:
        problems.append(
            f"_VERSION {constants['_VERSION'][0]!r} is not the frontmatter "
            f"version {meta_version!r}"
        )
    return problems


def _remove_stale_assets(project: Project, out_dir: Path) -> None:
    """Delete earlier assets of this project (any version) from out_dir."""
    patterns = (
        f"{project.distribution}-*.whl",
        f"{project.distribution}-*.tar.gz",
        *ROOT_FILES,
    )
    for pattern in patterns:
        for path in out_dir.glob(pattern):
            path.unlink()


def build(project: Project, out_dir: Path, slug: str) -> list[Path]:
    """Build the six assets into out_dir.

    Args:
        project: The project to release.
        out_dir: Where the assets go (created if needed).
        slug: The GitHub owner/name the pipe's wheel URL points to.

    Returns:
        The six asset paths, wheel and sdist first.

    Raises:
        ReleaseError: The build failed or produced unexpected files.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_assets(project, out_dir)
    print(f"building {project.name} {project.version} into {out_dir}", file=sys.stderr)
    # sdist first, then the wheel from the sdist: proves the sdist is complete.
    completed = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out_dir), str(project.root)],
        stdout=sys.stderr,
        check=False,
    )
    if completed.returncode != 0:
        raise ReleaseError(f"python -m build failed (exit {completed.returncode})")
    for name in (project.wheel_name, project.sdist_name):
        if not (out_dir / name).is_file():
            raise ReleaseError(f"python -m build did not produce {name}")
    for name in TOOL_FILES:
        shutil.copyfile(project.root / name, out_dir / name)
    pipe_text = (project.root / PIPE_FILE).read_text(encoding="utf-8")
    release_pipe = with_release_wheel(pipe_text, release_wheel_url(project, slug))
    (out_dir / PIPE_FILE).write_text(release_pipe, encoding="utf-8", newline="")
    return [out_dir / name for name in project.asset_names()]


def _wheel_problems(project: Project, wheel: Path, out_dir: Path) -> list[str]:
    """Check the wheel's metadata and contents."""
    problems = []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata_name = f"{project.distribution}-{project.version}.dist-info/METADATA"
        if metadata_name not in names:
            return [f"{wheel.name}: no {metadata_name}"]
        metadata = archive.read(metadata_name).decode("utf-8")
        wanted_modules = [
            f"{PACKAGE}/__init__.py",
            f"{PACKAGE}/pipes/pipe.py",
            *(f"{PACKAGE}/tools/{name}" for name in TOOL_FILES),
        ]
        problems.extend(
            f"{wheel.name}: missing {module}"
            for module in wanted_modules
            if module not in names
        )
        for name in TOOL_FILES:
            member = f"{PACKAGE}/tools/{name}"
            asset = out_dir / name
            if (
                member in names
                and asset.is_file()
                and archive.read(member) != asset.read_bytes()
            ):
                problems.append(f"{wheel.name}: {member} differs from asset {name}")
    header = metadata.split("\n\n", 1)[0].splitlines()
    if f"Name: {project.name}" not in header:
        problems.append(f"{wheel.name}: METADATA Name is not {project.name}")
    if f"Version: {project.version}" not in header:
        problems.append(f"{wheel.name}: METADATA Version is not {project.version}")
    requires = {
        str(Requirement(line.removeprefix("Requires-Dist: ")))
        for line in header
        if line.startswith("Requires-Dist: ")
    }
    problems.extend(
        f"{wheel.name}: METADATA lacks Requires-Dist: {dependency}"
        for dependency in project.dependencies
        if str(Requirement(dependency)) not in requires
    )
    return problems + _resource_problems(wheel)


# Runs in a fresh interpreter: reads the tool modules from the wheel alone.
_RESOURCE_PROBE = """
import importlib.resources, pathlib, sys
wheel = sys.argv[1]
sys.path.insert(0, wheel)
import {package}.tools as tools
origin = pathlib.Path(tools.__file__).as_posix()
if not origin.startswith(pathlib.Path(wheel).as_posix()):
    sys.exit("imported " + origin + ", not the wheel")
for name in {names!r}:
    text = importlib.resources.files(tools).joinpath(name).read_text(encoding="utf-8")
    if "class Tools" not in text:
        sys.exit(name + " has no class Tools")
"""


def _resource_problems(wheel: Path) -> list[str]:
    """Check that the tool modules are readable with importlib.resources."""
    probe = _RESOURCE_PROBE.format(package=PACKAGE, names=TOOL_FILES)
    completed = subprocess.run(
        [sys.executable, "-I", "-c", probe, str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        detail = (completed.stderr or completed.stdout).strip().splitlines()[-1:]
        reason = f"tool modules not readable with importlib.resources: {detail}"
        return [f"{wheel.name}: {reason}"]
    return []


def _sdist_problems(project: Project, sdist: Path) -> list[str]:
    """Check that the sdist holds what a rebuild and the root files need."""
    prefix = f"{project.distribution}-{project.version}/"
    wanted = [
        "PKG-INFO",
        "pyproject.toml",
        "LICENSE",
        "CHANGELOG.md",
        f"src/{PACKAGE}/__init__.py",
        f"src/{PACKAGE}/pipes/pipe.py",
        *ROOT_FILES,
        *(f"src/{PACKAGE}/tools/{name}" for name in TOOL_FILES),
    ]
    with tarfile.open(sdist) as archive:
        names = set(archive.getnames())
    return [
        f"{sdist.name}: missing {prefix}{name}"
        for name in wanted
        if prefix + name not in names
    ]


def _python_asset_problems(project: Project, out_dir: Path, slug: str) -> list[str]:
    """Check the four .py assets: frontmatter, the pipe's wheel URL, sources."""
    problems = []
    for name in ROOT_FILES:
        path = out_dir / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        problems.extend(
            f"{name}: {p}" for p in frontmatter_problems(text, project.version)
        )
        problems.extend(f"{name}: {p}" for p in replaced_import_problems(text))
    pipe = out_dir / PIPE_FILE
    if pipe.is_file():
        release_pipe = pipe.read_text(encoding="utf-8")
        expected = release_wheel_url(project, slug)
        problems.extend(
            f"{PIPE_FILE}: {p}"
            for p in pipe_problems(release_pipe, project.version, expected)
        )
        checkout_pipe = (project.root / PIPE_FILE).read_text(encoding="utf-8")
        checkout_problems = pipe_problems(checkout_pipe, project.version, "")
        problems.extend(f"checkout {PIPE_FILE}: {p}" for p in checkout_problems)
        if not checkout_problems:
            try:
                wanted = with_release_wheel(checkout_pipe, expected)
            except ReleaseError as error:
                problems.append(str(error))
            else:
                if release_pipe != wanted:
                    problems.append(
                        f"{PIPE_FILE}: differs from the checkout beyond _RELEASE_WHEEL"
                    )
    for name in TOOL_FILES:
        asset = out_dir / name
        module = project.root / "src" / PACKAGE / "tools" / name
        if (
            asset.is_file()
            and module.is_file()
            and asset.read_bytes() != module.read_bytes()
        ):
            problems.append(f"{name}: differs from src/{PACKAGE}/tools/{name}")
    return problems


def check(project: Project, out_dir: Path, slug: str) -> list[str]:
    """Validate the six assets in out_dir.

    Args:
        project: The project the assets should belong to.
        out_dir: Where the assets are.
        slug: The GitHub owner/name the pipe's wheel URL must point to.

    Returns:
        Human-readable problems (empty when the assets are right).
    """
    problems = [
        f"missing asset: {out_dir / name}"
        for name in project.asset_names()
        if not (out_dir / name).is_file()
    ]
    wheel = out_dir / project.wheel_name
    if wheel.is_file():
        problems.extend(_wheel_problems(project, wheel, out_dir))
    sdist = out_dir / project.sdist_name
    if sdist.is_file():
        problems.extend(_sdist_problems(project, sdist))
    problems.extend(_python_asset_problems(project, out_dir, slug))
    return problems


def main(argv: list[str] | None = None) -> int:
    """Build (or check) the release assets.

    Args:
        argv: Command-line arguments (defaults to sys.argv[1:]).

    Returns:
        0 on success, 1 when the build or the check fails.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "dist")
    parser.add_argument("--check", action="store_true", help="only check the assets")
    parser.add_argument("--tag", help="the release tag; must be v<project version>")
    parser.add_argument("--repo", help="GitHub OWNER/NAME (default: see module doc)")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out_dir: Path = args.out_dir.resolve()
    try:
        project = read_project(args.root.resolve())
        if args.tag is not None and args.tag != f"v{project.version}":
            raise ReleaseError(
                f"tag {args.tag} does not match the project version "
                f"(expected v{project.version})"
            )
        slug = repository_slug(project, args.repo)
        paths = None if args.check else build(project, out_dir, slug)
    except ReleaseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    problems = check(project, out_dir, slug)
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s) with the release assets", file=sys.stderr)
        return 1
    if paths is None:
        print(f"the six release assets in {out_dir} are right", file=sys.stderr)
    else:
        for path in paths:
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
