"""What a research continued without its request needs of Open WebUI.

A run taken up after a restart has no ``__event_emitter__`` and no request:
it writes into the chat's message through Open WebUI's own event emitter
(`open_webui.socket.main.get_event_emitter`: the user's open browser sees
each step, and the message is saved), marks the message done in the chat
store, and runs as one of Open WebUI's chat tasks so that the chat's Stop
button cancels it. Each call goes the way the running version takes it
(0.6 and 0.8 synchronous, 0.11 and 0.12 asynchronous).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from . import compat
from .emitter import Emitter

log = logging.getLogger(__name__)


class ChatHost(Protocol):
    """Where a continued research writes, and how it runs."""

    async def message_exists(self, user_id: str, chat_id: str, message_id: str) -> bool:
        """Whether the user's chat still has that message (not deleted meanwhile)."""
        ...

    async def emitter(self, user_id: str, chat_id: str, message_id: str) -> Emitter:
        """The event emitter of that message, as a request's would be."""
        ...

    async def mark_done(self, chat_id: str, message_id: str) -> None:
        """Note in the chat store that the message is finished."""
        ...

    async def start(
        self, work: Coroutine[Any, Any, None], chat_id: str
    ) -> asyncio.Task[None]:
        """Run ``work`` as the chat's task (its Stop button cancels it)."""
        ...


class OpenWebUIHost:
    """`ChatHost` on the running Open WebUI (0.6 to 0.12)."""

    async def message_exists(self, user_id: str, chat_id: str, message_id: str) -> bool:
        """Ask the chat store for the user's chat, then for the message in it."""
        chats = compat._attr("open_webui.models.chats", "Chats")
        owned = getattr(chats, "get_chat_by_id_and_user_id", None)
        if owned is None or not await compat.call(owned, chat_id, user_id):
            return False  # another user's chat (or none): never written to
        return bool(await _stored_message(chat_id, message_id))

    async def emitter(self, user_id: str, chat_id: str, message_id: str) -> Emitter:
        """Open WebUI's emitter for that message (it saves what it is sent).

        The message already holds what the run emitted before its process
        died: the sources read until then (Open WebUI's emitter appends each
        source event to the stored ones, and a resumed run tells its sources
        again), and, where Open WebUI saves a streaming reply as it goes,
        that reply's ``output`` items (which the browser would show instead
        of the text written now). The emitter returned leaves out the
        sources the message holds (`KnownSources`), and the stale output is
        removed first; so is what the dead process's chat task left in Redis
        (`_forget_dead_tasks`).
        """
        factory = compat._attr("open_webui.socket.main", "get_event_emitter")
        if factory is None:
            raise RuntimeError("this Open WebUI has no event emitter")
        info = {
            "user_id": user_id,
            "chat_id": chat_id,
            "message_id": message_id,
            "session_id": None,
        }
        emit = await compat.resolve(factory(info))
        if emit is None:
            raise RuntimeError("Open WebUI gave no emitter for the message")
        message = await _stored_message(chat_id, message_id) or {}
        try:
            await _forget_dead_tasks(chat_id, message)
        except Exception as error:  # the text is written all the same
            log.warning("the chat's earlier task stays listed: %s", error)
        if message.get("output"):
            try:
                await _upsert(chat_id, message_id, {"output": None})
            except Exception as error:  # the text is written all the same
                log.warning("the message's earlier output stays: %s", error)
        stored = message.get("sources")

        async def keep(sources: list[Any]) -> None:
            await _upsert(chat_id, message_id, {"sources": sources})

        return KnownSources(emit, stored if isinstance(stored, list) else [], keep)

    async def mark_done(self, chat_id: str, message_id: str) -> None:
        """Set the message's ``done`` (the browser shows its actions then)."""
        await _upsert(chat_id, message_id, {"done": True})

    async def start(
        self, work: Coroutine[Any, Any, None], chat_id: str
    ) -> asyncio.Task[None]:
        """Run ``work``, followed by one of Open WebUI's chat tasks.

        The work is this module's own task; Open WebUI's registry gets a
        follower of it (`open_webui.tasks.create_task`, the same call on 0.6
        to 0.12), so the chat's Stop, on any replica, cancels the follower,
        and the follower the work. Where the registry cannot be reached the
        work runs all the same.
        """
        task = asyncio.get_running_loop().create_task(work)
        create = compat._attr("open_webui.tasks", "create_task")
        app = compat.running_app()
        if create is None or app is None:
            return task
        follower = _follow(task)
        try:
            await compat.resolve(
                create(getattr(app.state, "redis", None), follower, id=chat_id)
            )
        except Exception as error:  # an older or newer signature
            log.debug("the continued research is no chat task: %s", error)
            follower.close()
        return task


async def _stored_message(chat_id: str, message_id: str) -> dict[str, Any] | None:
    """The message as the chat store holds it (None: no such message)."""
    chats = compat._attr("open_webui.models.chats", "Chats")
    getter = getattr(chats, "get_message_by_id_and_message_id", None)
    if getter is None:
        return None
    message = await compat.call(getter, chat_id, message_id)
    return message if isinstance(message, dict) and message else None


