"""A chat's research outlives a killed Open WebUI, in a real Open WebUI.

A dedicated ``open-webui serve`` (its own data directory, SQLite, its own
model server; the session's server is never touched) runs the scripted
research of `durable_research`: rounds 1 to 6 each read one page through the
real visit tool, round 7 answers citing every page the conversation holds.
User A asks in a saved chat, the way the browser does. When the fake model
receives the request for round 4, Open WebUI's whole process group is killed
with SIGKILL (no shutdown of any kind); the checkpoint of rounds 1 to 3 is
then in the database. Open WebUI starts again on the same data directory, and:

- user B, created through the admin API, asks the same question in a chat of
  their own while A's progress is stored: B's research starts from round 1
  (its first request is the system prompt and the question) and runs every
  round, reading every page itself;
- A regenerates the answer, as the browser does: the research goes on from
  round 4. The model is asked for round 4 again (the round in flight at the
  kill) with the very conversation it was sent before the kill, and never for
  rounds 1 to 3; pages 1 to 3 are neither fetched nor read again; the stored
  answer says it resumed from round 4, keeps the sources numbered as they
  were read and cites page 1 (read before the kill) and page 6 (after);
- once both runs answered, no checkpoint is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import socketio

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.pages import PageSite
from tongyi_deepresearch_openwebui_pipeline.adapters.checkpoint_store import (
    TABLE_NAME,
)
from tongyi_deepresearch_openwebui_pipeline.core.phrasing import resumed_text

from .conftest import pipe_valves
from .durable_research import (
    PAGES,
    QUESTION,
    DurableResearch,
    Turn,
    ask_in_new_chat,
    difference,
    regenerate,
    source_urls,
)
from .owui import PIPE_FILE, Api, OpenWebUIServer, installer, saved_chat

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

#: Rounds 1-3 finish; the request for this one finds Open WebUI killed.
KILLED_IN_ROUND = 4
#: How long any one wait may take (a start, a run, a held request).
TIMEOUT = 240.0
ADMIN = ("Durable Admin", "durable-admin@example.com", "e2e-Passw0rd!")
SECOND_USER = ("Durable Second", "durable-second@example.com", "e2e-Passw0rd-2!")

# The phases of the test, as the fake model records them.
KILLED = "A, until the kill"
OTHER_USER = "B, after the restart"
RESUMED = "A, regenerated after the restart"


# -- the dedicated Open WebUI ------------------------------------------------------


@dataclass
class Deployment:
    """The test's own Open WebUI, its model server and its admin."""

    server: OpenWebUIServer
    model: FakeOpenAI
    admin: Api = field(default_factory=lambda: Api("", ""))

    def kill(self) -> None:
        """SIGKILL Open WebUI's whole process group, as the OOM killer would."""
        process = self.server.process
        assert process is not None
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        self.server.keep_log("open-webui-durable-killed.log")

    def checkpoints(self) -> list[tuple[str, str]]:
        """The (user id, chat id) of every checkpoint in Open WebUI's SQLite."""
        database = self.server.data_dir / "webui.db"
        exists = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        query = f"SELECT owner, chat FROM {TABLE_NAME} ORDER BY owner"  # noqa: S608
        with contextlib.closing(sqlite3.connect(database)) as connection:
            if connection.execute(exists, (TABLE_NAME,)).fetchone() is None:
                return []  # the pipe never saved anything
            return [(str(o), str(c)) for o, c in connection.execute(query)]


@pytest.fixture
def deployment(owui_venv_path: Path, tmp_path: Path) -> Iterator[Deployment]:
    """A running Open WebUI of its own: admin, pipe and visit tool set up.

    Other users may use the pipe's model (an admin-made pipe model is
    private to the admin otherwise).
    """
    with FakeOpenAI(f"Tongyi-DeepResearch-durable-{uuid.uuid4().hex[:8]}") as model:
        server = OpenWebUIServer(
            owui_venv_path, tmp_path, {"BYPASS_MODEL_ACCESS_CONTROL": "true"}
        )
        deployment = Deployment(server, model)
        try:
            server.start(TIMEOUT)
            token = installer.sign_up(server.base_url, *ADMIN)
            deployment.admin = Api(server.base_url, token)
            _install_pipe(deployment.admin, pipe_valves(model))
            yield deployment
        finally:
            server.stop()
            server.keep_log("open-webui-durable.log")


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


