"""A safe event emitter, and the relay that sits between tools and the UI.

Open WebUI hands the pipe ``__event_emitter__``; a failing emit (a closed
socket, an old version) must never end a research run, so every emit goes
through `SafeEmitter`. Tools get an `EventRelay` instead of the raw emitter:
it forwards their status lines (a search's result URLs are shown by Open
WebUI from those).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

Emitter = Callable[[dict[str, Any]], Awaitable[Any]]


def status_payload(
    description: str, done: bool = False, **extra: Any
) -> dict[str, Any]:
    """A status line, as Open WebUI's event emitter takes it."""
    return {
        "type": "status",
        "data": {"description": description, "done": done, **extra},
    }


def notification_payload(level: str, content: str) -> dict[str, Any]:
    """A toast notification, as Open WebUI's event emitter takes it."""
    return {"type": "notification", "data": {"type": level, "content": content}}


class SafeEmitter:
    """Calls Open WebUI's emitter, swallowing and logging its failures."""

    def __init__(self, emitter: Emitter | None) -> None:
        """Wrap ``emitter`` (``None`` makes every emit a no-op)."""
        self._emitter = emitter
        self._warned = False
        # Open WebUI saves some events (sources, statuses) with a read-modify-
        # write of the chat message: two emits at once (two pages read in
        # parallel) would lose one. Emits therefore go out one at a time.
        self._lock = asyncio.Lock()

    @property
    def connected(self) -> bool:
        """Whether there is an emitter at all."""
        return self._emitter is not None

    async def __call__(self, event: dict[str, Any]) -> None:
        """Emit one event."""
        if self._emitter is None:
            return
        try:
            async with self._lock:
                await self._emitter(event)
        except Exception as error:
            if not self._warned:
                log.warning("event emitter failed: %s", type(error).__name__)
                self._warned = True

    async def status(
        self, description: str, *, done: bool = False, **extra: Any
    ) -> None:
        """Emit a status line."""
        await self(status_payload(description, done, **extra))

    async def notify(self, level: str, content: str) -> None:
        """Emit a toast notification."""
        await self(notification_payload(level, content))


class EventRelay:
    """The ``__event_emitter__`` the pipe gives to tools.

    Their status lines go on to the chat (Open WebUI shows a search's result
    URLs from them). Their source events do not: the pages a tool read come
    back in its result (``ToolResult.sources``), which the toolbox turns into
    the core's page reads and the run engine numbers once for the run; the
    chat's source events are the renderer's (`render.source_event`). A tool
    emits its own only for use on its own.
    """

    def __init__(self, emit: SafeEmitter, status_prefix: str = "") -> None:
        """Forward to ``emit``; in a heavy run, name the rollout in statuses."""
        self._emit = emit
        self._prefix = status_prefix

    async def __call__(self, event: dict[str, Any]) -> None:
        """Receive one event from a tool."""
        kind = event.get("type")
        data = event.get("data") or {}
        if kind in ("source", "citation"):
            return
        if kind == "status" and isinstance(data, dict):
            # A tool's own "done" must not end the pipe's status shimmer.
            data = {
                **data,
                "done": bool(data.get("action")) and data.get("done", False),
            }
            if self._prefix and isinstance(data.get("description"), str):
                data["description"] = self._prefix + data["description"]
            await self._emit({"type": "status", "data": data})
            return
        await self._emit(event)
