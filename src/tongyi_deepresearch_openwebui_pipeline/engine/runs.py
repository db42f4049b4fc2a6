"""Research runs built from ports: a single run, or a heavy one.

A **single** run is one `ResearchLoop`. A **heavy** run starts N rollouts of
the same question at once (each a full research run with its own history and
sampling; the model server batches them), then one synthesis call of the
research model integrates what they found into the answer. The engine knows
no user interface and does no I/O of its own: it takes the model and tool
ports, yields the events of the run (a rollout's wrapped in `RolloutEvent`),
and the front end renders them.

Decisions (each has a test in tests/test_heavy.py):

- Sources are numbered once for the whole run: the rollouts share one
  `SourceLedger`, and each page records which rollouts read it.
- A rollout's report is what the run produced, without another model call:
  its answer and the evidence extracted from each page it read (ParallelMuse
  compresses each rollout with a model call first; the extractor's evidence
  is already that compression, so the call is saved).
- A rollout that fails or ends without an answer does not sink the run: the
  synthesis works from the others and is told how many it has. With none, the
  run ends with an error that says why each rollout stopped.
- The run's time limit holds across rollouts: they stop early enough to leave
  the synthesis `synthesis_reserve` of it. Cancelling the run cancels every
  rollout and the synthesis.
- Closing a run's generator (``aclose()``, as a front end's Stop does) closes
  the generators under it before it returns: every ``async for`` over an
  inner generator runs inside ``contextlib.aclosing``, never leaving one to
  garbage collection.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Container
from dataclasses import dataclass, replace
from typing import Any

from ..core.events import (
    TERMINATION_TEXT,
    Event,
    ModelPort,
    RolloutEvent,
    RolloutSummary,
    RunEvent,
    RunFinished,
    RunStats,
    SourcesAdded,
    SynthesisStarted,
    ToolCallFinished,
    ToolOutcome,
    ToolPort,
)
from ..core.history import content_text
from ..core.loop import Limits, ResearchLoop, RunState
from ..core.prompts import (
    SYNTHESIS_REPORT,
    SYNTHESIS_REQUEST,
    SYNTHESIS_SOURCE,
    build_synthesis_system,
    drop_unknown_source_numbers,
    escape_structure_lines,
)
from ..core.sources import Source, SourceLedger, evidence_text
from ..core.toolcalls import ToolCall, neutralise_prompt_text

#: Most rollouts one heavy run may start.
MAX_ROLLOUTS = 8
#: Rounds of the synthesis: its answer, or one nudge and the wrap-up.
SYNTHESIS_ROUNDS = 2
#: Characters of a rollout's answer and of one page's evidence in a report.
REPORT_ANSWER_CHARS = 6000
REPORT_EVIDENCE_CHARS = 1500
#: Characters of a page's title in its source entry (titles are rarely 200).
REPORT_TITLE_CHARS = 500


@dataclass(frozen=True)
class HeavySettings:
    """How a heavy run is shaped."""

    rollouts: int = 3
    #: Rollouts running at once (the others wait for a slot).
    concurrency: int = 3
    #: Share of the run's time kept for the synthesis (at most 10 minutes).
    synthesis_reserve: float = 0.15


@dataclass(frozen=True)
class RunPlan:
    """What to run: the conversation, its budgets, and the run's shape.

    Every front end (the Open WebUI pipe, a headless runner) builds one and
    hands it to `research` with its ports.
    """

    #: The system prompt, then the chat (its last message the question).
    messages: list[dict[str, Any]]
    limits: Limits
    today: dt.date
    #: A heavy run's shape; None for a single run.
    heavy: HeavySettings | None = None


def research(
    plan: RunPlan,
    model: ModelPort,
    tools_for: Callable[[int], ToolPort],
    ledger: SourceLedger,
    summarizer: ModelPort | None = None,
) -> AsyncGenerator[RunEvent, None]:
    """Run `plan`: its events, ending with `RunFinished`.

    `tools_for(k)` gives rollout k of a heavy run its tools (0: a single run);
    `summarizer` writes the research state when a run consolidates (default:
    `model`).
    """
    if plan.heavy is None:
        state = RunState(messages=list(plan.messages), started=time.monotonic())
        return single_run(
            state, model, tools_for(0), plan.limits, ledger, summarizer=summarizer
        )
    heavy = HeavyRun(
        plan.messages,
        model,
        tools_for,
        ledger,
        plan.limits,
        plan.heavy,
        plan.today,
        summarizer=summarizer,
    )
    return heavy.run()


async def single_run(
    state: RunState,
    model: ModelPort,
    tools: ToolPort,
    limits: Limits,
    ledger: SourceLedger,
    *,
    summarizer: ModelPort | None = None,
) -> AsyncGenerator[RunEvent, None]:
    """One research run: the loop's events, with the pages read numbered.

    The sources the tools return are recorded in `ledger` as they come
    (`SourcesAdded` after the call that read them); `RunFinished` carries
    them all.
    """
    loop = ResearchLoop(state, model, tools, limits, summarizer=summarizer)
    async with _closing(loop.run()) as events:
        async for event in events:
            for recorded in _with_sources(event, ledger, reader=0):
                yield recorded


def _closing(
    events: AsyncIterator[Event],
) -> contextlib.aclosing[AsyncGenerator[Event, None]]:
    """``contextlib.aclosing`` for the loop's events (an async generator).

    `ResearchLoop.run` is typed as the iterator it is used as; the generator
    behind it has the ``aclose()`` this needs.
    """
    if not isinstance(events, AsyncGenerator):  # pragma: no cover - a port's bug
        raise TypeError(f"expected an async generator, got {type(events).__name__}")
    return contextlib.aclosing(events)


def _with_sources(event: Event, ledger: SourceLedger, reader: int) -> list[Event]:
    """`event`, then `SourcesAdded` for the pages it read first (or with sources)."""
    if isinstance(event, ToolCallFinished) and event.sources:
        added = tuple(
            source
            for data in event.sources
            if (source := ledger.record(data, reader)) is not None
        )
        return [event, SourcesAdded(added)] if added else [event]
    if isinstance(event, RunFinished):
        return [replace(event, sources=tuple(ledger.sources))]
    return [event]


class _NoTools:
    """The synthesis offers no tools (a call gets the loop's model-facing error)."""

    def available(self) -> list[str]:
        return []

    async def run(self, call: ToolCall) -> ToolOutcome:
        return ToolOutcome(f"Error: no tools can be used now ({call.name}).", False)


@dataclass
class _Finished:
    """A rollout task ended (after its last event)."""

    rollout: int


class HeavyRun:
    """N rollouts of one question at once, then one synthesis of their reports."""

    def __init__(  # noqa: PLR0917  (the ports and settings of one run)
        self,
        messages: list[dict[str, Any]],
        model: ModelPort,
        tools_for: Callable[[int], ToolPort],
        ledger: SourceLedger,
        limits: Limits,
        settings: HeavySettings,
        today: dt.date,
        clock: Callable[[], float] = time.monotonic,
        *,
        summarizer: ModelPort | None = None,
    ) -> None:
        """A heavy run of `messages` (system prompt, then the chat).

        `tools_for(k)` gives rollout k its tools: they record the pages they
        read in `ledger` as read by k.
        """
        self.messages = messages
        self.model = model
        self.tools_for = tools_for
        self.ledger = ledger
        self.limits = limits
        self.settings = replace(
            settings, rollouts=max(1, min(settings.rollouts, MAX_ROLLOUTS))
        )
        self.today = today
        self.clock = clock
        self.summarizer = summarizer
        self.started = clock()

    @property
    def rollouts(self) -> int:
        """How many rollouts this run starts."""
        return self.settings.rollouts

    async def run(self) -> AsyncGenerator[RunEvent, None]:
        """Yield every rollout's events as they come, then the synthesis's."""
        finished: dict[int, RunFinished] = {}
        async with contextlib.aclosing(self._rollouts()) as rollouts:
            async for event in rollouts:
                if isinstance(event.event, RunFinished):
                    finished[event.rollout] = event.event
                yield event
        results = [finished[k] for k in range(1, self.rollouts + 1)]
        async with contextlib.aclosing(self._synthesis(results)) as synthesis:
            async for event in synthesis:
                yield event

    # -- the rollouts --
    def _rollout_limits(self) -> Limits:
        reserve = min(self.limits.max_seconds * self.settings.synthesis_reserve, 600)
        return replace(self.limits, max_seconds=self.limits.max_seconds - reserve)

    async def _rollouts(self) -> AsyncGenerator[RolloutEvent, None]:
        queue: asyncio.Queue[RolloutEvent | _Finished] = asyncio.Queue()
        slots = asyncio.Semaphore(max(1, self.settings.concurrency))
        tasks = [
            asyncio.create_task(self._rollout(k, queue, slots))
            for k in range(1, self.rollouts + 1)
        ]
        try:
            running = len(tasks)
            while running:
                item = await queue.get()
                if isinstance(item, _Finished):
                    running -= 1
                else:
                    yield item
        finally:
            # Stop (or a finished run): nothing of any rollout keeps running.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _rollout(
        self,
        rollout: int,
        queue: asyncio.Queue[RolloutEvent | _Finished],
        slots: asyncio.Semaphore,
    ) -> None:
        """Run one rollout, putting its events on `queue`; it always finishes."""
        state = RunState(messages=copy.deepcopy(self.messages), started=self.started)
        ended = False
        try:
            async with slots:
                loop = ResearchLoop(
                    state,
                    self.model,
                    self.tools_for(rollout),
                    self._rollout_limits(),
                    self.clock,
                    summarizer=self.summarizer,
                )
                async with _closing(loop.run()) as events:
                    async for event in events:
                        ended |= isinstance(event, RunFinished)
                        for recorded in _with_sources(event, self.ledger, rollout):
                            await queue.put(
                                RolloutEvent(rollout, self.rollouts, recorded)
                            )
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a broken rollout must not sink the others
            if not ended:
                failed = RunFinished(
                    "error",
                    "",
                    state.stats(self.clock()),
                    error=f"{type(error).__name__}: {error}",
                )
                await queue.put(RolloutEvent(rollout, self.rollouts, failed))
        await queue.put(_Finished(rollout))

    # -- the synthesis --
    async def _synthesis(
        self, results: list[RunFinished]
    ) -> AsyncGenerator[RunEvent, None]:
        summaries = tuple(
            RolloutSummary(k, r.reason, r.stats, bool(r.answer), r.error)
            for k, r in enumerate(results, start=1)
        )
        answered = [(k, r) for k, r in enumerate(results, start=1) if r.answer]
        if not answered:
            yield RunFinished(
                "error",
                "",
                self._totals(results, None),
                error=_none_answered(results),
                rollouts=summaries,
            )
            return
        yield SynthesisStarted(len(answered), self.rollouts)
        state = RunState(
            messages=[
                {"role": "system", "content": build_synthesis_system(self.today)},
                {"role": "user", "content": self._request(answered)},
            ],
            started=self.started,
        )
        # The synthesis request is built to fit: it answers, never consolidates.
        limits = replace(self.limits, max_rounds=SYNTHESIS_ROUNDS, at_limit="wrap_up")
        loop = ResearchLoop(state, self.model, _NoTools(), limits, self.clock)
        async with _closing(loop.run()) as events:
            async for event in events:
                if not isinstance(event, RunFinished):
                    yield event
                    continue
                # The run's figures: every rollout's and the synthesis's.
                totals = self._totals(results, event.stats)
                yield replace(event, stats=totals, rollouts=summaries)

    def _request(self, answered: list[tuple[int, RunFinished]]) -> str:
        budget = self._report_chars(len(answered))
        known = {source.number for source in self.ledger.sources}
        reports = "\n\n".join(
            _report(number, finished, self.ledger.read_by(rollout), budget, known)
            for number, (rollout, finished) in enumerate(answered, start=1)
        )
        return SYNTHESIS_REQUEST.format(
            count=len(answered), question=_question(self.messages), reports=reports
        )

    def _report_chars(self, count: int) -> int:
        """Characters each report may take: together they fit the context."""
        room = self.limits.context_limit()
        # ~3 characters per token for such text, 2,000 tokens for the rest.
        return max(2000, (room - 2000) * 3 // max(count, 1))

    def _totals(
        self, results: list[RunFinished], synthesis: RunStats | None
    ) -> RunStats:
        stats = [r.stats for r in results] + ([synthesis] if synthesis else [])
        costs = [s.cost for s in stats if s.cost is not None]
        return RunStats(
            rounds=sum(s.rounds for s in stats),
            searches=sum(s.searches for s in stats),
            pages_requested=sum(s.pages_requested for s in stats),
            tool_calls=sum(s.tool_calls for s in stats),
            prompt_tokens=sum(s.prompt_tokens for s in stats),
            completion_tokens=sum(s.completion_tokens for s in stats),
            cost=sum(costs) if costs else None,
            seconds=self.clock() - self.started,
            consolidations=sum(s.consolidations for s in stats),
            consolidation_prompt_tokens=sum(
                s.consolidation_prompt_tokens for s in stats
            ),
            consolidation_completion_tokens=sum(
                s.consolidation_completion_tokens for s in stats
            ),
            peak_context_tokens=max(s.peak_context_tokens for s in stats),
            served_context_tokens=self.limits.model_context_tokens,
        )


def _question(messages: list[dict[str, Any]]) -> str:
    """The question: the last user message of the chat."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def _report(
    number: int,
    finished: RunFinished,
    sources: list[Source],
    budget: int,
    known: Container[int] | None = None,
) -> str:
    """One rollout's report: its answer, then the evidence of each page it read.

    What the rollout and its pages wrote is defused on the way in
    (`_excerpt`, `_report_title`): it cannot pose as the request's structure.
    The URL is the tool's, kept on one line and defused. `known` holds the
    run's source numbers (default: those of `sources`).
    """
    known = {source.number for source in sources} if known is None else known
    answer = _excerpt(finished.answer, min(REPORT_ANSWER_CHARS, budget // 2), known)
    room = budget - len(answer)
    items: list[str] = []
    for source in sources:
        item = SYNTHESIS_SOURCE.format(
            number=source.number,
            title=_report_title(source.title, known),
            url=neutralise_prompt_text(" ".join(source.url.split())),
            evidence=_excerpt(evidence_text(source), REPORT_EVIDENCE_CHARS, known),
        )
        if len(item) > room:
            items.append(f"({len(sources) - len(items)} more pages read, not shown)")
            break
        items.append(item)
        room -= len(item) + 2
    evidence = "## Evidence from the pages read\n\n" + (
        "\n\n".join(items) if items else "(no pages were read)"
    )
    return SYNTHESIS_REPORT.format(
        number=number,
        ending=TERMINATION_TEXT.get(finished.reason, finished.reason),
        answer=answer,
        evidence=evidence,
    )


def _excerpt(text: str, limit: int, known: Container[int]) -> str:
    """At most ``limit`` characters of ``text`` as the report holds it (`_report_text`).

    ``" …"`` marks a cut. Only the first ``2 × limit`` characters are read:
    the report keeps no more, and a hostile answer or page of megabytes would
    otherwise cost its whole length on the event loop. (Defusing may shorten
    what it reads, so a cut is also marked when what is shown fits.)
    """
    text = text.strip()
    read = text[: 2 * limit]
    shown = _report_text(read, known).strip()
    if len(shown) > limit:
        return shown[:limit].rstrip() + " …"
    return shown + " …" if len(read) < len(text) else shown


def _report_text(text: str, known: Container[int]) -> str:
    """A rollout's answer or a page's evidence, as the synthesis request holds it.

    Control tokens and protocol tags defused, source numbers the run does not
    hold dropped, then (last, so nothing after it can make one) every line
    that reads as a heading or a source entry escaped.
    """
    text = drop_unknown_source_numbers(neutralise_prompt_text(text), known)
    return escape_structure_lines(text)


def _report_title(title: str, known: Container[int]) -> str:
    """A page's title as its source entry holds it: one line, defused.

    A title longer than `REPORT_TITLE_CHARS` is cut (read no further).
    """
    title = " ".join(title[: 2 * REPORT_TITLE_CHARS].split())
    title = drop_unknown_source_numbers(neutralise_prompt_text(title), known)
    if len(title) <= REPORT_TITLE_CHARS:
        return title
    return title[:REPORT_TITLE_CHARS].rstrip() + " …"


def _none_answered(results: list[RunFinished]) -> str:
    reasons = "; ".join(
        f"rollout {k}: "
        + (result.error or TERMINATION_TEXT.get(result.reason, result.reason))
        for k, result in enumerate(results, start=1)
    )
    count = len(results)
    return f"None of the {count} research rollouts produced an answer ({reasons})."
