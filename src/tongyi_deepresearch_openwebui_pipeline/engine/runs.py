"""Research runs built from ports: a single run, or a heavy one.

A **single** run is one `ResearchLoop`. A **heavy** run is the lab's
ParallelMuse (arXiv 2510.24698, ``core/parallelmuse.py``): N research rollouts
of the same question, then the model writes one report per rollout from its
trajectory and one integrate call reads every report and gives the answer.
The engine knows no user interface and does no I/O of its own: it takes the
model and tool ports, yields the events of the run (a rollout's wrapped in
`RolloutEvent`), and the front end renders them.

Decisions (each has a test in tests/test_heavy.py or tests/test_lab_parallelmuse.py):

- Partial rollouts: the first rollout (``HeavySettings.initial_rollouts``)
  runs alone and asks for token log-probabilities; the others branch from the
  conversation before its most uncertain tool-call steps
  (`parallelmuse.branch_points`). A server that returns none in the first
  reply makes the others start at once from the question, and a status line
  says so. Branches wrap up at the context limit instead of consolidating
  (the loop takes the question to restart from as the last user message,
  which in a branch is a tool response).
- Sources are numbered once for the whole run: the rollouts share one
  `SourceLedger`, and each page records which rollouts read it.
- Reports and the integrate call use the lab's prompts and sampling
  (`parallelmuse.AGGREGATION_SAMPLING`), their reply lengths bounded by the
  served context; a trajectory or a set of reports too long for it is cut
  (`fit_trajectory`, `fit_reports`). The integrate answer streams as the
  run's answer; a reply without ``<answer>`` tags is taken as written, as the
  lab reads it.
- A rollout that fails or ends without an answer gets no report (the lab's
  filter); a report that fails is left out. With none left, the run ends
  with an error that says why.
- The run's time limit holds across rollouts: they stop early enough to leave
  the reports and the integrate call `synthesis_reserve` of it. Cancelling
  the run cancels every rollout and report call.
- Closing a run's generator (``aclose()``, as a front end's Stop does) closes
  the generators under it before it returns: every ``async for`` over an
  inner generator runs inside ``contextlib.aclosing``, never leaving one to
  garbage collection.
- Durable, single or heavy: with a `Checkpointer` the state before each
  round is saved before the round's request is sent, and a run asked again
  goes on from it; a heavy run keeps each rollout's progress, each ending
  and each report (`HeavyRun`; tests/test_durable_runs.py,
  tests/test_heavy_durable.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.budget import MESSAGE_OVERHEAD_TOKENS, estimate_text_tokens, messages_tokens
from ..core.checkpoint import MAX_ROLLOUTS, HeavyCheckpoint, SavedRollout
from ..core.events import (
    TERMINATION_TEXT,
    AliasesAdded,
    Consolidated,
    ContextWarning,
    Event,
    ModelChunk,
    ModelDelta,
    ModelError,
    ModelPort,
    ModelRetry,
    ModelUsage,
    RolloutEvent,
    RolloutSummary,
    RoundStarted,
    RunEvent,
    RunFinished,
    RunResumed,
    RunStats,
    SourcesAdded,
    SynthesisStarted,
    ToolCallFinished,
    ToolOutcome,
    ToolPort,
    WrappingUp,
)
from ..core.history import content_text
from ..core.loop import REPLY_MARGIN_SHARE, Limits, ResearchLoop, RunState
from ..core.parallelmuse import (
    AGGREGATION_SAMPLING,
    BRANCH_STEPS,
    CONVERGE_SYSTEM_PROMPT,
    INITIAL_ROLLOUTS,
    INTEGRATE_MAX_TOKENS,
    INTEGRATE_PROMPT,
    REPORT_ENTRY,
    REPORT_MAX_TOKENS,
    REPORT_PROMPT,
    TOP_LOGPROBS,
    Record,
    ReplyUncertainty,
    ScoredChunk,
    Step,
    TokenLogprobs,
    TunableModelPort,
    branch_points,
    fit_reports,
    fit_trajectory,
    integrate_request,
    is_wrap_up,
    message_records,
    report_from_reply,
    report_request,
)
from ..core.sources import SourceLedger
from ..core.toolcalls import ToolCall
from .checkpoints import Checkpointer, HeavyProgress

#: Rounds of the integrate call: it answers (its reply is the answer).
INTEGRATE_ROUNDS = 1
#: Longest report reply read, in characters: four characters a token of the
#: longest report asked for, four times over; a server sending more is read
#: as cut off there.
MAX_REPORT_CHARS = 16 * REPORT_MAX_TOKENS
#: Said in the status line when the first reply carries no log-probabilities.
NO_LOGPROBS_NOTICE = (
    "The model server returned no token log-probabilities, so the other "
    "rollouts start from the question instead of branching from this one's "
    "most uncertain steps (ParallelMuse's partial rollouts need them; vLLM, "
    "SGLang and llama.cpp return them)."
)


@dataclass(frozen=True)
class HeavySettings:
    """How a heavy run is shaped."""

    rollouts: int = 3
    #: Rollouts running at once (the others wait for a slot); also the most
    #: report calls at once.
    concurrency: int = 3
    #: Share of the run's time kept for the reports and the integrate call
    #: (at most 10 minutes).
    synthesis_reserve: float = 0.15
    #: ParallelMuse's partial rollouts: branch the later rollouts from the
    #: most uncertain steps of the first ones (False: all from the question).
    partial_rollouts: bool = True
    #: Rollouts run from the question before any branch.
    initial_rollouts: int = INITIAL_ROLLOUTS
    #: Most uncertain steps of an initial rollout that branches start from.
    branch_steps: int = BRANCH_STEPS
    #: Alternatives per token asked for, to measure a step's uncertainty.
    top_logprobs: int = TOP_LOGPROBS


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
    *,
    checkpointer: Checkpointer | None = None,
) -> AsyncGenerator[RunEvent, None]:
    """Run `plan`: its events, ending with `RunFinished`.

    `tools_for(k)` gives rollout k of a heavy run its tools (0: a single run);
    `summarizer` writes the research state when a run consolidates (default:
    `model`). A run, single or heavy, saves its progress through
    `checkpointer` and goes on from the checkpoint it finds there (its
    sources into `ledger`).
    """
    if plan.heavy is None:
        return _single_from(
            plan,
            model,
            tools_for(0),
            ledger,
            summarizer=summarizer,
            checkpointer=checkpointer,
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
        checkpointer=checkpointer,
    )
    return heavy.run()


async def _single_from(
    plan: RunPlan,
    model: ModelPort,
    tools: ToolPort,
    ledger: SourceLedger,
    *,
    summarizer: ModelPort | None,
    checkpointer: Checkpointer | None,
) -> AsyncGenerator[RunEvent, None]:
    """`single_run` from the plan's messages, or from the run's checkpoint."""
    if checkpointer is None:
        state = RunState(messages=list(plan.messages), started=time.monotonic())
        resuming = False
    else:
        state, resuming = await checkpointer.starting_state(plan.messages, ledger)
    events = single_run(
        state,
        model,
        tools,
        plan.limits,
        ledger,
        summarizer=summarizer,
        checkpointer=checkpointer,
        resuming=resuming,
    )
    async with contextlib.aclosing(events):
        async for event in events:
            yield event


async def single_run(
    state: RunState,
    model: ModelPort,
    tools: ToolPort,
    limits: Limits,
    ledger: SourceLedger,
    *,
    summarizer: ModelPort | None = None,
    checkpointer: Checkpointer | None = None,
    resuming: bool = False,
) -> AsyncGenerator[RunEvent, None]:
    """One research run: the loop's events, with the pages read numbered.

    The pages the tools read are recorded in `ledger` as they come
    (`SourcesAdded` after the call that read them first); `RunFinished`
    carries them all. The ledger is the engine's: a front end learns the
    sources from these events alone. With a `checkpointer`, the state is
    saved before every round after the first, before a wrap-up and after
    every consolidation, and forgotten when the run ends (but after an error,
    which a later try may go on from).
    `resuming`: `state` and `ledger` come from a checkpoint (said first).
    """
    said = 0
    if checkpointer is not None:
        for note in checkpointer.notes:  # what resuming found
            yield ContextWarning(note)
        said = len(checkpointer.notes)
    if resuming:
        yield RunResumed(
            state.round, tuple(ledger.sources), tuple(ledger.papers.values())
        )
    loop = ResearchLoop(state, model, tools, limits, summarizer=summarizer)
    async with _closing(loop.run()) as events:
        async for event in events:
            if checkpointer is not None:
                await _checkpoint(checkpointer, event, state, ledger)
                for note in checkpointer.notes[said:]:
                    yield ContextWarning(note)
                said = len(checkpointer.notes)
            for recorded in _with_sources(event, ledger, reader=0):
                yield recorded


async def _checkpoint(
    checkpointer: Checkpointer, event: Event, state: RunState, ledger: SourceLedger
) -> None:
    """Save between rounds and after a consolidation; forget at the end.

    A wrap-up is a round too (already counted when it is said): the state
    before it is saved as before any round.
    """
    if isinstance(event, RoundStarted) and event.round > 1:
        await checkpointer.save_between_rounds(state, ledger, event.round)
    elif isinstance(event, WrappingUp):
        await checkpointer.save_between_rounds(state, ledger, state.round)
    elif isinstance(event, Consolidated):
        await checkpointer.save(state, ledger)
    elif isinstance(event, RunFinished) and event.reason != "error":
        await checkpointer.finish()


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


@contextlib.asynccontextmanager
async def _stream_of(
    chunks: AsyncIterator[ScoredChunk],
) -> AsyncGenerator[AsyncIterator[ScoredChunk], None]:
    """A model port's stream, closed on the way out (the request with it)."""
    try:
        yield chunks
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()


