"""Durable runs: a run's state saved after every finished round, taken back later.

A `Checkpointer` belongs to one run of one user's chat. The run engine saves
between rounds (before each round after the first, after each consolidation,
before a wrap-up) and calls `finish` when the run ends with `RunFinished`; a
front end calls `resume` (or the engine `resume_heavy`) before the run to
learn whether an earlier run of the same question in the same chat can go on.
Saving never fails a run: a store that cannot be written is said once
(`notes`) and the research goes on unsaved.

**What a save costs the round.** The state before round n is durable before
round n's model request is sent: the engine awaits the save. Within that,
the event loop (which serves every other chat of the server) only takes the
record: the messages' pieces, new ones for what changed since the last save
(`core.checkpoint.MessagePieces`), and small copies. One worker thread then
encodes what is new, joins the pieces into one whole document and saves it
(`core.checkpoint.BlockingSave`: a file fsynced and renamed, or one database
transaction); a store that saves only on the loop gets the bytes after.
Saves asked for while a write is under way (a heavy run's rollouts) are
written together by the next write, which starts after them. What is left
on the loop is the thread's hand-off and the taking of the record, about
0.5 ms a save whatever the run's length (benchmarks/checkpoints.py).

**Stop.** A write in a thread cannot be stopped: a run cancelled while one is
under way waits for it (at most `WRITE_WAIT_SECONDS`), so that no write lands
after `finish` removed the record; a write still under way when `finish`
gives up waiting removes what it wrote itself.

A heavy run keeps its record in a `HeavyProgress`: each started rollout's
state between its rounds (taken when it starts, between its rounds, after its
consolidations and when it ends), each finished rollout's ending, the reports
written and, until the later rollouts start, the initial rollouts' most
uncertain steps (`HeavyProgress.keep` says the rule).

The store is a port (`core.checkpoint.CheckpointStore`): Open WebUI's
database for the pipe, a directory for the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..core.checkpoint import (
    MAX_BYTES,
    BlockingSave,
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    Header,
    HeavyCheckpoint,
    HeavyDocument,
    MessagePieces,
    Piece,
    ReportRecord,
    RolloutRecord,
    SingleDocument,
    SourcePieces,
    StateRecord,
    ending_record,
    papers_piece,
    question_key,
    read,
    state_record,
    step_record,
)
from ..core.events import ModelUsage, RunFinished
from ..core.loop import RunState
from ..core.parallelmuse import Step
from ..core.sources import SourceLedger

log = logging.getLogger(__name__)

#: How long an unfinished run's checkpoint is kept (a valve may change it).
DEFAULT_MAX_AGE_SECONDS = 7 * 24 * 3600.0
#: Longest a cancelled run, or `Checkpointer.finish`, waits for a write under
#: way (milliseconds when the store is well; a stuck one is not waited for).
WRITE_WAIT_SECONDS = 10.0


@dataclass(frozen=True)
class RunKey:
    """Whose run this is, where, and what it asks."""

    owner: str
    chat: str
    question: str
    #: "single" or "heavy": a heavy run does not resume a single one.
    mode: str = "single"


class _Document(Protocol):
    def encode(self, max_bytes: int) -> bytes: ...


class _Progress(Protocol):
    """What a run has to save: a single run's state, or a heavy run's."""

    def elapsed(self) -> float: ...

    def document(
        self,
        header: Header,
        sources: tuple[Piece, ...],
        dropped: bool,
        papers: Piece | None = None,
    ) -> _Document: ...


class _SingleProgress:
    """A single run's last state between rounds."""

    def __init__(self) -> None:
        self.pieces = MessagePieces()
        self.state: StateRecord | None = None
        self._elapsed = 0.0

    def keep(self, state: RunState, now: float) -> None:
        self.state = state_record(state, self.pieces)
        self.pieces.settle()
        self._elapsed = max(0.0, now - state.started)

    def elapsed(self) -> float:
        return self._elapsed

    def document(
        self,
        header: Header,
        sources: tuple[Piece, ...],
        dropped: bool,
        papers: Piece | None = None,
    ) -> SingleDocument:
        if self.state is None:  # pragma: no cover - kept before any write
            raise RuntimeError("nothing kept to save")
        return SingleDocument(
            header, self.state, sources, dropped=dropped, papers=papers
        )


