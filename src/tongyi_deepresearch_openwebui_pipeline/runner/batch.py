"""``batch``: a JSONL file of questions, researched with bounded concurrency.

Input: the lab's format, JSON Lines, one ``{"question": …, "answer": …}``
object a line (``answer`` is the reference answer, copied to the record;
other fields are ignored). Only a newline (LF) ends a line (a carriage
return before it and a UTF-8 byte order mark at the start of the file are
dropped), so U+2028 or U+0085 inside a question is text. A line that is not
such an object (not UTF-8, not JSON, nested more than `MAX_NESTING` levels,
longer than `MAX_LINE_BYTES`, or a question with a lone surrogate, which no
model server can be sent) is reported with its number and skipped; blank
lines are skipped silently. The input is read line by line (a pipe will do).

Output: one JSON line per (question, rollout) in the lab's record shape
(`results.batch_record`; `results.json_line`: no raw line separator or
control character in it), appended as each finishes and flushed at once,
so an interrupted batch keeps every finished record whole. It goes to one
file (records say their ``rollout_id``) or, as the lab's runner writes it
(inference/run_multi_react.py), to one file per rollout,
``DIR/iter{i}.jsonl`` (`OutputFile`).

Resuming reads each output back first, line by line (a line longer than
`MAX_LINE_BYTES` is not read), and only a regular file: a record already
there (by question and rollout) is not run again, unless it is a failed
run's (it has ``error``, the lab's test): that question is asked again and
its failed record is dropped from the file before the new one is written
(`drop_lines`, an atomic rewrite), so a scorer, which reads every line,
sees one record per question and rollout. A complete last record without
its newline is kept (the newline is added), an unfinished last line (a
crash mid-write) is cut off and its question run again.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import shutil
import stat
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, BinaryIO

from ..core.events import RunFinished, RunStats
from .research import RunnerError
from .results import Outcome, batch_record, is_failed, json_line

#: The deepest nesting of lists and objects a line may have. A question is
#: one level and its answer a few more; the JSON parser and writer recurse
#: per level, and a line nested thousands deep would end the process.
MAX_NESTING = 100
#: The longest line read, of the input or of an output read back (64 MiB).
#: A record holds a whole trajectory, a few MB even for hundreds of rounds;
#: a longer line is not read (nothing is held whole past this), and is
#: reported with its number.
MAX_LINE_BYTES = 64 << 20
#: The most read at a time to skip a line longer than the cap, or to copy.
_SKIP_BYTES = 1 << 20
#: The lab's file of rollout i (inference/run_multi_react.py).
ITER_FILE = "iter{rollout}.jsonl"


@dataclass(frozen=True)
class Question:
    """One question of the input (`line` is 1-based)."""

    line: int
    question: str
    answer: Any = None


@dataclass(frozen=True)
class BadLine:
    """An input line that is not a question, and why."""

    line: int
    reason: str


class JSONLineError(ValueError):
    """A line is not one readable JSON value; the message says why."""


def json_lines(data: bytes) -> list[bytes]:
    """The lines of a JSON Lines file: only a newline (LF) ends one.

    A carriage return before it and a UTF-8 byte order mark at the start of
    the file are dropped; the newline after the last line is optional.
    """
    lines = data.removeprefix(codecs.BOM_UTF8).split(b"\n")
    if not lines[-1]:
        lines.pop()
    return [line.removesuffix(b"\r") for line in lines]


@dataclass(frozen=True)
class Line:
    """One line of a file, where it is, and its bytes if they were read."""

    #: 1-based.
    number: int
    #: Byte offsets of its first byte and past its end (its newline included).
    start: int
    end: int
    #: Its bytes without the newline; None: longer than the cap, not read.
    data: bytes | None
    #: Whether a newline ends it (only the last line of a file may lack one).
    ended: bool


def read_lines(handle: BinaryIO, max_bytes: int = MAX_LINE_BYTES) -> Iterator[Line]:
    """The lines of `handle`, read one at a time, none held past `max_bytes`.

    Only a newline (LF) ends a line. A longer line is skipped a piece at a
    time and given with ``data=None``, so a file of any size, or a stream
    that never ends a line, is read in bounded memory.
    """
    number = position = 0
    while piece := handle.readline(max_bytes + 1):
        number += 1
        start, position = position, position + len(piece)
        if piece.endswith(b"\n"):
            yield Line(number, start, position, piece[:-1], ended=True)
        elif len(piece) <= max_bytes:  # the last line, without its newline
            yield Line(number, start, position, piece, ended=False)
        else:
            piece = b""  # not held while the rest is skipped
            position, ended = _skip_line(handle, position, min(max_bytes, _SKIP_BYTES))
            yield Line(number, start, position, None, ended=ended)


def _skip_line(handle: BinaryIO, position: int, size: int) -> tuple[int, bool]:
    """Read past the rest of a line, `size` bytes at a time.

    Returns:
        The offset after the line, and whether a newline ended it.
    """
    while rest := handle.readline(size):
        position += len(rest)
        if rest.endswith(b"\n"):
            return position, True
    return position, False


def too_long(max_bytes: int = MAX_LINE_BYTES) -> str:
    """Why a line was not read: ``longer than 64 MiB``."""
    mib = max_bytes / (1 << 20)
    size = f"{mib:g} MiB" if mib >= 1 else f"{max_bytes:,} bytes"
    return f"longer than {size}"


def parse_json_line(text: str) -> Any:
    """The JSON value of one line, nested at most `MAX_NESTING` levels.

    Raises:
        JSONLineError: Not valid JSON, nested too deeply or holding a
            number too long to read (the message is one line, for the user).
    """
    nested = f"nested more than {MAX_NESTING} levels deep"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise JSONLineError(f"not valid JSON ({error.msg})") from None
    except RecursionError:  # the parser recurses per level
        raise JSONLineError(nested) from None
    except ValueError:  # only an integer over the interpreter's digit limit
        digits = sys.get_int_max_str_digits()
        raise JSONLineError(
            f"not valid JSON (a number longer than {digits:,} digits)"
        ) from None
    if _nested_deeper_than(value, MAX_NESTING):
        raise JSONLineError(nested)
    return value


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` has lists or objects more than `limit` levels deep."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def lone_surrogate(text: str) -> str | None:
    """The first lone surrogate in `text` (None: it is Unicode text)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.object[error.start]
    return None


