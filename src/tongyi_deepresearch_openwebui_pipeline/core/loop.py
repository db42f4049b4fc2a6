"""The ReAct loop as the model was trained to run it, yielding typed events.

One round: stream the model's turn → keep it in the history (cut at any
generated ``<tool_response>``) → an ``<answer>`` ends the run; otherwise run
the turn's ``<tool_call>`` blocks and send their results back as ONE user
message of ``<tool_response>`` blocks. Budgets (rounds, context tokens, wall
clock) are checked before every round; when one runs out the model gets the
reference wrap-up message and one last call to answer.

Decisions beyond the reference agent (each has a test):

- Several calls in one turn all run (concurrently, up to
  ``Limits.max_calls_per_turn``); extra ones get an error block saying so.
  The reference silently ran only the first. Each call's result is shown
  (`ToolCallFinished`) as soon as that call finishes, so a quick search does
  not wait for a slow page; the model gets them all in one message, in the
  order of the calls.
- A call and an answer in the same turn: the answer ends the run.
- A turn with neither call nor answer gets a model-facing nudge in a
  ``<tool_response>`` block; a second one in a row ends the run with that
  text as an unmarked answer rather than looping.
- The wrap-up message is appended as its own user message instead of
  overwriting the last tool result, unless the context is too full to keep it.
  The reference run (`Limits.reference_run`) overwrites it, as the lab does.
- At the round limit the model is asked for its answer once more; the
  reference run makes no call there (the last message becomes the lab's
  `CALLS_EXCEEDED_MESSAGE`), and checks the time limit between rounds only,
  ending without a call when it has passed.
- The time limit is wall-clock and holds during a model turn and during
  tools, not only between rounds. A turn still thinking when it runs out is
  dropped and the wrap-up gets `Limits.wrap_up_seconds` of grace; a turn
  already writing its answer may finish it within that grace; tools still
  running are cancelled and answer the model with `TIME_LIMIT_TOOL`. A
  wrap-up that overruns its grace ends the run with what was written.
- Calls that are not strict JSON are parsed by json5 in a worker thread
  (`toolcalls.needs_lenient_parse`), never on the event loop.
- The served context is respected, whatever the budget valves say: a served
  context too small for research is said at the start (`ContextWarning`); a
  server that reports processing far fewer prompt tokens than were sent cut
  the conversation silently (Ollama drops its start), which is said and
  wraps the run up within what it processed; a request refused for its length
  (`ContextOverflowError`) makes room, oldest tool results first, and asks
  for the answer, a bounded number of times. A run never ends on a context
  overflow without an answer attempt. Every request asks for at most the
  reply that fits the served context beside its prompt.
- At the context limit (or on a refusal for length) the run either wraps up
  (`Limits.at_limit == "wrap_up"`, the reference) or consolidates as ReSum
  does (`core.consolidation`): once the conversation holds 0.9 x (the
  context - 1,000) tokens, one call of the summary model with ReSum's
  prompt writes a summary, and the conversation restarts as the system
  prompt plus the question and that summary in the lab's restart message,
  then the research goes on. At most `Limits.max_consolidations` times;
  rounds and time still hold. A summary call that fails, or a summary too
  big to leave room, falls back to the wrap-up, never to a silent stop.
- Every run ends with the lab's name for its ending
  (`RunFinished.lab_termination`) and its whole trajectory across
  consolidations (`RunFinished.trajectory`).

How it is built: a run is a chain of steps (a round, a tool turn, a
consolidation, the wrap-up, a model call), each an async generator that
yields the run's events and, last, may hand over to the step that follows
(`_Next`; without one the next round follows, and `RunFinished` ends the run).
What a step decides, plain methods return: the model's turn and the summary
reach `_after_turn`, `_after_answer_turn` and `_after_summary` as values, and
they give the next step; what outlasts a step is in `RunState` (which
checkpoints save). Only `run` iterates steps, each inside ``aclosing()``, so
Stop closes the step under way at once, with the model stream or the tool
calls it holds. Why: an async generator cannot return a value, so steps that
called each other needed holder objects and a closing loop at every call;
handing over keeps each step flat and the "Stop stops everything" rule in
one place.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from .budget import estimate_text_tokens, messages_tokens
from .consolidation import (
    MAX_RESTART_SHARE,
    SUMMARY_MIN_TOKENS,
    defused_summary,
    restarted_conversation,
    state_from_reply,
    summarised_history,
    summary_request,
    tagged_summary,
)
from .events import (
    LAB_ANSWER,
    LAB_CALLS_EXCEEDED,
    LAB_FORCED_ANSWER,
    LAB_FORCED_FORMAT_ERROR,
    LAB_TIME_LIMIT,
    AnswerDelta,
    Consolidated,
    ConsolidationFailed,
    ConsolidationStarted,
    ContextOverflowError,
    ContextWarning,
    Event,
    ModelChunk,
    ModelDelta,
    ModelError,
    ModelFinish,
    ModelPort,
    ModelRetry,
    ModelRetrying,
    ModelUsage,
    RoundStarted,
    RunFinished,
    Termination,
    ThinkingDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolOutcome,
    ToolPort,
    WrappingUp,
)
from .prompts import CALLS_EXCEEDED_MESSAGE, WRAP_UP_MESSAGE
from .protocol import Fragment, Turn, TurnParser
from .run_state import TALLIES, AtLimit, Limits, RunState
from .toolcalls import (
    CallError,
    ToolCall,
    check_call,
    needs_lenient_parse,
    parse_tool_call,
    wrap_response,
    wrap_responses,
)

# Re-exported: the run's budgets and state (`core.run_state`) are the loop's too.
__all__ = ["TALLIES", "AtLimit", "Limits", "RunState"]

NO_CALL_NUDGE = (
    "Error: your last turn contained neither a <tool_call> nor an <answer>. "
    "Call one of the tools, or, if you have enough information, give the final "
    "answer inside <answer></answer> tags."
)
CUT_OFF_NUDGE = (
    "Error: your last turn was cut off at the output token limit before a "
    "<tool_call> or an <answer>. Think more briefly, then call a tool or give the "
    "final answer inside <answer></answer> tags."
)
TOO_MANY_CALLS = (
    "Error: at most {limit} tool calls run per turn; this call was not run. "
    "Repeat it in your next turn if you still need it."
)
DROPPED_RESULT = "This tool result was removed to make room for the final answer."
TIME_LIMIT_TOOL = (
    "Error: the research time limit was reached before this tool finished; "
    "it was stopped and returned nothing."
)
#: Below this served context a research run can hold only a page or two.
MIN_RESEARCH_CONTEXT = 32 * 1024
#: How to serve more context, per server (said to the user).
RAISE_CONTEXT_HINT = (
    "Serve a longer context: Ollama num_ctx (or OLLAMA_CONTEXT_LENGTH=65536), "
    "llama.cpp -c 65536, vLLM --max-model-len, SGLang --context-length."
)
#: Reported prompt tokens below this share of those sent mean the server cut
#: the prompt (the estimate errs ~10% high, never by half); the gap must also
#: exceed `TRUNCATION_MIN_GAP` so short prompts cannot trip it.
TRUNCATION_RATIO = 0.5
TRUNCATION_MIN_GAP = 2048
#: Times the final answer is asked for again after an overflow, each with less.
OVERFLOW_RETRIES = 3
#: Fewest reply tokens a request asks for (a request is never sent with none).
MIN_REPLY_TOKENS = 16
#: Share of the served context kept free beside prompt and reply.
REPLY_MARGIN_SHARE = 0.01

#: Whether a run ended with an answer, and one in closed ``<answer>`` tags.
Answered = Literal["closed", "unmarked", "none"]
#: One step of a run: the run's events, and last, maybe the step that follows.
_Step: TypeAlias = AsyncGenerator["Event | _Next", None]
#: A call of the run, as the model asked for it or as the error it gets.
_Call: TypeAlias = ToolCall | CallError
#: A call's task: its outcome, and how long it took.
_CallTask: TypeAlias = asyncio.Task[tuple[ToolOutcome, float]]
#: A turn's call tasks, each with its call and the call's place in the turn.
_CallTasks: TypeAlias = dict[_CallTask, tuple[int, _Call]]


@dataclass(frozen=True)
class _Next:
    """The step that follows the step that yields this, as its last item.

    None: the next round (its budgets first), as after a step without it.
    """

    step: _Step | None


class _OutOfTimeError(Exception):
    """The wall-clock deadline passed while a model call was streaming."""


@dataclass(frozen=True)
class _TurnOutcome:
    """How a model turn ended: the turn as parsed, and what cut it short."""

    turn: Turn
    finish_reason: str | None = None
    #: The turn had started its ``<answer>`` (answer text was shown).
    answering: bool = False
    #: A refusal (`ContextOverflowError`), a failed call, or the deadline.
    failure: ModelError | _OutOfTimeError | None = None


@dataclass(frozen=True)
class _SummaryReply:
    """What the summary model wrote, what it cost, and what cut it short."""

    content: str
    reasoning: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failure: ModelError | _OutOfTimeError | None = None


def _fragment_events(fragments: list[Fragment]) -> list[Event]:
    """UI events for parsed fragments; blank text between blocks is dropped."""
    events: list[Event] = []
    for fragment in fragments:
        if fragment.kind == "answer":
            events.append(AnswerDelta(fragment.text))
        elif fragment.kind == "think" or fragment.text.strip():
            events.append(ThinkingDelta(fragment.text))
    return events


class ResearchLoop:
    """Drives one run: ``async for event in loop.run(): …``."""

    def __init__(
        self,
        state: RunState,
        model: ModelPort,
        tools: ToolPort,
        limits: Limits,
        clock: Callable[[], float] = time.monotonic,
        *,
        summarizer: ModelPort | None = None,
    ) -> None:
        """Bind the run state to its ports and budgets.

        ``summarizer`` writes the summary when the run consolidates
        (default: the research model itself).
        """
        self.state = state
        self.model = model
        self.tools = tools
        self.limits = limits
        self.clock = clock
        self.summarizer = summarizer or model
        state.served_context_tokens = limits.model_context_tokens
        # What a consolidated conversation keeps: the system messages, and
        # the question (the chat's last user message when the run started).
        self._system = [m for m in state.messages if m.get("role") == "system"]
        if state.opening < 0:  # a new run (a resumed one knows its opening)
            state.find_opening()
        # The event loop's timer saw the deadline pass (tools were stopped).
        self._out_of_time_seen = False

    # -- the loop --
    async def run(self) -> AsyncIterator[Event]:
        """Yield the run's events until it finishes (always with RunFinished).

        Each step runs inside ``aclosing()`` until it hands over (`_Next`);
        a step that does not is followed by the next round.
        """
        small = self._small_context_warning()
        if small is not None:
            yield small
        step = self._before_round()
        while True:
            following: _Step | None = None
            async with aclosing(step) as items:
                async for item in items:
                    if isinstance(item, _Next):
                        following = item.step
                        break
                    yield item
                    if isinstance(item, RunFinished):
                        return
            step = following if following is not None else self._before_round()

    def _before_round(self) -> _Step:
        """A round, or first a consolidation or the wrap-up if a budget ran out."""
        if self.limits.reference_run:
            return self._at_reference_limits()
        exhausted = self._exhausted_budget()
        if self.state.refused_for_length and not exhausted:
            exhausted = "context_limit"
        if exhausted == "context_limit" and self._may_consolidate():
            return self._consolidate()
        if exhausted:
            return self._wrap_up(exhausted)
        return self._round()

    def _at_reference_limits(self) -> _Step:
        """The reference agent's limits, in its order (inference/react_agent.py).

        After the last available round the last message becomes the lab's
        `CALLS_EXCEEDED_MESSAGE`; a context over its limit then gets the
        wrap-up (written over the last message) and one call; otherwise the
        round limit, and the time limit before a round, end the run without
        a call.
        """
        state = self.state
        out_of_rounds = state.round >= self.limits.max_rounds
        if out_of_rounds:
            state.overwrite_last(CALLS_EXCEEDED_MESSAGE)
        if state.round > 0 and state.context_tokens() > self._context_limit():
            return self._wrap_up("context_limit")
        if out_of_rounds:
            return _just(self._finished("round_limit"))
        if self.clock() - state.started > self.limits.max_seconds:
            return _just(self._finished("time_limit"))
        return self._round()

    async def _round(self) -> _Step:
        """One round: the model's turn (`_after_turn` says what follows it)."""
        state = self.state
        state.round += 1
        yield RoundStarted(state.round, self.limits.max_rounds)
        deadline, grace = self._deadline(), self._grace_deadline()
        yield _Next(self._model_turn(deadline, grace, self._after_turn))

    def _after_turn(self, outcome: _TurnOutcome) -> _Step | None:
        """After a round's turn: the end, its calls, or a nudge (None: go on)."""
        if outcome.failure is not None:
            return self._after_failed_turn(outcome)
        state, turn = self.state, outcome.turn
        state.add({"role": "assistant", "content": turn.history_text})
        if turn.answer is not None:
            return _just(
                self._finished(
                    "answer", answer=turn.answer.strip(), closed=turn.answer_closed
                )
            )
        if turn.calls:
            state.stalls = 0
            return self._run_calls(turn.calls)
        if state.stalls >= 1 and turn.stray_text:
            return _just(
                self._finished("answer", answer=turn.stray_text, answer_marked=False)
            )
        state.stalls += 1
        nudge = CUT_OFF_NUDGE if outcome.finish_reason == "length" else NO_CALL_NUDGE
        state.add({"role": "user", "content": wrap_response(nudge)})
        return None

    def _after_failed_turn(self, outcome: _TurnOutcome) -> _Step | None:
        """A turn cut short: recover from a refusal or the deadline, or end."""
        failure = outcome.failure
        if isinstance(failure, ContextOverflowError):
            warning = self._overflowed(failure)
            if not self._may_consolidate():
                return _just(warning, then=self._wrap_up("context_limit"))
            # The refused round did not happen: it is asked again after the
            # consolidation (or the wrap-up answers).
            self.state.round -= 1
            self.state.refused_for_length = True
            return _just(warning)
        if isinstance(failure, ModelError):
            return _just(self._finished("error", error=failure.message))
        return self._out_of_time(outcome)

    # -- deadlines --
    def _deadline(self) -> float | None:
        """The run's wall-clock deadline, in event-loop time.

        None for the reference run: the lab checks its time limit between
        rounds only, and lets a turn or a tool under way finish.
        """
        if self.limits.reference_run:
            return None
        remaining = self.limits.max_seconds - (self.clock() - self.state.started)
        return asyncio.get_running_loop().time() + max(remaining, 0.0)

    def _grace_deadline(self) -> float | None:
        """Deadline for the final answer: the run's, plus the wrap-up grace."""
        deadline = self._deadline()
        if deadline is None:
            return None
        now = asyncio.get_running_loop().time()
        return max(deadline, now) + self.limits.wrap_up_seconds

    def _out_of_time(self, outcome: _TurnOutcome) -> _Step:
        """The deadline passed mid-turn: keep a started answer, or wrap up."""
        if not outcome.answering:
            # The unfinished turn is dropped; the wrap-up asks for the answer.
            return self._wrap_up("time_limit")
        # It was writing its answer and overran even the grace: keep that.
        turn = outcome.turn
        self.state.add({"role": "assistant", "content": turn.history_text})
        return _just(
            self._finished(
                "time_limit",
                answer=(turn.answer or "").strip(),
                answer_marked=turn.answer_closed,
            )
        )

    # -- one model call --
    async def _model_turn(
        self,
        deadline: float | None,
        answer_deadline: float | None,
        then: Callable[[_TurnOutcome], _Step | None],
    ) -> _Step:
        """Stream one model turn, bounded in wall-clock time, then hand over.

        The turn must end by ``deadline``, or by ``answer_deadline`` once it
        has started its answer; past it the stream is cancelled and the turn
        is what was parsed so far. ``then`` gets the outcome (a refusal or a
        failed call in it too) and gives the step that follows.
        """
        parser, answering, finish_reason = TurnParser(), False, None
        measured = False
        failure: ModelError | _OutOfTimeError | None = None
        messages, prompt = list(self.state.messages), self.state.context_tokens()
        stream: AsyncIterator[ModelChunk] | None = None
        try:
            reply_tokens = self._reply_tokens(prompt)
            stream = aiter(self.model.stream(messages, max_tokens=reply_tokens))
            while (
                chunk := await _next_chunk(
                    stream, answer_deadline if answering else deadline
                )
            ) is not None:
                if isinstance(chunk, ModelDelta):
                    fragments = parser.feed_reasoning(chunk.reasoning) + parser.feed(
                        chunk.content
                    )
                    for event in _fragment_events(fragments):
                        answering |= isinstance(event, AnswerDelta)
                        yield event
                elif isinstance(chunk, ModelUsage):
                    measured = True
                    for event in self._on_usage(chunk, len(messages)):
                        yield event
                elif isinstance(chunk, ModelFinish):
                    finish_reason = chunk.reason
                elif isinstance(chunk, ModelRetry):
                    parser, answering = TurnParser(), False
                    yield _retrying(chunk)
        except (ModelError, _OutOfTimeError) as error:
            failure = error
        finally:
            # A cancelled or abandoned turn must not leave the request open.
            await _close(stream)
        if failure is None:
            for event in _fragment_events(parser.flush()):
                yield event
        turn = parser.finish()
        if failure is None:
            self._note_unmeasured(turn, prompt, measured=measured)
        yield _Next(then(_TurnOutcome(turn, finish_reason, answering, failure)))

    def _note_unmeasured(self, turn: Turn, prompt: int, *, measured: bool) -> None:
        """Without usage from the server, the peak context is estimated."""
        if not measured:
            self.state.note_peak(prompt + estimate_text_tokens(turn.history_text))

    def _on_usage(self, usage: ModelUsage, sent: int) -> list[Event]:
        """The turn's usage: the totals, and a warning if the prompt was cut."""
        counted: Event = self.state.count_usage(usage, sent)
        warning = self._truncation(usage, sent)
        return [counted] if warning is None else [counted, warning]

    def _small_context_warning(self) -> ContextWarning | None:
        served = self.limits.model_context_tokens
        if not 0 < served < MIN_RESEARCH_CONTEXT:
            return None
        outcome = (
            "so the research will consolidate every few rounds to go on, a "
            "summary call each time"
            if self.limits.at_limit == "consolidate"
            else "so it will stop early"
        )
        return ContextWarning(
            f"The model server serves a context of only {served:,} tokens; "
            f"research needs {MIN_RESEARCH_CONTEXT:,} or more (64K recommended), "
            f"{outcome}. {RAISE_CONTEXT_HINT}"
        )

    def _truncation(self, usage: ModelUsage, sent: int) -> ContextWarning | None:
        """A warning when the server processed far less than was sent.

        Ollama, for one, silently drops the start of a prompt longer than its
        context (the system prompt first) and reports what it kept. The run
        then holds to what the server processed, so the next check wraps up.
        """
        if usage.prompt_tokens <= 0:
            return None
        expected = messages_tokens(self.state.messages[:sent], image_tokens=0)
        processed = usage.prompt_tokens
        if processed >= TRUNCATION_RATIO * expected:
            return None
        if expected - processed < TRUNCATION_MIN_GAP:
            return None
        self.state.cap_context(processed + usage.completion_tokens)
        return ContextWarning(
            f"The model server processed only {processed:,} of the about "
            f"{expected:,} prompt tokens sent: it cut the conversation to fit a "
            "smaller context than the research needs, so the model no longer "
            f"sees all of it. The run is wrapping up. {RAISE_CONTEXT_HINT}"
        )

    def _overflowed(self, error: ContextOverflowError) -> ContextWarning:
        """Hold the run to the context the server holds; say so."""
        sent = self.state.context_tokens()
        self.state.cap_context(error.limit or int(sent * 0.75))
        return ContextWarning(
            f"{error.message} Making room and asking for the answer. "
            f"{RAISE_CONTEXT_HINT}"
        )

    # -- consolidation --
    def _may_consolidate(self) -> bool:
        limits = self.limits
        return (
            limits.at_limit == "consolidate"
            and self.state.counters.consolidations < limits.max_consolidations
        )

    def _consolidation_point(self) -> float:
        return self.limits.consolidation_point(self.state.context_cap)

    async def _consolidate(self) -> _Step:
        """Replace the conversation by the question and its summary; go on.

        ReSum's request and restart (`core.consolidation`). Without a usable
        summary the conversation is untouched, `ConsolidationFailed` says why
        and the wrap-up follows.
        """
        state = self.state
        number = state.counters.consolidations + 1
        before = state.context_tokens()
        point = self._consolidation_point()
        yield ConsolidationStarted(
            number, self.limits.max_consolidations, before, int(point)
        )
        request, reply_tokens = summary_request(
            state.question,
            summarised_history(state.messages, state.opening),
            state.last_summary,
            self._hard_limit(),
        )
        if reply_tokens < SUMMARY_MIN_TOKENS:
            too_long = "the conversation is too long to summarise in the context"
            yield _Next(self._not_consolidated(number, too_long))
            return
        yield _Next(
            self._summary_call(
                request,
                reply_tokens,
                lambda reply: self._after_summary(reply, number, before, point),
            )
        )

    def _after_summary(
        self, reply: _SummaryReply, number: int, before: int, point: float
    ) -> _Step:
        """Restart from the summary if it is usable and leaves room to go on."""
        if isinstance(reply.failure, _OutOfTimeError):
            self._out_of_time_seen = True
            return self._not_consolidated(number, "the time limit was reached")
        if reply.failure is not None:
            return self._not_consolidated(number, reply.failure.message)
        written = state_from_reply(reply.content) or state_from_reply(
            reply.reasoning, tagged_only=True
        )
        if not written:
            unusable = "the summary model wrote no usable summary"
            return self._not_consolidated(number, unusable)
        restarted = restarted_conversation(self._system, self.state.question, written)
        after = messages_tokens(restarted)
        if after > MAX_RESTART_SHARE * point:
            no_room = f"the summary it wrote ({after:,} tokens) leaves no room to go on"
            return self._not_consolidated(number, no_room)
        self.state.restart(restarted, tagged_summary(defused_summary(written)))
        summary = defused_summary(written).strip()
        tokens = (before, after, reply.prompt_tokens, reply.completion_tokens)
        return _just(Consolidated(number, summary, *tokens), then=self._round())

    async def _not_consolidated(self, number: int, reason: str) -> _Step:
        """Say why the consolidation did not happen; the wrap-up follows."""
        yield ConsolidationFailed(number, reason)
        yield _Next(self._wrap_up(self._exhausted_budget() or "context_limit"))

    async def _summary_call(
        self,
        request: list[dict[str, Any]],
        max_tokens: int,
        then: Callable[[_SummaryReply], _Step],
    ) -> _Step:
        """Stream the summary model's reply within the deadline; hand over.

        ``then`` gets the reply (or what cut it short) and gives the next step.
        """
        content: list[str] = []
        reasoning: list[str] = []
        prompt_tokens = completion_tokens = 0
        failure: ModelError | _OutOfTimeError | None = None
        deadline = self._deadline()
        stream: AsyncIterator[ModelChunk] | None = None
        try:
            stream = aiter(self.summarizer.stream(request, max_tokens=max_tokens))
            while (chunk := await _next_chunk(stream, deadline)) is not None:
                if isinstance(chunk, ModelDelta):
                    content.append(chunk.content)
                    reasoning.append(chunk.reasoning)
                elif isinstance(chunk, ModelRetry):
                    content.clear()
                    reasoning.clear()
                    yield _retrying(chunk)
                elif isinstance(chunk, ModelUsage):
                    prompt_tokens += chunk.prompt_tokens
                    completion_tokens += chunk.completion_tokens
                    yield self.state.count_summary_usage(chunk)
        except (ModelError, _OutOfTimeError) as error:
            failure = error
        finally:
            await _close(stream)
        reply = _SummaryReply(
            "".join(content),
            "".join(reasoning),
            prompt_tokens,
            completion_tokens,
            failure,
        )
        if failure is None and not prompt_tokens:
            written = estimate_text_tokens(reply.content + reply.reasoning)
            self.state.note_peak(messages_tokens(request) + written)
        yield _Next(then(reply))

    # -- tools --
    async def _run_calls(self, raw_calls: tuple[str, ...]) -> _Step:
        """Run the turn's calls together; each result is yielded as it finishes.

        The calls still running at the deadline stop (`TIME_LIMIT_TOOL`), and
        so do all when the run is closed or cancelled. The results go back to
        the model as one message, in the calls' order.
        """
        planned = await self._planned_calls(raw_calls)
        for index, call in enumerate(planned):
            yield ToolCallStarted(index, call.name, dict(call.arguments))
        started, deadline = self.clock(), self._deadline()
        tasks = {
            asyncio.ensure_future(self._timed(call)): (index, call)
            for index, call in enumerate(planned)
        }
        finished: list[ToolCallFinished] = []
        running = set(tasks)
        try:
            while running:
                done, running = await asyncio.wait(
                    running,
                    timeout=_seconds_left(deadline),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:  # the deadline passed
                    break
                for event in self._finished_calls(done, tasks, started):
                    finished.append(event)
                    yield event
        finally:
            # Also when the run is closed or cancelled: nothing is left running.
            await _stop(tasks)
        self._out_of_time_seen |= bool(running)
        for event in self._finished_calls(running, tasks, started):
            finished.append(event)
            yield event
        finished.sort(key=lambda event: event.index)
        self.state.add(
            {"role": "user", "content": wrap_responses(e.result for e in finished)}
        )

    async def _planned_calls(self, raw_calls: tuple[str, ...]) -> list[_Call]:
        """The turn's calls parsed and checked; those past the limit, errors."""
        available = self.tools.available()
        limit = self.limits.max_calls_per_turn
        planned: list[_Call] = []
        for index, raw in enumerate(raw_calls):
            if index >= limit:
                planned.append(CallError(TOO_MANY_CALLS.format(limit=limit)))
                continue
            parsed = await _parse_off_loop(raw)
            planned.append(
                check_call(parsed, available)
                if isinstance(parsed, ToolCall)
                else parsed
            )
        return planned

    def _finished_calls(
        self, ended: Iterable[_CallTask], tasks: _CallTasks, started: float
    ) -> list[ToolCallFinished]:
        """The calls of ``ended`` tasks, in call order, each counted once.

        Each comes with its own call's duration (the calls of one turn run
        together, but a quick search is not as slow as the page read beside
        it); a stopped call answers `TIME_LIMIT_TOOL` after the time it ran.
        """
        events: list[ToolCallFinished] = []
        for task in sorted(ended, key=lambda task: tasks[task][0]):
            index, call = tasks[task]
            outcome, seconds = (
                (ToolOutcome(TIME_LIMIT_TOOL, ok=False), self.clock() - started)
                if task.cancelled()
                else task.result()
            )
            self.state.count_call(call, outcome)
            events.append(
                ToolCallFinished(
                    index,
                    call.name,
                    dict(call.arguments),
                    outcome.text,
                    outcome.ok,
                    seconds,
                    outcome.pages,
                    outcome.papers,
                )
            )
        return events

    async def _timed(self, call: _Call) -> tuple[ToolOutcome, float]:
        started = self.clock()
        outcome = await self._run_one(call)
        return outcome, self.clock() - started

    async def _run_one(self, call: _Call) -> ToolOutcome:
        if isinstance(call, CallError):
            return ToolOutcome(call.message, ok=False)
        try:
            return await self.tools.run(call)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            return ToolOutcome(
                f"Error: the {call.name} tool failed ({type(error).__name__}). "
                "Try again or use another tool.",
                ok=False,
            )

    # -- budgets --
    # The budgets, within what the server showed it holds (`context_cap`).
    def _hard_limit(self) -> int:
        return self.limits.hard_limit(self.state.context_cap)

    def _reply_room(self) -> int:
        return self.limits.reply_room(self.state.context_cap)

    def _context_limit(self) -> int:
        return self.limits.context_limit(self.state.context_cap)

    def _reply_tokens(self, prompt: int) -> int:
        """The longest reply that fits the served context beside ``prompt``.

        A margin of `REPLY_MARGIN_SHARE` of the context (at least 32 tokens)
        covers what the template adds that no count sees.
        """
        hard = self._hard_limit()
        margin = max(32, int(hard * REPLY_MARGIN_SHARE))
        room = hard - prompt - margin
        return max(MIN_REPLY_TOKENS, min(self.limits.max_output_tokens, room))

    def _exhausted_budget(self) -> Termination | None:
        state, limits = self.state, self.limits
        if state.round >= limits.max_rounds:
            return "round_limit"
        if self._out_of_time_seen or self.clock() - state.started >= limits.max_seconds:
            return "time_limit"
        if state.round > 0 and self._context_full():
            return "context_limit"
        return None

    def _context_full(self) -> bool:
        """Whether the conversation must be consolidated, or else answered from.

        While the run may consolidate, that is ReSum's point (checked after
        each round, as the lab does); after that, the usable context.
        """
        tokens = self.state.context_tokens()
        if self._may_consolidate():
            return tokens >= self._consolidation_point()
        return tokens > self._context_limit()

    async def _wrap_up(self, reason: Termination) -> _Step:
        """Ask for the final answer: one last call (and its retries)."""
        # The wrap-up is a model call like any round: the summary counts it.
        self.state.round += 1
        yield WrappingUp(reason)
        self._ask_for_the_answer()
        yield _Next(self._answer_turn(reason, self._grace_deadline(), attempt=0))

    async def _answer_turn(
        self, reason: Termination, grace: float | None, attempt: int
    ) -> _Step:
        """The wrap-up's call, once the answer has room."""
        self._make_room_for_answer()
        yield _Next(
            self._model_turn(
                grace,
                grace,
                lambda outcome: self._after_answer_turn(
                    outcome, reason, grace, attempt
                ),
            )
        )

    def _after_answer_turn(
        self,
        outcome: _TurnOutcome,
        reason: Termination,
        grace: float | None,
        attempt: int,
    ) -> _Step:
        """After the wrap-up's call: the end, or a retry with less after a refusal."""
        failure = outcome.failure
        if isinstance(failure, ContextOverflowError) and attempt < OVERFLOW_RETRIES:
            retry = self._answer_turn(reason, grace, attempt + 1)
            return _just(self._overflowed(failure), then=retry)
        if isinstance(failure, ModelError):
            return _just(self._finished("error", error=failure.message))
        # Even the grace ran out: end with whatever answer was written.
        cut_short = isinstance(failure, _OutOfTimeError)
        ending: Termination = "time_limit" if cut_short else reason
        return _just(self._answer_given(outcome.turn, ending, cut_short=cut_short))

    def _answer_given(
        self, turn: Turn, reason: Termination, *, cut_short: bool
    ) -> RunFinished:
        """The run's end with the wrap-up's answer, its text, or none."""
        self.state.add({"role": "assistant", "content": turn.history_text})
        if turn.answer is not None:
            return self._finished(
                reason, answer=turn.answer.strip(), answer_marked=turn.answer_closed
            )
        if turn.stray_text:
            return self._finished(reason, answer=turn.stray_text, answer_marked=False)
        if cut_short:
            return self._finished("time_limit")
        return self._finished("no_answer", budget=reason)

    def _ask_for_the_answer(self) -> None:
        """Put the wrap-up message in: its own message, or the reference's place.

        The reference agent writes it over the last message (usually the
        last tool result); this project appends it, so that the result the
        model asked for last is still read (`_make_room_for_answer` drops it
        first when it cannot fit). The question is never overwritten.
        """
        if not (
            self.limits.reference_run and self.state.overwrite_last(WRAP_UP_MESSAGE)
        ):
            self.state.add({"role": "user", "content": WRAP_UP_MESSAGE})

    def _make_room_for_answer(self) -> None:
        """Drop tool results until the wrap-up and its reply fit."""
        fits = self._hard_limit() - self._reply_room()
        self.state.drop_tool_results(fits, wrap_response(DROPPED_RESULT))

    def _finished(
        self,
        reason: Termination,
        *,
        answer: str = "",
        error: str = "",
        answer_marked: bool = True,
        closed: bool | None = None,
        budget: Termination | None = None,
    ) -> RunFinished:
        """The run's last event.

        Args:
            reason: Why the run ended.
            answer: The answer, if any.
            error: What stopped the run (``reason`` "error").
            answer_marked: The answer was given as the final answer.
            closed: The answer's ``<answer>`` block was closed (default:
                ``answer_marked``), as the lab's test for an answer needs.
            budget: For "no_answer": the budget that ran out first.
        """
        if not answer:
            answered: Answered = "none"
        elif answer_marked and (answer_marked if closed is None else closed):
            answered = "closed"
        else:
            answered = "unmarked"
        return RunFinished(
            reason=reason,
            answer=answer,
            stats=self.state.stats(self.clock()),
            error=error,
            answer_marked=answer_marked,
            lab_termination=lab_termination(budget or reason, answered),
            trajectory=tuple(dict(message) for message in self.state.trajectory),
        )


def lab_termination(ending: Termination, answered: Answered) -> str:
    """The lab's name for a run's ending (inference/react_agent.py), or "".

    An answer in ``<answer></answer>`` is ``answer``; the wrap-up at the
    context limit is ``generate an answer as token limit reached``, or with
    the ``format error: `` prefix when its reply has no closed answer; the
    round and the time limits without an answer are ``exceed available llm
    calls`` and ``No answer found after 2h30mins``. The lab's agent asks for
    no answer at those two limits, so an answer given there (this project's
    default) has no name in its records (""), nor has an unmarked answer
    before any limit, or an error (the lab writes an error record).

    Args:
        ending: Why the run ended; for "no_answer", the budget that ran out.
        answered: Whether an answer came, and in closed ``<answer>`` tags.
    """
    if ending == "answer":
        return LAB_ANSWER if answered == "closed" else ""
    if ending == "context_limit":
        return LAB_FORCED_ANSWER if answered == "closed" else LAB_FORCED_FORMAT_ERROR
    return _LAB_ENDED_WITHOUT_ANSWER.get(ending, "") if answered == "none" else ""


#: The lab's names for the limits at which it ends a run without a call.
_LAB_ENDED_WITHOUT_ANSWER: dict[str, str] = {
    "round_limit": LAB_CALLS_EXCEEDED,
    "time_limit": LAB_TIME_LIMIT,
}


async def _just(event: Event, then: _Step | None = None) -> _Step:
    """A step of one event, handing over to ``then`` if given."""
    yield event
    if then is not None:
        yield _Next(then)


def _retrying(retry: ModelRetry) -> ModelRetrying:
    """The port retries the call: said to the user."""
    return ModelRetrying(retry.attempt, retry.max_attempts, retry.reason, retry.delay)


async def _next_chunk(
    stream: AsyncIterator[ModelChunk], deadline: float | None
) -> ModelChunk | None:
    """The stream's next chunk (None at its end), or `_OutOfTimeError` past it."""
    try:
        async with asyncio.timeout_at(deadline):
            return await anext(stream)
    except StopAsyncIteration:
        return None
    except TimeoutError:
        raise _OutOfTimeError from None


async def _close(stream: AsyncIterator[ModelChunk] | None) -> None:
    """Close a model stream, and with it its request, if it was opened."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


def _seconds_left(deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (event-loop time), at least 0; None: no limit."""
    if deadline is None:
        return None
    return max(deadline - asyncio.get_running_loop().time(), 0.0)


async def _stop(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel the tasks still running and wait until every one has ended."""
    stopping = list(tasks)
    for task in stopping:
        task.cancel()
    await asyncio.gather(*stopping, return_exceptions=True)


async def _parse_off_loop(raw: str) -> ToolCall | CallError:
    """Parse a call; the slow JSON5 fallback runs in a worker thread."""
    if needs_lenient_parse(raw):
        return await asyncio.to_thread(parse_tool_call, raw)
    return parse_tool_call(raw)