def _with_sources(event: Event, ledger: SourceLedger, reader: int) -> list[Event]:
    """`event` with what its pages did to `ledger` said after it.

    A tool call's pages are recorded: `SourcesAdded` for those read first,
    `AliasesAdded` for earlier sources now cited from another address too.
    The run's end gets the sources and the number of pages read.
    """
    if isinstance(event, ToolCallFinished):
        ledger.keep_papers(event.papers)
    if isinstance(event, ToolCallFinished) and event.pages:
        recorded = [ledger.record(page, reader) for page in event.pages]
        added = {r.source.number: r.source for r in recorded if r.new}
        # A source numbered by this very call is told whole in SourcesAdded.
        readdressed = {
            r.source.number: r.source
            for r in recorded
            if r.readdressed and r.source.number not in added
        }
        return [
            event,
            *([SourcesAdded(tuple(added.values()))] if added else []),
            *([AliasesAdded(tuple(readdressed.values()))] if readdressed else []),
        ]
    if isinstance(event, RunFinished):
        return [_with_run_sources(event, ledger)]
    return [event]


def _with_run_sources(finished: RunFinished, ledger: SourceLedger) -> RunFinished:
    """`finished` carrying the run's sources and its pages read (the ledger's)."""
    return replace(finished, sources=tuple(ledger.sources), pages_read=ledger.reads)


