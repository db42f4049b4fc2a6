"""Harness for the end-to-end tests: a real Open WebUI, driven like a user would.

- `OpenWebUIServer` starts ``open-webui serve`` on 127.0.0.1 from the Open WebUI
  venv with a hermetic environment (temporary data directory, offline, no
  model providers), waits until it is ready, keeps its log in a file and stops
  its whole process group.
- `Api` is a small REST client (admin token) for the calls the tests make.
- `stream_chat` runs an inline streamed chat (``POST /api/chat/completions``),
  `ui_chat` runs a chat the way the browser does (socket.io session, chat
  saved server side) and reads it back; `started_ui_chat` starts one and
  lets the test act while it runs (Stop it: `LiveChat.stop`).
- `ScriptedModel` routes the fake model server's requests: research turns by
  conversation (a key in the question) and turn number, the visit tool's
  extractor calls (non-streaming) to a separate answer, the citation check's
  verdict calls (told apart by their system message) to another.
- ``search_block`` / ``visit_block`` / ``tool_response`` write the reference
  tool output formats (tongyi-protocol.md §3), to compare with what the model
  received.

The pipe is installed with ``scripts/install_pipe.py``, the same code
``scripts/serve`` uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import socketio

from tests.fakes.openai_server import FakeOpenAI, Reply
from tongyi_deepresearch_openwebui_pipeline.core.citation_check import (
    VERDICT_SYSTEM_PROMPT,
)
from tongyi_deepresearch_openwebui_pipeline.core.parallelmuse import (
    CONVERGE_SYSTEM_PROMPT,
)

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".e2e-artifacts"
PIPE_FILE = ROOT / "tongyi_deepresearch_pipe.py"
DEFAULT_OWUI_VERSION = "0.12.4"
TOOL_IDS = ("deepresearch_search", "deepresearch_scholar", "deepresearch_visit")
SECRET_KEY = "e2e-secret-key-not-for-production"  # a throwaway test key

# What a real user's environment must not leak into the hermetic server.
_PASSED_THROUGH = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")


def _load_installer() -> ModuleType:
    """scripts/install_pipe.py as a module (scripts/ is not a package)."""
    name = "tdr_install_pipe"
    if name in sys.modules:
        return sys.modules[name]
    path = ROOT / "scripts" / "install_pipe.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


installer = _load_installer()
PIPE_MODEL_ID: str = installer.PIPE_MODEL_ID
HEAVY_MODEL_ID: str = installer.HEAVY_MODEL_ID
FUNCTION_ID: str = installer.FUNCTION_ID


# -- the Open WebUI venv ---------------------------------------------------------


def owui_version() -> str:
    """The Open WebUI version under test (``OPEN_WEBUI_VERSION``)."""
    return os.environ.get("OPEN_WEBUI_VERSION") or DEFAULT_OWUI_VERSION


def owui_venv() -> Path:
    """The Open WebUI venv: ``TDR_OWUI_VENV``, else the one prepare-e2e makes."""
    explicit = os.environ.get("TDR_OWUI_VENV")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    home = os.environ.get("TDR_OWUI_HOME") or str(Path(cache) / "tdr-owui")
    return Path(home) / f"owui-{owui_version()}"


def venv_problem(venv: Path) -> str:
    """Why the venv cannot run Open WebUI ('' when it can)."""
    if not (venv / "bin" / "open-webui").is_file():
        return (
            f"no Open WebUI installed at {venv} "
            "(run `bash scripts/prepare-e2e` or set TDR_OWUI_VENV)"
        )
    return ""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def hermetic_env(data_dir: Path, extra: Mapping[str, str] | None = None) -> dict:
    """Environment for a server that touches nothing outside ``data_dir``.

    No model providers, no update checks, no downloads, no embedding model
    (its endpoint is the discard port, so file uploads keep their text and
    fail fast at embedding), local pages allowed for Open WebUI's loader.
    """
    env = {key: os.environ[key] for key in _PASSED_THROUGH if key in os.environ}
    env.update(
        {
            "DATA_DIR": str(data_dir),
            "WEBUI_SECRET_KEY": SECRET_KEY,
            "OFFLINE_MODE": "true",
            "HF_HUB_OFFLINE": "1",
            "ENABLE_VERSION_UPDATE_CHECK": "false",
            "ENABLE_OLLAMA_API": "false",
            "ENABLE_OPENAI_API": "false",
            # Older versions list an "arena-model" next to the pipe otherwise.
            "ENABLE_EVALUATION_ARENA_MODELS": "false",
            "RAG_EMBEDDING_ENGINE": "openai",
            "RAG_OPENAI_API_BASE_URL": "http://127.0.0.1:9/v1",
            "RAG_OPENAI_API_KEY": "unused",
            "ENABLE_LOCAL_WEB_FETCH": "true",
            "ENABLE_RAG_LOCAL_WEB_FETCH": "true",
            "BYPASS_WEB_SEARCH_EMBEDDING_AND_RETRIEVAL": "true",
            "ANONYMIZED_TELEMETRY": "false",
            "SCARF_NO_ANALYTICS": "true",
            "DO_NOT_TRACK": "true",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    return env


def web_search_env(searxng_search_url: str, count: int = 3) -> dict[str, str]:
    """Environment that points Open WebUI's web search at a SearXNG instance.

    Set at server start (it seeds the config of a fresh data directory) rather
    than over REST, because the REST update differs per version: 0.8.12 answers
    HTTP 500 (it reads a config key it never defines), and 0.11.4 writes every
    web field, so a partial update sets the others to null (a null
    SEARXNG_LANGUAGE then breaks every SearXNG search).
    """
    return {
        "ENABLE_WEB_SEARCH": "true",
        "ENABLE_RAG_WEB_SEARCH": "true",
        "WEB_SEARCH_ENGINE": "searxng",
        "SEARXNG_QUERY_URL": f"{searxng_search_url}?q=<query>",
        "WEB_SEARCH_RESULT_COUNT": str(count),
        "WEB_LOADER_ENGINE": "",
        "BYPASS_WEB_SEARCH_EMBEDDING_AND_RETRIEVAL": "true",
    }


class ServerError(RuntimeError):
    """Open WebUI did not start (the message ends with its log's tail)."""


class OpenWebUIServer:
    """One ``open-webui serve`` process on 127.0.0.1 (its own process group)."""

    def __init__(
        self,
        venv: Path,
        workdir: Path,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        """Prepare (not start) a server whose data and log live in ``workdir``."""
        self.venv = venv
        self.workdir = workdir
        self.port = free_port()
        self.data_dir = workdir / "data"
        self.log_path = workdir / "open-webui.log"
        self.env = hermetic_env(self.data_dir, extra_env)
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_seconds = 0.0

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 240.0) -> OpenWebUIServer:
        """Start the server and wait until it is ready.

        Raises:
            ServerError: when it exits or is not ready in time (log tail attached).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            str(self.venv / "bin" / "open-webui"),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=self.workdir,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: stopped as a whole
            )
        try:
            installer.wait_ready(self.base_url, timeout, alive=self.running)
        except installer.OpenWebUIError as error:
            self.stop()
            raise ServerError(
                f"{error}\n--- open-webui log (tail) ---\n{self.log_tail()}"
            ) from None
        self.startup_seconds = time.monotonic() - started
        return self

    def running(self) -> bool:
        """Whether the server process is still alive."""
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float = 20.0) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after ``grace``."""
        process = self.process
        if process is None:
            return
        stop_process_group(process, grace)
        # Children that outlived the leader (none expected) go too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of the server log."""
        return log_tail(self.log_path, lines)

    def keep_log(self, name: str = "open-webui.log") -> Path:
        """Copy the log to ``.e2e-artifacts/`` (CI uploads that folder)."""
        ARTIFACTS.mkdir(exist_ok=True)
        target = ARTIFACTS / name
        if self.log_path.exists():
            shutil.copyfile(self.log_path, target)
        return target


def stop_process_group(process: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM the process group, SIGKILL after ``grace``; reap the leader."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def log_tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of a log file ('' when missing)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def port_is_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port``."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


# -- REST ------------------------------------------------------------------------


class ApiError(AssertionError):
    """An unexpected HTTP answer from Open WebUI."""


@dataclass
class Api:
    """Open WebUI's REST API with a bearer token (sync; one call at a time)."""

    base_url: str
    token: str

    def _client(self, timeout: float) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=timeout,
        )

    def call(
        self, method: str, path: str, timeout: float = 120.0, **kwargs: Any
    ) -> Any:
        """One request; the decoded JSON answer (raises ApiError on >= 400)."""
        with self._client(timeout) as client:
            response = client.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise ApiError(
                f"{method} {path}: HTTP {response.status_code}: {response.text[:1000]}"
            )
        return response.json() if response.content else None

    def get(self, path: str) -> Any:
        """GET ``path``."""
        return self.call("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        """POST JSON ``body`` to ``path``."""
        return self.call("POST", path, json={} if body is None else body)

    def rest_client(self) -> Any:
        """The installer's client for the same server and token."""
        return installer.RestClient(self.base_url, self.token)

    def models(self) -> list[dict[str, Any]]:
        """``GET /api/models`` entries."""
        return self.get("/api/models")["data"]

    def tools(self) -> list[dict[str, Any]]:
        """``GET /api/v1/tools/`` entries."""
        return self.get("/api/v1/tools/")

    def wait_for_tools(
        self, ids: tuple[str, ...] = TOOL_IDS, timeout: float = 10.0
    ) -> dict[str, dict[str, Any]]:
        """Registry entries of ``ids`` once all are present (else what there is)."""
        deadline = time.monotonic() + timeout
        while True:
            found = {tool["id"]: tool for tool in self.tools() if tool["id"] in ids}
            if len(found) == len(ids) or time.monotonic() > deadline:
                return found
            time.sleep(0.5)

    def upload_file(self, name: str, data: bytes, content_type: str) -> dict:
        """Upload a file and extract its text now (not in the background)."""
        return self.call(
            "POST",
            "/api/v1/files/?process=true&process_in_background=false",
            files={"file": (name, data, content_type)},
        )

    def chat(self, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
        """A non-streaming ``POST /api/chat/completions``."""
        return self.call(
            "POST", "/api/chat/completions", timeout, json={**body, "stream": False}
        )

    def get_chat(self, chat_id: str) -> dict[str, Any]:
        """``GET /api/v1/chats/{chat_id}``."""
        return self.get(f"/api/v1/chats/{chat_id}")


# -- inline streamed chat ----------------------------------------------------------


@dataclass
class ChatStream:
    """What an inline streamed chat sent back, parsed from its SSE lines."""

    status: int = 0
    chunks: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    seconds: float = 0.0

    @property
    def pieces(self) -> list[str]:
        """The non-empty ``delta.content`` pieces, in arrival order."""
        return [
            (choice.get("delta") or {}).get("content") or ""
            for chunk in self.chunks
            for choice in chunk.get("choices") or []
            if (choice.get("delta") or {}).get("content")
        ]

    @property
    def content(self) -> str:
        """All ``delta.content`` pieces joined."""
        return "".join(self.pieces)

    @property
    def errors(self) -> list[Any]:
        """``{"error": …}`` items in the stream."""
        return [chunk["error"] for chunk in self.chunks if "error" in chunk]

    @property
    def finish_reasons(self) -> list[str]:
        """Every ``finish_reason`` sent."""
        return [
            choice["finish_reason"]
            for chunk in self.chunks
            for choice in chunk.get("choices") or []
            if choice.get("finish_reason")
        ]


async def stream_chat(
    base_url: str,
    token: str,
    question: str,
    model: str = PIPE_MODEL_ID,
    timeout: float = 120.0,
    **extra: Any,
) -> ChatStream:
    """Ask ``question`` in an inline streamed chat and collect the stream."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "stream": True,
        **extra,
    }
    result = ChatStream()
    started = time.monotonic()
    async with (
        httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        ) as client,
        client.stream("POST", "/api/chat/completions", json=body) as response,
    ):
        result.status = response.status_code
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                result.done = True
                continue
            with contextlib.suppress(json.JSONDecodeError):
                result.chunks.append(json.loads(data))
    result.seconds = time.monotonic() - started
    return result


# -- the UI path: socket.io session + saved chat ----------------------------------


@dataclass
class UiChat:
    """A chat run the way the browser runs it, read back from the server."""

    chat_id: str
    message_id: str
    events: list[dict[str, Any]]
    chat: dict[str, Any]
    #: Whether the final ``chat:completion`` (``done: true``) arrived.
    finished: bool = False

    @property
    def message(self) -> dict[str, Any]:
        """The saved assistant message."""
        return self.chat["chat"]["history"]["messages"][self.message_id]

    def event_types(self) -> list[str]:
        """The ``type`` of every socket event for this chat, in order."""
        return [
            str((event.get("data") or {}).get("type"))
            for event in self.events
            if event.get("chat_id") == self.chat_id
        ]

    def snapshots(self) -> list[str]:
        """The message content of each live ``chat:completion`` (0.6 / 0.8).

        Every update before the final one (``done``) carries the whole content
        so far, so the list shows how the message grew on screen.
        """
        return [
            str(data["content"])
            for event in self.events
            if event.get("message_id") == self.message_id
            and (payload := event.get("data") or {}).get("type") == "chat:completion"
            and isinstance(data := payload.get("data"), dict)
            and not data.get("done")
            and isinstance(data.get("content"), str)
        ]

    def deltas(self, kind: str) -> list[str]:
        """Live ``response:completion`` deltas of one kind (e.g. reasoning)."""
        return [
            str(payload["data"].get("delta", ""))
            for event in self.events
            if event.get("message_id") == self.message_id
            and (payload := event.get("data") or {}).get("type")
            == "response:completion"
            and payload["data"].get("type") == f"response.{kind}.delta"
        ]


def ui_chat_request(
    question: str,
    *,
    model: str,
    session_id: str,
    message_id: str,
    background_tasks: tuple[str, ...],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The user message and the ``/api/chat/completions`` body the web UI sends.

    The answer streams to the socket session ``session_id`` and is saved as
    message ``message_id``; ``background_tasks`` are the ones switched on.
    """
    user_message = {
        "id": str(uuid.uuid4()),
        "parentId": None,
        "childrenIds": [],
        "role": "user",
        "content": question,
        "timestamp": int(time.time()),
    }
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "stream": True,
        "session_id": session_id,
        "parent_id": None,
        "id": message_id,
        "user_message": user_message,
        "background_tasks": dict.fromkeys(background_tasks, True),
    }
    return user_message, body


async def post_ui_chat(
    base_url: str, token: str, body: dict[str, Any], timeout: float, label: str
) -> dict[str, Any]:
    """POST a UI chat request; the server's answer (it runs in the background)."""
    async with httpx.AsyncClient(
        base_url=base_url,
        headers={"Authorization": f"Bearer {token}"},
        timeout=timeout,
    ) as client:
        response = await client.post("/api/chat/completions", json=body)
    if response.status_code != 200:
        raise ApiError(f"{label}: HTTP {response.status_code}: {response.text}")
    answer = response.json()
    if not answer.get("status"):
        raise ApiError(f"{label}: not run in the background: {answer}")
    return answer


def item_text(item: Mapping[str, Any]) -> str:
    """The text of one item of a message's ``output`` (all its parts)."""
    return "".join(
        str(part.get("text", ""))
        for part in item.get("content") or []
        if isinstance(part, dict)
    )


def output_texts(message: Mapping[str, Any], kind: str) -> list[str]:
    """The text of each part of the saved message's ``output`` items of ``kind``."""
    return [
        part.get("text", "")
        for item in message.get("output") or []
        if item.get("type") == kind
        for part in item.get("content") or []
    ]


@dataclass
class LiveChat:
    """A UI chat in progress (`started_ui_chat`): where it runs, what it sent."""

    api: Api
    chat_id: str
    message_id: str
    events: list[dict[str, Any]]
    #: The final ``chat:completion`` (``done: true``) arrived.
    finished: asyncio.Event
    #: Open WebUI said the chat's task was cancelled (``chat:tasks:cancel``).
    cancelled: asyncio.Event

    async def task_ids(self) -> list[str]:
        """The chat's running tasks (``GET /api/tasks/chat/{chat_id}``)."""
        answer = await asyncio.to_thread(
            self.api.get, f"/api/tasks/chat/{self.chat_id}"
        )
        return [str(task) for task in answer["task_ids"]]

    async def stop(self) -> None:
        """Press Stop, as this version's web UI does.

        0.11+ stop the chat (``POST /api/tasks/chat/{chat_id}/stop``); 0.6
        and 0.8 stop each of its tasks (``POST /api/tasks/stop/{task_id}``).
        """
        if owui_version_tuple() >= (0, 11):
            path = f"/api/tasks/chat/{self.chat_id}/stop"
            answer = await asyncio.to_thread(self.api.post, path)
            assert answer.get("status") is True, answer
            return
        task_ids = await self.task_ids()
        assert task_ids, "no task of the chat to stop"
        for task_id in task_ids:
            answer = await asyncio.to_thread(
                self.api.post, f"/api/tasks/stop/{task_id}"
            )
            assert answer.get("status") is True, answer


@contextlib.asynccontextmanager
async def started_ui_chat(
    api: Api,
    question: str,
    model: str = PIPE_MODEL_ID,
    timeout: float = 120.0,
    *,
    socket_url: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> AsyncIterator[LiveChat]:
    """Start a new chat over a socket.io session, as the web UI does.

    The server saves the chat, streams events to the session and writes the
    assistant message when done. Yields once the server runs the chat (its
    task started), with the session open until the block ends. ``socket_url``
    is where the session connects (default: ``api``'s server; another
    replica of a scaled deployment works the same way). ``extra`` are more
    fields of the request, as the chat input adds them (the tools selected
    in it: ``tool_ids``; the prompt variables: ``variables``).
    """
    events: list[dict[str, Any]] = []
    message_id = str(uuid.uuid4())
    finished = asyncio.Event()
    cancelled = asyncio.Event()

    sio = socketio.AsyncClient(reconnection=False)

    async def on_event(data: dict[str, Any]) -> None:
        events.append(data)
        payload = data.get("data") or {}
        if data.get("message_id") != message_id:
            return
        if payload.get("type") == "chat:tasks:cancel":
            cancelled.set()
        if payload.get("type") == "chat:completion":
            update = payload.get("data")
            if isinstance(update, dict) and update.get("done"):
                finished.set()

    sio.on("events", on_event)
    await sio.connect(
        socket_url or api.base_url,
        socketio_path="/ws/socket.io",
        auth={"token": api.token},
        transports=["websocket"],
        wait_timeout=20,
    )
    try:
        # Acknowledged: once it returns, the session is in the user's room and
        # no event of the chat can miss it.
        await sio.call(
            "user-join", {"auth": {"token": api.token}}, timeout=int(timeout)
        )
        user_message, body = ui_chat_request(
            question,
            model=model,
            session_id=str(sio.get_sid()),
            message_id=message_id,
            background_tasks=(
                "title_generation",
                "tags_generation",
                "follow_up_generation",
            ),
        )
        body |= dict(extra or {})
        chat_id = None
        if not server_creates_chats():
            # 0.6 / 0.8: the browser saves the new chat first, then runs the
            # completion in it (without a chat id it would run inline).
            chat_id = await asyncio.to_thread(
                create_chat, api, model, user_message, message_id
            )
            body |= {
                "chat_id": chat_id,
                "parent_id": user_message["id"],
                "parent_message": user_message,  # 0.6 reads its files
            }
        answer = await post_ui_chat(api.base_url, api.token, body, timeout, "UI chat")
        chat_id = chat_id or answer["chat_id"]
        yield LiveChat(api, chat_id, message_id, events, finished, cancelled)
    finally:
        await sio.disconnect()


async def ui_chat(
    api: Api,
    question: str,
    model: str = PIPE_MODEL_ID,
    timeout: float = 120.0,
    *,
    socket_url: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> UiChat:
    """Run a new chat as the web UI does (`started_ui_chat`) and read it back."""
    async with started_ui_chat(
        api, question, model, timeout, socket_url=socket_url, extra=extra
    ) as live:
        await asyncio.wait_for(live.finished.wait(), timeout)
        chat = await saved_chat(api, live.chat_id, live.message_id, timeout=20)
    return UiChat(
        live.chat_id, live.message_id, live.events, chat, live.finished.is_set()
    )


def server_saves_answers_whole() -> bool:
    """Whether the server saves the finished answer as done, with ``output``.

    0.8.12+ do; on 0.6.43 the server saves the content only (reasoning as
    ``<details type="reasoning">`` blocks) and the browser marks it done.
    """
    return owui_version_tuple() >= (0, 8)


def server_streams_deltas() -> bool:
    """Whether the UI session gets live ``response:completion`` deltas.

    0.11.4 / 0.12.4 stream deltas (``response.reasoning_text.delta``, …);
    0.6.43 / 0.8.12 send the whole message content so far in each live
    ``chat:completion`` event instead.
    """
    return owui_version_tuple() >= (0, 11)


def owui_version_tuple() -> tuple[int, ...]:
    """The version under test as numbers (``(0, 12, 4)``)."""
    return tuple(int(part) for part in owui_version().split(".")[:3])


def server_creates_chats() -> bool:
    """Whether ``/api/chat/completions`` creates the chat of a UI turn itself.

    0.11.4 and 0.12.4 do (the answer carries ``chat_id``); 0.6.43 and 0.8.12
    need the chat saved first (``POST /api/v1/chats/new``), as their UI does.
    """
    return owui_version_tuple() >= (0, 11)


def create_chat(
    api: Api, model: str, user_message: dict[str, Any], message_id: str
) -> str:
    """Save a new chat holding the question and an empty answer; its id."""
    now = int(time.time())
    question = {**user_message, "childrenIds": [message_id], "models": [model]}
    reply = {
        "id": message_id,
        "parentId": question["id"],
        "childrenIds": [],
        "role": "assistant",
        "content": "",
        "model": model,
        "modelIdx": 0,
        "timestamp": now,
    }
    chat = {
        "id": "",
        "title": "New Chat",
        "models": [model],
        "params": {},
        "history": {
            "messages": {question["id"]: question, message_id: reply},
            "currentId": message_id,
        },
        "messages": [question, reply],
        "tags": [],
        "timestamp": now * 1000,
    }
    return str(api.post("/api/v1/chats/new", {"chat": chat})["id"])


async def saved_chat(
    api: Api, chat_id: str, message_id: str, timeout: float
) -> dict[str, Any]:
    """The chat once its assistant message is saved as done (0.6: has content)."""
    deadline = time.monotonic() + timeout
    while True:
        chat = await asyncio.to_thread(api.get_chat, chat_id)
        message = chat["chat"]["history"]["messages"].get(message_id) or {}
        saved = message.get("done") if server_saves_answers_whole() else None
        if not server_saves_answers_whole():
            # 0.6 writes the final content after its last event; never "done".
            saved = bool(message.get("content"))
        if saved or time.monotonic() > deadline:
            return chat
        await asyncio.sleep(0.25)


# -- the scripted model ------------------------------------------------------------


def question_of(body: Mapping[str, Any]) -> str:
    """The user's question in a research request (first non-tool user message)."""
    for message in body.get("messages") or []:
        content = message.get("content")
        if (
            message.get("role") == "user"
            and isinstance(content, str)
            and not content.startswith("<tool_response>")
        ):
            return content
    return ""


def tool_responses(body: Mapping[str, Any]) -> list[str]:
    """The contents of the ``<tool_response>`` user messages, in order."""
    return [
        message["content"]
        for message in body.get("messages") or []
        if message.get("role") == "user"
        and isinstance(message.get("content"), str)
        and message["content"].startswith("<tool_response>")
    ]


def turn_of(body: Mapping[str, Any]) -> int:
    """Which research turn a request is (assistant messages so far)."""
    return sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")


Extractor = Callable[[str], Reply]
#: The citation check's model: (statement, the request's body) -> its reply.
Verdicts = Callable[[str, dict[str, Any]], Reply]


def is_verdict_request(body: Mapping[str, Any]) -> bool:
    """Whether a request is one of the citation check's verdict calls."""
    messages = body.get("messages") or []
    return bool(messages) and messages[0].get("content") == VERDICT_SYSTEM_PROMPT


def verdict_statement(body: Mapping[str, Any]) -> str:
    """The statement a verdict request asks about (its ``<statement>`` block)."""
    asked = str(body["messages"][-1]["content"])
    return asked.partition("<statement>\n")[2].partition("\n</statement>")[0]


class ScriptedModel:
    """Answers the fake model server's requests from per-conversation scripts.

    Research requests (streaming) are matched to a conversation by a key that
    occurs in the question, and answered with that conversation's reply for
    the turn (the number of assistant messages so far), so concurrent chats
    never take each other's replies. Non-streaming requests are the visit
    tool's extractor calls and go to ``extractor(prompt)``. The citation
    check's verdict calls (streaming, after an answer that cites the pages
    read) go to ``verdicts(statement, body)``; unscripted, they fail
    (HTTP 500), and the check counts each as "cannot tell".
    """

    def __init__(self, fake: FakeOpenAI) -> None:
        """Route ``fake``'s requests through this script."""
        self.fake = fake
        self.conversations: dict[str, list[Reply]] = {}
        self.extractor: Extractor | None = None
        self.verdicts: Verdicts | None = None
        self._first_turns: threading.Barrier | None = None
        # Heavy runs: per key, each rollout's turns and the integrate reply.
        self.heavy: dict[str, tuple[list[list[Reply]], Reply]] = {}
        self.synthesis_bodies: list[dict[str, Any]] = []
        self._rollouts_started: dict[str, int] = {}
        self._lock = threading.Lock()
        fake.respond_with(self)

    def heavy_conversation(
        self, key: str, rollouts: list[list[Reply]], synthesis: Reply
    ) -> None:
        """Script a heavy run: each rollout's turns, then the integrate reply.

        Rollouts send the same first request; they get ``rollouts`` in the
        order they arrive, and later turns go to the rollout whose first reply
        is in their history. ParallelMuse's report and integrate calls are told
        apart by their system message: a report repeats the rollout's answer
        (the trajectory's last ``*Answer:*`` line), the integrate call gets
        ``synthesis`` and its body is kept in `synthesis_bodies`.
        """
        self.heavy[key] = (rollouts, synthesis)
        self.conversations[key] = []  # so that key_of finds it
        self._rollouts_started[key] = 0

    def _heavy_reply(self, key: str, body: dict[str, Any]) -> Reply:
        rollouts, synthesis = self.heavy[key]
        messages = body.get("messages") or []
        if str(messages[0].get("content", "")) == CONVERGE_SYSTEM_PROMPT:
            request = str(messages[-1].get("content", ""))
            if request.startswith("Given the following problem-solving trajectory:"):
                said = re.findall(r"^\*Answer:\* (.*)$", request, re.MULTILINE)
                report = said[-1] if said else "-"
                return Reply(content=f"<report>\n{report}\n</report>")
            self.synthesis_bodies.append(body)
            return synthesis
        turn = turn_of(body)
        if turn == 0:
            with self._lock:
                index = self._rollouts_started[key]
                self._rollouts_started[key] += 1
            if self._first_turns is not None:
                try:
                    self._first_turns.wait()
                except threading.BrokenBarrierError:
                    return Reply(status=503, error="the other rollouts never arrived")
            return rollouts[index % len(rollouts)][0]
        first = next(m for m in messages if m.get("role") == "assistant")
        for replies in rollouts:
            if replies[0].content.strip() in str(first.get("content")):
                return replies[min(turn, len(replies) - 1)]
        return Reply(status=500, error="no rollout scripted for this history")

    def conversation(self, key: str, *replies: Reply) -> None:
        """Script the turns of the conversation whose question contains ``key``."""
        self.conversations[key] = list(replies)

    def hold_first_turns(self, parties: int, timeout: float = 30.0) -> None:
        """Answer no conversation's first turn until ``parties`` are waiting.

        Shows concurrency structurally: chats run one after the other never
        get there, and their first turns fail (HTTP 503) after ``timeout``.
        """
        self._first_turns = threading.Barrier(parties, timeout=timeout)

    def key_of(self, body: Mapping[str, Any]) -> str | None:
        """Which conversation a research request belongs to."""
        if is_verdict_request(body):
            return None  # its statement may quote a key: it is no research turn
        question = question_of(body)
        for key in self.conversations:
            if key in question:
                return key
        return None

    def bodies(self, key: str | None = None) -> list[dict[str, Any]]:
        """Recorded research requests (of one conversation when ``key`` is set).

        The citation check's verdict calls are not research requests: see
        `verdict_bodies`.
        """
        return [
            body
            for body in list(self.fake.bodies)
            if body.get("stream")
            and not is_verdict_request(body)
            and (key is None or self.key_of(body) == key)
        ]

    def verdict_bodies(self) -> list[dict[str, Any]]:
        """Recorded verdict requests of the citation check, in arrival order."""
        return [body for body in list(self.fake.bodies) if is_verdict_request(body)]

    def extractor_prompts(self) -> list[str]:
        """The prompts of the extractor calls (non-streaming requests)."""
        return [
            str(body["messages"][-1]["content"])
            for body in list(self.fake.bodies)
            if not body.get("stream")
        ]

    def __call__(self, body: dict[str, Any]) -> Reply:
        """The reply for one request (runs in the fake server's threads)."""
        if is_verdict_request(body):
            if self.verdicts is None:
                return Reply(status=500, error="no verdict scripted")
            return self.verdicts(verdict_statement(body), body)
        key = self.key_of(body)
        if key in self.heavy:
            return self._heavy_reply(key, body)
        if not body.get("stream"):
            if self.extractor is None:
                return Reply(status=500, error="no extractor scripted")
            return self.extractor(str(body["messages"][-1]["content"]))
        if key is None:
            return Reply(status=500, error="no conversation scripted for this question")
        turn = turn_of(body)
        if turn == 0 and self._first_turns is not None:
            try:
                self._first_turns.wait()
            except threading.BrokenBarrierError:
                return Reply(status=503, error="the other chats never arrived")
        replies = self.conversations[key]
        return replies[min(turn, len(replies) - 1)]


# -- reference tool output formats (tongyi-protocol.md §3) --------------------------


def tool_response(text: str) -> str:
    """A tool result as the model receives it."""
    return f"<tool_response>\n{text}\n</tool_response>"


def search_block(query: str, hits: list[tuple[str, str, str]]) -> str:
    """The search tool's text for one query; ``hits`` are (title, url, snippet)."""
    entries = [
        f"{index}. [{title}]({url})\n" + (f"\n{snippet}" if snippet else "")
        for index, (title, url, snippet) in enumerate(hits, start=1)
    ]
    return (
        f"A Google search for '{query}' found {len(hits)} results:\n\n"
        "## Web Results\n" + "\n\n".join(entries)
    )


def visit_block(url: str, goal: str, evidence: str, summary: str) -> str:
    """The visit tool's text for one URL (before the final strip)."""
    return (
        f"The useful information in {url} for user goal {goal} as follows: \n\n"
        f"Evidence in page: \n{evidence}\n\n"
        f"Summary: \n{summary}\n\n"
    )
