"""A run's state as a versioned, bounded record that can be saved and loaded.

A research of 10 to 60 minutes should survive the process that runs it. After
every finished round the run engine takes a checkpoint: the conversation as
the model will see it, the trajectory across consolidations, the budgets spent
(rounds, tokens, the seconds the run has taken), and the sources with their
numbers and evidence. A record is UTF-8 JSON within `MAX_BYTES`; `read` takes
one back and refuses, with a reason a person can read, anything that is not a
checkpoint of a version it reads for this user and chat: a file or row from
elsewhere is data, never trusted.

Two kinds of record, told apart by their version:

- **version 1** (`VERSION`): a single run (`Checkpoint`: `encode`, `decode`);
- **version 2** (`HEAVY_VERSION`): a heavy run (`HeavyCheckpoint`,
  `decode_heavy`): each started rollout's state between its rounds, how each
  finished rollout ended, the reports written, and, while the later rollouts
  have not started, the initial rollouts' most uncertain steps they branch
  from. A reader of version 1 only refuses it by its version.

**Written once, assembled often.** A record is taken on the event loop as
pieces that never change (`StateRecord`, `Piece`): each message is its JSON,
encoded once and kept while the message is unchanged (`MessagePieces`), or a
copy of it still to encode; a writer's thread then encodes what is new and
joins the pieces into one whole document (`SingleDocument`,
`HeavyDocument`). A 100-round research re-encodes only the round's new
messages, not the whole conversation, and nothing of it on the event loop.

Nothing here holds a setting: no key, no server URL, no valve. The record is
the research itself (what the model and the tools wrote), so it belongs to one
user and one chat, and a store keeps it only for them.

Pure: JSON in, JSON out; where it is stored is the front end's choice.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import operator
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .events import TERMINATION_TEXT, Counters, ModelUsage, RunFinished, RunStats
from .loop import RunState
from .parallelmuse import Step
from .sources import MAX_PAPERS, Paper, Source

#: The record's name, and the versions of its two kinds: another name or
#: version is not read.
FORMAT = "tongyi-deepresearch-checkpoint"
VERSION = 1
HEAVY_VERSION = 2
#: Largest record written or read. A 100-round research holds the context
#: (at most ~0.5 MB of text at 110K tokens), its trajectory and its sources:
#: a few MB (README gives the measured size); past this, the trajectory before
#: the current conversation is left out (`Checkpoint.trajectory_dropped`).
MAX_BYTES = 16 * 1024 * 1024
#: Most rollouts one heavy run may start (and a heavy record may hold).
MAX_ROLLOUTS = 8
#: Deepest JSON nesting read (messages are lists of dicts of lists at most).
_MAX_DEPTH = 32


class CheckpointError(ValueError):
    """A record that is not a usable checkpoint; the message says why."""


@dataclass(frozen=True)
class Checkpoint:
    """One run's progress: where a resumed run goes on from."""

    #: The user and the chat it belongs to (a store checks both).
    owner: str
    chat: str
    #: What the run was asked: "single" or "heavy", and the question's key
    #: (`question_key`), so a different question in the chat starts fresh.
    mode: str
    question: str
    state: RunState
    sources: tuple[Source, ...]
    #: Pages read, re-reads included (the ledger's `reads`).
    reads: int = 0
    #: Seconds of research before the save (the clock restarts on resume).
    elapsed: float = 0.0
    #: When it was saved (seconds since the epoch), for expiry.
    saved_at: float = 0.0
    #: The trajectory before the current conversation did not fit `MAX_BYTES`.
    trajectory_dropped: bool = False
    #: The scholarly records the run's searches found (for its exports).
    papers: tuple[Paper, ...] = ()


@dataclass(frozen=True)
class SavedRollout:
    """A heavy run's rollout as its checkpoint kept it."""

    number: int
    #: Its state between rounds (a finished rollout's: as it ended).
    state: RunState
    #: It branched from an initial rollout's step (it wraps up at the limit).
    branch: bool = False
    #: Rounds of its conversation that its parent ran.
    inherited_rounds: int = 0
    #: How it ended (its rounds its own); None while it runs.
    ending: RunFinished | None = None
    #: An initial rollout's most uncertain steps, while branches may start.
    steps: tuple[Step, ...] = ()


@dataclass(frozen=True)
class SavedReport:
    """A report written on a rollout's trajectory, and what its call cost."""

    rollout: int
    text: str
    usage: tuple[ModelUsage, ...] = ()


