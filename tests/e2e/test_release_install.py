"""A fresh install from the release assets alone, in a real Open WebUI.

The assets are built once per session with ``scripts/build_release.py``
(wheel, sdist, the pipe file with its wheel URL, the tool files). Each test
runs an ``open-webui serve`` of its own (its own data directory and model
server; `durable_deployment`), with ``PIP_OPTIONS=--no-index`` (Open WebUI's
own pip options, which the pipe file uses too): the wheel's dependencies are
in the venv already, so pip looks nothing up on an index.

- Online: the package is not installed in Open WebUI's Python. The release
  pipe file, its ``_RELEASE_WHEEL`` pointed at a local HTTP server serving the
  built wheel, is created as a function through the REST API: the file
  installs the wheel (downloaded exactly once), the pipe installs its tools,
  the admin sets the valves, and a research reading six pages through the
  real visit tool answers in a saved chat.
- Offline: the built wheel is installed first, ``_RELEASE_WHEEL`` points at a
  closed port on 127.0.0.1 and Open WebUI runs with ``OFFLINE_MODE=true``:
  creating the function succeeds (0.1.0's asset, whose ``requirements:``
  line named the wheel URL, was refused with HTTP 400 on 0.6.43) and the
  same research answers.

The shared Open WebUI venv has the project's wheel installed by
scripts/prepare-e2e; each test leaves it installed as it found it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.http import LocalServer, Request, Response
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.pages import PageSite

from .conftest import pipe_valves
from .durable_deployment import TIMEOUT, answered, ui_session
from .durable_research import (
    PAGES,
    QUESTION,
    DurableResearch,
    Turn,
    ask_in_new_chat,
    source_urls,
)
from .owui import (
    FUNCTION_ID,
    ROOT,
    TOOL_IDS,
    Api,
    OpenWebUIServer,
    free_port,
    installer,
    port_is_free,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

DISTRIBUTION = "tongyi-deepresearch-openwebui-pipeline"
PIPE_ASSET = "tongyi_deepresearch_pipe.py"
ADMIN = ("Release Admin", "release-admin@example.com", "e2e-Passw0rd!")
#: Open WebUI's own pip options, which the pipe file passes to pip as well.
NO_INDEX = {"PIP_OPTIONS": "--no-index"}
_WHEEL_LINE = re.compile(r'^_RELEASE_WHEEL = "[^"]*"$', re.MULTILINE)


@dataclass(frozen=True)
class ReleaseAssets:
    """The assets scripts/build_release.py built."""

    directory: Path
    version: str
    wheel: Path

    def pipe_file(self, wheel_url: str) -> str:
        """The release pipe file with ``_RELEASE_WHEEL`` set to ``wheel_url``."""
        text = (self.directory / PIPE_ASSET).read_text(encoding="utf-8")
        rewritten, count = _WHEEL_LINE.subn(f'_RELEASE_WHEEL = "{wheel_url}"', text)
        assert count == 1, "the release pipe file has one _RELEASE_WHEEL line"
        return rewritten


@pytest.fixture(scope="session")
def release_assets(tmp_path_factory: pytest.TempPathFactory) -> ReleaseAssets:
    """Build the release assets once for the session."""
    out_dir = tmp_path_factory.mktemp("release-assets")
    completed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "build_release.py"),
            "--out-dir",
            str(out_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    paths = [Path(line) for line in completed.stdout.splitlines() if line.strip()]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"
    ]["version"]
    wheel = paths[0]
    assert wheel.name == (
        f"tongyi_deepresearch_openwebui_pipeline-{version}-py3-none-any.whl"
    )
    return ReleaseAssets(out_dir, version, wheel)


# -- the Open WebUI venv's own pip -------------------------------------------------


def venv_pip(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the venv's pip (no index: everything it needs is local)."""
    return subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def installed_version(venv: Path) -> str | None:
    """The project's version installed in the venv, or None."""
    completed = venv_pip(venv, "show", DISTRIBUTION)
    if completed.returncode != 0:
        return None
    found = re.search(r"^Version: (\S+)$", completed.stdout, re.MULTILINE)
    return found.group(1) if found else None


def install_wheel(venv: Path, wheel: Path) -> None:
    """Install ``wheel`` into the venv as prepare-e2e does (over what is there)."""
    completed = venv_pip(
        venv, "install", "--no-index", "--no-deps", "--force-reinstall", str(wheel)
    )
    assert completed.returncode == 0, completed.stderr[-3000:]


def uninstall(venv: Path) -> None:
    """Remove the project from the venv."""
    completed = venv_pip(venv, "uninstall", "--yes", DISTRIBUTION)
    assert completed.returncode == 0, completed.stderr[-3000:]


@pytest.fixture
def prepared_venv(
    owui_venv_path: Path, release_assets: ReleaseAssets
) -> Iterator[Path]:
    """The Open WebUI venv; the project's wheel reinstalled after the test."""
    assert installed_version(owui_venv_path) == release_assets.version, (
        "scripts/prepare-e2e installs the project's wheel into the venv"
    )
    try:
        yield owui_venv_path
    finally:
        install_wheel(owui_venv_path, release_assets.wheel)


# -- a server of the test's own ------------------------------------------------------


@dataclass
class Installed:
    """A running Open WebUI, its model server and its admin."""

    server: OpenWebUIServer
    model: FakeOpenAI
    admin: Api


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Any]:
    """Start an Open WebUI of the test's own (stopped after the test)."""
    started: list[OpenWebUIServer] = []
    with FakeOpenAI("Tongyi-DeepResearch-release") as model:

        def start(venv: Path, extra_env: dict[str, str]) -> Installed:
            server = OpenWebUIServer(venv, tmp_path, extra_env)
            started.append(server)
            server.start(TIMEOUT)
            token = installer.sign_up(server.base_url, *ADMIN)
            return Installed(server, model, Api(server.base_url, token))

        try:
            yield start
        finally:
            for server in started:
                server.stop()
                server.keep_log("open-webui-release.log")


