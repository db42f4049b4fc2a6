"""Session fixtures of the scaled profile: PostgreSQL, Redis, two Open WebUI replicas.

Everything runs on 127.0.0.1: a throwaway PostgreSQL cluster and redis-server
(Debian packages; ``scripts/prepare-e2e`` installs them with apt-get as root),
the fake model server, a fake SearXNG, a local web site, and two
``open-webui serve`` processes sharing the database, Redis, the secret key and
the data folder, with pip installs from frontmatter off (the project's wheel is
already in the Open WebUI venv). The pipe is installed through replica A; then
both replicas list models at the same moment, which makes each process start
its background tool install.

Missing pieces skip the profile with the reason, except under CI (``CI`` set),
where that is a failure.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.e2e.owui import (
    PIPE_FILE,
    Api,
    OpenWebUIServer,
    ScriptedModel,
    installer,
    owui_venv,
    owui_version_tuple,
    venv_problem,
    web_search_env,
)
from tests.e2e.shared import fake_model_valves
from tests.e2e.shared import unavailable as unavailable_for
from tests.fakes.client_watch import ClientWatch
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.searxng import FakeSearXNG
from tongyi_deepresearch_openwebui_pipeline import __version__

from .cluster import Cluster, Replica, list_models_at_once
from .services import (
    PostgresServer,
    RedisServer,
    ServiceError,
    find_postgres_bindir,
    find_redis_server,
)

ADMIN_NAME = "Scaled Admin"
ADMIN_EMAIL = "scaled-admin@example.com"
ADMIN_PASSWORD = "scaled-Passw0rd!"  # a throwaway account of a temporary server
REDIS_KEY_PREFIX = "tdr-scaled"

PROJECT = "tongyi-deepresearch-openwebui-pipeline"
_INSTALLED_VERSION = (
    "from importlib.metadata import PackageNotFoundError, version\n"
    "try:\n"
    f"    print(version({PROJECT!r}))\n"
    "except PackageNotFoundError:\n"
    "    pass\n"
)

CLUSTER_KEY = pytest.StashKey[Cluster]()
TIMINGS_KEY = pytest.StashKey[dict[str, float]]()


def unavailable(reason: str) -> NoReturn:
    """Skip (or, under CI, fail) because something the profile needs is missing."""
    unavailable_for(reason, "the scaled profile")


def pipe_valves(fake_model: FakeOpenAI) -> dict[str, Any]:
    """Valves pointing the pipe at the fake model server.

    The timeouts are longer than any gate of a test holds a reply: a gate
    that is never opened fails the test as such, not as a model timeout.
    """
    return fake_model_valves(
        fake_model, api_key="sk-scaled-test-key", request_timeout=300, tool_timeout=300
    )


@pytest.fixture(scope="session")
def scaled_venv() -> Path:
    """The Open WebUI venv (0.12 or later: the scale-out features under test)."""
    venv = owui_venv()
    problem = venv_problem(venv)
    if problem:
        unavailable(problem)
    if owui_version_tuple() < (0, 12):
        pytest.skip("the scaled profile runs against Open WebUI 0.12 or later")
    # Pip installs from frontmatter are off: the pipe runs from the wheel
    # prepare-e2e installed, which must be this checkout's version.
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", _INSTALLED_VERSION],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if installed != __version__:
        unavailable(
            f"{PROJECT} {__version__} is not installed in {venv} (found "
            f"{installed or 'none'}): run `bash scripts/prepare-e2e`"
        )
    return venv


@pytest.fixture(scope="session")
def postgres(scaled_venv: Path) -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL cluster on a free loopback port."""
    bindir = find_postgres_bindir()
    if bindir is None:
        unavailable(
            "PostgreSQL (initdb, postgres, pg_isready, psql) not found: install "
            "the postgresql package (`bash scripts/prepare-e2e` does as root) "
            "or set TDR_PG_BINDIR"
        )
    try:
        server = PostgresServer(bindir)
    except ServiceError as error:
        unavailable(str(error))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis(scaled_venv: Path) -> Iterator[RedisServer]:
    """A redis-server without persistence on a free loopback port."""
    program = find_redis_server()
    if program is None:
        unavailable(
            "redis-server not found: install the redis-server package "
            "(`bash scripts/prepare-e2e` does as root) or set TDR_REDIS_SERVER"
        )
    server = RedisServer(program)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def model_watch(fake_model: FakeOpenAI) -> ClientWatch:
    """Lets the fake model server's routes see their client leave."""
    return ClientWatch(fake_model.server)