@dataclass(frozen=True)
class HeavyCheckpoint:
    """A heavy run's progress: its rollouts, its reports, its sources."""

    owner: str
    chat: str
    question: str
    #: Rollouts the run starts (the saved ones are among 1..rollouts).
    rollouts: int
    started: tuple[SavedRollout, ...]
    reports: tuple[SavedReport, ...]
    sources: tuple[Source, ...]
    reads: int = 0
    #: Seconds of research before the save, the run's (all rollouts').
    elapsed: float = 0.0
    saved_at: float = 0.0
    #: A rollout's trajectory before its conversation did not fit `MAX_BYTES`.
    trajectory_dropped: bool = False
    mode: str = "heavy"
    #: The scholarly records the rollouts' searches found (for the exports).
    papers: tuple[Paper, ...] = ()


class CheckpointStore(Protocol):
    """Bytes kept per (owner, chat), across processes and restarts."""

    async def load(self, owner: str, chat: str) -> bytes | None:
        """The checkpoint kept for ``owner``'s ``chat`` (None: none kept)."""
        ...

    async def save(self, owner: str, chat: str, data: bytes) -> None:
        """Keep ``data``, replacing what was kept, all or nothing."""
        ...

    async def remove(self, owner: str, chat: str) -> None:
        """Forget the chat's checkpoint (the run finished or was stopped)."""
        ...

    async def expire(self, older_than: float) -> int:
        """Forget checkpoints saved before ``older_than``; how many."""
        ...


@runtime_checkable
class BlockingSave(Protocol):
    """A store that can also save from a worker thread, blocking that thread.

    The run engine then encodes a record and saves it in one thread, one
    hand-off from the event loop instead of two.
    """

    def save_blocking(self, owner: str, chat: str, data: bytes) -> None:
        """`CheckpointStore.save`, done in the calling (worker) thread."""
        ...


def question_key(question: str) -> str:
    """The question as a checkpoint remembers it (whitespace-normalised)."""
    return " ".join(question.split())


# -- pieces: JSON encoded once ----------------------------------------------------


class Piece:
    """A value of a record, turned into JSON once, when first written.

    It is made on the event loop from a value nothing changes any more (a
    copy, or text), and encoded by the writer's thread; a record taken later
    reuses it as it is.
    """

    __slots__ = ("_json", "_value")

    def __init__(self, value: Any) -> None:
        """Hold ``value`` (JSON-able) until it is written."""
        self._value: Any = value
        self._json: str | None = None

    def json(self) -> str:
        """The value as JSON (encoded on the first call)."""
        if self._json is None:
            self._json = _json_text(self._value)
            self._value = None
        return self._json


#: Compact JSON; ensure_ascii: a lone surrogate a server streamed stays
#: writable. One encoder for every call (json.dumps with options makes one
#: each time).
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_json_text = _ENCODER.encode


#: A message's values as they were (compared by identity first).
_Items = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class _Lane:
    """The messages of one list a record holds, as the last record took them."""

    messages: list[dict[str, Any]]
    pieces: tuple[Piece, ...]
    #: The last message's values then (it alone may be edited in place).
    last: _Items


class MessagePieces:
    """The `Piece` of each message of a run, kept while the message is unchanged.

    A record holds a few lists of messages (``lane``: the conversation, the
    trajectory before it, a step's conversation); each is compared with what
    the last record took of it, by identity, at C speed. The loop appends
    messages, replaces one with a new dict (`_make_room_for_answer`,
    consolidation), or writes over the LAST one in place (`_overwrite_last`):
    the messages before the last one taken keep their pieces when they are
    the same objects; the last one also when its values are the same; what
    differs from there on gets new pieces. A piece is made from a copy, so a
    message may change after it is taken. Only the lanes asked for since the
    last `settle` are kept.
    """

    def __init__(self) -> None:
        """Start with no pieces."""
        self._lanes: dict[Hashable, _Lane] = {}
        self._used: set[Hashable] = set()

    def of(
        self, messages: Sequence[dict[str, Any]], lane: Hashable = "messages"
    ) -> tuple[Piece, ...]:
        """The pieces of ``messages``, in order (new ones for what changed)."""
        seen = self._lanes.get(lane)
        same = 0
        if seen is not None:
            same = _same_start(seen.messages, messages)
            if (
                same
                and same == len(seen.messages)
                and tuple(messages[same - 1].items()) != seen.last
            ):
                same -= 1  # the last one taken was written over in place since
        pieces = (seen.pieces[:same] if seen else ()) + tuple(
            Piece(_frozen_copy(message)) for message in messages[same:]
        )
        last_items = tuple(messages[-1].items()) if messages else ()
        self._lanes[lane] = _Lane(list(messages), pieces, last_items)
        self._used.add(lane)
        return pieces

    def settle(self) -> None:
        """Keep only the lanes asked for since the last settle."""
        self._lanes = {lane: self._lanes[lane] for lane in self._used}
        self._used = set()