def _line_text(raw: str | bytes) -> str:
    """One input line as text, without the whitespace around it."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise JSONLineError("not UTF-8 text") from None
    return text.strip()


def _why_not_a_question(item: Any) -> str | None:
    """Why a line's JSON value is not a question (None: it is one)."""
    if not isinstance(item, dict):
        return "not a JSON object"
    question = item.get("question")
    if not isinstance(question, str) or not question.strip():
        return 'no "question" text'
    surrogate = lone_surrogate(question)
    if surrogate is not None:
        code = f"\\u{ord(surrogate):04x}"
        return f'the "question" is not Unicode text (a lone surrogate {code})'
    return None


def _question(
    number: int, raw: str | bytes | None, max_bytes: int = MAX_LINE_BYTES
) -> Question | BadLine | None:
    """The question of one input line, why it is none, or None when blank.

    `raw` None: the line was longer than `max_bytes` and not read.
    """
    if raw is None:
        return BadLine(number, too_long(max_bytes))
    try:
        text = _line_text(raw)
        if not text:
            return None
        item = parse_json_line(text)
    except JSONLineError as error:
        return BadLine(number, str(error))
    reason = _why_not_a_question(item)
    if reason is not None:
        return BadLine(number, reason)
    return Question(number, item["question"].strip(), item.get("answer"))


def parse_questions(
    lines: Iterable[str | bytes | None], max_bytes: int = MAX_LINE_BYTES
) -> tuple[list[Question], list[BadLine]]:
    """The questions of a JSONL input, and the lines that are not questions.

    Args:
        lines: The input's lines (`json_lines`, `input_lines`), as bytes or
            already text (None: a line longer than `max_bytes`, not read).
        max_bytes: The cap the lines were read with (for the message).
    """
    questions: list[Question] = []
    bad: list[BadLine] = []
    for number, raw in enumerate(lines, start=1):
        found = _question(number, raw, max_bytes)
        if isinstance(found, Question):
            questions.append(found)
        elif found is not None:
            bad.append(found)
    return questions, bad


def input_lines(
    handle: BinaryIO, max_bytes: int = MAX_LINE_BYTES
) -> Iterator[bytes | None]:
    """The lines of a JSONL input as `parse_questions` takes them, streamed.

    As `json_lines`: a byte order mark at the start and a carriage return
    before each newline are dropped. None stands for a line too long to read.
    """
    for line in read_lines(handle, max_bytes):
        data = line.data
        if data is not None:
            if line.number == 1:
                data = data.removeprefix(codecs.BOM_UTF8)
            data = data.removesuffix(b"\r")
        yield data


Key = tuple[str, int]


