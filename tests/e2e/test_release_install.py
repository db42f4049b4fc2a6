"""A fresh install from the release assets alone, in a real Open WebUI.

The assets are built once per session with ``scripts/build_release.py``
(wheel, sdist, the pipe file with its wheel URL, the tool files; the
``release_assets`` fixture). Each test runs an ``open-webui serve`` of its own
(its own data directory and model server; `release.start_installed`), with
``PIP_OPTIONS=--no-index`` (Open WebUI's own pip options, which the pipe file
uses too): the wheel's dependencies are in the venv already, so pip looks
nothing up on an index.

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

from pathlib import Path
from typing import Any

import pytest

from tests.fakes.http import LocalServer, Request, Response
from tests.fakes.pages import PageSite

from .durable_deployment import TIMEOUT
from .durable_research import DurableResearch
from .owui import TOOL_IDS, free_port, port_is_free
from .release import (
    NO_INDEX,
    ReleaseAssets,
    assert_research_answered,
    assert_valves_stored,
    create_pipe,
    install_wheel,
    installed_version,
    let_visit_read_loopback,
    research_in_saved_chat,
    uninstall,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


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