def _add_user(admin: Api, name: str, email: str, password: str) -> Api:
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

    def finished(self, message_id: str) -> asyncio.Event:
        """Set when the answer ``message_id`` ends (``chat:completion`` done)."""
        return self._finished.setdefault(message_id, asyncio.Event())

    async def on_event(self, data: dict[str, Any]) -> None:
        """Note each finished answer."""
        payload = data.get("data") or {}
        if payload.get("type") == "chat:completion" and (
            (payload.get("data") or {}).get("done")
        ):
            self.finished(str(data.get("message_id"))).set()


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


# -- the test ----------------------------------------------------------------------


async def test_a_research_killed_in_round_4_goes_on_after_the_restart(
    deployment: Deployment, page_site: PageSite
) -> None:
    research = DurableResearch(page_site, "durable", KILLED_IN_ROUND, TIMEOUT)
    deployment.model.respond_with(research)
    admin = deployment.admin
    owner = str(admin.get("/api/v1/auths/")["id"])
    fetches = [research.fetches()]

    # A asks; Open WebUI is killed once round 4's request reaches the model.
    research.phase = KILLED
    async with ui_session(admin) as session:
        killed = await ask_in_new_chat(admin, session.sid, QUESTION, TIMEOUT)
        reached = await asyncio.to_thread(research.held.wait, TIMEOUT)
        assert reached, deployment.server.log_tail()
        deployment.kill()
    research.release.set()
    fetches.append(research.fetches())
    assert deployment.checkpoints() == [(owner, killed.chat_id)]

    deployment.server.start(TIMEOUT)
    # B asks the same question while A's progress is stored.
    research.phase = OTHER_USER
    second = _add_user(admin, *SECOND_USER)
    async with ui_session(second) as session:
        other = await ask_in_new_chat(second, session.sid, QUESTION, TIMEOUT)
        other_answer = await answered(second, session, other)
    fetches.append(research.fetches())
    assert deployment.checkpoints() == [(owner, killed.chat_id)]

    # A regenerates the answer in the same chat: the research goes on.
    research.phase = RESUMED
    async with ui_session(admin) as session:
        resumed = await regenerate(admin, session.sid, killed, TIMEOUT)
        message = await answered(admin, session, resumed)
    fetches.append(research.fetches())
    content = str(message["content"])

    # The model was asked rounds 1-4, then 4 (the round in flight) to 7: no
    # finished round twice, and round 4 with the conversation it had.
    assert research.turns(KILLED) == [0, 1, 2, 3]
    assert research.turns(RESUMED) == [3, 4, 5, 6]
    assert research.conversations(RESUMED)[0] == research.conversations(KILLED)[3]
    # Each page fetched and read once in A's research, before or after the kill.
    assert difference(fetches[1], fetches[0]) == [1, 1, 1, 0, 0, 0]
    assert difference(fetches[3], fetches[2]) == [0, 0, 0, 1, 1, 1]
    assert research.pages_read(KILLED) == [1, 2, 3]
    assert research.pages_read(RESUMED) == [4, 5, 6]
    # The chat says it resumed, keeps the sources' numbers, and cites pages
    # read before and after the kill.
    note = resumed_text(KILLED_IN_ROUND - 1, KILLED_IN_ROUND - 1)
    assert content.splitlines()[0] == f"*{note}*", content[:500]
    assert source_urls(message) == [research.url(k) for k in range(1, PAGES + 1)]
    assert research.answer_shown() in content.splitlines(), content
    # The citation check of the resumed run quoted what the extractor recorded
    # before the kill: its one statement cites six pages, the first three
    # are asked about (one call each).
    assert research.pages_checked(RESUMED) == [1, 2, 3]
    assert research.pages_checked(KILLED) == []
    assert "\n- Citations: 1 of 1 statement supported by the pages it cites\n" in (
        content
    )
    # Both runs answered: nothing is kept.
    assert deployment.checkpoints() == []

    # B's research started from round 1 (system prompt and question only)
    # and did every round and read every page itself.
    first = research.conversations(OTHER_USER)[0]
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[1]["content"] == QUESTION
    assert research.turns(OTHER_USER) == list(range(PAGES + 1))
    assert difference(fetches[2], fetches[1]) == [1] * PAGES
    assert research.pages_read(OTHER_USER) == list(range(1, PAGES + 1))
    other_content = str(other_answer["content"])
    assert "Resuming the research" not in other_content
    assert research.answer_shown() in other_content.splitlines(), other_content
