"""Release assets in a real Open WebUI: build them, install them, research.

Shared by the fresh-install and upgrade tests (their fixtures are in
conftest.py): `build_assets` runs a checkout's scripts/build_release.py as
the release workflow does; the venv helpers run the Open WebUI venv's own
pip with no index (everything the wheel needs is in the venv already);
`start_installed` runs an ``open-webui serve`` of the test's own (its own data
directory and model server; `durable_deployment`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fakes.openai_server import FakeOpenAI

from .durable_deployment import TIMEOUT, answered, ui_session
from .durable_research import (
    PAGES,
    QUESTION,
    DurableResearch,
    Turn,
    ask_in_new_chat,
    source_urls,
)
from .owui import FUNCTION_ID, Api, OpenWebUIServer, installer
from .shared import pipe_valves

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


def build_assets(root: Path, out_dir: Path, version: str) -> ReleaseAssets:
    """Run ``root``'s scripts/build_release.py into ``out_dir``.

    Its first line of output is the wheel, which must be ``version``'s.
    """
    completed = subprocess.run(
        [
            sys.executable,
            str(root / "scripts" / "build_release.py"),
            "--out-dir",
            str(out_dir),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    wheel = Path(completed.stdout.splitlines()[0])
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


# -- a server of the test's own ------------------------------------------------------


@dataclass
class Installed:
    """A running Open WebUI, its model server and its admin."""

    server: OpenWebUIServer
    model: FakeOpenAI
    admin: Api


def start_installed(
    venv: Path,
    data_dir: Path,
    model: FakeOpenAI,
    extra_env: dict[str, str],
    started: list[OpenWebUIServer],
) -> Installed:
    """Start ``open-webui serve`` (listed in ``started``) and sign the admin up."""
    server = OpenWebUIServer(venv, data_dir, extra_env)
    started.append(server)
    server.start(TIMEOUT)
    token = installer.sign_up(server.base_url, *ADMIN)
    return Installed(server, model, Api(server.base_url, token))


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