def _same_start(seen: Sequence[Any], now: Sequence[Any]) -> int:
    """How many of the first items of ``now`` are those of ``seen`` (identity)."""
    return len(list(itertools.takewhile(bool, map(operator.is_, seen, now))))


def _frozen_copy(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as it is now, whatever is done to it later."""
    if all(isinstance(value, str | int | float | None) for value in message.values()):
        return dict(message)  # text is never edited in place
    return copy.deepcopy(message)  # a list content (a question with images)


class SourcePieces:
    """Each source's `Piece`, kept while the source is unchanged.

    A ledger only adds to a source: richer evidence (a new text), another
    address (``aliases``), another rollout reading it (``readers``); the
    texts by identity and the sets by size tell whether it changed.
    """

    def __init__(self) -> None:
        """Start with no pieces."""
        self._kept: dict[int, tuple[Source, tuple[Any, ...], Piece]] = {}

    def of(self, sources: Sequence[Source]) -> tuple[Piece, ...]:
        """The pieces of ``sources``, in order."""
        used: dict[int, tuple[Source, tuple[Any, ...], Piece]] = {}
        pieces = []
        for source in sources:
            key = id(source)
            looks = (
                source.number,
                source.url,
                source.title,
                source.evidence,
                source.summary,
                len(source.aliases),
                len(source.readers),
            )
            entry = self._kept.get(key)
            if entry is None or entry[0] is not source or entry[1] != looks:
                entry = (source, looks, Piece(_source_record(source)))
            used[key] = entry
            pieces.append(entry[2])
        self._kept = used
        return tuple(pieces)


def papers_piece(papers: Sequence[Paper]) -> Piece:
    """The run's scholarly records as one piece of a record."""
    return Piece([_paper_record(paper) for paper in papers[:MAX_PAPERS]])


def _paper_record(paper: Paper) -> dict[str, Any]:
    return {
        "url": paper.url,
        "title": paper.title,
        "pdf": paper.pdf,
        "authors": list(paper.authors),
        "year": paper.year,
        "venue": paper.venue,
        "doi": paper.doi,
    }


def _source_record(source: Source) -> dict[str, Any]:
    return {
        "number": source.number,
        "url": source.url,
        "title": source.title,
        "evidence": source.evidence,
        "summary": source.summary,
        "aliases": sorted(source.aliases),
        "readers": sorted(source.readers),
    }


# -- a run's state, taken between rounds --------------------------------------------

#: RunState fields written by `state_record` itself, not as plain values.
_STRUCTURED = frozenset({"messages", "trajectory", "counters", "pages", "started"})
#: The plain fields (numbers, text, None), by name.
_PLAIN = tuple(
    f.name for f in dataclasses.fields(RunState) if f.name not in _STRUCTURED
)
#: The counters' names (each a number, or None).
_COUNTERS = tuple(f.name for f in dataclasses.fields(Counters))


@dataclass(frozen=True)
class StateRecord:
    """A `RunState` as a record holds it, taken when it was: nothing in it changes.

    The trajectory ends with the conversation's own messages: they are written
    once (``shared`` of them), and joined again, the same objects, on load.
    """

    plain: dict[str, Any]
    counters: dict[str, Any]
    pages: Piece
    messages: tuple[Piece, ...]
    #: The trajectory before the conversation's own messages.
    head: tuple[Piece, ...]
    shared: int

    @property
    def round(self) -> int:
        """The rounds finished when it was taken."""
        return int(self.plain["round"])

    def body(self, *, with_history: bool) -> dict[str, Any]:
        """The record's ``state`` object (the earlier trajectory left out or not)."""
        return {
            **self.plain,
            "counters": self.counters,
            "pages": self.pages,
            "messages": list(self.messages),
            "trajectory_head": list(self.head) if with_history else [],
            "trajectory_shared": self.shared,
        }


def state_record(
    state: RunState, pieces: MessagePieces, *, round: int | None = None
) -> StateRecord:
    """``state`` as it is now (``round``: the rounds finished, if not its own).

    Cheap: the messages are pieces (new ones only for what changed since
    ``pieces`` last saw them), the rest small copies.
    """
    shared = _same_start(state.messages[::-1], state.trajectory[::-1])
    plain = {name: getattr(state, name) for name in _PLAIN}
    if round is not None:
        plain["round"] = round
    counters = state.counters
    return StateRecord(
        plain=plain,
        counters={name: getattr(counters, name) for name in _COUNTERS},
        pages=Piece([list(page) for page in state.pages]),
        messages=pieces.of(state.messages),
        head=pieces.of(state.trajectory[: len(state.trajectory) - shared], "head"),
        shared=shared,
    )


# -- documents: the pieces joined -----------------------------------------------------


@dataclass(frozen=True)
class Header:
    """What every record says first: whose run, which question, when."""

    owner: str
    chat: str
    mode: str
    question: str
    saved_at: float
    elapsed: float
    reads: int

    def fields(self, version: int) -> dict[str, Any]:
        """The record's first fields, in their order."""
        return {
            "format": FORMAT,
            "version": version,
            "owner": self.owner,
            "chat": self.chat,
            "mode": self.mode,
            "question": self.question,
            "saved_at": self.saved_at,
            "elapsed": self.elapsed,
            "reads": self.reads,
        }


@dataclass(frozen=True)
class SingleDocument:
    """A single run's record, ready to be written (by any thread)."""

    header: Header
    state: StateRecord
    sources: tuple[Piece, ...]
    #: The trajectory was already incomplete (a resumed run's).
    dropped: bool = False
    #: The scholarly records found (`papers_piece`); None: none.
    papers: Piece | None = None

    def encode(self, max_bytes: int = MAX_BYTES) -> bytes:
        """The record, at most ``max_bytes`` (see `encode`)."""
        return _within(self._record, max_bytes)

    def _record(self, with_history: bool) -> dict[str, Any]:
        return {
            **self.header.fields(VERSION),
            "trajectory_dropped": self.dropped or not with_history,
            "state": self.state.body(with_history=with_history),
            "sources": list(self.sources),
            "papers": self.papers if self.papers is not None else [],
        }


@dataclass(frozen=True)
class StepRecord:
    """An initial rollout's step, as a record holds it.

    ``prefix``: the step answered the first ``prefix`` messages of the
    rollout's saved conversation (and had read its first ``pages`` pages);
    otherwise (the conversation was consolidated since) its own ``messages``
    and pages are written.
    """

    uncertainty: float
    round: int
    prefix: int | None
    pages: int | Piece
    messages: tuple[Piece, ...] = ()

    def body(self) -> dict[str, Any]:
        """The step's object in the record."""
        if self.prefix is not None:
            return {
                "uncertainty": self.uncertainty,
                "round": self.round,
                "prefix": self.prefix,
                "pages": self.pages,
            }
        return {
            "uncertainty": self.uncertainty,
            "round": self.round,
            "messages": list(self.messages),
            "pages": self.pages,
        }


def step_record(
    step: Step, state: RunState, pieces: MessagePieces, lane: Hashable = "step"
) -> StepRecord:
    """``step`` of the rollout whose state is ``state``, as cheaply as it can be.

    ``lane``: where ``pieces`` keeps this step's messages, if it needs them.
    """
    count, pages = len(step.messages), len(step.pages)
    if (
        count <= len(state.messages)
        and tuple(state.messages[:count]) == step.messages
        and tuple(state.pages[:pages]) == step.pages
    ):
        return StepRecord(step.uncertainty, step.round, count, pages)
    return StepRecord(
        step.uncertainty,
        step.round,
        None,
        Piece([list(page) for page in step.pages]),
        pieces.of(step.messages, lane),
    )


@dataclass(frozen=True)
class RolloutRecord:
    """One started rollout of a heavy run, as its record holds it."""

    number: int
    state: StateRecord
    branch: bool = False
    inherited_rounds: int = 0
    #: How it ended (`ending_record`); None while it runs.
    ending: dict[str, Any] | None = None
    steps: tuple[StepRecord, ...] = ()

    def body(self, *, with_history: bool) -> dict[str, Any]:
        """The rollout's object in the record."""
        return {
            "number": self.number,
            "branch": self.branch,
            "inherited_rounds": self.inherited_rounds,
            "state": self.state.body(with_history=with_history),
            "ending": self.ending,
            "steps": [step.body() for step in self.steps],
        }


def ending_record(finished: RunFinished) -> dict[str, Any]:
    """What a record keeps of a finished rollout (what its report needs)."""
    return {
        "reason": finished.reason,
        "answer": finished.answer,
        "error": finished.error,
        "answer_marked": finished.answer_marked,
        "lab_termination": finished.lab_termination,
        "stats": dataclasses.asdict(finished.stats),
    }


@dataclass(frozen=True)
class ReportRecord:
    """A written report, as its record holds it."""

    rollout: int
    text: Piece
    usage: tuple[ModelUsage, ...] = ()

    def body(self) -> dict[str, Any]:
        """The report's object in the record."""
        return {
            "rollout": self.rollout,
            "text": self.text,
            "usage": [dataclasses.asdict(usage) for usage in self.usage],
        }


@dataclass(frozen=True)
class HeavyDocument:
    """A heavy run's record, ready to be written (by any thread)."""

    header: Header
    rollouts: int
    started: tuple[RolloutRecord, ...]
    reports: tuple[ReportRecord, ...]
    sources: tuple[Piece, ...]
    dropped: bool = False
    #: The scholarly records found (`papers_piece`); None: none.
    papers: Piece | None = None

    def encode(self, max_bytes: int = MAX_BYTES) -> bytes:
        """The record, at most ``max_bytes``; the earlier trajectories go first."""
        return _within(self._record, max_bytes)

    def _record(self, with_history: bool) -> dict[str, Any]:
        return {
            **self.header.fields(HEAVY_VERSION),
            "trajectory_dropped": self.dropped or not with_history,
            "rollouts": self.rollouts,
            "started": [r.body(with_history=with_history) for r in self.started],
            "reports": [report.body() for report in self.reports],
            "sources": list(self.sources),
            "papers": self.papers if self.papers is not None else [],
        }


def _within(record: Callable[[bool], dict[str, Any]], max_bytes: int) -> bytes:
    """``record(True)`` as bytes, or ``record(False)`` if that is too big.

    Raises:
        CheckpointError: Even without the earlier trajectory it is too big.
    """
    data = _render(record(True))
    if len(data) <= max_bytes:
        return data
    data = _render(record(False))
    if len(data) <= max_bytes:
        return data
    raise CheckpointError(
        f"the run's state is {len(data):,} bytes, over the {max_bytes:,}-byte limit"
    )


def _render(record: dict[str, Any]) -> bytes:
    """The record as compact JSON: its pieces as they were encoded."""
    out: list[str] = []
    _render_into(record, out)
    return "".join(out).encode("ascii")


def _render_into(value: Any, out: list[str]) -> None:
    if isinstance(value, Piece):
        out.append(value.json())
    elif isinstance(value, dict):
        out.append("{")
        for index, (key, item) in enumerate(value.items()):
            out.append(f"{',' if index else ''}{_key(key)}:")
            _render_into(item, out)
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            if type(item) is Piece:  # most of a record: said at once
                out.append(item.json())
            else:
                _render_into(item, out)
        out.append("]")
    else:
        out.append(_json_text(value))


#: Each key of a record as JSON (a record's keys are its own few names).
_KEYS: dict[str, str] = {}
_MOST_KEYS = 256


def _key(name: str) -> str:
    encoded = _KEYS.get(name)
    if encoded is None:
        encoded = _json_text(name)
        if len(_KEYS) < _MOST_KEYS:
            _KEYS[name] = encoded
    return encoded


def encode(checkpoint: Checkpoint, max_bytes: int = MAX_BYTES) -> bytes:
    """``checkpoint`` as UTF-8 JSON, at most ``max_bytes``.

    Raises:
        CheckpointError: Even without the earlier trajectory it is too big.
    """
    header = Header(
        owner=checkpoint.owner,
        chat=checkpoint.chat,
        mode=checkpoint.mode,
        question=checkpoint.question,
        saved_at=checkpoint.saved_at,
        elapsed=checkpoint.elapsed,
        reads=checkpoint.reads,
    )
    document = SingleDocument(
        header,
        state_record(checkpoint.state, MessagePieces()),
        SourcePieces().of(checkpoint.sources),
        dropped=checkpoint.trajectory_dropped,
        papers=papers_piece(checkpoint.papers),
    )
    return document.encode(max_bytes)


# -- reading ------------------------------------------------------------------


def read(
    data: bytes, *, owner: str, chat: str, now: float, max_bytes: int = MAX_BYTES
) -> Checkpoint | HeavyCheckpoint:
    """The checkpoint in ``data``, of either kind, for ``owner``'s ``chat``.

    Raises:
        CheckpointError: As `decode` and `decode_heavy`; a version neither
            reads is refused by its version.
    """
    record = _parsed(data, max_bytes)
    version = record.get("version")
    if version == VERSION:
        return _single(record, owner=owner, chat=chat, now=now)
    if version == HEAVY_VERSION:
        return _heavy(record, owner=owner, chat=chat, now=now)
    raise CheckpointError(
        f"it is version {version!r}; this version reads {VERSION} and {HEAVY_VERSION}"
    )


def decode(
    data: bytes, *, owner: str, chat: str, now: float, max_bytes: int = MAX_BYTES
) -> Checkpoint:
    """The single run's checkpoint in ``data``, for ``owner``'s ``chat``.

    Args:
        data: What a store kept.
        owner: The user asking to resume.
        chat: The chat they resume in.
        now: The clock a resumed run measures its time with.
        max_bytes: The largest record read.

    Raises:
        CheckpointError: ``data`` is too big, not JSON, another format or
            version, another user's or chat's, or not the shape written.
    """
    record = _parsed(data, max_bytes)
    _check_version(record, VERSION)
    return _single(record, owner=owner, chat=chat, now=now)


def decode_heavy(
    data: bytes, *, owner: str, chat: str, now: float, max_bytes: int = MAX_BYTES
) -> HeavyCheckpoint:
    """The heavy run's checkpoint in ``data``, for ``owner``'s ``chat``.

    Raises:
        CheckpointError: As `decode`; and a rollout out of the run's range or
            twice, a report for a rollout that did not answer, a step or a
            count past what it counts.
    """
    record = _parsed(data, max_bytes)
    _check_version(record, HEAVY_VERSION)
    return _heavy(record, owner=owner, chat=chat, now=now)


def _parsed(data: bytes, max_bytes: int) -> dict[str, Any]:
    """``data`` as a record of this format (its kind not yet known)."""
    if len(data) > max_bytes:
        raise CheckpointError(f"it is over {max_bytes:,} bytes")
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CheckpointError("it is not JSON") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError("it is not a research checkpoint")
    return record


def _check_version(record: dict[str, Any], version: int) -> None:
    if record.get("version") != version:
        raise CheckpointError(
            f"it is version {record.get('version')!r}; this version reads {version}"
        )


def _check_owner(record: dict[str, Any], owner: str, chat: str) -> None:
    _check_depth(record)
    if record.get("owner") != owner or record.get("chat") != chat:
        raise CheckpointError("it belongs to another user or chat")


def _check_depth(record: Any) -> None:
    """Refuse nesting deeper than a checkpoint writes (iteratively)."""
    pending: list[tuple[Any, int]] = [(record, 0)]
    while pending:
        value, depth = pending.pop()
        if depth > _MAX_DEPTH:
            raise CheckpointError("it nests deeper than a checkpoint does")
        if isinstance(value, dict):
            pending.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            pending.extend((item, depth + 1) for item in value)


def _single(record: dict[str, Any], *, owner: str, chat: str, now: float) -> Checkpoint:
    _check_owner(record, owner, chat)
    try:
        return _checkpoint(record, now)
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"it is damaged ({type(error).__name__})") from None


