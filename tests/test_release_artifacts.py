"""The release: six assets built for real, installed into clean venvs.

One release build and two clean Python 3.11 venvs per session (session-scoped
fixtures): one with the wheel installed (pip resolves its dependencies from the
package index), one with only the wheel's dependencies, to load the root files
from the checkout with nothing of ours installed. pip needs to reach the index.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.packaging_support import (
    DISTRIBUTION,
    PACKAGE,
    PIPE_FILE,
    ROOT,
    ROOT_FILES,
    TOOL_FILES,
    openwebui_frontmatter,
    project_table,
    project_version,
    run_probe,
    sdist_name,
    wheel_name,
)

# Builds the release and installs it into fresh venvs: minutes, so out of the
# quick loop (`-m "not slow and …"`, see pyproject.toml); the full run has it.
pytestmark = pytest.mark.slow

REPO = "example-owner/example-repo"
BUILD_SCRIPT = ROOT / "scripts" / "build_release.py"


@dataclass(frozen=True)
class Release:
    """Assets built by scripts/build_release.py, and the paths it printed."""

    out_dir: Path
    printed: list[Path]

    @property
    def wheel(self) -> Path:
        return self.out_dir / wheel_name(project_version())

    @property
    def sdist(self) -> Path:
        return self.out_dir / sdist_name(project_version())


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _pip_install(venv: Path, *args: str) -> None:
    # The dev venv's pip installs into the new venv (no pip inside it needed).
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(_python(venv)),
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--quiet",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert completed.returncode == 0, (
        completed.stdout[-3000:] + completed.stderr[-3000:]
    )


def _clean_venv(path: Path) -> Path:
    # venv bases the new environment on the base interpreter, not on .venv.
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)],
        check=True,
        timeout=300,
    )
    return path


def _wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(
            f"{PACKAGE}-{project_version()}.dist-info/METADATA"
        ).decode("utf-8")
    header = metadata.split("\n\n", 1)[0]
    return [
        line.removeprefix("Requires-Dist: ")
        for line in header.splitlines()
        if line.startswith("Requires-Dist: ") and "extra ==" not in line
    ]


def _run(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-I", "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=240,
        check=False,
    )


@pytest.fixture(scope="session")
def release(tmp_path_factory) -> Release:
    out_dir = tmp_path_factory.mktemp("release") / "dist"
    completed = subprocess.run(
        [sys.executable, str(BUILD_SCRIPT), "--out-dir", str(out_dir)],
        capture_output=True,
        text=True,
        env=os.environ | {"GITHUB_REPOSITORY": REPO},
        timeout=900,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return Release(out_dir, [Path(line) for line in completed.stdout.splitlines()])


@pytest.fixture(scope="session")
def installed_venv(release, tmp_path_factory) -> Path:
    venv = _clean_venv(tmp_path_factory.mktemp("installed") / "venv")
    _pip_install(venv, str(release.wheel))
    return venv


@pytest.fixture(scope="session")
def deps_only_venv(release, tmp_path_factory) -> Path:
    venv = _clean_venv(tmp_path_factory.mktemp("deps-only") / "venv")
    _pip_install(venv, *_wheel_requirements(release.wheel))
    return venv


# --- the six assets -----------------------------------------------------------


def test_build_prints_the_six_assets(release):
    version = project_version()
    assert [path.name for path in release.printed] == [
        wheel_name(version),
        sdist_name(version),
        *ROOT_FILES,
    ]
    assert all(path.parent == release.out_dir for path in release.printed)
    assert all(path.is_file() and path.stat().st_size > 0 for path in release.printed)


def test_release_pipe_installs_exactly_this_release_wheel(release):
    asset = openwebui_frontmatter((release.out_dir / PIPE_FILE).read_text("utf-8"))
    checkout = openwebui_frontmatter((ROOT / PIPE_FILE).read_text("utf-8"))
    requirement = Requirement(asset["requirements"])
    assert requirement.name == DISTRIBUTION
    assert requirement.url == (
        f"https://github.com/{REPO}/releases/download/"
        f"v{project_version()}/{release.wheel.name}"
    )
    assert requirement.url is not None
    assert (release.out_dir / requirement.url.rsplit("/", 1)[1]).is_file()
    assert {k: v for k, v in asset.items() if k != "requirements"} == {
        k: v for k, v in checkout.items() if k != "requirements"
    }


def test_tool_assets_are_the_root_files(release):
    for name in TOOL_FILES:
        assert (release.out_dir / name).read_bytes() == (ROOT / name).read_bytes()


def test_wheel_holds_the_package_and_its_metadata(release):
    with zipfile.ZipFile(release.wheel) as archive:
        names = set(archive.namelist())
        for name in TOOL_FILES:
            member = f"{PACKAGE}/tools/{name}"
            assert archive.read(member) == (ROOT / name).read_bytes()
        metadata = archive.read(
            f"{PACKAGE}-{project_version()}.dist-info/METADATA"
        ).decode("utf-8")
    assert f"{PACKAGE}/__init__.py" in names
    assert f"{PACKAGE}/pipes/pipe.py" in names
    assert not any(name.startswith(("tests/", "scripts/")) for name in names)
    header = metadata.split("\n\n", 1)[0].splitlines()
    assert f"Name: {DISTRIBUTION}" in header
    assert f"Version: {project_version()}" in header
    assert {str(Requirement(r)) for r in _wheel_requirements(release.wheel)} == {
        str(Requirement(r)) for r in project_table()["dependencies"]
    }


def test_sdist_holds_sources_root_files_and_tests(release):
    prefix = f"{PACKAGE}-{project_version()}/"
    with tarfile.open(release.sdist) as archive:
        names = set(archive.getnames())
    for name in (
        "pyproject.toml",
        "LICENSE",
        "CHANGELOG.md",
        "README.md",
        *ROOT_FILES,
        *(f"src/{PACKAGE}/tools/{tool}" for tool in TOOL_FILES),
        "tests/test_packaging.py",
        "scripts/build_release.py",
    ):
        assert prefix + name in names, f"sdist lacks {name}"


def _check(out_dir: Path, repo: str = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(BUILD_SCRIPT),
            "--check",
            "--out-dir",
            str(out_dir),
            "--repo",
            repo,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_check_mode_accepts_the_built_assets(release):
    completed = _check(release.out_dir)
    assert completed.returncode == 0, completed.stderr


def test_check_mode_rejects_broken_assets(release, tmp_path):
    broken = tmp_path / "dist"
    shutil.copytree(release.out_dir, broken)
    (broken / release.sdist.name).unlink()
    with (broken / "visit_tool.py").open("a", encoding="utf-8") as file:
        file.write("# edited after the build\n")
    completed = _check(broken)
    assert completed.returncode == 1
    assert f"missing asset: {broken / release.sdist.name}" in completed.stderr
    assert "visit_tool.py differs from asset visit_tool.py" in completed.stderr
    assert "visit_tool.py: differs from src/" in completed.stderr


def test_check_mode_rejects_a_pipe_pointing_at_another_repository(release):
    completed = _check(release.out_dir, repo="someone-else/other")
    assert completed.returncode == 1
    assert f"{PIPE_FILE}: requirements is" in completed.stderr


# --- the wheel installed into a clean venv ------------------------------------


def test_installed_wheel_gives_pipe_and_tools(installed_venv, tmp_path):
    code = (
        "import importlib, json\n"
        f"import {PACKAGE} as package\n"
        f"from {PACKAGE}.pipes.pipe import Pipe\n"
        "Pipe()\n"
        "tools = {}\n"
        f"for name in {[name.removesuffix('.py') for name in TOOL_FILES]!r}:\n"
        f"    module = importlib.import_module('{PACKAGE}.tools.' + name)\n"
        "    tools[name] = type(module.Tools()).__name__\n"
        "print(json.dumps({'file': package.__file__, 'version': package.__version__,"
        " 'tools': tools}))\n"
    )
    completed = _run(_python(installed_venv), code, tmp_path)
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert Path(result["file"]).is_relative_to(installed_venv)
    assert result["version"] == project_version()
    assert set(result["tools"].values()) == {"Tools"}


def test_installed_wheel_has_consistent_dependencies(installed_venv):
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(_python(installed_venv)),
            "check",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_installed_tool_modules_are_readable_as_resources(installed_venv, tmp_path):
    code = (
        "import hashlib, importlib.resources, json\n"
        f"files = importlib.resources.files('{PACKAGE}.tools')\n"
        "print(json.dumps({name: hashlib.sha256(files.joinpath(name).read_bytes())"
        f".hexdigest() for name in {list(TOOL_FILES)!r}}}))\n"
    )
    completed = _run(_python(installed_venv), code, tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout) == {
        name: hashlib.sha256((ROOT / name).read_bytes()).hexdigest()
        for name in TOOL_FILES
    }


@pytest.mark.parametrize("name", ROOT_FILES)
def test_pasted_file_runs_against_the_installed_wheel(installed_venv, name, tmp_path):
    # As Open WebUI runs it: exec'd from a temporary file, nothing beside it.
    class_name = "Pipe" if name == PIPE_FILE else "Tools"
    completed = run_probe(
        _python(installed_venv), "open-webui", ROOT / name, class_name, tmp_path
    )
    assert completed.returncode == 0, completed.stderr
    module, defined_in, instance = completed.stdout.strip().split("|")
    assert instance == class_name
    if name == PIPE_FILE:
        assert module == f"{PACKAGE}.pipes.pipe"
        assert Path(defined_in).is_relative_to(installed_venv)
    else:
        assert module.startswith("tool_probe_")


def test_release_pipe_asset_runs_against_the_installed_wheel(
    installed_venv, release, tmp_path
):
    completed = run_probe(
        _python(installed_venv),
        "open-webui",
        release.out_dir / PIPE_FILE,
        "Pipe",
        tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith(f"{PACKAGE}.pipes.pipe|")


# --- the checkout, nothing of ours installed ----------------------------------


def test_package_is_not_installed_in_the_deps_only_venv(deps_only_venv, tmp_path):
    completed = _run(_python(deps_only_venv), f"import {PACKAGE}", tmp_path)
    assert completed.returncode != 0
    assert f"No module named '{PACKAGE}'" in completed.stderr


@pytest.mark.parametrize("name", ROOT_FILES)
def test_root_file_loads_from_the_checkout_without_install(
    deps_only_venv, name, tmp_path
):
    class_name = "Pipe" if name == PIPE_FILE else "Tools"
    completed = run_probe(
        _python(deps_only_venv), "in-place", ROOT / name, class_name, tmp_path
    )
    assert completed.returncode == 0, completed.stderr
    module, defined_in, instance = completed.stdout.strip().split("|")
    assert instance == class_name
    if name == PIPE_FILE:
        # The shim's fallback: the package sources beside the file.
        assert module == f"{PACKAGE}.pipes.pipe"
        assert Path(defined_in) == ROOT / "src" / PACKAGE / "pipes" / "pipe.py"
    else:
        assert Path(defined_in) == ROOT / name


def test_shim_outside_a_checkout_does_not_fall_back(deps_only_venv, tmp_path):
    copy = tmp_path / PIPE_FILE
    shutil.copy(ROOT / PIPE_FILE, copy)
    completed = run_probe(_python(deps_only_venv), "open-webui", copy, "Pipe", tmp_path)
    assert completed.returncode != 0
    assert "ImportError:" in completed.stderr
    assert "pip install" in completed.stderr