@dataclass
class Existing:
    """What an output file already holds."""

    #: (question, rollout) of the runs that ended (records without ``error``).
    done: set[Key] = field(default_factory=set)
    #: The byte ranges of failed runs' records, by (question, rollout).
    failed: dict[Key, list[tuple[int, int]]] = field(default_factory=dict)
    #: 1-based numbers of lines that are not records (left as they are).
    unreadable: list[int] = field(default_factory=list)
    #: 1-based numbers of lines longer than the cap (not read, left as they are).
    too_long: list[int] = field(default_factory=list)
    #: An unfinished last line was cut off.
    repaired: bool = False

    def failed_lines(self, keys: Iterable[Key]) -> list[tuple[int, int]]:
        """The byte ranges of the failed records of `keys`."""
        return [span for key in keys for span in self.failed.get(key, ())]


def _record(data: bytes) -> dict[str, Any] | None:
    """The record of one output line (None: not a record)."""
    try:
        record = parse_json_line(data.decode("utf-8", "replace"))
    except JSONLineError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("question"), str):
        return None
    return record


def _record_key(record: dict[str, Any], rollout: int | None) -> Key:
    """(question, rollout) of a record; `rollout` given: the file's own."""
    if rollout is None:
        found = record.get("rollout_id", 1)
        rollout = found if isinstance(found, int) else 1
    return record["question"].strip(), rollout


