"""The release: six assets built for real, installed into clean venvs.

One release build and three clean Python 3.11 venvs per session (session-scoped
fixtures): one with the wheel installed (pip resolves its dependencies from the
package index), one with only the wheel's dependencies, to load the root files
from the checkout with nothing of ours installed, and one like it with pip
inside, where the released pipe file may run pip (it never installs there). The
test that lets the pipe file install its wheel gets a venv of its own. pip needs
to reach the index to make the venvs; the pipe file's own pip runs reach only a
wheel server on 127.0.0.1, with the machine's pip configuration switched off.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.fakes.http import LocalServer, Response
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


def _clean_venv(path: Path, *, with_pip: bool = False) -> Path:
    # venv bases the new environment on the base interpreter, not on .venv.
    # With pip: the bundled one (ensurepip, no download), for the pipe file's
    # own `python -m pip install`.
    options = [] if with_pip else ["--without-pip"]
    subprocess.run(
        [sys.executable, "-m", "venv", *options, str(path)],
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


def _deps_venv_with_pip(release: Release, path: Path) -> Path:
    venv = _clean_venv(path, with_pip=True)
    _pip_install(venv, *_wheel_requirements(release.wheel))
    return venv


@pytest.fixture(scope="session")
def pip_deps_venv(release, tmp_path_factory) -> Path:
    """The wheel's dependencies and pip, not the package; nothing installs here.

    The tests using it serve no wheel (404), so a pipe file that wrongly ran
    pip fails that test without installing anything for the next one.
    """
    return _deps_venv_with_pip(release, tmp_path_factory.mktemp("pip-deps") / "venv")


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


def _module_strings(text: str) -> dict[str, str]:
    """The module-level `NAME = "string"` assignments of a Python file."""
    return {
        target.id: node.value.value
        for node in ast.parse(text).body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _release_wheel_url(wheel: Path) -> str:
    return (
        f"https://github.com/{REPO}/releases/download/v{project_version()}/{wheel.name}"
    )


def test_release_pipe_names_this_release_wheel_and_nothing_else_changes(release):
    asset = (release.out_dir / PIPE_FILE).read_text("utf-8")
    checkout = (ROOT / PIPE_FILE).read_text("utf-8")
    url = _release_wheel_url(release.wheel)
    assert _module_strings(asset)["_RELEASE_WHEEL"] == url
    assert _module_strings(asset)["_VERSION"] == project_version()
    assert _module_strings(checkout)["_RELEASE_WHEEL"] == ""
    assert (release.out_dir / url.rsplit("/", 1)[1]).is_file()
    # The checkout's file but for that one line.
    assert asset == checkout.replace(
        '\n_RELEASE_WHEEL = ""\n', f'\n_RELEASE_WHEEL = "{url}"\n', 1
    )
    assert asset != checkout
    # Open WebUI finds nothing to pip-install (0.6 would at every load).
    assert "requirements" not in openwebui_frontmatter(asset)
    assert openwebui_frontmatter(asset) == openwebui_frontmatter(checkout)
    assert openwebui_frontmatter(asset)["version"] == project_version()


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
    other = _release_wheel_url(release.wheel).replace(REPO, "someone-else/other")
    assert (
        f"problem: {PIPE_FILE}: _RELEASE_WHEEL is "
        f"{_release_wheel_url(release.wheel)!r}, not {other!r}\n"
    ) in completed.stderr


def test_check_mode_rejects_a_pipe_that_open_webui_would_pip_install(release, tmp_path):
    broken = tmp_path / "dist"
    shutil.copytree(release.out_dir, broken)
    pipe = broken / PIPE_FILE
    text = pipe.read_text("utf-8")
    requirement = f"{DISTRIBUTION} @ {_release_wheel_url(release.wheel)}"
    edited = text.replace(
        "\nlicense: MIT\n", f"\nlicense: MIT\nrequirements: {requirement}\n", 1
    ).replace(f'\n_VERSION = "{project_version()}"\n', '\n_VERSION = "0.0.9"\n', 1)
    assert edited.count("\n") == text.count("\n") + 1
    pipe.write_text(edited, encoding="utf-8")
    completed = _check(broken)
    assert completed.returncode == 1
    problems = [
        line.removeprefix(f"problem: {PIPE_FILE}: ")
        for line in completed.stderr.splitlines()
        if line.startswith(f"problem: {PIPE_FILE}: ")
    ]
    assert problems == [
        f"frontmatter requirements is {requirement!r}: Open WebUI would "
        "pip-install it at every load (the file installs its wheel itself)",
        f"_VERSION is '0.0.9', not {project_version()!r}",
        f"_VERSION '0.0.9' is not the frontmatter version {project_version()!r}",
        "differs from the checkout beyond _RELEASE_WHEEL",
    ]


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


# --- the released pipe file installs its wheel itself ---------------------------

# The help's first sentence, for the version this checkout releases.
HELP_FIRST_SENTENCE = (
    f"The Tongyi DeepResearch pipe needs the Python package '{DISTRIBUTION}' "
    f"{project_version()} or newer in Open WebUI's Python environment."
)
WHEEL_PATH = f"/releases/download/v{project_version()}/{wheel_name(project_version())}"


def _asset_pointing_at(
    release: Release, url: str, directory: Path, version: str | None = None
) -> Path:
    """The release pipe asset with `_RELEASE_WHEEL` (and `_VERSION`) rewritten."""
    text = (release.out_dir / PIPE_FILE).read_text("utf-8")
    line = f'\n_RELEASE_WHEEL = "{_release_wheel_url(release.wheel)}"\n'
    assert text.count(line) == 1
    text = text.replace(line, f'\n_RELEASE_WHEEL = "{url}"\n')
    if version is not None:
        line = f'\n_VERSION = "{project_version()}"\n'
        assert text.count(line) == 1
        text = text.replace(line, f'\n_VERSION = "{version}"\n')
    path = directory / "pasted" / PIPE_FILE
    path.parent.mkdir()
    path.write_text(text, encoding="utf-8")
    return path


def _server_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """Open WebUI's environment as the pipe file sees it, for a server offline.

    The machine's pip configuration (/etc/pip.conf, ~/.config/pip: find-links
    and file:// indexes) is switched off, and so is every package index: the
    pipe file's pip can reach only the wheel URL it is given.
    """
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path / "home"),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        **settings,
    }


def _wheel_server(release: Release) -> LocalServer:
    wheel = release.wheel.read_bytes()
    return LocalServer(
        {
            WHEEL_PATH: lambda _: Response(
                200, {"Content-Type": "application/octet-stream"}, wheel
            )
        }
    )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _installed_version(venv: Path, cwd: Path) -> str | None:
    completed = _run(
        _python(venv),
        "import importlib.metadata as m\n"
        "try:\n"
        f"    print(m.version({DISTRIBUTION!r}))\n"
        "except m.PackageNotFoundError:\n"
        "    print('none')\n",
        cwd,
    )
    assert completed.returncode == 0, completed.stderr
    version = completed.stdout.strip()
    return None if version == "none" else version


def _import_error(completed: subprocess.CompletedProcess[str]) -> str:
    """The message of the ImportError the probe ended with."""
    assert completed.returncode != 0
    last_line = completed.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ImportError: "), completed.stderr[-2000:]
    return last_line.removeprefix("ImportError: ")


def test_release_pipe_installs_its_wheel_where_the_package_is_missing(
    release, tmp_path
):
    # A venv of its own: this test installs the package into it.
    venv = _deps_venv_with_pip(release, tmp_path / "venv")
    assert _installed_version(venv, tmp_path) is None
    with _wheel_server(release) as server:
        asset = _asset_pointing_at(release, server.url(WHEEL_PATH), tmp_path)
        env = _server_env(tmp_path)
        first = run_probe(_python(venv), "open-webui", asset, "Pipe", tmp_path, env=env)
        served = [(request.method, request.path) for request in server.requests]
        # Loaded again (a restart): the wheel is installed, nothing is fetched.
        again = run_probe(_python(venv), "open-webui", asset, "Pipe", tmp_path, env=env)
        served_again = [(request.method, request.path) for request in server.requests]
    assert first.returncode == 0, first.stderr[-3000:]
    module, defined_in, instance = first.stdout.strip().split("|")
    assert (module, instance) == (f"{PACKAGE}.pipes.pipe", "Pipe")
    assert Path(defined_in).is_relative_to(venv)
    assert served == [("GET", WHEEL_PATH)]
    assert _installed_version(venv, tmp_path) == project_version()
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout == first.stdout
    assert served_again == served


@pytest.mark.parametrize(
    "file_version",
    [project_version(), "0.0.1", project_version() + ".0"],
    ids=["same", "older-file", "same-with-a-trailing-zero"],
)
def test_release_pipe_uses_an_installed_package_as_new_as_itself_offline(
    installed_venv, release, file_version, tmp_path
):
    # Nothing listens at the wheel URL, and this venv has no pip: had the file
    # tried to install anything, it would end in an ImportError.
    url = f"http://127.0.0.1:{_closed_port()}{WHEEL_PATH}"
    asset = _asset_pointing_at(release, url, tmp_path, version=file_version)
    completed = run_probe(
        _python(installed_venv),
        "open-webui",
        asset,
        "Pipe",
        tmp_path,
        env=_server_env(tmp_path),
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    module, defined_in, _ = completed.stdout.strip().split("|")
    assert module == f"{PACKAGE}.pipes.pipe"
    assert Path(defined_in).is_relative_to(installed_venv)


@pytest.mark.parametrize(
    ("switch", "reason"),
    [
        ({"OFFLINE_MODE": "true"}, "OFFLINE_MODE is true"),
        ({"OFFLINE_MODE": "True"}, "OFFLINE_MODE is true"),
        (
            {"ENABLE_PIP_INSTALL_FRONTMATTER_REQUIREMENTS": "false"},
            "ENABLE_PIP_INSTALL_FRONTMATTER_REQUIREMENTS is not true",
        ),
        (
            {"ENABLE_PIP_INSTALL_FRONTMATTER_REQUIREMENTS": "0"},
            "ENABLE_PIP_INSTALL_FRONTMATTER_REQUIREMENTS is not true",
        ),
    ],
    ids=["offline", "offline-capitalised", "pip-installs-off", "pip-installs-0"],
)
def test_release_pipe_installs_nothing_when_open_webui_forbids_it(
    pip_deps_venv, release, switch, reason, tmp_path
):
    with LocalServer() as server:  # a request would get a 404
        asset = _asset_pointing_at(release, server.url(WHEEL_PATH), tmp_path)
        completed = run_probe(
            _python(pip_deps_venv),
            "open-webui",
            asset,
            "Pipe",
            tmp_path,
            env=_server_env(tmp_path, **switch),
        )
        requests = list(server.requests)
    message = _import_error(completed)
    assert requests == []
    assert message.startswith(HELP_FIRST_SENTENCE + " ")
    assert message.endswith(
        f"(it is not installed, and installing it is switched off: {reason})"
    )
    assert "Offline, or to install it yourself:" in message


def test_release_pipe_newer_than_the_installed_package_needs_its_wheel(
    installed_venv, release, tmp_path
):
    # An upgrade pasted on a server that may not pip-install: the older package
    # is not used (it would run the old code); the error says what to do.
    with LocalServer() as server:
        asset = _asset_pointing_at(
            release, server.url(WHEEL_PATH), tmp_path, version="99.0.0"
        )
        completed = run_probe(
            _python(installed_venv),
            "open-webui",
            asset,
            "Pipe",
            tmp_path,
            env=_server_env(tmp_path, OFFLINE_MODE="true"),
        )
        requests = list(server.requests)
    message = _import_error(completed)
    assert requests == []
    assert message.startswith(
        f"The Tongyi DeepResearch pipe needs the Python package '{DISTRIBUTION}' "
        "99.0.0 or newer in Open WebUI's Python environment. "
    )
    assert message.endswith(
        f"({project_version()} is installed, and installing it is switched off: "
        "OFFLINE_MODE is true)"
    )


def test_release_pipe_reads_open_webuis_switches_as_open_webui_does(
    pip_deps_venv, release, tmp_path
):
    # Open WebUI's env.py: OFFLINE_MODE is on only for "true" (any case) and pip
    # installs are off for anything but "true": "1" and "TRUE" let pip run.
    settings = {
        "OFFLINE_MODE": "1",
        "ENABLE_PIP_INSTALL_FRONTMATTER_REQUIREMENTS": "TRUE",
    }
    with LocalServer() as server:
        url = server.url(WHEEL_PATH)
        asset = _asset_pointing_at(release, url, tmp_path)
        completed = run_probe(
            _python(pip_deps_venv),
            "open-webui",
            asset,
            "Pipe",
            tmp_path,
            env=_server_env(tmp_path, **settings),
        )
        requests = [(request.method, request.path) for request in server.requests]
    assert requests == [("GET", WHEEL_PATH)]
    assert _import_error(completed).endswith(
        f"(`pip install {url}` failed with exit status 1)"
    )


def test_release_pipe_reports_a_failed_pip_without_its_secrets(
    pip_deps_venv, release, tmp_path
):
    # The wheel URL answers 404; the URL and the index options carry passwords.
    with LocalServer() as server:
        url = server.url(WHEEL_PATH)
        secret_url = url.replace("http://", "http://mirror-user:wheel-pw-4471@")
        asset = _asset_pointing_at(release, secret_url, tmp_path)
        index = server.base_url.replace("http://", "http://index-user:index-pw-9923@")
        completed = run_probe(
            _python(pip_deps_venv),
            "open-webui",
            asset,
            "Pipe",
            tmp_path,
            env=_server_env(
                tmp_path,
                PIP_OPTIONS="--no-input --retries 0",
                PIP_PACKAGE_INDEX_OPTIONS=f"--extra-index-url {index}/simple/",
            ),
        )
        requests = list(server.requests)
    message = _import_error(completed)
    # pip ran and fetched the URL (with its credentials), and failed on the 404.
    assert [(request.method, request.path) for request in requests] == [
        ("GET", WHEEL_PATH)
    ]
    assert requests[0].headers["authorization"].startswith("Basic ")
    assert message.startswith(HELP_FIRST_SENTENCE + " ")
    assert message.endswith(f"(`pip install {url}` failed with exit status 1)")
    output = completed.stdout + completed.stderr
    for secret in ("wheel-pw-4471", "index-pw-9923", "mirror-user", "index-user"):
        assert secret not in output
    assert _installed_version(pip_deps_venv, tmp_path) is None


# Runs in the installed venv: loads the installed package, then makes its
# loaded copy look like another version (as after pip replaced it on disk in a
# running Open WebUI), then loads the pipe file as Open WebUI does.
STALE_COPY_PROBE = r"""
import importlib, inspect, json, os, pathlib, sys, tempfile, types, uuid
path, loaded_version, package = sys.argv[1:4]
old_pipe = importlib.import_module(package + ".pipes.pipe").Pipe
sys.modules[package].__version__ = loaded_version
# Held here, so that no new module can take an old one's id().
old_modules = [
    module for name, module in sys.modules.items() if name.split(".")[0] == package
]
old_ids = {id(module) for module in old_modules}
source = pathlib.Path(path).read_text(encoding="utf-8")
module = types.ModuleType("function_probe_" + uuid.uuid4().hex)
with tempfile.TemporaryDirectory() as empty_dir:
    temp_file = os.path.join(empty_dir, "content")
    pathlib.Path(temp_file).write_text(source, encoding="utf-8")
    module.__dict__["__file__"] = temp_file
    exec(compile(source, temp_file, "exec"), module.__dict__)
