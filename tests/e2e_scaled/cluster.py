"""Two Open WebUI replicas sharing one PostgreSQL, one Redis and one data folder.

Replica A starts first and runs the database migrations (Open WebUI runs them
at import without a lock, so two processes migrating an empty database at once
race and one dies); B starts once A is ready, with migrations off. Both then
share everything a load-balanced deployment shares: the database, Redis (the
socket.io manager, task list and stop commands), the secret key and the data
folder. The browser side of a chat is a socket.io session, authenticated on
the replica it connects to (``SocketWatch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import socketio

from tests.e2e.owui import (
    FUNCTION_ID,
    PIPE_MODEL_ID,
    Api,
    ApiError,
    OpenWebUIServer,
    item_text,
    post_ui_chat,
    ui_chat_request,
)

from .services import PostgresServer, RedisServer

#: Lines of a replica's log that show something went wrong in the server.
#: Open WebUI logs "<time> | LEVEL | logger:function:line - message"; uvicorn
#: writes "ERROR:" at the start of its lines; the pipe's registry writes
#: "could not install tool …".
ERROR_LINE = re.compile(
    r"\|\s*(ERROR|CRITICAL)\s*\||^(ERROR|CRITICAL):|Traceback \(most recent call last\)"
    r"|could not install",
    re.MULTILINE,
)


@dataclass
class Replica:
    """One ``open-webui serve`` process of the cluster."""

    name: str
    server: OpenWebUIServer
    api: Api = field(default_factory=lambda: Api("", ""))

    @property
    def base_url(self) -> str:
        """Where this replica listens."""
        return self.server.base_url

    @property
    def log_path(self) -> Path:
        """This replica's log file."""
        return self.server.log_path

    def log_size(self) -> int:
        """The log's length in bytes now (a mark for `error_lines`)."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_text(self, since: int = 0, until: int | None = None) -> str:
        """The log from byte ``since`` on (up to byte ``until``)."""
        with self.log_path.open("rb") as log:
            log.seek(since)
            data = log.read() if until is None else log.read(max(0, until - since))
        return data.decode("utf-8", "replace")

    def error_lines(self, since: int = 0, until: int | None = None) -> list[str]:
        """Lines of the log (bytes ``since`` to ``until``) that report an error."""
        return [
            line
            for line in self.log_text(since, until).splitlines()
            if ERROR_LINE.search(line)
        ]


@dataclass
class Cluster:
    """The two replicas and what they share."""

    a: Replica
    b: Replica
    postgres: PostgresServer
    redis: RedisServer
    #: The admin's token (valid on both replicas: one secret key, one database).
    token: str
    #: What each replica's ``GET /api/models`` listed in the first, concurrent call.
    first_listing: dict[str, list[str]] = field(default_factory=dict)
    #: Registry entries of the tools as each replica lists them.
    tools: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    #: Each replica's log size when the cluster was set up (start + install).
    setup_marks: dict[str, int] = field(default_factory=dict)

    @property
    def replicas(self) -> tuple[Replica, Replica]:
        """A and B."""
        return (self.a, self.b)

    def other(self, replica: Replica) -> Replica:
        """The replica that is not ``replica``."""
        return self.b if replica is self.a else self.a

    def log_marks(self) -> dict[str, int]:
        """Each replica's log size now."""
        return {r.name: r.log_size() for r in self.replicas}

    def errors_since(self, marks: Mapping[str, int]) -> dict[str, list[str]]:
        """Error lines each replica logged since ``marks`` (empty lists if none)."""
        return {r.name: r.error_lines(marks.get(r.name, 0)) for r in self.replicas}

    def restart(self, label: str) -> None:
        """Stop both replicas, then start A (it migrates) and B once A is ready.

        Each replica's log so far is kept as an artifact named with ``label``;
        the restarted processes write fresh logs (``setup_marks`` then no
        longer apply to them).
        """
        for replica in (self.b, self.a):
            replica.server.stop()
        for replica in self.replicas:
            replica.server.keep_log(f"open-webui-scaled-{replica.name}-{label}.log")
        for replica in self.replicas:
            replica.server.start()


