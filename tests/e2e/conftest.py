"""Session fixtures: one real Open WebUI for the whole e2e session, plus fakes.

Everything runs on 127.0.0.1: the fake model server (`FakeOpenAI`, which also
answers the visit tool's extractor calls), a fake SearXNG, a local web site
(HTML and PDF pages) and ``open-webui serve`` itself. The pipe is installed
the way a user installs it: the content of ``tongyi_deepresearch_pipe.py``
pasted as a new Function over the REST API, switched on, valves filled in.

When the Open WebUI venv is missing the whole suite is skipped, except under
CI (``CI`` set), where that is a failure.
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.scholarly import FakeScholarly
from tests.fakes.searxng import FakeSearXNG

from .owui import (
    PIPE_FILE,
    ROOT,
    Api,
    OpenWebUIServer,
    ScriptedModel,
    installer,
    owui_venv,
    venv_problem,
    web_search_env,
)
from .release import (
    Installed,
    ReleaseAssets,
    build_assets,
    install_wheel,
    installed_version,
    start_installed,
)
from .shared import pipe_valves, unavailable

ADMIN_NAME = "E2E Admin"
ADMIN_EMAIL = "admin@example.com"
ADMIN_PASSWORD = "e2e-Passw0rd!"  # a throwaway account of a temporary server

SERVER_KEY = pytest.StashKey[OpenWebUIServer]()
TIMINGS_KEY = pytest.StashKey[dict[str, float]]()


@dataclass
class OwuiSession:
    """The running Open WebUI and what the session set up in it."""

    server: OpenWebUIServer
    api: Api
    venv: Path
    #: Registry entries of the DeepResearch tools found after installing the pipe.
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Why the visit tool cannot read the local site ('' when it can).
    visit_setup_problem: str = ""

    @property
    def base_url(self) -> str:
        """Where Open WebUI listens."""
        return self.server.base_url

    @property
    def token(self) -> str:
        """The admin's bearer token."""
        return self.api.token


@pytest.fixture(scope="session")
def owui_venv_path() -> Path:
    """The Open WebUI venv (skip the suite, or fail under CI, when missing)."""
    venv = owui_venv()
    problem = venv_problem(venv)
    if problem:
        unavailable(problem)
    return venv


def _set_up_tools(api: Api, session: OwuiSession) -> None:
    """Let the visit tool read the local site (it refuses loopback by default)."""
    # The pipe registers them in the background: ~1 s on 0.12.4, ~13 s on 0.6.43.
    session.tools = api.wait_for_tools(timeout=60)
    if "deepresearch_visit" not in session.tools:
        session.visit_setup_problem = (
            "deepresearch_visit is not in Open WebUI's tool registry, so its "
            "ALLOW_PRIVATE_URLS valve cannot be set and the local pages are refused"
        )
        return
    api.post(
        "/api/v1/tools/id/deepresearch_visit/valves/update",
        {"ALLOW_PRIVATE_URLS": True},
    )


@pytest.fixture(scope="session")
def owui(
    request: pytest.FixtureRequest,
    owui_venv_path: Path,
    fake_model: FakeOpenAI,
    fake_search: FakeSearXNG,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OwuiSession]:
    """A running Open WebUI with an admin, the pipe and web search set up."""
    if not PIPE_FILE.is_file():
        pytest.fail(f"{PIPE_FILE.name} (the release asset) is missing", pytrace=False)
    server = OpenWebUIServer(
        owui_venv_path,
        tmp_path_factory.mktemp("owui"),
        # Open WebUI's own page loader may read the local site (the name of the
        # setting before 0.11, which later versions still read).
        {
            **web_search_env(fake_search.search_url),
            "ENABLE_RAG_LOCAL_WEB_FETCH": "true",
        },
    )
    request.config.stash[SERVER_KEY] = server
    timings = request.config.stash.setdefault(TIMINGS_KEY, {})
    try:
        server.start()
        timings["Open WebUI start (s)"] = server.startup_seconds
        started = time.monotonic()
        token = installer.sign_up(
            server.base_url, ADMIN_NAME, ADMIN_EMAIL, ADMIN_PASSWORD
        )
        api = Api(server.base_url, token)
        client = api.rest_client()
        content = PIPE_FILE.read_text(encoding="utf-8")
        installer.install_pipe(client, content, pipe_valves(fake_model))
        installer.wait_for_model(client)
        session = OwuiSession(server, api, owui_venv_path)
        _set_up_tools(api, session)
        timings["pipe install + setup (s)"] = time.monotonic() - started
        yield session
    finally:
        server.stop()
        server.keep_log()


@pytest.fixture
def model(owui: OwuiSession, fake_model: FakeOpenAI) -> Iterator[ScriptedModel]:
    """A fresh script for the fake model server (nothing recorded yet)."""
    fake_model.replies.clear()
    fake_model.bodies.clear()
    fake_model.server.requests.clear()
    scripted = ScriptedModel(fake_model)
    yield scripted
    fake_model.responder = None


@pytest.fixture
def search(owui: OwuiSession, fake_search: FakeSearXNG) -> FakeSearXNG:
    """The fake SearXNG with no scripts and no recorded requests."""
    fake_search.reset()
    return fake_search


@pytest.fixture
def scholar_apis(owui: OwuiSession, apis: FakeScholarly) -> Iterator[FakeScholarly]:
    """The scholar tool searching the fake OpenAlex (its valves put back after).

    Its default backend is api.openalex.org; the tests reach only 127.0.0.1.
    """
    if "deepresearch_scholar" not in owui.tools:
        pytest.fail("deepresearch_scholar is not in Open WebUI's tool registry")
    valves = "/api/v1/tools/id/deepresearch_scholar/valves/update"
    owui.api.post(valves, {"OPENALEX_URL": apis.openalex_url})
    try:
        yield apis
    finally:
        owui.api.post(valves, {})


# -- release assets and servers of a test's own (test_release_*) ---------------


@pytest.fixture(scope="session")
def release_assets(tmp_path_factory: pytest.TempPathFactory) -> ReleaseAssets:
    """This checkout's release assets, built once for the session."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    out_dir = tmp_path_factory.mktemp("release-assets")
    return build_assets(ROOT, out_dir, pyproject["project"]["version"])


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


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., Installed]]:
    """Start an Open WebUI of the test's own (stopped after the test).

    Called with the venv and the extra environment; one model server for all.
    """
    started: list[OpenWebUIServer] = []
    with FakeOpenAI("Tongyi-DeepResearch-release") as model:

        def start(venv: Path, extra_env: dict[str, str]) -> Installed:
            return start_installed(venv, tmp_path, model, extra_env, started)

        try:
            yield start
        finally:
            for server in started:
                server.stop()
                server.keep_log("open-webui-release.log")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Attach the tail of Open WebUI's log to every failed e2e test."""
    report = yield
    server = item.config.stash.get(SERVER_KEY, None)
    if report.failed and server is not None:
        report.sections.append(("open-webui log (tail)", server.log_tail(80)))
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print how long Open WebUI took to start."""
    timings = config.stash.get(TIMINGS_KEY, None)
    if not timings:
        return
    terminalreporter.section("e2e timings")
    for name, seconds in timings.items():
        terminalreporter.write_line(f"{name}: {seconds:.1f}")