def create_pipe(installed: Installed, content: str) -> dict[str, Any]:
    """Paste ``content`` as the pipe function, switch it on, set the valves.

    ``installer.install_pipe`` fails on any HTTP error of Open WebUI's.
    """
    client = installed.admin.rest_client()
    installer.install_pipe(client, content, pipe_valves(installed.model))
    installer.wait_for_model(client)
    return installed.admin.get(f"/api/v1/functions/id/{FUNCTION_ID}")


def let_visit_read_loopback(installed: Installed) -> dict[str, dict[str, Any]]:
    """The tools the pipe installed; the visit tool let to read 127.0.0.1."""
    tools = installed.admin.wait_for_tools(timeout=60)
    if "deepresearch_visit" in tools:
        installed.admin.post(
            "/api/v1/tools/id/deepresearch_visit/valves/update",
            {"ALLOW_PRIVATE_URLS": True},
        )
    return tools


async def research_in_saved_chat(
    installed: Installed, research: DurableResearch
) -> dict[str, Any]:
    """Ask the research question in a new saved chat; the stored answer."""
    return (await research_turn(installed, research))[1]


async def research_turn(
    installed: Installed, research: DurableResearch
) -> tuple[Turn, dict[str, Any]]:
    """Ask the research question in a new saved chat; its turn and answer."""
    installed.model.respond_with(research)
    admin = installed.admin
    async with ui_session(admin) as session:
        turn = await ask_in_new_chat(admin, session.sid, QUESTION, TIMEOUT)
        return turn, await answered(admin, session, turn)


def assert_research_answered(
    research: DurableResearch, message: dict[str, Any]
) -> None:
    """Every page read once through the visit tool; the answer cites them all."""
    content = str(message["content"])
    assert research.turns("") == list(range(PAGES + 1))
    assert research.pages_read("") == list(range(1, PAGES + 1))
    assert research.fetches() == [1] * PAGES
    assert source_urls(message) == [research.url(k) for k in range(1, PAGES + 1)]
    assert research.answer_shown() in content.splitlines(), content


def assert_valves_stored(installed: Installed) -> None:
    """The admin's valves as set (the key kept encrypted)."""
    stored = installed.admin.get(f"/api/v1/functions/id/{FUNCTION_ID}/valves")
    expected = pipe_valves(installed.model)
    expected.pop("API_KEY")
    assert {name: stored[name] for name in expected} == expected
    assert str(stored["API_KEY"]).startswith("encrypted:")


# -- the tests ---------------------------------------------------------------------


async def test_a_fresh_install_downloads_the_release_wheel_once(
    prepared_venv: Path,
    release_assets: ReleaseAssets,
    start_server: Any,
    page_site: PageSite,
) -> None:
    wheel_bytes = release_assets.wheel.read_bytes()
    wheel_path = f"/releases/download/v{release_assets.version}/"
    wheel_path += release_assets.wheel.name

    def serve_wheel(request: Request) -> Response:
        return Response(200, {"Content-Type": "application/octet-stream"}, wheel_bytes)

    uninstall(prepared_venv)
    assert installed_version(prepared_venv) is None
    with LocalServer({wheel_path: serve_wheel}) as wheels:
        content = release_assets.pipe_file(wheels.url(wheel_path))
        installed = start_server(prepared_venv, {"OFFLINE_MODE": "false", **NO_INDEX})
        function = create_pipe(installed, content)
        served = [(request.method, request.path) for request in wheels.requests]
        version_after_install = installed_version(prepared_venv)
        tools = let_visit_read_loopback(installed)
        research = DurableResearch(page_site, "releaseonline", 0, TIMEOUT)
        message = await research_in_saved_chat(installed, research)
        served_in_the_end = len(wheels.requests)

    # The file installed the release wheel from its URL, downloading it once.
    assert served == [("GET", wheel_path)]
    assert served_in_the_end == 1
    assert version_after_install == release_assets.version
    assert function["content"] == content
    assert function["is_active"] is True
    # The pipe installed its tools, the valves are the admin's, a research ran.
    assert sorted(tools) == sorted(TOOL_IDS)
    assert_valves_stored(installed)
    assert_research_answered(research, message)


async def test_an_offline_install_with_the_wheel_installed_downloads_nothing(
    prepared_venv: Path,
    release_assets: ReleaseAssets,
    start_server: Any,
    page_site: PageSite,
) -> None:
    install_wheel(prepared_venv, release_assets.wheel)
    closed_port = free_port()
    assert port_is_free(closed_port)
    wheel_url = (
        f"http://127.0.0.1:{closed_port}/releases/download/"
        f"v{release_assets.version}/{release_assets.wheel.name}"
    )
    content = release_assets.pipe_file(wheel_url)
    installed = start_server(prepared_venv, {"OFFLINE_MODE": "true", **NO_INDEX})

    # Created (an HTTP error would fail here), switched on, valves set.
    function = create_pipe(installed, content)
    tools = let_visit_read_loopback(installed)
    research = DurableResearch(page_site, "releaseoffline", 0, TIMEOUT)
    message = await research_in_saved_chat(installed, research)

    assert function["content"] == content
    assert function["is_active"] is True
    assert installed_version(prepared_venv) == release_assets.version
    assert sorted(tools) == sorted(TOOL_IDS)
    assert_valves_stored(installed)
    assert_research_answered(research, message)