def _heavy(
    record: dict[str, Any], *, owner: str, chat: str, now: float
) -> HeavyCheckpoint:
    _check_owner(record, owner, chat)
    try:
        return _heavy_checkpoint(record, now)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"it is damaged ({type(error).__name__})") from None


def _checkpoint(record: dict[str, Any], now: float) -> Checkpoint:
    elapsed = _number(record["elapsed"])
    dropped = _flag(record["trajectory_dropped"])
    return Checkpoint(
        owner=_text(record["owner"]),
        chat=_text(record["chat"]),
        mode=_text(record["mode"]),
        question=_text(record["question"]),
        state=_state(record["state"], now - elapsed, dropped=dropped),
        sources=_sources(record["sources"]),
        reads=_count(record["reads"]),
        elapsed=elapsed,
        saved_at=_number(record["saved_at"]),
        trajectory_dropped=dropped,
        papers=_papers(record.get("papers", [])),
    )


def _state(value: Any, started: float, *, dropped: bool) -> RunState:
    """A `StateRecord`'s body back as the state it was."""
    state_record = _dict(value)
    messages = [_message(m) for m in _list(state_record["messages"])]
    head = [_message(m) for m in _list(state_record["trajectory_head"])]
    shared = _count(state_record["trajectory_shared"], len(messages))
    plain = {
        f.name: _typed(state_record[f.name], str(f.type))
        for f in dataclasses.fields(RunState)
        if f.name not in _STRUCTURED | {"opening"}
    }
    # The message the conversation opens with; -1 until the loop finds it (a
    # rollout saved as it starts).
    opening = state_record["opening"]
    if not (type(opening) is int and opening == -1):
        _count(opening, len(messages) - 1)
    return RunState(
        opening=opening,
        messages=messages,
        started=started,
        counters=_counters(state_record["counters"]),
        pages=[_page(page) for page in _list(state_record["pages"])],
        trajectory=list(messages)
        if dropped
        else head + messages[len(messages) - shared :],
        **plain,
    )