async def _forget_dead_tasks(chat_id: str, message: dict[str, Any]) -> None:
    """Forget what the chat's tasks of dead processes left in Redis (0.11+).

    Open WebUI 0.11 and 0.12 keep the text a running chat task streams in
    Redis, and every read of the chat shows it over the stored message, as
    not done, for as long as the task is listed: after a replica died, for
    minutes (its tasks' entries expire only then). That is the dead run's
    text, over the one written now: the stream of every task of the chat
    that is not this process's is removed (a live one on another replica
    saves its whole stream again with its next words). The task the message
    names as its own (0.12: ``meta.task_id``) is gone with its process: it
    is no longer listed either (the chat's Stop and its "generating" state
    are the continued run's).
    """
    module = compat._import("open_webui.tasks")
    list_ids = getattr(module, "list_task_ids_by_item_id", None)
    clear = getattr(module, "clear_response_stream", None)
    if module is None or list_ids is None or clear is None:
        return  # 0.6 / 0.8: a chat shows its stored messages only
    redis = getattr(getattr(compat.running_app(), "state", None), "redis", None)
    local = getattr(module, "tasks", {})
    for task_id in await compat.resolve(list_ids(redis, chat_id)) or ():
        if task_id not in local:
            await compat.resolve(clear(redis, task_id))
    meta = message.get("meta")
    dead = meta.get("task_id") if isinstance(meta, dict) else None
    cleanup = getattr(module, "cleanup_task", None)
    if isinstance(dead, str) and dead and dead not in local and cleanup is not None:
        await compat.resolve(cleanup(redis, dead, chat_id))


async def _upsert(chat_id: str, message_id: str, fields: dict[str, Any]) -> None:
    """Set ``fields`` of the stored message (the others stay)."""
    chats = compat._attr("open_webui.models.chats", "Chats")
    upsert = getattr(chats, "upsert_message_to_chat_by_id_and_message_id", None)
    if upsert is not None:
        await compat.call(upsert, chat_id, message_id, fields)


class KnownSources:
    """A message's emitter that leaves out the sources the message holds.

    A resumed run numbers its sources as before its interruption and tells
    them again (the ones its checkpoint kept, then each new one). While they
    are the message's stored sources, in order, they are not sent on
    (Open WebUI would store each twice, and an open browser would show it
    twice). From the first that differs (a page of the unfinished round was
    read before the process died, and the round went otherwise) the stored
    ones past the common start are removed and the run's own go on, so the
    stored sources are the run's, numbered as its text cites them; at the
    answer's end (``chat:completion`` done) those never told again go too.
    """

    def __init__(
        self,
        emit: Emitter,
        stored: list[Any],
        keep: Callable[[list[Any]], Awaitable[None]],
    ) -> None:
        """Send on to ``emit``; ``keep(sources)`` stores the message's sources."""
        self._emit = emit
        self._stored = stored
        self._keep = keep
        #: How many stored sources the run has told again, in order.
        self._matched = 0
        #: Whether the run's sources went their own way (or the run ended).
        self._parted = False

    async def __call__(self, event: dict[str, Any]) -> Any:
        """Send ``event`` on, unless it is a source the message holds."""
        if not self._parted:
            kind = event.get("type")
            data = event.get("data")
            if kind in {"source", "citation"} and isinstance(data, dict):
                if data.get("type") is None:  # the sources Open WebUI stores
                    if self._known(data):
                        self._matched += 1
                        return None
                    await self._part()
            elif (
                kind == "chat:completion"
                and isinstance(data, dict)
                and (data.get("done"))
            ):
                await self._part()
        return await self._emit(event)

    def _known(self, data: dict[str, Any]) -> bool:
        if self._matched >= len(self._stored):
            return False
        url = _source_url(data)
        return url is not None and url == _source_url(self._stored[self._matched])

    async def _part(self) -> None:
        self._parted = True
        if self._matched < len(self._stored):
            try:
                await self._keep(self._stored[: self._matched])
            except Exception as error:  # the run goes on; the list is longer
                log.warning("the message's earlier sources stay: %s", error)


def _source_url(data: Any) -> str | None:
    """Which page a source event (or a stored source) is about."""
    if not isinstance(data, dict):
        return None
    metadata = data.get("metadata")
    if isinstance(metadata, list) and metadata and isinstance(metadata[0], dict):
        url = metadata[0].get("source")
        if isinstance(url, str):
            return url
    source = data.get("source")
    url = source.get("url") if isinstance(source, dict) else None
    return url if isinstance(url, str) else None


async def _follow(task: asyncio.Task[None]) -> None:
    """Wait for ``task``; cancelled, cancel it too."""
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        task.cancel()
        raise
    except Exception:  # the work's own failure is the work's to report
        return
