"""README's start command: ``bash scripts/serve`` from start to Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.openai_server import FakeOpenAI, Reply, answer

from .owui import (
    PIPE_MODEL_ID,
    ROOT,
    Api,
    ScriptedModel,
    free_port,
    hermetic_env,
    installer,
    log_tail,
    port_is_free,
    stream_chat,
)

pytestmark = pytest.mark.e2e

SERVE = ROOT / "scripts" / "serve"
READY_LINE = "Open WebUI is running at"
API_KEY = "sk-serve-test-key"


@pytest.fixture
def serve_model(fake_model: FakeOpenAI) -> Iterator[ScriptedModel]:
    """The fake model server with a fresh script (no Open WebUI session needed)."""
    fake_model.bodies.clear()
    fake_model.server.requests.clear()
    yield ScriptedModel(fake_model)
    fake_model.responder = None


def _wait_for_line(process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while READY_LINE not in log.read_text(errors="replace"):
        if process.poll() is not None:
            pytest.fail(
                f"scripts/serve exited ({process.returncode}):\n{log_tail(log)}"
            )
        if time.monotonic() > deadline:
            pytest.fail(
                f"scripts/serve not ready after {timeout:.0f} s:\n{log_tail(log)}"
            )
        time.sleep(0.5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_serve_installs_the_pipe_then_stops_on_ctrl_c(
    owui_venv_path: Path, serve_model: ScriptedModel, tmp_path: Path
) -> None:
    port = free_port()
    data_dir = tmp_path / "data"
    env = hermetic_env(data_dir)
    del env["WEBUI_SECRET_KEY"]  # serve keeps its own per data directory
    env.update(
        {
            "PORT": str(port),
            "TDR_OWUI_VENV": str(owui_venv_path),
            "TONGYI_API_BASE_URL": serve_model.fake.base_url,
            "TONGYI_API_KEY": API_KEY,
            "TONGYI_MODEL_ID": serve_model.fake.model,
        }
    )
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", str(SERVE), "--no-prepare"],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        await asyncio.to_thread(_wait_for_line, process, log, 300)
        url = f"http://127.0.0.1:{port}"
        assert url in log.read_text()

        # No sign-in page: Open WebUI's single admin is used without a password.
        token = installer.sign_in(url, "admin@localhost", "admin")
        api = Api(url, token)
        assert PIPE_MODEL_ID in [model["id"] for model in api.models()]
        valves = api.get(f"/api/v1/functions/id/{installer.FUNCTION_ID}/valves")
        assert valves["API_BASE_URL"] == serve_model.fake.base_url
        assert valves["MODEL_ID"] == serve_model.fake.model
        assert valves["API_KEY"] != API_KEY  # kept encrypted at rest
        assert API_KEY not in log.read_text()

        serve_model.conversation(
            "served", Reply(reasoning="Simple.", content=answer("Served answer: 42."))
        )
        stream = await stream_chat(url, token, "A served question?")
        assert "Served answer: 42." in stream.content
        assert len(serve_model.bodies("served")) == 1
        assert (
            serve_model.fake.requests[-1].headers["authorization"]
            == f"Bearer {API_KEY}"
        )

        # Data stays in DATA_DIR, nothing in the working directory.
        assert (data_dir / "webui.db").is_file()
        assert (data_dir / ".webui_secret_key").is_file()
        assert not (tmp_path / ".webui_secret_key").exists()

        process.send_signal(signal.SIGINT)  # Ctrl-C
        returncode = await asyncio.to_thread(process.wait, 60)
        assert returncode == 0, log_tail(log)
        assert "Open WebUI stopped" in log.read_text()
        assert not _group_alive(process.pid), "a process of scripts/serve outlived it"
        assert port_is_free(port)
    finally:
        if process.poll() is None or _group_alive(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