def _sources(value: Any) -> tuple[Source, ...]:
    sources = tuple(_source(s) for s in _list(value))
    if [s.number for s in sources] != list(range(1, len(sources) + 1)):
        raise ValueError("sources out of their numbering")
    return sources


def _papers(value: Any) -> tuple[Paper, ...]:
    """The scholarly records of a record (a record of before them has none)."""
    items = _list(value)
    if len(items) > MAX_PAPERS:
        raise ValueError("too many papers")
    return tuple(_paper(item) for item in items)


def _paper(value: Any) -> Paper:
    item = _dict(value)
    return Paper(
        url=_text(item["url"]),
        title=_text(item["title"]),
        pdf=_text(item["pdf"]),
        authors=tuple(_text(author) for author in _list(item["authors"])),
        year=_text(item["year"]),
        venue=_text(item["venue"]),
        doi=_text(item["doi"]),
    )


def _source(value: Any) -> Source:
    item = _dict(value)
    return Source(
        number=_count(item["number"]),
        url=_text(item["url"]),
        title=_text(item["title"]),
        evidence=_text(item["evidence"]),
        summary=_text(item["summary"]),
        aliases={_text(a) for a in _list(item["aliases"])},
        readers={_count(r) for r in _list(item["readers"])},
    )


# -- reading a heavy run's record --