print(json.dumps({
    "same_class": module.Pipe is old_pipe,
    "defined_in": inspect.getfile(module.Pipe),
    "package_version": sys.modules[package].__version__,
    "old_modules_left": sum(
        id(module) in old_ids for name, module in sys.modules.items()
        if name.split(".")[0] == package
    ),
    "old_modules": len(old_modules),
}))
"""


@pytest.mark.parametrize(
    ("loaded_version", "reloaded"),
    [("0.0.1", True), (project_version(), False)],
    ids=["older-copy-loaded", "same-version-loaded"],
)
def test_release_pipe_drops_a_loaded_copy_of_another_version(
    installed_venv, release, loaded_version, reloaded, tmp_path
):
    url = f"http://127.0.0.1:{_closed_port()}{WHEEL_PATH}"
    asset = _asset_pointing_at(release, url, tmp_path)
    completed = subprocess.run(
        [
            str(_python(installed_venv)),
            "-I",
            "-c",
            STALE_COPY_PROBE,
            str(asset),
            loaded_version,
            PACKAGE,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_server_env(tmp_path),
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout)
    assert Path(result["defined_in"]).is_relative_to(installed_venv)
    assert result["old_modules"] >= 3  # the package, pipes, pipes.pipe, ...
    if reloaded:
        # The installed package, imported afresh: none of the stale modules.
        assert result["same_class"] is False
        assert result["package_version"] == project_version()
        assert result["old_modules_left"] == 0
    else:
        # The same version stays loaded: nothing is imported twice.
        assert result["same_class"] is True
        assert result["package_version"] == project_version()
        assert result["old_modules_left"] == result["old_modules"]


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