class _NoTools:
    """The integrate call offers no tools (a call gets a model-facing error)."""

    def available(self) -> list[str]:
        return []

    async def run(self, call: ToolCall) -> ToolOutcome:
        return ToolOutcome(f"Error: no tools can be used now ({call.name}).", False)


# -- partial rollouts: where an initial rollout was uncertain --


class _ScoredModel:
    """An initial rollout's model port: it keeps the steps a branch can start from.

    Each request asks for ``top_logprobs`` alternatives per token (when the
    port can ask); a reply that calls a tool becomes a `Step` holding its
    tool call's uncertainty and the conversation it answered. The first
    complete reply tells ``first_reply`` whether the server returned any
    log-probabilities.
    """

    def __init__(
        self,
        model: ModelPort,
        top_logprobs: int,
        state: RunState,
        first_reply: Callable[[bool], None],
        steps: list[Step] | None = None,
    ) -> None:
        """Wrap ``model`` for the rollout whose state is ``state``.

        ``steps`` are the rollout's steps so far (a resumed one's), kept in
        that list as they come.
        """
        self.model = model
        self.top_logprobs = top_logprobs
        self.state = state
        self.steps: list[Step] = [] if steps is None else steps
        self._first_reply: Callable[[bool], None] | None = first_reply

    def _chunks(
        self, messages: list[dict[str, Any]], max_tokens: int | None
    ) -> AsyncIterator[ScoredChunk]:
        if isinstance(self.model, TunableModelPort):
            return self.model.stream_scored(
                messages, max_tokens, top_logprobs=self.top_logprobs
            )
        return self.model.stream(messages, max_tokens)

    async def stream(
        self, messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> AsyncIterator[ModelChunk]:
        """The reply's chunks, the log-probabilities kept apart."""
        # What the step answered, as it was sent (the loop edits its own
        # messages later, when it makes room for a final answer).
        before = Step(
            0.0,
            self.state.round,
            tuple(dict(m) for m in messages),
            tuple(self.state.pages),
        )
        uncertainty = ReplyUncertainty()
        async with _stream_of(self._chunks(messages, max_tokens)) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, TokenLogprobs):
                    uncertainty.add(chunk)
                    continue
                if isinstance(chunk, ModelRetry):  # the reply starts over
                    uncertainty = ReplyUncertainty()
                yield chunk
        self._keep(before, uncertainty)

    def _keep(self, before: Step, uncertainty: ReplyUncertainty) -> None:
        if self._first_reply is not None:
            self._first_reply(uncertainty.served)
            self._first_reply = None
        score = uncertainty.tool_call_uncertainty()
        if score is not None and not is_wrap_up(before.messages):
            self.steps.append(replace(before, uncertainty=score))