class HeavyProgress:
    """A heavy run's checkpoint as its rollouts go (every call on the event loop).

    Each `keep` takes a rollout's record at once, so a rollout that goes on
    (or a later edit of a message) never changes what a write in a thread
    encodes. Scored steps, ParallelMuse's branch points, are kept by this
    rule: only an initial rollout's `branch_steps` most uncertain steps (the
    only ones `parallelmuse.branch_points` can pick, ties to the earlier),
    in their order, and only until the later rollouts start
    (`branches_started`); a step that answered the first messages of the
    rollout's saved conversation is written as that count, one the rollout
    consolidated away as its own messages. A record holds at most the
    rollouts' states, their endings, their reports and `branch_steps`
    conversations per initial rollout.
    """

    def __init__(
        self, rollouts: int, branch_steps: int, elapsed: Callable[[], float]
    ) -> None:
        """Keep a heavy run of ``rollouts`` whose time so far is ``elapsed()``."""
        self.rollouts = rollouts
        self.branch_steps = max(branch_steps, 1)
        self._elapsed = elapsed
        self._started: dict[int, RolloutRecord] = {}
        self._pieces: dict[int, MessagePieces] = {}
        self._reports: dict[int, ReportRecord] = {}
        self._branches_started = False

    def keep(
        self,
        number: int,
        state: RunState,
        *,
        round: int | None = None,
        branch: bool = False,
        inherited_rounds: int = 0,
        steps: Sequence[Step] = (),
        ending: RunFinished | None = None,
    ) -> None:
        """Take rollout ``number``'s record as it is now.

        Args:
            number: The rollout (1-based).
            state: Its state, between rounds or as it ended.
            round: The rounds it finished, when not ``state.round`` (a save
                before a round already counted).
            branch: It branched from an initial rollout's step.
            inherited_rounds: Rounds of its conversation its parent ran.
            steps: An initial rollout's scored steps so far.
            ending: How it ended (None while it runs).
        """
        pieces = self._pieces.setdefault(number, MessagePieces())
        kept = (
            () if self._branches_started else _most_uncertain(steps, self.branch_steps)
        )
        self._started[number] = RolloutRecord(
            number,
            state_record(state, pieces, round=round),
            branch=branch,
            inherited_rounds=inherited_rounds,
            ending=None if ending is None else ending_record(ending),
            steps=tuple(
                step_record(step, state, pieces, ("step", index))
                for index, step in enumerate(kept)
            ),
        )
        pieces.settle()

    def keep_report(
        self, rollout: int, text: str, usage: Sequence[ModelUsage] = ()
    ) -> None:
        """Keep the report written on ``rollout``'s trajectory."""
        self._reports[rollout] = ReportRecord(rollout, Piece(text), tuple(usage))

    def branches_started(self) -> None:
        """The later rollouts started: no branch starts from a step any more."""
        self._branches_started = True
        self._started = {
            number: replace(record, steps=())
            for number, record in self._started.items()
        }

    def elapsed(self) -> float:
        """Seconds the run has taken."""
        return self._elapsed()

    def document(
        self,
        header: Header,
        sources: tuple[Piece, ...],
        dropped: bool,
        papers: Piece | None = None,
    ) -> HeavyDocument:
        """The record as it is now, for a writer's thread."""
        return HeavyDocument(
            header,
            self.rollouts,
            tuple(self._started[k] for k in sorted(self._started)),
            tuple(self._reports[k] for k in sorted(self._reports)),
            sources,
            dropped=dropped,
            papers=papers,
        )


