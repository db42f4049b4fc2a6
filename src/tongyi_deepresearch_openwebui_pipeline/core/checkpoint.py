"""A run's state as a versioned, bounded record that can be saved and loaded.

A research of 10 to 60 minutes should survive the process that runs it. After
every finished round the run engine takes a `Checkpoint`: the conversation as
the model will see it, the trajectory across consolidations, the budgets spent
(rounds, tokens, the seconds the run has taken), and the sources with their
numbers and evidence. `encode` writes it as UTF-8 JSON within `MAX_BYTES`;
`decode` reads one back and refuses, with a reason a person can read, anything
that is not a checkpoint of this version for this user and chat: a file or row
from elsewhere is data, never trusted.

Nothing here holds a setting: no key, no server URL, no valve. The record is
the research itself (what the model and the tools wrote), so it belongs to one
user and one chat, and a store keeps it only for them.

Pure: JSON in, JSON out; where it is stored is the front end's choice.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Protocol

from .events import Counters
from .loop import RunState
from .sources import Source

#: The record's name and version: another name or version is not read.
FORMAT = "tongyi-deepresearch-checkpoint"
VERSION = 1
#: Largest record written or read. A 100-round research holds the context
#: (at most ~0.5 MB of text at 110K tokens), its trajectory and its sources:
#: a few MB (README gives the measured size); past this, the trajectory before
#: the current conversation is left out (`Checkpoint.trajectory_dropped`).
MAX_BYTES = 16 * 1024 * 1024
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


def question_key(question: str) -> str:
    """The question as a checkpoint remembers it (whitespace-normalised)."""
    return " ".join(question.split())


# -- writing ------------------------------------------------------------------


def encode(checkpoint: Checkpoint, max_bytes: int = MAX_BYTES) -> bytes:
    """``checkpoint`` as UTF-8 JSON, at most ``max_bytes``.

    Raises:
        CheckpointError: Even without the earlier trajectory it is too big.
    """
    record = _record(checkpoint, with_history=True)
    data = _dumps(record)
    if len(data) <= max_bytes:
        return data
    data = _dumps(_record(checkpoint, with_history=False))
    if len(data) <= max_bytes:
        return data
    raise CheckpointError(
        f"the run's state is {len(data):,} bytes, over the {max_bytes:,}-byte limit"
    )


def _dumps(record: dict[str, Any]) -> bytes:
    # ensure_ascii: a lone surrogate a server streamed stays writable.
    return json.dumps(record, separators=(",", ":"), allow_nan=False).encode("ascii")


def _record(checkpoint: Checkpoint, *, with_history: bool) -> dict[str, Any]:
    state = checkpoint.state
    shared = _shared_tail(state.messages, state.trajectory)
    head = state.trajectory[: len(state.trajectory) - shared] if with_history else []
    return {
        "format": FORMAT,
        "version": VERSION,
        "owner": checkpoint.owner,
        "chat": checkpoint.chat,
        "mode": checkpoint.mode,
        "question": checkpoint.question,
        "saved_at": checkpoint.saved_at,
        "elapsed": checkpoint.elapsed,
        "reads": checkpoint.reads,
        "trajectory_dropped": checkpoint.trajectory_dropped or not with_history,
        "state": {
            **_scalars(state),
            "counters": dataclasses.asdict(state.counters),
            "pages": [list(page) for page in state.pages],
            "messages": state.messages,
            # The trajectory ends with the conversation's own messages: they
            # are written once, and joined again (the same objects) on load.
            "trajectory_head": head,
            "trajectory_shared": shared,
        },
        "sources": [_source_record(source) for source in checkpoint.sources],
    }


#: RunState fields written by `_record` itself, not as plain values.
_STRUCTURED = frozenset({"messages", "trajectory", "counters", "pages", "started"})


def _scalars(state: RunState) -> dict[str, Any]:
    """Every plain field of ``state`` (numbers, text, None) by name."""
    return {
        f.name: getattr(state, f.name)
        for f in dataclasses.fields(state)
        if f.name not in _STRUCTURED
    }


def _shared_tail(messages: list[Any], trajectory: list[Any]) -> int:
    """How many of the conversation's last messages end the trajectory too."""
    shared = 0
    while (
        shared < min(len(messages), len(trajectory))
        and messages[-1 - shared] is trajectory[-1 - shared]
    ):
        shared += 1
    return shared


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


# -- reading ------------------------------------------------------------------


def decode(
    data: bytes, *, owner: str, chat: str, now: float, max_bytes: int = MAX_BYTES
) -> Checkpoint:
    """The checkpoint in ``data``, for ``owner``'s ``chat``.

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
    if len(data) > max_bytes:
        raise CheckpointError(f"it is over {max_bytes:,} bytes")
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CheckpointError("it is not JSON") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError("it is not a research checkpoint")
    if record.get("version") != VERSION:
        raise CheckpointError(
            f"it is version {record.get('version')!r}; this version reads {VERSION}"
        )
    _check_depth(record)
    if record.get("owner") != owner or record.get("chat") != chat:
        raise CheckpointError("it belongs to another user or chat")
    try:
        return _checkpoint(record, now)
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"it is damaged ({type(error).__name__})") from None


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


def _checkpoint(record: dict[str, Any], now: float) -> Checkpoint:
    state_record = _dict(record["state"])
    messages = [_message(m) for m in _list(state_record["messages"])]
    head = [_message(m) for m in _list(state_record["trajectory_head"])]
    shared = _count(state_record["trajectory_shared"], len(messages))
    elapsed = _number(record["elapsed"])
    dropped = record["trajectory_dropped"]
    if not isinstance(dropped, bool):
        raise TypeError("expected true or false")
    scalars = {
        f.name: _typed(state_record[f.name], str(f.type))
        for f in dataclasses.fields(RunState)
        if f.name not in _STRUCTURED
    }
    state = RunState(
        messages=messages,
        started=now - elapsed,
        counters=Counters(**_dict(state_record["counters"])),
        pages=[
            (_text(url), _text(title)) for url, title in _list(state_record["pages"])
        ],
        trajectory=list(messages)
        if dropped
        else head + messages[len(messages) - shared :],
        **scalars,
    )
    sources = tuple(_source(s) for s in _list(record["sources"]))
    if [s.number for s in sources] != list(range(1, len(sources) + 1)):
        raise ValueError("sources out of their numbering")
    return Checkpoint(
        owner=_text(record["owner"]),
        chat=_text(record["chat"]),
        mode=_text(record["mode"]),
        question=_text(record["question"]),
        state=state,
        sources=sources,
        reads=_count(record["reads"]),
        elapsed=elapsed,
        saved_at=_number(record["saved_at"]),
        trajectory_dropped=dropped,
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


def _counters(value: Any) -> Counters:
    record = _dict(value)
    names = {f.name for f in dataclasses.fields(Counters)}
    if set(record) != names:
        raise ValueError("counters of another version")
    return dataclasses.replace(
        Counters(), **{name: _tally(v) for name, v in record.items()}
    )


def _tally(value: Any) -> int | float | None:
    """A counter: a count, the cost (a number), or no cost (None)."""
    if value is None:
        return None
    return _count(value) if isinstance(value, int) else _number(value)


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
        if not isinstance(value, bool):
            raise TypeError("expected true or false")
        return value
    if "int" in kinds and isinstance(value, int):
        return _count(value)
    if "float" in kinds:
        return _number(value)
    if "str" in kinds:
        return _text(value)
    raise TypeError(f"expected {annotation}")