def _shared_env(
    data_dir: Path, postgres: PostgresServer, redis: RedisServer, search_url: str
) -> dict[str, str]:
    """What both replicas share, as a load-balanced deployment does."""
    return {
        **web_search_env(search_url),
        "ENABLE_RAG_LOCAL_WEB_FETCH": "true",
        "DATA_DIR": str(data_dir),
        "DATABASE_URL": postgres.url,
        "REDIS_URL": redis.url,
        "REDIS_KEY_PREFIX": REDIS_KEY_PREFIX,
        "WEBSOCKET_MANAGER": "redis",
        "ENABLE_WEBSOCKET_SUPPORT": "true",
        "ENABLE_PIP_INSTALL_FRONTMATTER_REQUIREMENTS": "false",
    }


@pytest.fixture(scope="session")
def cluster(  # noqa: PLR0917  (the fixtures it builds on)
    request: pytest.FixtureRequest,
    scaled_venv: Path,
    postgres: PostgresServer,
    redis: RedisServer,
    fake_model: FakeOpenAI,
    fake_search: FakeSearXNG,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    """Two running replicas, an admin, the pipe installed, its tools registered."""
    if not PIPE_FILE.is_file():
        pytest.fail(f"{PIPE_FILE.name} (the release asset) is missing", pytrace=False)
    workdir = tmp_path_factory.mktemp("scaled")
    shared = _shared_env(workdir / "data", postgres, redis, fake_search.search_url)
    (workdir / "data").mkdir()
    a = Replica("A", OpenWebUIServer(scaled_venv, _mkdir(workdir / "a"), shared))
    b = Replica(
        "B",
        OpenWebUIServer(
            scaled_venv,
            _mkdir(workdir / "b"),
            {**shared, "ENABLE_DB_MIGRATIONS": "false"},
        ),
    )
    timings = request.config.stash.setdefault(TIMINGS_KEY, {})
    try:
        a.server.start()
        timings["replica A start (s)"] = a.server.startup_seconds
        token = installer.sign_up(a.base_url, ADMIN_NAME, ADMIN_EMAIL, ADMIN_PASSWORD)
        a.api = Api(a.base_url, token)
        # Installed, not yet listed: no process has started its tool install.
        installer.install_pipe(
            a.api.rest_client(),
            PIPE_FILE.read_text(encoding="utf-8"),
            pipe_valves(fake_model),
        )
        b.server.start()
        timings["replica B start (s)"] = b.server.startup_seconds
        b.api = Api(b.base_url, token)
        cluster = Cluster(a, b, postgres, redis, token)
        request.config.stash[CLUSTER_KEY] = cluster
        cluster.first_listing = list_models_at_once(cluster.replicas)
        for replica in cluster.replicas:
            cluster.tools[replica.name] = replica.api.wait_for_tools(timeout=90)
        if "deepresearch_visit" in cluster.tools["A"]:
            a.api.post(
                "/api/v1/tools/id/deepresearch_visit/valves/update",
                {"ALLOW_PRIVATE_URLS": True},
            )
        cluster.setup_marks = cluster.log_marks()
        yield cluster
    finally:
        for replica in (b, a):
            replica.server.stop()
            replica.server.keep_log(f"open-webui-scaled-{replica.name}.log")


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def model(cluster: Cluster, fake_model: FakeOpenAI) -> Iterator[ScriptedModel]:
    """A fresh script for the fake model server (nothing recorded yet)."""
    fake_model.replies.clear()
    fake_model.bodies.clear()
    fake_model.server.requests.clear()
    scripted = ScriptedModel(fake_model)
    yield scripted
    fake_model.responder = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Attach the tail of both replicas' logs to every failed scaled test."""
    report = yield
    cluster = item.config.stash.get(CLUSTER_KEY, None)
    if report.failed and cluster is not None:
        for replica in cluster.replicas:
            report.sections.append(
                (f"replica {replica.name} log (tail)", replica.server.log_tail(60))
            )
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print how long the replicas took to start."""
    timings = config.stash.get(TIMINGS_KEY, None)
    if not timings:
        return
    terminalreporter.section("scaled e2e timings")
    for name, seconds in timings.items():
        terminalreporter.write_line(f"{name}: {seconds:.1f}")