@dataclass
class _Rollout:
    """One rollout of a heavy run: where it starts, and how it ended."""

    number: int
    state: RunState
    model: ModelPort
    limits: Limits
    #: Rounds of its conversation that its parent ran (a branch's prefix).
    inherited_rounds: int = 0
    #: It branched from an initial rollout's step.
    branch: bool = False
    finished: RunFinished | None = None
    #: An initial rollout's scored steps, which branches start from (None:
    #: not scored); its port (`_ScoredModel`) adds to them.
    steps: list[Step] | None = None
    #: Its rounds when it (re)started: the first round it runs is the next.
    start_round: int = 0


@dataclass
class _Finished:
    """A rollout task ended (after its last event)."""

    rollout: int


@dataclass
class _FirstReply:
    """An initial rollout's first reply came, with log-probabilities or not."""

    rollout: int
    served: bool


_Item = RolloutEvent | _Finished | _FirstReply


@dataclass
class _Report:
    """One rollout's report, or why there is none; and what the call cost."""

    rollout: int
    text: str = ""
    error: str = ""
    usage: list[ModelUsage] = field(default_factory=list)
    #: The reply's content as it streams, at most `MAX_REPORT_CHARS` of it.
    parts: list[str] = field(default_factory=list)
    chars: int = 0

    def take(self, chunk: ScoredChunk) -> None:
        """One chunk of the report call: its text, or its usage."""
        if isinstance(chunk, ModelDelta) and self.chars < MAX_REPORT_CHARS:
            self.parts.append(chunk.content)
            self.chars += len(chunk.content)
        elif isinstance(chunk, ModelRetry):  # the reply starts over
            self.parts, self.chars = [], 0
        elif isinstance(chunk, ModelUsage):
            self.usage.append(chunk)


