"""Durable runs: a run's state saved after every finished round, taken back later.

A `Checkpointer` belongs to one run of one user's chat. The run engine calls
`save` between rounds (before each round after the first, and after each
consolidation) and `finish` when the run ends with `RunFinished`; a front end
calls `resume` before the run to learn whether an earlier run of the same
question in the same chat can go on. Saving never fails a run: a store that
cannot be written is said once (`notes`) and the research goes on unsaved.

The store is a port (`core.checkpoint.CheckpointStore`): Open WebUI's
database for the pipe, a directory for the runner.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..core.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    decode,
    encode,
    question_key,
)
from ..core.loop import RunState
from ..core.sources import SourceLedger

log = logging.getLogger(__name__)

#: How long an unfinished run's checkpoint is kept (a valve may change it).
DEFAULT_MAX_AGE_SECONDS = 7 * 24 * 3600.0


@dataclass(frozen=True)
class RunKey:
    """Whose run this is, where, and what it asks."""

    owner: str
    chat: str
    question: str
    #: "single" or "heavy": a heavy run does not resume a single one.
    mode: str = "single"


class Checkpointer:
    """Saves one run's progress to a store, and finds it again."""

    def __init__(
        self,
        store: CheckpointStore,
        key: RunKey,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS,
    ) -> None:
        """Save under ``key`` in ``store``.

        Args:
            store: Where checkpoints live.
            key: The run's user, chat, question and mode.
            clock: The run's clock (`RunState.started` is on it).
            wall_clock: Seconds since the epoch, for expiry.
            max_age_seconds: Older checkpoints are not resumed, and removed.
        """
        self.store = store
        self.key = key
        self.clock = clock
        self.wall_clock = wall_clock
        self.max_age_seconds = max_age_seconds
        #: What went wrong, said once each (for the front end's status line).
        self.notes: list[str] = []
        self._failed_saves = 0

    async def resume(self) -> Checkpoint | None:
        """The checkpoint this run goes on from, or None to start afresh.

        A checkpoint of another question or mode in the chat is replaced by
        this run; a damaged, foreign or expired one is removed, with a note.
        """
        key = self.key
        try:
            data = await self.store.load(key.owner, key.chat)
        except Exception as error:  # a store's fault is a note
            self._note(f"Saved progress could not be read ({type(error).__name__}).")
            return None
        if data is None:
            return None
        try:
            saved = decode(data, owner=key.owner, chat=key.chat, now=self.clock())
        except CheckpointError as error:
            self._note(f"Saved progress was not used: {error}.")
            await self._remove()
            return None
        if saved.saved_at < self.wall_clock() - self.max_age_seconds:
            await self._remove()
            return None
        if saved.question != question_key(key.question) or saved.mode != key.mode:
            return None
        return saved

    async def starting_state(
        self, messages: list[dict[str, Any]], ledger: SourceLedger
    ) -> tuple[RunState, bool]:
        """The state a run starts from, and whether it is a checkpoint's.

        A checkpoint of this run (`resume`) gives its state and puts its
        sources, numbers kept, into ``ledger``; else a new state opens with
        ``messages``.
        """
        saved = await self.resume()
        if saved is None:
            return RunState(messages=list(messages), started=self.clock()), False
        ledger.restore(saved.sources, saved.reads)
        return saved.state, True

    async def save(self, state: RunState, ledger: SourceLedger) -> None:
        """Keep ``state`` (between rounds) and the run's sources."""
        key = self.key
        checkpoint = Checkpoint(
            owner=key.owner,
            chat=key.chat,
            mode=key.mode,
            question=question_key(key.question),
            state=state,
            sources=tuple(ledger.sources),
            reads=ledger.reads,
            elapsed=max(0.0, self.clock() - state.started),
            saved_at=self.wall_clock(),
        )
        try:
            data = encode(checkpoint)
            await self.store.save(key.owner, key.chat, data)
        except Exception as error:  # never fail the research
            self._failed_saves += 1
            log.warning("checkpoint not saved: %s", type(error).__name__)
            if self._failed_saves == 1:
                why = (
                    error
                    if isinstance(error, CheckpointError)
                    else type(error).__name__
                )
                self._note(
                    f"Progress could not be saved ({why}); the research goes on, "
                    "but cannot be resumed if interrupted."
                )

    async def save_between_rounds(
        self, state: RunState, ledger: SourceLedger, next_round: int
    ) -> None:
        """Keep the state as it is before ``next_round`` (already counted)."""
        await self.save(replace(state, round=next_round - 1), ledger)

    async def finish(self) -> None:
        """The run ended (answered, failed or stopped): forget its progress."""
        await self._remove()

    async def _remove(self) -> None:
        try:
            await self.store.remove(self.key.owner, self.key.chat)
        except Exception as error:  # a store's fault is a note
            log.warning("checkpoint not removed: %s", type(error).__name__)

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
