"""A chat's research goes on by itself after the process running it died.

Three parts, each small:

- `HeldRun`: a run inside Open WebUI holds the lease of its chat
  (`adapters.run_leases`) while it lives, renewing it every third of its
  length from a worker thread. If another process takes it over (the user
  regenerated on another replica, or this process was too slow to renew and
  the run was continued elsewhere) the run is cancelled and keeps its
  checkpoint for the one that goes on. At its end it lets go: released when
  the run ended (answered, stopped, failed), left to lapse at once when the
  process is being stopped (a restart: the run is to go on).
- `Continuer`: one per process, started the first time Open WebUI lists the
  pipe's models (Open WebUI loads a pipe then; at startup when its
  base-models cache is on). Every half lease it claims each lapsed run whose
  checkpoint is still there and has the pipe continue it.
- `MessageWriter`: a continued run has no request whose stream Open WebUI
  saves; it writes the message itself through Open WebUI's emitter (the text
  as Open WebUI stores a finished message), at most once a second, and marks
  it done at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ..run_leases import Claimed, LeaseTable, Ticket
from .emitter import Emitter
from .host import ChatHost
from .render import stored_form

log = logging.getLogger(__name__)

#: Longest a lease's last write (release, lapse) may hold up a run's end.
LETTING_GO_SECONDS = 5.0
#: How often a continued message is saved while it streams (seconds).
WRITE_EVERY_SECONDS = 1.0

#: The cancellation message of a run whose lease another process took.
TAKEN_OVER = "the research went on elsewhere"


def holder_id() -> str:
    """A new holder's name: unique to one run in one process."""
    return uuid.uuid4().hex


class HeldRun:
    """One run's lease on its chat, kept while it lives."""

    def __init__(
        self,
        table: LeaseTable,
        owner: str,
        chat: str,
        ticket: Ticket,
        *,
        seconds: float,
        run: asyncio.Task[Any] | None,
    ) -> None:
        """Hold ``owner``'s ``chat`` for ``run`` (the task consuming the run)."""
        self.table = table
        self.owner = owner
        self.chat = chat
        self.ticket = ticket
        self.seconds = seconds
        self.holder = holder_id()
        #: Another process took the run over (this one was cancelled for it).
        self.taken_over = False
        self._run = run
        self._beat: asyncio.Task[None] | None = None

    async def take(self) -> bool:
        """Take the lease (whoever held it); False when it cannot be written."""
        try:
            await asyncio.to_thread(
                self.table.take,
                self.owner,
                self.chat,
                self.holder,
                self.seconds,
                self.ticket,
            )
        except Exception as error:  # the research goes on, just not by itself
            log.warning("the run cannot be continued after a restart: %s", error)
            return False
        self._beat = asyncio.get_running_loop().create_task(self._heartbeat())
        return True

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.seconds / 3)
            try:
                kept = await asyncio.to_thread(
                    self.table.renew, self.owner, self.chat, self.holder, self.seconds
                )
            except Exception as error:  # a database hiccup: try again next beat
                log.warning("the run's lease was not renewed: %s", error)
                continue
            if not kept:
                self.taken_over = True
                if self._run is not None:
                    self._run.cancel(TAKEN_OVER)
                return

    async def let_go(self, *, restarting: bool) -> None:
        """Stop renewing; release the lease, or let it lapse at once (restart)."""
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(BaseException):
                await self._beat
        if self.taken_over:
            return
        write = self.table.lapse if restarting else self.table.release
        with contextlib.suppress(Exception):
            async with asyncio.timeout(LETTING_GO_SECONDS):
                await asyncio.to_thread(write, self.owner, self.chat, self.holder)


#: Continues one claimed run (the pipe's `continue_run`).
ContinueRun = Callable[[Claimed], Coroutine[Any, Any, None]]
#: Whether the chat's checkpoint is still stored.
HasCheckpoint = Callable[[str, str], Awaitable[bool]]


class Continuer:
    """Takes up the lapsed runs of the deployment, one process at a time."""

    def __init__(
        self,
        table: LeaseTable,
        has_checkpoint: HasCheckpoint,
        continue_run: ContinueRun,
        *,
        seconds: Callable[[], float],
        enabled: Callable[[], bool],
    ) -> None:
        """Scan ``table`` every half lease (``seconds()``) while ``enabled()``."""
        self.table = table
        self.has_checkpoint = has_checkpoint
        self.continue_run = continue_run
        self.seconds = seconds
        self.enabled = enabled
        self.holder = holder_id()
        self._scanner: asyncio.Task[None] | None = None
        #: The runs this process continues (kept referenced while they run).
        self.running: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Start scanning (once; needs a running event loop)."""
        if self._scanner is not None and not self._scanner.done():
            return
        self._scanner = asyncio.get_running_loop().create_task(self._scan_forever())

    def cancel(self) -> None:
        """Stop scanning (the runs under way go on)."""
        if self._scanner is not None:
            self._scanner.cancel()

    async def _scan_forever(self) -> None:
        while True:
            if self.enabled():
                try:
                    await self.scan_once()
                except Exception as error:  # the database away: next time
                    log.warning("lapsed researches were not looked for: %s", error)
            await asyncio.sleep(self.seconds() / 2)

    async def scan_once(self) -> list[Claimed]:
        """Claim every lapsed run with a checkpoint and start continuing it."""
        claimed: list[Claimed] = []
        for owner, chat in await asyncio.to_thread(self.table.lapsed):
            run = await asyncio.to_thread(
                self.table.claim, owner, chat, self.holder, self.seconds()
            )
            if run is None:
                continue  # another replica's, or an unreadable ticket
            if not await self.has_checkpoint(owner, chat):
                # Nothing to go on from (removed, expired): forget the run.
                await asyncio.to_thread(self.table.release, owner, chat, self.holder)
                continue
            claimed.append(run)
            task = asyncio.get_running_loop().create_task(self.continue_run(run))
            self.running.add(task)
            task.add_done_callback(self.running.discard)
        return claimed


class MessageWriter:
    """Writes a continued run's text into its chat message."""

    def __init__(
        self,
        emit: Emitter,
        host: ChatHost,
        chat_id: str,
        message_id: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Write through ``emit`` (Open WebUI's emitter of that message)."""
        self.emit = emit
        self.host = host
        self.chat_id = chat_id
        self.message_id = message_id
        self.clock = clock
        self.text = ""
        self._written_at: float | None = None

    async def add(self, piece: str) -> None:
        """Append ``piece``; save the message if a second has passed."""
        self.text += piece
        now = self.clock()
        if self._written_at is None or now - self._written_at >= WRITE_EVERY_SECONDS:
            await self._write()
            self._written_at = now

    async def finish(self) -> None:
        """Save the whole message, mark it done, and tell the open browser."""
        content = await self._write()
        await self.host.mark_done(self.chat_id, self.message_id)
        await self.emit(
            {"type": "chat:completion", "data": {"done": True, "content": content}}
        )

    async def _write(self) -> str:
        content = await asyncio.to_thread(stored_form, self.text)
        await self.emit({"type": "replace", "data": {"content": content}})
        return content