def _heavy_checkpoint(record: dict[str, Any], now: float) -> HeavyCheckpoint:
    if record["mode"] != "heavy":
        raise ValueError("a heavy record of another mode")
    rollouts = _count(record["rollouts"])
    if not 1 <= rollouts <= MAX_ROLLOUTS:
        raise CheckpointError(
            f"it is damaged: it counts {rollouts} rollouts (at most {MAX_ROLLOUTS})"
        )
    elapsed = _number(record["elapsed"])
    dropped = _flag(record["trajectory_dropped"])
    started = tuple(
        _saved_rollout(item, now - elapsed, dropped=dropped)
        for item in _list(record["started"])
    )
    _check_numbers([r.number for r in started], rollouts)
    reports = tuple(_saved_report(item) for item in _list(record["reports"]))
    _check_reports(reports, started)
    return HeavyCheckpoint(
        owner=_text(record["owner"]),
        chat=_text(record["chat"]),
        question=_text(record["question"]),
        rollouts=rollouts,
        started=started,
        reports=reports,
        sources=_sources(record["sources"]),
        reads=_count(record["reads"]),
        elapsed=elapsed,
        saved_at=_number(record["saved_at"]),
        trajectory_dropped=dropped,
        papers=_papers(record.get("papers", [])),
    )