def _open_regular(path: Path) -> BinaryIO | None:
    """`path` opened for reading if it is a regular file; None if it is missing.

    It is opened without blocking and without becoming a controlling
    terminal, then checked, so a FIFO without a writer, a terminal or a
    device (``/dev/stdout``, ``/dev/full``) is refused before a byte is read.

    Raises:
        RunnerError: `path` is not a regular file (exit 2).
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise RunnerError(
            f"cannot resume from {path}: not a regular file (a batch reads its "
            "output back to resume)",
            code=2,
        )
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "rb")


def read_existing(
    path: Path, rollout: int | None = None, *, max_line_bytes: int = MAX_LINE_BYTES
) -> Existing:
    """The records already in `path`, its last line made whole.

    Read line by line, and only from a regular file. A last line without
    its newline is a complete record (kept: the newline is added) or the
    start of one a crash cut short (cut off).

    Args:
        path: An output file (missing: nothing yet).
        rollout: The rollout every record of the file is (a lab's
            ``iter{i}.jsonl``); None: each record's ``rollout_id`` says.
        max_line_bytes: The longest line read.

    Raises:
        RunnerError: `path` is not a regular file (exit 2).
        OSError: It cannot be read or repaired.
    """
    existing = Existing()
    handle = _open_regular(path)
    if handle is None:
        return existing
    last: Line | None = None
    with handle:
        for line in read_lines(handle, max_line_bytes):
            if not line.ended:
                last = line
                break
            _take(existing, line, rollout)
    if last is not None:
        _make_last_line_whole(path, existing, last, rollout)
    return existing


def _take(existing: Existing, line: Line, rollout: int | None) -> None:
    """Note what one whole line of an output holds."""
    data = line.data
    if data is None:
        existing.too_long.append(line.number)
        return
    if not data.strip():
        return
    record = _record(data)
    if record is None:
        existing.unreadable.append(line.number)
        return
    key = _record_key(record, rollout)
    if is_failed(record):
        existing.failed.setdefault(key, []).append((line.start, line.end))
    else:
        existing.done.add(key)


def _make_last_line_whole(
    path: Path, existing: Existing, last: Line, rollout: int | None
) -> None:
    """Add the newline a whole last record lacks, or cut an unfinished one off."""
    if last.data is not None and _record(last.data) is not None:
        with path.open("ab") as handle:
            handle.write(b"\n")
        # Its span takes the newline in, so dropping it leaves no blank line.
        _take(existing, replace(last, end=last.end + 1, ended=True), rollout)
        return
    with path.open("r+b") as handle:
        handle.truncate(last.start)
    existing.repaired = last.data is None or bool(last.data.strip())


def drop_lines(path: Path, spans: Iterable[tuple[int, int]]) -> None:
    """Rewrite `path` without the byte ranges `spans` (whole lines).

    The rest is copied a piece at a time to a new file beside it, which
    then replaces it in one step (`os.replace`), keeping its permissions:
    an interruption leaves the old file or the new one, never half of each.
    """
    spans = sorted(spans)
    if not spans:
        return
    target = path.resolve()
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with target.open("rb") as source, temporary.open("wb") as copy:
            position = 0
            for start, end in spans:
                _copy_bytes(source, copy, start - position)
                source.seek(end)
                position = end
            shutil.copyfileobj(source, copy, _SKIP_BYTES)
            copy.flush()
            os.fsync(copy.fileno())
        shutil.copymode(target, temporary)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def _copy_bytes(source: BinaryIO, target: BinaryIO, count: int) -> None:
    """Copy the next `count` bytes of `source` to `target`, a piece at a time."""
    while count > 0:
        piece = source.read(min(count, _SKIP_BYTES))
        if not piece:
            return
        target.write(piece)
        count -= len(piece)


@dataclass(frozen=True)
class OutputFile:
    """One file a batch writes records to."""

    path: Path
    #: The rollout of every record in it (a lab's ``iter{i}.jsonl``); None:
    #: every rollout, each record saying its own ``rollout_id``.
    rollout: int | None = None


def output_files(
    output: Path | None, directory: Path | None, rollouts: int
) -> list[OutputFile]:
    """Where a batch's records go: one file, or the lab's ``iter{i}.jsonl``."""
    if directory is None:
        if output is None:
            raise ValueError("a batch needs an output file or directory")
        return [OutputFile(output)]
    return [
        OutputFile(directory / ITER_FILE.format(rollout=rollout), rollout)
        for rollout in range(1, rollouts + 1)
    ]


@dataclass(frozen=True)
class Job:
    """One rollout of one question."""

    question: Question
    rollout_id: int


def jobs_to_run(
    questions: list[Question], rollouts: int, done: set[Key]
) -> tuple[list[Job], int]:
    """The jobs still to run (each question once), and how many are done."""
    jobs: list[Job] = []
    seen: set[Key] = set()
    skipped = 0
    for question in questions:
        for rollout in range(1, rollouts + 1):
            key = (question.question, rollout)
            if key in seen:
                continue
            seen.add(key)
            if key in done:
                skipped += 1
            else:
                jobs.append(Job(question, rollout))
    return jobs, skipped


class RecordWriter:
    """Appends whole records to the output, each flushed as it is written."""

    def __init__(self, handle: IO[str]) -> None:
        """Write to `handle` (opened for appending, UTF-8)."""
        self._handle = handle

    def write(self, record: dict[str, Any]) -> None:
        """One record, one line, in one write.

        Raises:
            RunnerError: The output cannot be written (a full disk): exit 2.
        """
        line = json_line(record)
        try:
            self._handle.write(line)
            self._handle.flush()
        except OSError as error:
            name = getattr(self._handle, "name", "the output")
            reason = error.strerror or str(error)
            raise RunnerError(f"cannot write {name}: {reason}", code=2) from None


Research = Callable[[Job], Awaitable[Outcome]]
#: What the final table reads of each record (kept in memory; messages are not).
SUMMARY_FIELDS = ("termination", "rounds", "tokens", "cost")
#: The table's name for a failed run (its record has no termination).
FAILED = "failed"


def failed_outcome(job: Job, error: str) -> Outcome:
    """The outcome of a run that broke before it could end on its own."""
    stats = RunStats(0, 0, 0, 0, 0, 0, None, 0.0)
    return Outcome(job.question.question, RunFinished("error", "", stats, error=error))


@dataclass
class BatchState:
    """A batch in progress (read by the progress line)."""

    total: int
    skipped: int = 0
    done: int = 0
    errors: int = 0
    running: int = 0
    started: float = field(default_factory=time.monotonic)
    records: list[dict[str, Any]] = field(default_factory=list)
    #: Why the failed runs failed: each distinct error, counted.
    failures: Counter[str] = field(default_factory=Counter)

    def note(self, record: dict[str, Any]) -> None:
        """Count a record written (its figures kept for the final table)."""
        self.done += 1
        if is_failed(record):
            self.errors += 1
            self.failures[str(record.get("error") or "unknown error")] += 1
            self.records.append({"termination": FAILED})
            return
        self.records.append({key: record.get(key) for key in SUMMARY_FIELDS})


def _unredacted(text: str) -> str:
    return text


async def run_batch(
    jobs: list[Job],
    research: Research,
    writer: RecordWriter,
    state: BatchState,
    *,
    concurrency: int = 4,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    writer_for: Callable[[int], RecordWriter] | None = None,
    redact: Callable[[str], str] = _unredacted,
) -> None:
    """Run `jobs`, `concurrency` at a time, writing each record as it ends.

    Records go to `writer`, or to ``writer_for(rollout)`` when given (the
    lab's file per rollout). A run that raises is recorded as failed, its
    error passed through `redact` (it may quote a setting). Cancelling this
    coroutine cancels the runs in flight; the records already written stay
    whole.
    """
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            job = queue.pop()
            state.running += 1
            try:
                outcome = await research(job)
            except Exception as error:  # a broken run must not sink the batch
                reason = redact(f"{type(error).__name__}: {error}")
                outcome = failed_outcome(job, reason)
            finally:
                state.running -= 1
            record = batch_record(outcome, job.question.answer, job.rollout_id)
            (writer_for(job.rollout_id) if writer_for else writer).write(record)
            state.note(record)
            if on_record is not None:
                on_record(record)

    workers = [
        asyncio.create_task(worker())
        for _ in range(max(1, min(concurrency, len(jobs))))
    ]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
