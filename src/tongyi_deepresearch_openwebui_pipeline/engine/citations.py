"""After the answer: its citations checked against the pages they cite.

A run's events pass through `with_citations_checked`. When the run ends with
an answer that cites its sources, the answer has already streamed; the
statements carrying citations are then checked (`core.citation_check`),
while the chat says so (`CitationsChecking`), and `RunFinished` comes with
the report. The check never holds up the answer's text, only the end of the
run: at most `CitationCheck.max_seconds`, and never past the run's own time
limit. Cancelling the run (Stop) cancels every check call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace

from ..core.citation_check import (
    CitationReport,
    check_citations,
    scan_statements,
)
from ..core.events import CitationsChecking, ModelPort, RunEvent, RunFinished
from ..core.sources import SourceBook, rewrite_answer

#: Most cited statements checked in one answer (the rest are counted).
MAX_STATEMENTS = 20
#: Most verdict calls at once.
CONCURRENCY = 4
#: Longest the check may take after the answer.
MAX_SECONDS = 90.0
#: Each verdict's reply limit (room for a reasoning model's thinking).
MAX_TOKENS = 2048


@dataclass(frozen=True)
class CitationCheck:
    """How a run's citations are checked: by which model, within what bounds."""

    model: ModelPort
    max_statements: int = MAX_STATEMENTS
    concurrency: int = CONCURRENCY
    max_seconds: float = MAX_SECONDS
    max_tokens: int = MAX_TOKENS


async def with_citations_checked(
    events: AsyncGenerator[RunEvent, None],
    check: CitationCheck | None,
    run_seconds: float,
) -> AsyncGenerator[RunEvent, None]:
    """``events``, with the answer's citations checked before `RunFinished`.

    Args:
        events: A run's events (single or Heavy), ending with `RunFinished`.
        check: How to check (None: the events pass unchanged).
        run_seconds: The run's whole time (its limit and the wrap-up's
            grace); the check ends when the run has spent it (its figures
            count the time before a resume too), and within its own
            `CitationCheck.max_seconds`.
    """
    async with contextlib.aclosing(events):
        async for event in events:
            if (
                check is None
                or not isinstance(event, RunFinished)
                or not (event.answer and event.sources)
            ):
                yield event
            else:
                left = run_seconds - event.stats.seconds
                checking = _checking(event, check, left)
                async with contextlib.aclosing(checking):
                    async for said in checking:
                        yield said


async def _checking(
    finished: RunFinished, check: CitationCheck, seconds_left: float
) -> AsyncGenerator[RunEvent, None]:
    """`CitationsChecking`, then ``finished`` with the check's report."""
    # Linear, but a long hostile answer takes seconds: off the event loop.
    numbered = await asyncio.to_thread(
        rewrite_answer, finished.answer, SourceBook(finished.sources)
    )
    scan = await asyncio.to_thread(scan_statements, numbered, check.max_statements)
    if not scan.statements:
        yield replace(finished, citations=CitationReport(skipped=scan.skipped))
        return
    yield CitationsChecking(len(scan.statements))
    seconds = max(0.0, min(check.max_seconds, seconds_left))
    report = await check_citations(
        scan.statements,
        {source.number: source for source in finished.sources},
        check.model,
        concurrency=check.concurrency,
        deadline=asyncio.get_running_loop().time() + seconds,
        max_tokens=check.max_tokens,
        skipped=scan.skipped,
    )
    yield replace(finished, citations=report)