def _check_numbers(numbers: list[int], rollouts: int) -> None:
    """Each rollout once, within the run's ``rollouts``."""
    for number in numbers:
        if not 1 <= number <= rollouts:
            raise CheckpointError(
                f"it is damaged: it holds rollout {number} of {rollouts}"
            )
    if len(set(numbers)) != len(numbers):
        raise CheckpointError("it is damaged: it holds a rollout twice")


def _check_reports(
    reports: tuple[SavedReport, ...], started: tuple[SavedRollout, ...]
) -> None:
    """Each report once, on a rollout that answered."""
    answered = {r.number for r in started if r.ending is not None and r.ending.answer}
    for report in reports:
        if report.rollout not in answered:
            raise CheckpointError(
                f"it is damaged: it holds a report on rollout {report.rollout}, "
                "which did not answer"
            )
    if len({report.rollout for report in reports}) != len(reports):
        raise CheckpointError("it is damaged: it holds a report twice")


def _saved_rollout(value: Any, started: float, *, dropped: bool) -> SavedRollout:
    item = _dict(value)
    state = _state(item["state"], started, dropped=dropped)
    inherited = _count(item["inherited_rounds"], state.round)
    ending = item["ending"]
    return SavedRollout(
        number=_count(item["number"]),
        state=state,
        branch=_flag(item["branch"]),
        inherited_rounds=inherited,
        ending=None if ending is None else _ending(ending, state),
        steps=tuple(_step(step, state) for step in _list(item["steps"])),
    )


