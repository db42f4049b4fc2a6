"""``batch``: a JSONL file of questions, researched with bounded concurrency.

Input: the lab's format, one ``{"question": …, "answer": …}`` object a line
(``answer`` is the reference answer, copied to the record; other fields are
ignored). A line that is not such an object is reported with its number and
skipped; blank lines are skipped silently.

Output: one JSON line per (question, rollout), appended as each finishes and
flushed at once, so an interrupted batch keeps every finished record whole.
Resuming reads the output first: records already there (by question and
``rollout_id``) are not run again, and an unfinished last line (a crash
mid-write) is cut off and its question run again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..core.events import RunFinished, RunStats
from .results import Outcome, batch_record


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


def parse_questions(lines: Iterable[str]) -> tuple[list[Question], list[BadLine]]:
    """The questions of a JSONL input, and the lines that are not questions."""
    questions: list[Question] = []
    bad: list[BadLine] = []
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        try:
            item = json.loads(text)
        except json.JSONDecodeError as error:
            bad.append(BadLine(number, f"not valid JSON ({error.msg})"))
            continue
        if not isinstance(item, dict):
            bad.append(BadLine(number, "not a JSON object"))
            continue
        question = item.get("question")
        if not isinstance(question, str) or not question.strip():
            bad.append(BadLine(number, 'no "question" text'))
            continue
        questions.append(Question(number, question.strip(), item.get("answer")))
    return questions, bad


@dataclass
class Existing:
    """What an output file already holds."""

    done: set[tuple[str, int]] = field(default_factory=set)
    #: 1-based numbers of lines that are not records (left as they are).
    unreadable: list[int] = field(default_factory=list)
    #: An unfinished last line was cut off.
    repaired: bool = False


def read_existing(path: Path) -> Existing:
    """The records already in `path` (cutting off an unfinished last line)."""
    existing = Existing()
    if not path.exists():
        return existing
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        with path.open("r+b") as handle:
            handle.truncate(keep)
        data = data[:keep]
        existing.repaired = True
    for number, raw in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:
            existing.unreadable.append(number)
            continue
        if not isinstance(record, dict) or not isinstance(record.get("question"), str):
            existing.unreadable.append(number)
            continue
        rollout = record.get("rollout_id", 1)
        existing.done.add(
            (record["question"].strip(), rollout if isinstance(rollout, int) else 1)
        )
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
        """One record, one line, in one write."""
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        self._handle.write(line)
        self._handle.flush()


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