def _most_uncertain(steps: Sequence[Step], count: int) -> list[Step]:
    """The ``count`` most uncertain of ``steps`` (ties: the earlier), in order."""
    ranked = sorted(range(len(steps)), key=lambda index: -steps[index].uncertainty)
    return [steps[index] for index in sorted(ranked[:count])]


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
        write_wait_seconds: float = WRITE_WAIT_SECONDS,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        """Save under ``key`` in ``store``.

        Args:
            store: Where checkpoints live.
            key: The run's user, chat, question and mode.
            clock: The run's clock (`RunState.started` is on it).
            wall_clock: Seconds since the epoch, for expiry.
            max_age_seconds: Older checkpoints are not resumed, and removed.
            write_wait_seconds: Longest a cancelled run or `finish` waits for
                a write under way.
            max_bytes: The largest record written.
        """
        self.store = store
        self.key = key
        self.clock = clock
        self.wall_clock = wall_clock
        self.max_age_seconds = max_age_seconds
        self.write_wait_seconds = write_wait_seconds
        self.max_bytes = max_bytes
        #: What went wrong, said once each (for the front end's status line).
        self.notes: list[str] = []
        self._failed_saves = 0
        self._single = _SingleProgress()
        self._sources = SourcePieces()
        #: The papers' piece, and how many it holds (a ledger only adds).
        self._papers: tuple[int, Piece | None] = (0, None)
        #: What the next write takes, and the ledger it takes the sources of.
        self._progress: _Progress = self._single
        self._ledger = SourceLedger()
        #: The resumed record's trajectory was already incomplete.
        self._dropped = False
        #: The store's blocking save, when a worker thread can call it.
        self._blocking = _blocking_save(store)
        #: Writes started so far, and the last one (under way, or landed).
        self._writes = 0
        self._write: asyncio.Future[None] | None = None
        #: `finish` was called: no write starts; one it gave up waiting for
        #: removes what it wrote (``_removal``).
        self._finished = False
        self._remove_after_write = False
        self._removal: asyncio.Future[None] | None = None

    # -- taking a checkpoint back --
    async def resume(self) -> Checkpoint | None:
        """The single run's checkpoint this run goes on from, or None.

        A checkpoint of another question or mode in the chat is replaced by
        this run; a damaged, foreign or expired one is removed, with a note.
        """
        saved = await self._saved()
        if not isinstance(saved, Checkpoint):
            return None
        self._dropped = saved.trajectory_dropped
        return saved

    async def resume_heavy(self, rollouts: int) -> HeavyCheckpoint | None:
        """The heavy run's checkpoint this run of ``rollouts`` goes on from, or None.

        As `resume`; a checkpoint saved for another number of rollouts is
        not used (said in a note), and replaced by this run.
        """
        saved = await self._saved()
        if not isinstance(saved, HeavyCheckpoint):
            return None
        if saved.rollouts != rollouts:
            self._note(
                f"Saved progress was not used: it was saved for {saved.rollouts} "
                f"rollouts; this run has {rollouts}."
            )
            return None
        self._dropped = saved.trajectory_dropped
        return saved

    async def _saved(self) -> Checkpoint | HeavyCheckpoint | None:
        """The chat's checkpoint if it is this run's, read off the event loop."""
        key = self.key
        try:
            data = await self.store.load(key.owner, key.chat)
        except Exception as error:  # a store's fault is a note
            self._note(f"Saved progress could not be read ({type(error).__name__}).")
            return None
        if data is None:
            return None
        try:
            saved = await asyncio.to_thread(
                read, data, owner=key.owner, chat=key.chat, now=self.clock()
            )
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
        ledger.restore(saved.sources, saved.reads, saved.papers)
        return saved.state, True

    # -- saving --
    async def save(self, state: RunState, ledger: SourceLedger) -> None:
        """Keep ``state`` (between rounds) and the run's sources, durably."""
        self._single.keep(state, self.clock())
        await self._commit(self._single, ledger)

    async def save_between_rounds(
        self, state: RunState, ledger: SourceLedger, next_round: int
    ) -> None:
        """Keep the state as it is before ``next_round`` (already counted)."""
        await self.save(replace(state, round=next_round - 1), ledger)

    async def save_heavy(self, progress: HeavyProgress, ledger: SourceLedger) -> None:
        """Keep a heavy run's ``progress`` and its sources, durably."""
        await self._commit(progress, ledger)

    async def _commit(self, progress: _Progress, ledger: SourceLedger) -> None:
        """Wait for a write that takes ``progress`` as it is now.

        A write under way took an earlier state: the next one, started once
        it lands, takes this one, and every other asked for meanwhile (a
        heavy run's rollouts are written together).
        """
        self._progress, self._ledger = progress, ledger
        asked = self._writes
        while self._writes == asked:  # no write has started since this call
            if self._write is not None and not self._write.done():
                await self._through(self._write)  # an earlier one lands first
            else:
                self._write = self._start()
                self._writes += 1
        if self._write is not None:
            await self._through(self._write)

    async def _through(self, write: asyncio.Future[None]) -> None:
        """Wait for ``write`` to land (its failure is a note, not an error)."""
        try:
            await asyncio.wait({write})
        except asyncio.CancelledError:
            # Stop: the write cannot be stopped in its thread; let it land
            # first, so that nothing is written after `finish` removed it.
            await _landed(write, self.write_wait_seconds)
            raise

    def _start(self) -> asyncio.Future[None] | None:
        """Take the record on the loop; encode and store it in a worker thread."""
        if self._finished:
            return None
        key, ledger, progress = self.key, self._ledger, self._progress
        header = Header(
            owner=key.owner,
            chat=key.chat,
            mode=key.mode,
            question=question_key(key.question),
            saved_at=self.wall_clock(),
            elapsed=progress.elapsed(),
            reads=ledger.reads,
        )
        sources = self._sources.of(ledger.sources)
        document = progress.document(
            header, sources, self._dropped, self._papers_of(ledger)
        )
        write: asyncio.Future[None]
        if self._blocking is not None:  # one thread encodes and saves
            write = asyncio.get_running_loop().run_in_executor(
                None,
                _encoded_and_saved,
                document,
                self.max_bytes,
                self._blocking,
                key,
            )
        else:
            write = asyncio.ensure_future(self._encoded_then_saved(document))
        write.add_done_callback(self._written)
        return write

    def _papers_of(self, ledger: SourceLedger) -> Piece | None:
        """The piece of the ledger's papers, made again only when one was added."""
        count, piece = self._papers
        if count != len(ledger.papers):
            piece = papers_piece(list(ledger.papers.values()))
            self._papers = (len(ledger.papers), piece)
        return piece

    async def _encoded_then_saved(self, document: _Document) -> None:
        """A store that saves only on the loop: encode in a thread, then save."""
        data = await asyncio.to_thread(document.encode, self.max_bytes)
        await self.store.save(self.key.owner, self.key.chat, data)

    def _written(self, write: asyncio.Future[None]) -> None:
        """A write landed: say a failure; remove it if `finish` gave up on it."""
        if write.cancelled():
            return
        error = write.exception()
        if isinstance(error, Exception):  # never fail the research
            self._failed(error)
        if self._remove_after_write:
            self._removal = asyncio.ensure_future(self._remove())

    def _failed(self, error: Exception) -> None:
        self._failed_saves += 1
        log.warning("checkpoint not saved: %s", type(error).__name__)
        if self._failed_saves == 1:
            why = error if isinstance(error, CheckpointError) else type(error).__name__
            self._note(
                f"Progress could not be saved ({why}); the research goes on, "
                "but cannot be resumed if interrupted."
            )

    # -- forgetting --
    async def finish(self) -> None:
        """The run ended (answered, failed or stopped): forget its progress.

        A write under way lands first (at most `write_wait_seconds`); one
        that takes longer removes what it wrote itself.
        """
        self._finished = True
        write = self._write
        if write is not None and not write.done():
            try:
                await asyncio.wait({write}, timeout=self.write_wait_seconds)
            finally:  # given up, or cancelled: the write removes itself
                self._remove_after_write = not write.done()
        await self._remove()

    async def _remove(self) -> None:
        try:
            await self.store.remove(self.key.owner, self.key.chat)
        except Exception as error:  # a store's fault is a note
            log.warning("checkpoint not removed: %s", type(error).__name__)

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _blocking_save(store: CheckpointStore) -> Callable[[str, str, bytes], None] | None:
    """``store``'s `save_blocking`, if its `save` is the one that goes with it.

    A store that overrides `save` alone (a wrapper, a test's failing store)
    is saved through its `save`.
    """
    if not isinstance(store, BlockingSave):
        return None

    def giver(name: str) -> type | None:
        return next((k for k in type(store).__mro__ if name in vars(k)), None)

    return store.save_blocking if giver("save") is giver("save_blocking") else None


def _encoded_and_saved(
    document: _Document,
    max_bytes: int,
    save: Callable[[str, str, bytes], None],
    key: RunKey,
) -> None:
    """Encode ``document`` and save it (in a worker thread)."""
    save(key.owner, key.chat, document.encode(max_bytes))


async def _landed(write: asyncio.Future[None], seconds: float) -> None:
    """Wait up to ``seconds`` for ``write``, even through cancellations.

    The caller is being cancelled already (a run's Stop cancels it, then the
    tasks under it once more): a second cancellation must not end the wait
    for a write that is landing.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not write.done() and (left := deadline - loop.time()) > 0:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({write}, timeout=left)