def _ending(value: Any, state: RunState) -> RunFinished:
    item = _dict(value)
    reason = _text(item["reason"])
    if reason not in TERMINATION_TEXT or reason == "error":
        raise ValueError("an ending a record does not keep")
    return RunFinished(
        reason=reason,  # type: ignore[arg-type]  (checked against its names)
        answer=_text(item["answer"]),
        stats=_stats(item["stats"]),
        error=_text(item["error"]),
        answer_marked=_flag(item["answer_marked"]),
        lab_termination=_text(item["lab_termination"]),
        trajectory=tuple(dict(message) for message in state.trajectory),
    )


def _stats(value: Any) -> RunStats:
    record = _dict(value)
    names = {f.name for f in dataclasses.fields(RunStats)}
    if set(record) != names:
        raise ValueError("figures of another version")
    figures = {name: _tally(name, v) for name, v in record.items()}
    return RunStats(**figures)


def _step(value: Any, state: RunState) -> Step:
    """A saved step: its conversation, a prefix of the state's or its own."""
    item = _dict(value)
    if "prefix" in item:
        count = _count(item["prefix"], len(state.messages))
        pages = state.pages[: _count(item["pages"], len(state.pages))]
        messages = tuple(dict(m) for m in state.messages[:count])
    else:
        pages = [_page(page) for page in _list(item["pages"])]
        messages = tuple(_message(m) for m in _list(item["messages"]))
    return Step(
        uncertainty=_number(item["uncertainty"]),
        round=_count(item["round"], state.round + 1),
        messages=messages,
        pages=tuple(pages),
    )


def _saved_report(value: Any) -> SavedReport:
    item = _dict(value)
    usage = tuple(_usage(u) for u in _list(item["usage"]))
    return SavedReport(_count(item["rollout"]), _text(item["text"]), usage)


def _usage(value: Any) -> ModelUsage:
    item = _dict(value)
    if set(item) != {"prompt_tokens", "completion_tokens", "cost"}:
        raise ValueError("usage of another version")
    cost = item["cost"]
    return ModelUsage(
        _count(item["prompt_tokens"]),
        _count(item["completion_tokens"]),
        None if cost is None else _number(cost),
    )


# -- values --


def _counters(value: Any) -> Counters:
    record = _dict(value)
    names = {f.name for f in dataclasses.fields(Counters)}
    if set(record) != names:
        raise ValueError("counters of another version")
    return Counters(**{name: _tally(name, v) for name, v in record.items()})


def _tally(name: str, value: Any) -> Any:
    """A figure: the cost (a number, or None: no cost), the seconds, or a count."""
    if name == "cost":
        return None if value is None else _number(value)
    if name == "seconds":
        return _number(value)
    return _count(value)


def _page(value: Any) -> tuple[str, str]:
    url, title = _list(value)
    return _text(url), _text(title)


def _message(value: Any) -> dict[str, Any]:
    message = _dict(value)
    if not isinstance(message.get("role"), str):
        raise ValueError("a message without a role")
    return message


def _dict(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError("expected an object")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError("expected a list")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("expected text")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("expected true or false")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError("expected a number")
    if not math.isfinite(value) or value < 0:
        raise ValueError("expected a finite, non-negative number")
    return float(value)


def _count(value: Any, most: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError("expected a count")
    if most is not None and value > most:
        raise ValueError("a count past its list")
    return value


def _typed(value: Any, annotation: str) -> Any:
    """``value`` as the RunState field annotated ``annotation`` holds it."""
    kinds = {kind.strip() for kind in annotation.split("|")}
    if value is None and "None" in kinds:
        return None
    if "bool" in kinds:
        return _flag(value)
    if "int" in kinds and isinstance(value, int):
        return _count(value)
    if "float" in kinds:
        return _number(value)
    if "str" in kinds:
        return _text(value)
    raise TypeError(f"expected {annotation}")
