"""A dedicated Open WebUI to kill and start again, for the durable-research tests.

tests/e2e/test_durable.py (the research resumes when the user regenerates)
and tests/e2e/test_continued.py (it goes on by itself) each run their own
``open-webui serve`` (its own data directory, SQLite, its own model server;
the session's server is never touched):

- `deployed` starts it with an admin, the pipe (with the test's valves) and
  the visit tool let to read 127.0.0.1; `Deployment.kill` SIGKILLs its whole
  process group, as the OOM killer would; `Deployment.rows` reads a table
  of the pipe's in Open WebUI's SQLite (checkpoints, leases);
- `add_user` makes a second user through the admin API;
- `ui_session` is a browser's socket.io session, noting each answer it saw
  finish; `answered` reads an answer back once it finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import socketio

from tests.fakes.openai_server import FakeOpenAI
from tongyi_deepresearch_openwebui_pipeline.adapters import (
    checkpoint_store,
    run_leases,
)

from .durable_research import Turn
from .owui import PIPE_FILE, Api, OpenWebUIServer, installer, saved_chat

#: How long any one wait may take (a start, a run, a held request).
TIMEOUT = 240.0


@dataclass
class Deployment:
    """The test's own Open WebUI, its model server and its admin."""

    server: OpenWebUIServer
    model: FakeOpenAI
    #: Names the kept logs (``open-webui-<name>.log``).
    name: str
    admin: Api = field(default_factory=lambda: Api("", ""))

    def kill(self) -> None:
        """SIGKILL Open WebUI's whole process group, as the OOM killer would."""
        process = self.server.process
        assert process is not None
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        self.server.keep_log(f"open-webui-{self.name}-killed.log")

    def checkpoints(self) -> list[tuple[str, str]]:
        """The (user id, chat id) of every checkpoint in Open WebUI's SQLite."""
        return self.rows(checkpoint_store.TABLE_NAME)

    def leases(self) -> list[tuple[str, str]]:
        """The (user id, chat id) of every run's lease in Open WebUI's SQLite."""
        return self.rows(run_leases.TABLE_NAME)

    def rows(self, table: str) -> list[tuple[str, str]]:
        """The (user id, chat id) of every row of ``table`` in Open WebUI's SQLite."""
        database = self.server.data_dir / "webui.db"
        exists = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        query = f"SELECT owner, chat FROM {table} ORDER BY owner"  # noqa: S608
        with contextlib.closing(sqlite3.connect(database)) as connection:
            if connection.execute(exists, (table,)).fetchone() is None:
                return []  # the pipe never wrote one
            return [(str(o), str(c)) for o, c in connection.execute(query)]


@contextlib.contextmanager
def deployed(
    venv: Path,
    workdir: Path,
    name: str,
    valves: Callable[[FakeOpenAI], dict[str, Any]],
    admin: tuple[str, str, str],
) -> Iterator[Deployment]:
    """A running Open WebUI of its own: admin, pipe and visit tool set up.

    Other users may use the pipe's model (an admin-made pipe model is
    private to the admin otherwise).
    """
    with FakeOpenAI(f"Tongyi-DeepResearch-{name}-{uuid.uuid4().hex[:8]}") as model:
        server = OpenWebUIServer(venv, workdir, {"BYPASS_MODEL_ACCESS_CONTROL": "true"})
        deployment = Deployment(server, model, name)
        try:
            server.start(TIMEOUT)
            token = installer.sign_up(server.base_url, *admin)
            deployment.admin = Api(server.base_url, token)
            _install_pipe(deployment.admin, valves(model))
            yield deployment
        finally:
            server.stop()
            server.keep_log(f"open-webui-{name}.log")


def _install_pipe(api: Api, valves: dict[str, Any]) -> None:
    """The pipe, as a user installs it, and the visit tool let to read 127.0.0.1."""
    client = api.rest_client()
    installer.install_pipe(client, PIPE_FILE.read_text(encoding="utf-8"), valves)
    installer.wait_for_model(client)
    tools = api.wait_for_tools(timeout=60)
    if "deepresearch_visit" not in tools:
        pytest.fail(f"the visit tool was not installed (tools: {sorted(tools)})")
    api.post(
        "/api/v1/tools/id/deepresearch_visit/valves/update",
        {"ALLOW_PRIVATE_URLS": True},
    )


def add_user(admin: Api, name: str, email: str, password: str) -> Api:
    """A new user (role user) made through the admin API, signed in."""
    admin.post(
        "/api/v1/auths/add",
        {"name": name, "email": email, "password": password, "role": "user"},
    )
    return Api(admin.base_url, installer.sign_in(admin.base_url, email, password))


# -- the browser's side ------------------------------------------------------------


class UiSession:
    """A browser's socket.io session: which answers it saw finish."""

    def __init__(self) -> None:
        """No session id until connected."""
        self.sid = ""
        self._finished: dict[str, asyncio.Event] = {}
        #: The ``content`` of each answer's end (``chat:completion`` done).
        self.final: dict[str, Any] = {}

    def finished(self, message_id: str) -> asyncio.Event:
        """Set when the answer ``message_id`` ends (``chat:completion`` done)."""
        return self._finished.setdefault(message_id, asyncio.Event())

    async def on_event(self, data: dict[str, Any]) -> None:
        """Note each finished answer."""
        payload = data.get("data") or {}
        update = payload.get("data") or {}
        if payload.get("type") == "chat:completion" and update.get("done"):
            message_id = str(data.get("message_id"))
            self.final[message_id] = update.get("content")
            self.finished(message_id).set()


@contextlib.asynccontextmanager
async def ui_session(api: Api) -> AsyncIterator[UiSession]:
    """A socket.io session of ``api``'s user, joined to the user's room."""
    session = UiSession()
    sio = socketio.AsyncClient(reconnection=False)
    sio.on("events", session.on_event)
    await sio.connect(
        api.base_url,
        socketio_path="/ws/socket.io",
        auth={"token": api.token},
        transports=["websocket"],
        wait_timeout=20,
    )
    try:
        await sio.call("user-join", {"auth": {"token": api.token}}, timeout=20)
        session.sid = str(sio.get_sid())
        yield session
    finally:
        await sio.disconnect()


async def answered(api: Api, session: UiSession, turn: Turn) -> dict[str, Any]:
    """The saved answer of ``turn`` once it has ended (bounded)."""
    await asyncio.wait_for(session.finished(turn.message_id).wait(), TIMEOUT)
    chat = await saved_chat(api, turn.chat_id, turn.message_id, timeout=30)
    return chat["chat"]["history"]["messages"][turn.message_id]