class SocketWatch:
    """A browser's socket.io session on one replica, recording every event."""

    def __init__(self, replica: Replica, token: str) -> None:
        """Prepare (not connect) a session on ``replica``."""
        self.replica = replica
        self.token = token
        self.events: list[dict[str, Any]] = []
        self.sio = socketio.AsyncClient(reconnection=False)
        self.sio.on("events", self._on_event)
        self.sio.on("disconnect", self._on_disconnect)
        self._changed = asyncio.Event()
        #: (monotonic time, reason) of each disconnect the client saw.
        self.disconnects: list[tuple[float, Any]] = []
        self.joined_at = 0.0
        #: The server's answer to ``user-join`` (the user's id and name).
        self.joined: Any = None

    async def _on_disconnect(self, reason: Any = None) -> None:
        self.disconnects.append((time.monotonic(), reason))
        self._changed.set()

    async def _on_event(self, data: dict[str, Any]) -> None:
        self.events.append(data)
        self._changed.set()

    async def __aenter__(self) -> SocketWatch:
        """Connect, authenticated, and join the user's room (acknowledged)."""
        await self.sio.connect(
            self.replica.base_url,
            socketio_path="/ws/socket.io",
            auth={"token": self.token},
            transports=["websocket"],
            wait_timeout=30,
        )
        # The ack means the server has put this session in the user's room:
        # no event sent after it can miss this session.
        self.joined = await self.sio.call(
            "user-join", {"auth": {"token": self.token}}, timeout=60
        )
        if not self.joined:
            await self.sio.disconnect()
            raise AssertionError(f"replica {self.replica.name} refused user-join")
        self.joined_at = time.monotonic()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Disconnect."""
        with contextlib.suppress(Exception):
            await self.sio.disconnect()

    @property
    def sid(self) -> str:
        """The session id (``session_id`` of a chat request)."""
        return str(self.sio.get_sid())

    def of_chat(self, chat_id: str) -> list[dict[str, Any]]:
        """The events of one chat, in arrival order."""
        return [e for e in self.events if e.get("chat_id") == chat_id]

    def types(self, chat_id: str) -> list[str]:
        """The ``data.type`` of each event of one chat."""
        return [str((e.get("data") or {}).get("type")) for e in self.of_chat(chat_id)]

    def shows(self, text: str) -> bool:
        """Whether ``text`` streamed to this session, in one piece or spread out.

        Open WebUI sends an output item's text as a ``chat:completion``
        snapshot of the whole output followed by ``response:completion``
        deltas, and where it cuts depends on timing: the text can start in a
        snapshot and end three deltas later. So each item's text is rebuilt
        from the latest snapshot plus the deltas after it
        (`streamed_texts`); any other event (a status line, an error) is
        searched as it is.
        """
        if any(text in streamed for streamed in self.streamed_texts().values()):
            return True
        return any(text in json.dumps(e, ensure_ascii=False) for e in self.events)

    def streamed_texts(self) -> dict[str, str]:
        """Each streamed output item's text so far, by item id."""
        texts: dict[str, str] = {}
        for event in self.events:
            payload = event.get("data") or {}
            data = payload.get("data")
            if not isinstance(data, dict):
                continue
            if payload.get("type") == "chat:completion" and isinstance(
                data.get("output"), list
            ):
                for item in data["output"]:
                    if isinstance(item, dict) and "id" in item:
                        texts[str(item["id"])] = item_text(item)
            elif payload.get("type") == "response:completion" and isinstance(
                data.get("delta"), str
            ):
                item_id = str(data.get("item_id"))
                texts[item_id] = texts.get(item_id, "") + data["delta"]
        return texts

    async def wait_for(
        self, predicate: Callable[[SocketWatch], bool], timeout: float, what: str
    ) -> None:
        """Wait until ``predicate(self)`` holds (checked on every event)."""

        async def waiting() -> None:
            while not predicate(self):
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(waiting(), timeout)
        except TimeoutError:
            raise AssertionError(
                f"{what}: not seen on the socket of replica {self.replica.name} "
                f"within {timeout:.0f} s ({self.diagnosis()})"
            ) from None

    def diagnosis(self) -> str:
        """The session's state, for a failure message."""
        chats = sorted({str(e.get("chat_id")) for e in self.events})
        return (
            f"sid {self.sio.get_sid()!r}, connected {self.sio.connected}, "
            f"transport {self.sio.transport()!r}, disconnects "
            f"{[(round(t - self.joined_at, 1), r) for t, r in self.disconnects]} "
            f"(s after join), {len(self.events)} events of chats {chats}"
        )


async def start_chat(
    replica: Replica,
    token: str,
    session_id: str,
    question: str,
    model: str = PIPE_MODEL_ID,
) -> tuple[str, str]:
    """Start a UI chat on ``replica`` as the browser does; (chat id, message id).

    The server creates the chat (0.11+), runs the completion in the
    background and streams it to ``session_id`` (a socket session on any
    replica).
    """
    message_id = str(uuid.uuid4())
    _, body = ui_chat_request(
        question,
        model=model,
        session_id=session_id,
        message_id=message_id,
        background_tasks=("title_generation", "tags_generation"),
    )
    label = f"chat on {replica.name}"
    answer = await post_ui_chat(replica.base_url, token, body, 120, label)
    if not answer.get("chat_id"):
        raise ApiError(f"{label}: not run in the background: {answer}")
    return str(answer["chat_id"]), message_id


async def saved_message(
    api: Api, chat_id: str, message_id: str, timeout: float = 60.0
) -> dict[str, Any]:
    """The assistant message once it is saved as done (read through ``api``)."""
    deadline = time.monotonic() + timeout
    while True:
        chat = await asyncio.to_thread(api.get_chat, chat_id)
        message = chat["chat"]["history"]["messages"].get(message_id) or {}
        if message.get("done") or time.monotonic() > deadline:
            return message
        await asyncio.sleep(0.25)


def list_models_at_once(replicas: tuple[Replica, Replica]) -> dict[str, list[str]]:
    """``GET /api/models`` on both replicas at the same moment.

    Each replica loads the pipe's module first (its valves schema needs it,
    and reading it does not list models), so both listings reach the pipe's
    ``pipes()``, which starts the tool install, at once.
    """
    for replica in replicas:
        replica.api.get(f"/api/v1/functions/id/{FUNCTION_ID}/valves/spec")
    start = threading.Barrier(len(replicas))

    def listing(replica: Replica) -> list[str]:
        start.wait(60)
        return [str(model["id"]) for model in replica.api.models()]

    with ThreadPoolExecutor(len(replicas)) as pool:
        results = list(pool.map(listing, replicas))
    return {r.name: ids for r, ids in zip(replicas, results, strict=True)}