class HeavyRun:
    """N rollouts of one question, then ParallelMuse's reports and integration.

    With a `Checkpointer` the run is durable (`HeavyProgress` says what is
    kept): it saves each rollout's state between its rounds and after its
    consolidations, each rollout's ending, and each report written. A run
    that finds its checkpoint goes on from it: finished rollouts are not run
    again (their endings are said again), running ones go on from their last
    saved round (a branch keeps its inherited rounds), rollouts not started
    start as they would have (branches from the saved steps), reports
    written are not asked again, and the integrate call runs. A rollout that
    ended with an error is kept as it was before its failing round, so a
    later try goes on with it, as a single run does.
    """

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
        checkpointer: Checkpointer | None = None,
    ) -> None:
        """A heavy run of `messages` (system prompt, then the chat).

        `tools_for(k)` gives rollout k its tools: they record the pages they
        read in `ledger` as read by k. `checkpointer` keeps its progress.
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
        self.checkpointer = checkpointer
        self.started = clock()
        self._runs: dict[int, _Rollout] = {}
        self.progress = (
            None
            if checkpointer is None
            else HeavyProgress(
                self.rollouts,
                self.settings.branch_steps,
                lambda: max(0.0, self.clock() - self.started),
            )
        )
        #: Reports a checkpoint kept, by rollout (not asked again).
        self._kept_reports: dict[int, _Report] = {}
        #: The checkpointer's notes already said.
        self._said = 0

    @property
    def rollouts(self) -> int:
        """How many rollouts this run starts."""
        return self.settings.rollouts

    async def run(self) -> AsyncGenerator[RunEvent, None]:
        """Yield every rollout's events as they come, then the aggregation's."""
        saved = await self._resume()
        for event in [*self._notes(), *self._resumed(saved)]:
            yield event
        async with contextlib.aclosing(self._rollouts(saved)) as rollouts:
            async for event in rollouts:
                yield event
        async with contextlib.aclosing(self._aggregation()) as aggregation:
            async for event in aggregation:
                for warning in self._notes():
                    yield warning
                if (
                    self.checkpointer is not None
                    and isinstance(event, RunFinished)
                    and event.reason != "error"
                ):
                    await self.checkpointer.finish()
                yield event

    # -- durability --
    async def _resume(self) -> HeavyCheckpoint | None:
        """The run's checkpoint, its sources and clock taken back (None: none)."""
        if self.checkpointer is None:
            return None
        saved = await self.checkpointer.resume_heavy(self.rollouts)
        if saved is None:
            return None
        self.ledger.restore(saved.sources, saved.reads, saved.papers)
        self.started = self.clock() - saved.elapsed
        for rollout in saved.started:
            rollout.state.started = self.started
        self._kept_reports = {
            report.rollout: _Report(report.rollout, report.text, usage=[*report.usage])
            for report in saved.reports
        }
        return saved

    def _resumed(self, saved: HeavyCheckpoint | None) -> list[RunEvent]:
        """What a resumed run says first: its rounds and sources, its endings."""
        if saved is None:
            return []
        rounds = sum(
            rollout.ending.stats.rounds
            if rollout.ending is not None
            else rollout.state.round - rollout.inherited_rounds
            for rollout in saved.started
        )
        said: list[RunEvent] = [
            RunResumed(
                rounds, tuple(self.ledger.sources), tuple(self.ledger.papers.values())
            )
        ]
        for rollout in saved.started:
            if rollout.ending is not None:
                ending = _with_run_sources(rollout.ending, self.ledger)
                said.append(RolloutEvent(rollout.number, self.rollouts, ending))
        return said

    def _notes(self) -> list[ContextWarning]:
        """What the checkpointer found, or could not save, not yet said."""
        if self.checkpointer is None:
            return []
        notes = self.checkpointer.notes[self._said :]
        self._said += len(notes)
        return [ContextWarning(note) for note in notes]

    def _keep(
        self,
        rollout: _Rollout,
        *,
        round: int | None = None,
        ending: RunFinished | None = None,
    ) -> None:
        """Take ``rollout``'s record as it is now (written by the next save)."""
        if self.progress is not None:
            self.progress.keep(
                rollout.number,
                rollout.state,
                round=round,
                branch=rollout.branch,
                inherited_rounds=rollout.inherited_rounds,
                steps=rollout.steps or (),
                ending=ending,
            )

    async def _save(self) -> None:
        """Write what is kept (the caller's rollout waits for it)."""
        if self.checkpointer is not None and self.progress is not None:
            await self.checkpointer.save_heavy(self.progress, self.ledger)

    async def _saved_between_rounds(self, rollout: _Rollout, event: Event) -> None:
        """Save ``rollout`` before a round or a wrap-up, or after a consolidation."""
        if isinstance(event, RoundStarted) and event.round > rollout.start_round + 1:
            self._keep(rollout, round=event.round - 1)
        elif isinstance(event, WrappingUp):
            self._keep(rollout, round=rollout.state.round - 1)
        elif isinstance(event, Consolidated):
            self._keep(rollout)
        else:
            return
        await self._save()

    async def _saved_ending(self, rollout: _Rollout, finished: RunFinished) -> None:
        """Save how ``rollout`` ended (an error keeps its last saved round)."""
        if finished.reason != "error":
            self._keep(rollout, ending=finished)
            await self._save()

    # -- the rollouts --
    def _rollout_limits(self) -> Limits:
        reserve = min(self.limits.max_seconds * self.settings.synthesis_reserve, 600)
        return replace(self.limits, max_seconds=self.limits.max_seconds - reserve)

    def _initial_count(self) -> int:
        """Rollouts that start from the question at once (all, without branches)."""
        if not self.settings.partial_rollouts:
            return self.rollouts
        return min(max(1, self.settings.initial_rollouts), self.rollouts)

    def _fresh(self, number: int, state: RunState | None = None) -> _Rollout:
        """Rollout ``number`` from the question (or from its saved ``state``)."""
        if state is None:
            state = RunState(
                messages=copy.deepcopy(self.messages), started=self.started
            )
        return _Rollout(number, state, self.model, self._rollout_limits())

    def _initial(
        self,
        number: int,
        queue: asyncio.Queue[_Item],
        saved: SavedRollout | None = None,
    ) -> _Rollout:
        """Rollout ``number`` from the question (or where it was saved), scored."""
        rollout = self._fresh(number, None if saved is None else saved.state)
        rollout.steps = [] if saved is None else list(saved.steps)
        rollout.model = _ScoredModel(
            self.model,
            self.settings.top_logprobs,
            rollout.state,
            lambda served: queue.put_nowait(_FirstReply(number, served)),
            rollout.steps,
        )
        return rollout

    def _opening(
        self, number: int, queue: asyncio.Queue[_Item], saved: SavedRollout | None
    ) -> _Rollout:
        """Initial rollout ``number``: scored when later ones branch from it."""
        if self._initial_count() < self.rollouts:
            return self._initial(number, queue, saved)
        return self._fresh(number, None if saved is None else saved.state)

    def _branch(self, number: int, step: Step) -> _Rollout:
        """Rollout ``number`` continuing the conversation before ``step``."""
        done = max(step.round - 1, 0)
        state = RunState(
            messages=copy.deepcopy(list(step.messages)),
            started=self.started,
            round=done,
            pages=list(step.pages),
        )
        return self._branching(_Rollout(number, state, self.model, self.limits, done))

    def _branching(self, rollout: _Rollout) -> _Rollout:
        """``rollout`` as a branch: it wraps up at the context limit."""
        # The loop would restart a consolidated branch from its last user
        # message, here a tool response, as if it were the question.
        rollout.limits = replace(self._rollout_limits(), at_limit="wrap_up")
        rollout.branch = True
        return rollout

    def _restored(self, saved: SavedRollout) -> _Rollout:
        """A later rollout where its checkpoint left it (or how it ended)."""
        rollout = self._fresh(saved.number, saved.state)
        rollout.inherited_rounds = saved.inherited_rounds
        rollout.finished = saved.ending
        return self._branching(rollout) if saved.branch else rollout

    def _ended(self, saved: SavedRollout) -> _Rollout:
        """A rollout its checkpoint says ended: not run again."""
        rollout = self._restored(saved)
        if saved.number <= self._initial_count() < self.rollouts:
            rollout.steps = list(saved.steps)  # later rollouts may branch from it
        return rollout

    def _later(self, numbers: list[int]) -> list[_Rollout]:
        """The later rollouts: branches of the initial ones where they can be."""
        runs = [self._runs[k] for k in sorted(self._runs)]
        steps = [run.steps for run in runs if run.steps is not None]
        points = branch_points(steps, len(numbers), self.settings.branch_steps)
        return [
            self._fresh(number) if point is None else self._branch(number, point)
            for number, point in zip(numbers, points, strict=True)
        ]

    def _plan(
        self, saved: HeavyCheckpoint | None, queue: asyncio.Queue[_Item]
    ) -> tuple[list[_Rollout], list[_Rollout], list[int]]:
        """What the rollouts start from: a checkpoint's, or the question.

        The initial rollouts to run, the later ones to run (a checkpoint's
        that had started), and the later ones not started yet. A rollout its
        checkpoint says ended is registered as such, and not run.
        """
        kept = {rollout.number: rollout for rollout in saved.started} if saved else {}
        for rollout in kept.values():
            if rollout.ending is not None:
                self._runs[rollout.number] = self._ended(rollout)
                self._keep(self._runs[rollout.number], ending=rollout.ending)
        initial = self._initial_count()
        first = [
            self._opening(k, queue, kept.get(k))
            for k in range(1, initial + 1)
            if k not in self._runs
        ]
        later = list(range(initial + 1, self.rollouts + 1))
        if not any(k in kept for k in later):
            return first, [], later
        going_on = [
            self._restored(kept[k]) for k in later if k in kept and k not in self._runs
        ]
        return first, going_on, [k for k in later if k not in kept]

    async def _rollouts(
        self, saved: HeavyCheckpoint | None
    ) -> AsyncGenerator[RunEvent, None]:
        """Run the rollouts: the initial ones, then branches or fresh ones."""
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        slots = asyncio.Semaphore(max(1, self.settings.concurrency))
        tasks: list[asyncio.Task[None]] = []

        def start(rollouts: list[_Rollout]) -> int:
            for rollout in rollouts:
                self._runs[rollout.number] = rollout
                rollout.start_round = rollout.state.round
                self._keep(rollout)
                tasks.append(asyncio.create_task(self._rollout(rollout, queue, slots)))
            return len(rollouts)

        def start_later(rollouts: list[_Rollout]) -> int:
            if self.progress is not None:
                self.progress.branches_started()
            return start(rollouts)

        first, going_on, later = self._plan(saved, queue)
        running = start(first)
        if going_on or not later:  # no later rollout is left to branch
            running += start_later(going_on)
        detected = False
        try:
            if not running and later:  # the initial ones had all ended
                running += start_later(self._later(later))
                later = []
            while running:
                item = await queue.get()
                for warning in self._notes():
                    yield warning
                if isinstance(item, RolloutEvent):
                    yield item
                elif isinstance(item, _FirstReply):
                    if detected or not later:
                        continue
                    detected = True
                    if not item.served:
                        yield RolloutEvent(
                            item.rollout,
                            self.rollouts,
                            ContextWarning(NO_LOGPROBS_NOTICE),
                        )
                        running += start_later([self._fresh(k) for k in later])
                        later = []
                else:
                    running -= 1
                    if not running and later:
                        running += start_later(self._later(later))
                        later = []
        finally:
            # Stop (or a finished run): nothing of any rollout keeps running.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _rollout(
        self,
        rollout: _Rollout,
        queue: asyncio.Queue[_Item],
        slots: asyncio.Semaphore,
    ) -> None:
        """Run one rollout, putting its events on `queue`; it always finishes."""
        number, state = rollout.number, rollout.state
        try:
            async with slots:
                loop = ResearchLoop(
                    state,
                    rollout.model,
                    self.tools_for(number),
                    rollout.limits,
                    self.clock,
                    summarizer=self.summarizer or self.model,
                )
                async with _closing(loop.run()) as events:
                    async for event in events:
                        await self._saved_between_rounds(rollout, event)
                        for recorded in _with_sources(event, self.ledger, number):
                            item = self._rollout_event(rollout, recorded)
                            if isinstance(item.event, RunFinished):
                                await self._saved_ending(rollout, item.event)
                            await queue.put(item)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a broken rollout must not sink the others
            if rollout.finished is None:
                failed = RunFinished(
                    "error",
                    "",
                    state.stats(self.clock()),
                    error=f"{type(error).__name__}: {error}",
                )
                await queue.put(self._rollout_event(rollout, failed))
        await queue.put(_Finished(number))

    def _rollout_event(self, rollout: _Rollout, event: Event) -> RolloutEvent:
        """``event`` of ``rollout``; its end keeps the rollout's own figures."""
        if isinstance(event, RunFinished):
            # A branch's rounds before it started were its parent's.
            rounds = event.stats.rounds - rollout.inherited_rounds
            event = replace(event, stats=replace(event.stats, rounds=rounds))
            rollout.finished = event
        return RolloutEvent(rollout.number, self.rollouts, event)

    # -- compressed reasoning aggregation --
    def _finished(self) -> list[RunFinished]:
        """How each rollout ended, in order."""
        ended: list[RunFinished] = []
        for number in range(1, self.rollouts + 1):
            run = self._runs.get(number)
            finished = run.finished if run is not None else None
            ended.append(
                finished
                or RunFinished("error", "", _no_stats(), error="the rollout never ran")
            )
        return ended

    async def _aggregation(self) -> AsyncGenerator[RunEvent, None]:
        results = self._finished()
        summaries = tuple(
            RolloutSummary(k, r.reason, r.stats, bool(r.answer), r.error)
            for k, r in enumerate(results, start=1)
        )
        answered = [k for k, r in enumerate(results, start=1) if r.answer]
        if not answered:
            failed = RunFinished(
                "error",
                "",
                self._totals(results),
                error=_none_answered(results),
                rollouts=summaries,
            )
            yield _with_run_sources(failed, self.ledger)
            return
        yield SynthesisStarted(len(answered), self.rollouts)
        aggregator = self._aggregator()
        reports = await self._reports(aggregator, answered)
        written = [report.text for report in reports if report.text]
        if not written:
            failed = RunFinished(
                "error",
                "",
                self._totals(results, reports),
                error=_none_reported(reports),
                rollouts=summaries,
            )
            yield _with_run_sources(failed, self.ledger)
            return
        async with contextlib.aclosing(
            self._integrate(aggregator, written, results, reports, summaries)
        ) as events:
            async for event in events:
                yield event

    def _aggregator(self) -> ModelPort:
        """The research model, sampled as the lab's report and integrate calls."""
        if isinstance(self.model, TunableModelPort):
            return self.model.tuned(AGGREGATION_SAMPLING)
        return self.model

    async def _integrate(
        self,
        aggregator: ModelPort,
        reports: list[str],
        results: list[RunFinished],
        written: list[_Report],
        summaries: tuple[RolloutSummary, ...],
    ) -> AsyncGenerator[RunEvent, None]:
        """The integrate call: its answer streams as the run's answer."""
        state = RunState(
            messages=integrate_request(
                _question(self.messages), fit_reports(reports, self._reports_room())
            ),
            started=self.started,
            # The lab reads a reply without <answer> tags as the answer: one
            # stall already counted makes the loop take it as written, with
            # no nudge.
            stalls=1,
        )
        limits = replace(
            self.limits,
            max_rounds=INTEGRATE_ROUNDS,
            at_limit="wrap_up",
            max_output_tokens=INTEGRATE_MAX_TOKENS,
        )
        loop = ResearchLoop(state, aggregator, _NoTools(), limits, self.clock)
        async with _closing(loop.run()) as events:
            async for event in events:
                if not isinstance(event, RunFinished):
                    yield event
                    continue
                # The run's figures: every rollout's, the reports' and this call's.
                totals = self._totals(results, written, event.stats)
                ended = replace(event, stats=totals, rollouts=summaries)
                yield _with_run_sources(ended, self.ledger)

    # -- the reports --
    async def _reports(self, model: ModelPort, rollouts: list[int]) -> list[_Report]:
        """One report per rollout, written at once (as many as may run).

        A report a checkpoint kept is not asked again.
        """
        slots = asyncio.Semaphore(max(1, self.settings.concurrency))
        tasks = {
            number: asyncio.create_task(self._report(model, number, slots))
            for number in rollouts
            if number not in self._kept_reports
        }
        try:
            written = dict(
                zip(tasks, await asyncio.gather(*tasks.values()), strict=True)
            )
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
        return [self._kept_reports.get(k) or written[k] for k in rollouts]

    async def _report(
        self, model: ModelPort, number: int, slots: asyncio.Semaphore
    ) -> _Report:
        """Rollout ``number``'s report: the lab's request over its trajectory."""
        report = _Report(number)
        messages = report_request(await self._trajectory(number))
        max_tokens = self._reply_tokens(messages, REPORT_MAX_TOKENS)
        try:
            async with (
                slots,
                asyncio.timeout_at(self._deadline()),
                _stream_of(model.stream(messages, max_tokens)) as chunks,
            ):
                async for chunk in chunks:
                    report.take(chunk)
        except ModelError as error:
            report.error = error.message
            return report
        except TimeoutError:
            report.error = TERMINATION_TEXT["time_limit"]
            return report
        report.text = report_from_reply("".join(report.parts))
        if not report.text:
            report.error = "the report was empty"
        elif self.progress is not None:
            self.progress.keep_report(number, report.text, report.usage)
            await self._save()
        return report

    async def _trajectory(self, number: int) -> str:
        """Rollout ``number``'s conversation as its report request holds it.

        Rendered a message at a time, the event loop free between them: a
        trajectory fills a context (half a megabyte of text and more).
        """
        messages = self._runs[number].state.messages
        given = _common_start(messages, self.messages)
        records: list[Record] = []
        for index, message in enumerate(messages):
            records += message_records(message, given=index < given)
            await asyncio.sleep(0)
        room = self._room(
            REPORT_PROMPT, min(REPORT_MAX_TOKENS, self.limits.hard_limit() // 4)
        )
        return fit_trajectory(records, room)

    def _reports_room(self) -> int:
        """Tokens the reports may take together in the integrate request."""
        reply = min(INTEGRATE_MAX_TOKENS, self.limits.hard_limit() // 2)
        entries = self.rollouts * estimate_text_tokens(REPORT_ENTRY)
        question = estimate_text_tokens(_question(self.messages))
        return self._room(INTEGRATE_PROMPT, reply) - entries - question

    def _room(self, prompt: str, reply: int) -> int:
        """Tokens left for what goes into ``prompt`` beside a ``reply``."""
        hard = self.limits.hard_limit()
        framing = estimate_text_tokens(CONVERGE_SYSTEM_PROMPT + prompt)
        return max(
            hard - reply - framing - 2 * MESSAGE_OVERHEAD_TOKENS - _margin(hard), 0
        )

    def _reply_tokens(self, messages: list[dict[str, Any]], most: int) -> int:
        """The longest reply (up to ``most``) that fits beside ``messages``."""
        hard = self.limits.hard_limit()
        room = hard - messages_tokens(messages) - _margin(hard)
        return max(min(most, room), 1)

    def _deadline(self) -> float:
        """The run's wall-clock deadline, in event-loop time."""
        remaining = self.limits.max_seconds - (self.clock() - self.started)
        return asyncio.get_running_loop().time() + max(remaining, 0.0)

    def _totals(
        self,
        results: list[RunFinished],
        reports: Sequence[_Report] = (),
        integrate: RunStats | None = None,
    ) -> RunStats:
        stats = [r.stats for r in results] + [_report_stats(reports)]
        stats += [integrate] if integrate else []
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


def _margin(hard: int) -> int:
    """Tokens kept free beside prompt and reply (as the loop keeps them)."""
    return max(32, int(hard * REPLY_MARGIN_SHARE))


def _common_start(messages: list[dict[str, Any]], given: list[dict[str, Any]]) -> int:
    """How many of ``messages``' first messages are those of ``given``."""
    count = 0
    for mine, theirs in zip(messages, given, strict=False):
        if mine != theirs:
            break
        count += 1
    return count


def _no_stats() -> RunStats:
    return RunStats(0, 0, 0, 0, 0, 0, None, 0.0)


def _report_stats(reports: Sequence[_Report]) -> RunStats:
    """What the report calls cost, as figures to add to the run's."""
    usage = [u for report in reports for u in report.usage]
    costs = [u.cost for u in usage if u.cost is not None]
    return replace(
        _no_stats(),
        prompt_tokens=sum(u.prompt_tokens for u in usage),
        completion_tokens=sum(u.completion_tokens for u in usage),
        cost=sum(costs) if costs else None,
        peak_context_tokens=max(
            (u.prompt_tokens + u.completion_tokens for u in usage), default=0
        ),
    )


def _question(messages: list[dict[str, Any]]) -> str:
    """The question: the last user message of the chat."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def _none_answered(results: list[RunFinished]) -> str:
    reasons = "; ".join(
        f"rollout {k}: "
        + (result.error or TERMINATION_TEXT.get(result.reason, result.reason))
        for k, result in enumerate(results, start=1)
    )
    count = len(results)
    return f"None of the {count} research rollouts produced an answer ({reasons})."


def _none_reported(reports: list[_Report]) -> str:
    reasons = "; ".join(f"rollout {r.rollout}: {r.error}" for r in reports)
    return (
        f"No report could be written on the {len(reports)} rollouts that "
        f"answered ({reasons})."
    )
