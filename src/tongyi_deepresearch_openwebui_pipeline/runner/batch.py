"""``batch``: a JSONL file of questions, researched with bounded concurrency.

Input: the lab's format, JSON Lines, one ``{"question": …, "answer": …}``
object a line (``answer`` is the reference answer, copied to the record;
other fields are ignored). Only a newline (LF) ends a line (a carriage
return before it and a UTF-8 byte order mark at the start of the file are
dropped), so U+2028 or U+0085 inside a question is text. A line that is not
such an object (not UTF-8, not JSON, nested more than `MAX_NESTING` levels,
or a question with a lone surrogate, which no model server can be sent) is
reported with its number and skipped; blank lines are skipped silently.

Output: one JSON line per (question, rollout) (`results.json_line`: no raw
line separator or control character in it), appended as each finishes and
flushed at once, so an interrupted batch keeps every finished record whole.
Resuming reads the output first: records already there (by question and
``rollout_id``) are not run again; a complete last record without its
newline is kept (the newline is added), an unfinished last line (a crash
mid-write) is cut off and its question run again.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..core.events import RunFinished, RunStats
from .research import RunnerError
from .results import Outcome, batch_record, json_line

#: The deepest nesting of lists and objects a line may have. A question is
#: one level and its answer a few more; the JSON parser and writer recurse
#: per level, and a line nested thousands deep would end the process.
MAX_NESTING = 100


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


def _question(number: int, raw: str | bytes) -> Question | BadLine | None:
    """The question of one input line, why it is none, or None when blank."""
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
    lines: Iterable[str | bytes],
) -> tuple[list[Question], list[BadLine]]:
    """The questions of a JSONL input, and the lines that are not questions.

    Args:
        lines: The input's lines (`json_lines`), as bytes or already text.
    """
    questions: list[Question] = []
    bad: list[BadLine] = []
    for number, raw in enumerate(lines, start=1):
        found = _question(number, raw)
        if isinstance(found, Question):
            questions.append(found)
        elif found is not None:
            bad.append(found)
    return questions, bad


@dataclass
class Existing:
    """What an output file already holds."""

    done: set[tuple[str, int]] = field(default_factory=set)
    #: 1-based numbers of lines that are not records (left as they are).
    unreadable: list[int] = field(default_factory=list)
    #: An unfinished last line was cut off.
    repaired: bool = False


def _record_key(raw: bytes) -> tuple[str, int] | None:
    """(question, rollout) of one output line (None: not a record)."""
    try:
        record = parse_json_line(raw.decode("utf-8", "replace"))
    except JSONLineError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("question"), str):
        return None
    rollout = record.get("rollout_id", 1)
    return record["question"].strip(), rollout if isinstance(rollout, int) else 1


def read_existing(path: Path) -> Existing:
    """The records already in `path`, its last line made whole.

    A last line without its newline is a complete record (kept: the newline
    is added) or the start of one a crash cut short (cut off).
    """
    existing = Existing()
    if not path.exists():
        return existing
    data = path.read_bytes()
    lines = data.split(b"\n")
    last = lines.pop()  # b"" when the file ends with a newline
    if _record_key(last) is not None:  # whole: only its newline is missing
        with path.open("ab") as handle:
            handle.write(b"\n")
        lines.append(last)
    elif last:
        with path.open("r+b") as handle:
            handle.truncate(len(data) - len(last))
        existing.repaired = bool(last.strip())
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        key = _record_key(raw)
        if key is None:
            existing.unreadable.append(number)
        else:
            existing.done.add(key)
    return existing


@dataclass(frozen=True)
class Job:
    """One rollout of one question."""

    question: Question
    rollout_id: int


def jobs_to_run(
    questions: list[Question], rollouts: int, done: set[tuple[str, int]]
) -> tuple[list[Job], int]:
    """The jobs still to run (each question once), and how many are done."""
    jobs: list[Job] = []
    seen: set[tuple[str, int]] = set()
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


async def run_batch(
    jobs: list[Job],
    research: Research,
    writer: RecordWriter,
    state: BatchState,
    *,
    concurrency: int = 4,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Run `jobs`, `concurrency` at a time, writing each record as it ends.

    Cancelling this coroutine cancels the runs in flight; the records
    already written stay whole.
    """
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            job = queue.pop()
            state.running += 1
            try:
                outcome = await research(job)
            except Exception as error:  # a broken run must not sink the batch
                outcome = failed_outcome(job, f"{type(error).__name__}: {error}")
            finally:
                state.running -= 1
            record = batch_record(outcome, job.question.answer, job.rollout_id)
            writer.write(record)
            state.done += 1
            state.errors += record["termination"] == "error"
            state.records.append({key: record.get(key) for key in SUMMARY_FIELDS})
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
