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
  The reference silently ran only the first.
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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from .budget import MESSAGE_OVERHEAD_TOKENS, estimate_text_tokens, messages_tokens
from .consolidation import (
    MAX_RESTART_SHARE,
    SUMMARY_MIN_TOKENS,
    consolidation_point,
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
    Counters,
    Event,
    ModelDelta,
    ModelError,
    ModelFinish,
    ModelPort,
    ModelRetry,
    ModelRetrying,
    ModelUsage,
    RoundStarted,
    RunFinished,
    RunStats,
    Termination,
    ThinkingDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolOutcome,
    ToolPort,
    UsageUpdated,
    WrappingUp,
)
from .history import content_text
from .prompts import CALLS_EXCEEDED_MESSAGE, WRAP_UP_MESSAGE
from .protocol import Fragment, Turn, TurnParser
from .toolcalls import (
    CallError,
    ToolCall,
    check_call,
    needs_lenient_parse,
    parse_tool_call,
    wrap_response,
    wrap_responses,
)

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
#: The counters a tool's outcome may add to (`ToolOutcome.counts`).
TALLIES = ("searches", "pages_requested")
#: Times the final answer is asked for again after an overflow, each with less.
OVERFLOW_RETRIES = 3
#: Fewest reply tokens a request asks for (a request is never sent with none).
MIN_REPLY_TOKENS = 16
#: Share of the served context kept free beside prompt and reply.
REPLY_MARGIN_SHARE = 0.01

#: What a run does when the conversation fills the usable context.
AtLimit = Literal["consolidate", "wrap_up"]
#: Whether a run ended with an answer, and one in closed ``<answer>`` tags.
Answered = Literal["closed", "unmarked", "none"]
#: The loop's own steps are async generators, and each is iterated inside
#: ``aclosing()``: a run closed early (Stop) closes every step under it at
#: once, down to the model's stream, instead of leaving them to the garbage
#: collector's finalizer.
_Events: TypeAlias = AsyncGenerator[Event, None]


class _OutOfTimeError(Exception):
    """The wall-clock deadline passed while a model turn was streaming."""


@dataclass(frozen=True)
class Limits:
    """The run's budgets."""

    max_rounds: int = 100
    max_context_tokens: int = 110 * 1024
    max_seconds: float = 150 * 60
    max_calls_per_turn: int = 5
    #: Context the server can actually hold (prompt + reply); 0 = unknown.
    model_context_tokens: int = 0
    max_output_tokens: int = 10000
    #: Extra wall-clock time, past `max_seconds`, for the final answer.
    wrap_up_seconds: float = 120.0
    #: At the context limit: the reference wrap-up, or consolidate and go on.
    at_limit: AtLimit = "wrap_up"
    #: Most consolidations of one run (then the wrap-up).
    max_consolidations: int = 30
    #: The reference agent's limits (inference/react_agent.py): the wrap-up
    #: overwrites the last message, the round limit makes no further call,
    #: and the time limit is checked between rounds and ends without a call.
    reference_run: bool = False

    def hard_limit(self, cap: int = 0) -> int:
        """The most the server holds, prompt and reply together (within `cap`)."""
        hard = self.model_context_tokens or (
            self.max_context_tokens + self.max_output_tokens
        )
        return min(hard, cap) if cap else hard

    def reply_room(self, cap: int = 0) -> int:
        """Tokens kept free for the reply (at most half of a small context)."""
        return min(self.max_output_tokens, self.hard_limit(cap) // 2)

    def context_limit(self, cap: int = 0) -> int:
        """The most the conversation may hold before the model must answer."""
        usable = self.hard_limit(cap) - self.reply_room(cap)
        return max(min(self.max_context_tokens, usable), 1)

    def consolidation_point(self, cap: int = 0) -> float:
        """The conversation size at which the run consolidates (ReSum's trigger).

        The lab's ``0.9 * (MAX_CONTEXT * 1024 - 1000)`` with ``MAX_CONTEXT *
        1024`` the context served (within `cap`), and within the budget
        `max_context_tokens`: 28,591.2 tokens on a 32K server.
        """
        return consolidation_point(min(self.hard_limit(cap), self.max_context_tokens))


@dataclass
class RunState:
    """Everything one research run owns. Nothing of it lives on the Pipe."""

    messages: list[dict[str, Any]]
    started: float
    round: int = 0
    stalls: int = 0
    counters: Counters = field(default_factory=Counters)
    # Server-reported size of the conversation up to and including the last
    # assistant turn, and how many messages that covered.
    measured_tokens: int | None = None
    measured_upto: int = 0
    #: Largest prompt + reply of any call, and the context the server serves.
    peak_context_tokens: int = 0
    served_context_tokens: int = 0
    #: (url, title) of every page read, in order.
    pages: list[tuple[str, str]] = field(default_factory=list)
    #: Every message of the run in order, across consolidations
    #: (`RunFinished.trajectory`); the opening conversation when empty.
    trajectory: list[dict[str, Any]] = field(default_factory=list)
    #: The message the conversation opens with (the question; after a
    #: consolidation, the restart), which a summary does not summarise; -1
    #: until the loop finds it when the run starts.
    opening: int = -1
    #: The question: the chat's last user message when the run started.
    question: str = ""
    #: The last summary as the restart carried it ("" before the first).
    last_summary: str = ""
    #: The context the server showed it holds (a refusal, a silent cut).
    context_cap: int = 0
    #: The server refused the last request for its length.
    refused_for_length: bool = False

    def __post_init__(self) -> None:
        """The trajectory starts as the conversation the run opens with."""
        if not self.trajectory:
            self.trajectory = list(self.messages)

    def add(self, message: dict[str, Any]) -> None:
        """Append ``message`` to the conversation and to the trajectory.

        Both hold the same dict: a message the reference wrap-up overwrites
        is overwritten in the trajectory too, as in the lab's ``messages``.
        """
        self.messages.append(message)
        self.trajectory.append(message)

    def context_tokens(self) -> int:
        """Best estimate of the conversation's size in tokens."""
        if self.measured_tokens is None:
            return messages_tokens(self.messages)
        # The reply's completion tokens leave out its framing in the template.
        return (
            self.measured_tokens
            + MESSAGE_OVERHEAD_TOKENS
            + messages_tokens(self.messages[self.measured_upto :])
        )

    def stats(self, now: float) -> RunStats:
        """Figures for the summary."""
        c = self.counters
        return RunStats(
            rounds=self.round,
            searches=c.searches,
            pages_requested=c.pages_requested,
            tool_calls=c.tool_calls,
            prompt_tokens=c.prompt_tokens,
            completion_tokens=c.completion_tokens,
            cost=c.cost,
            seconds=now - self.started,
            consolidations=c.consolidations,
            consolidation_prompt_tokens=c.consolidation_prompt_tokens,
            consolidation_completion_tokens=c.consolidation_completion_tokens,
            peak_context_tokens=self.peak_context_tokens,
            served_context_tokens=self.served_context_tokens,
        )

    def note_peak(self, tokens: int) -> None:
        """Keep the largest context any call used."""
        self.peak_context_tokens = max(self.peak_context_tokens, tokens)


def _fragment_events(fragments: list[Fragment]) -> list[Event]:
    """UI events for parsed fragments; blank text between blocks is dropped."""
    events: list[Event] = []
    for fragment in fragments:
        if fragment.kind == "answer":
            events.append(AnswerDelta(fragment.text))
        elif fragment.kind == "think" or fragment.text.strip():
            events.append(ThinkingDelta(fragment.text))
    return events


@dataclass
class _TurnResult:
    turn: Turn
    finish_reason: str | None = None
    #: The turn had started its ``<answer>`` (answer text was shown).
    answering: bool = False
    #: The server reported usage for the turn.
    measured: bool = False
    #: The server refused the request for its length (no turn came).
    refused: bool = False


@dataclass
class _Step:
    #: The run has finished (`RunFinished` was yielded).
    ended: bool = False


@dataclass
class _Consolidation:
    #: The conversation was replaced by the question and its state.
    done: bool = False


@dataclass
class _SummaryCall:
    """What the summary model wrote, and what it cost."""

    content_parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def content(self) -> str:
        """The reply's content."""
        return "".join(self.content_parts)

    @property
    def reasoning(self) -> str:
        """The reply's reasoning channel."""
        return "".join(self.reasoning_parts)


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
            state.opening = next(
                (
                    index
                    for index in range(len(state.messages) - 1, -1, -1)
                    if state.messages[index].get("role") == "user"
                ),
                -1,
            )
            state.question = (
                content_text(state.messages[state.opening].get("content"))
                if state.opening >= 0
                else ""
            )
        # The event loop's timer saw the deadline pass (tools were stopped).
        self._out_of_time_seen = False

    # -- the loop --
    async def run(self) -> AsyncIterator[Event]:
        """Yield the run's events until it finishes (always with RunFinished)."""
        small = self._small_context_warning()
        if small is not None:
            yield small
        async with aclosing(self._rounds()) as events:
            async for event in events:
                yield event

    async def _rounds(self) -> _Events:
        step = _Step()
        while not step.ended:
            async with aclosing(self._at_budgets(step)) as events:
                async for event in events:
                    yield event
            if step.ended:
                return
            async with aclosing(self._round(step)) as events:
                async for event in events:
                    yield event

    async def _at_budgets(self, step: _Step) -> _Events:
        """Before a round: consolidate, or wrap up, when a budget ran out."""
        if self.limits.reference_run:
            async with aclosing(self._at_reference_limits(step)) as events:
                async for event in events:
                    yield event
            return
        exhausted = self._exhausted_budget()
        if self.state.refused_for_length and not exhausted:
            exhausted = "context_limit"
        if exhausted == "context_limit" and self._may_consolidate():
            consolidation = _Consolidation()
            async with aclosing(self._consolidate(consolidation)) as events:
                async for event in events:
                    yield event
            if consolidation.done:
                self.state.refused_for_length = False
                return
            exhausted = self._exhausted_budget() or "context_limit"
        if exhausted:
            step.ended = True
            async with aclosing(self._wrap_up(exhausted)) as events:
                async for event in events:
                    yield event

    async def _at_reference_limits(self, step: _Step) -> _Events:
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
            self._overwrite_last(CALLS_EXCEEDED_MESSAGE)
        if state.round > 0 and state.context_tokens() > self._context_limit():
            ending: Termination = "context_limit"
        elif out_of_rounds:
            ending = "round_limit"
        elif self.clock() - state.started > self.limits.max_seconds:
            ending = "time_limit"
        else:
            return
        step.ended = True
        if ending != "context_limit":
            yield self._finished(ending)
            return
        async with aclosing(self._wrap_up("context_limit")) as events:
            async for event in events:
                yield event

    async def _round(self, step: _Step) -> _Events:
        """One round: the model's turn, then its tool calls (or the end)."""
        state = self.state
        state.round += 1
        yield RoundStarted(state.round, self.limits.max_rounds)
        result = _TurnResult(TurnParser().finish())
        async with aclosing(self._turn_or_end(result, step)) as events:
            async for event in events:
                yield event
        if step.ended or result.refused:
            return
        turn = result.turn
        state.add({"role": "assistant", "content": turn.history_text})
        if turn.answer is not None:
            step.ended = True
            yield self._finished(
                "answer", answer=turn.answer.strip(), closed=turn.answer_closed
            )
        elif turn.calls:
            state.stalls = 0
            async with aclosing(self._run_calls(turn.calls)) as events:
                async for event in events:
                    yield event
        elif state.stalls >= 1 and turn.stray_text:
            step.ended = True
            yield self._finished("answer", answer=turn.stray_text, answer_marked=False)
        else:
            state.stalls += 1
            cut = result.finish_reason == "length"
            nudge = CUT_OFF_NUDGE if cut else NO_CALL_NUDGE
            state.add({"role": "user", "content": wrap_response(nudge)})

    async def _turn_or_end(self, result: _TurnResult, step: _Step) -> _Events:
        """Stream the model's turn; a failure ends the run or is recovered from."""
        deadline, grace = self._deadline(), self._grace_deadline()
        try:
            async with aclosing(self._model_turn(result, deadline, grace)) as events:
                async for event in events:
                    yield event
            return
        except ContextOverflowError as error:
            yield self._overflowed(error)
            if self._may_consolidate():
                # The refused round did not happen: it is asked again after
                # the consolidation (or the wrap-up answers).
                self.state.round -= 1
                self.state.refused_for_length = True
                result.refused = True
                return
            events = self._wrap_up("context_limit")
        except ModelError as error:
            events = _just(self._finished("error", error=error.message))
        except _OutOfTimeError:
            events = self._out_of_time(result)
        step.ended = True
        async with aclosing(events):
            async for event in events:
                yield event

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

    async def _out_of_time(self, result: _TurnResult) -> _Events:
        """The deadline passed mid-turn: keep a started answer, or wrap up."""
        if not result.answering:
            # The unfinished turn is dropped; the wrap-up asks for the answer.
            async with aclosing(self._wrap_up("time_limit")) as events:
                async for event in events:
                    yield event
            return
        # It was writing its answer and overran even the grace: keep that.
        turn = result.turn
        self.state.add({"role": "assistant", "content": turn.history_text})
        yield self._finished(
            "time_limit",
            answer=(turn.answer or "").strip(),
            answer_marked=turn.answer_closed,
        )

    # -- one model call --
    async def _model_turn(
        self,
        result: _TurnResult,
        deadline: float | None,
        answer_deadline: float | None,
    ) -> _Events:
        """Stream one model turn into ``result``, bounded in wall-clock time.

        The turn must end by ``deadline``, or by ``answer_deadline`` once it
        has started its answer. Past it the stream is cancelled, ``result.turn``
        holds what was parsed so far and `_OutOfTimeError` is raised.
        """
        parser = TurnParser()
        sent = len(self.state.messages)
        prompt = self.state.context_tokens()
        stream = aiter(
            self.model.stream(
                list(self.state.messages), max_tokens=self._reply_tokens(prompt)
            )
        )
        try:
            while True:
                limit = answer_deadline if result.answering else deadline
                try:
                    async with asyncio.timeout_at(limit):
                        chunk = await anext(stream)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    result.turn = parser.finish()
                    raise _OutOfTimeError from None
                if isinstance(chunk, ModelDelta):
                    fragments = parser.feed_reasoning(chunk.reasoning) + parser.feed(
                        chunk.content
                    )
                    for event in _fragment_events(fragments):
                        result.answering |= isinstance(event, AnswerDelta)
                        yield event
                elif isinstance(chunk, ModelUsage):
                    result.measured = True
                    for event in self._on_usage(chunk, sent):
                        yield event
                elif isinstance(chunk, ModelFinish):
                    result.finish_reason = chunk.reason
                elif isinstance(chunk, ModelRetry):
                    parser = TurnParser()
                    result.answering = False
                    yield ModelRetrying(
                        chunk.attempt, chunk.max_attempts, chunk.reason, chunk.delay
                    )
        finally:
            # A cancelled or abandoned turn must not leave the request open.
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()
        for event in _fragment_events(parser.flush()):
            yield event
        result.turn = parser.finish()
        self._note_unmeasured(result, prompt)

    def _note_unmeasured(self, result: _TurnResult, prompt: int) -> None:
        """Without usage from the server, the peak context is estimated."""
        if not result.measured:
            reply = estimate_text_tokens(result.turn.history_text)
            self.state.note_peak(prompt + reply)

    def _on_usage(self, usage: ModelUsage, sent: int) -> list[Event]:
        """The turn's usage: the totals, and a warning if the prompt was cut."""
        counted: Event = self._count_usage(usage, sent)
        warning = self._truncation(usage, sent)
        return [counted] if warning is None else [counted, warning]

    def _count_usage(self, usage: ModelUsage, sent: int) -> UsageUpdated:
        state, counters = self.state, self.state.counters
        counters.prompt_tokens += usage.prompt_tokens
        counters.completion_tokens += usage.completion_tokens
        if usage.cost is not None:
            counters.cost = (counters.cost or 0.0) + usage.cost
        state.measured_tokens = usage.prompt_tokens + usage.completion_tokens
        state.measured_upto = sent + 1  # the prompt plus the reply being streamed
        state.note_peak(state.measured_tokens)
        return UsageUpdated(
            usage.prompt_tokens,
            usage.completion_tokens,
            counters.prompt_tokens,
            counters.completion_tokens,
            counters.cost,
            state.measured_tokens,
        )

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
        self._cap_context(processed + usage.completion_tokens)
        return ContextWarning(
            f"The model server processed only {processed:,} of the about "
            f"{expected:,} prompt tokens sent: it cut the conversation to fit a "
            "smaller context than the research needs, so the model no longer "
            f"sees all of it. The run is wrapping up. {RAISE_CONTEXT_HINT}"
        )

    def _overflowed(self, error: ContextOverflowError) -> ContextWarning:
        """Hold the run to the context the server holds; say so."""
        sent = self.state.context_tokens()
        self._cap_context(error.limit or int(sent * 0.75))
        return ContextWarning(
            f"{error.message} Making room and asking for the answer. "
            f"{RAISE_CONTEXT_HINT}"
        )

    def _cap_context(self, tokens: int) -> None:
        tokens = max(tokens, 1)
        self.state.context_cap = min(self.state.context_cap or tokens, tokens)

    # -- consolidation --
    def _may_consolidate(self) -> bool:
        limits = self.limits
        return (
            limits.at_limit == "consolidate"
            and self.state.counters.consolidations < limits.max_consolidations
        )

    def _consolidation_point(self) -> float:
        return self.limits.consolidation_point(self.state.context_cap)

    async def _consolidate(self, outcome: _Consolidation) -> _Events:
        """Replace the conversation by the question and its summary, if one comes.

        ReSum's request and restart (`core.consolidation`). ``outcome.done``
        says whether it did; otherwise the conversation is untouched and
        `ConsolidationFailed` says why.
        """
        state = self.state
        number = state.counters.consolidations + 1
        before = state.context_tokens()
        point = self._consolidation_point()
        yield ConsolidationStarted(
            number, self.limits.max_consolidations, before, int(point)
        )
        request, reply_tokens = summary_request(
            self.state.question,
            summarised_history(state.messages, self.state.opening),
            self.state.last_summary,
            self._hard_limit(),
        )
        if reply_tokens < SUMMARY_MIN_TOKENS:
            yield ConsolidationFailed(
                number, "the conversation is too long to summarise in the context"
            )
            return
        call = _SummaryCall()
        try:
            summary = self._summary_call(request, reply_tokens, call)
            async with aclosing(summary) as events:
                async for event in events:
                    yield event
        except ModelError as error:
            yield ConsolidationFailed(number, error.message)
            return
        except _OutOfTimeError:
            self._out_of_time_seen = True
            yield ConsolidationFailed(number, "the time limit was reached")
            return
        written = state_from_reply(call.content) or state_from_reply(
            call.reasoning, tagged_only=True
        )
        if not written:
            yield ConsolidationFailed(
                number, "the summary model wrote no usable summary"
            )
            return
        restarted = restarted_conversation(self._system, self.state.question, written)
        after = messages_tokens(restarted)
        if after > MAX_RESTART_SHARE * point:
            yield ConsolidationFailed(
                number,
                f"the summary it wrote ({after:,} tokens) leaves no room to go on",
            )
            return
        self._restart(restarted, tagged_summary(defused_summary(written)))
        outcome.done = True
        yield Consolidated(
            number,
            defused_summary(written).strip(),
            before,
            after,
            call.prompt_tokens,
            call.completion_tokens,
        )

    def _restart(self, restarted: list[dict[str, Any]], summary: str) -> None:
        """Go on from ``restarted``; its last message opens the conversation now.

        The restart message joins the trajectory after the conversation it
        replaces, as in ReSum's ``full_trajectory``; ``summary`` is the next
        summary request's last summary.
        """
        state = self.state
        state.messages[:] = restarted
        state.trajectory.append(restarted[-1])
        state.measured_tokens, state.measured_upto = None, 0
        state.counters.consolidations += 1
        self.state.opening = len(restarted) - 1
        self.state.last_summary = summary

    async def _summary_call(
        self, request: list[dict[str, Any]], max_tokens: int, call: _SummaryCall
    ) -> _Events:
        """Stream the summary model's reply into ``call``, within the deadline."""
        counters = self.state.counters
        deadline = self._deadline()
        stream = aiter(self.summarizer.stream(request, max_tokens=max_tokens))
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        chunk = await anext(stream)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise _OutOfTimeError from None
                if isinstance(chunk, ModelDelta):
                    call.content_parts.append(chunk.content)
                    call.reasoning_parts.append(chunk.reasoning)
                elif isinstance(chunk, ModelRetry):
                    call.content_parts.clear()
                    call.reasoning_parts.clear()
                    yield ModelRetrying(
                        chunk.attempt, chunk.max_attempts, chunk.reason, chunk.delay
                    )
                elif isinstance(chunk, ModelUsage):
                    call.prompt_tokens += chunk.prompt_tokens
                    call.completion_tokens += chunk.completion_tokens
                    counters.consolidation_prompt_tokens += chunk.prompt_tokens
                    counters.consolidation_completion_tokens += chunk.completion_tokens
                    yield self._count_summary_usage(chunk)
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()
        if not call.prompt_tokens:
            written = estimate_text_tokens(call.content + call.reasoning)
            self.state.note_peak(messages_tokens(request) + written)

    def _count_summary_usage(self, usage: ModelUsage) -> UsageUpdated:
        """Add a summary call's usage to the run's totals."""
        state, counters = self.state, self.state.counters
        counters.prompt_tokens += usage.prompt_tokens
        counters.completion_tokens += usage.completion_tokens
        if usage.cost is not None:
            counters.cost = (counters.cost or 0.0) + usage.cost
        state.note_peak(usage.prompt_tokens + usage.completion_tokens)
        return UsageUpdated(
            usage.prompt_tokens,
            usage.completion_tokens,
            counters.prompt_tokens,
            counters.completion_tokens,
            counters.cost,
            state.context_tokens(),
        )

    # -- tools --
    async def _run_calls(self, raw_calls: tuple[str, ...]) -> _Events:
        available = self.tools.available()
        limit = self.limits.max_calls_per_turn
        planned: list[ToolCall | CallError] = []
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
        for index, call in enumerate(planned):
            yield ToolCallStarted(index, call.name, dict(call.arguments))
        timed = await self._run_until_deadline(planned)
        for index, (call, (outcome, seconds)) in enumerate(
            zip(planned, timed, strict=True)
        ):
            self._tally(call, outcome)
            self.state.pages.extend((page.url, page.title) for page in outcome.pages)
            yield ToolCallFinished(
                index,
                call.name,
                dict(call.arguments),
                outcome.text,
                outcome.ok,
                seconds,
                outcome.pages,
            )
        self.state.add(
            {"role": "user", "content": wrap_responses(o.text for o, _ in timed)}
        )

    async def _run_until_deadline(
        self, planned: list[ToolCall | CallError]
    ) -> list[tuple[ToolOutcome, float]]:
        """Run the calls concurrently; any still running at the deadline stop.

        Each outcome comes with its own call's duration (the calls of one turn
        run together, but a quick search is not as slow as the page read beside
        it).
        """
        started = self.clock()
        tasks = [asyncio.ensure_future(self._timed(call)) for call in planned]
        if not tasks:
            return []
        deadline = self._deadline()
        timeout = (
            None
            if deadline is None
            else max(deadline - asyncio.get_running_loop().time(), 0.0)
        )
        try:
            _, running = await asyncio.wait(tasks, timeout=timeout)
            self._out_of_time_seen |= bool(running)
        finally:
            # Also on cancellation of the run itself: nothing is left running.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        stopped = self.clock() - started
        return [
            task.result()
            if not task.cancelled()
            else (ToolOutcome(TIME_LIMIT_TOOL, ok=False), stopped)
            for task in tasks
        ]

    async def _timed(self, call: ToolCall | CallError) -> tuple[ToolOutcome, float]:
        started = self.clock()
        outcome = await self._run_one(call)
        return outcome, self.clock() - started

    async def _run_one(self, call: ToolCall | CallError) -> ToolOutcome:
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

    def _tally(self, call: ToolCall | CallError, outcome: ToolOutcome) -> None:
        """Count the call, and what its tool said it adds to the tallies."""
        counters = self.state.counters
        if isinstance(call, CallError):
            return
        counters.tool_calls += 1
        for name, count in outcome.counts:
            if name in TALLIES:
                setattr(counters, name, getattr(counters, name) + count)

    # -- budgets --
    # The budgets, within what the server showed it holds (`_context_cap`).
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

    async def _wrap_up(self, reason: Termination) -> _Events:
        state = self.state
        # The wrap-up is a model call like any round: the summary counts it.
        state.round += 1
        yield WrappingUp(reason)
        self._ask_for_the_answer()
        result = _TurnResult(TurnParser().finish())
        cut_short = False
        grace = self._grace_deadline()
        for attempt in range(OVERFLOW_RETRIES + 1):
            self._make_room_for_answer()
            result = _TurnResult(TurnParser().finish())
            try:
                async with aclosing(self._model_turn(result, grace, grace)) as events:
                    async for event in events:
                        yield event
            except ContextOverflowError as error:
                if attempt == OVERFLOW_RETRIES:
                    yield self._finished("error", error=error.message)
                    return
                yield self._overflowed(error)
                continue
            except ModelError as error:
                yield self._finished("error", error=error.message)
                return
            except _OutOfTimeError:
                # Even the grace ran out: end with whatever answer was written.
                reason = "time_limit"
                cut_short = True
            break
        turn = result.turn
        state.add({"role": "assistant", "content": turn.history_text})
        if turn.answer is not None:
            yield self._finished(
                reason, answer=turn.answer.strip(), answer_marked=turn.answer_closed
            )
        elif turn.stray_text:
            yield self._finished(reason, answer=turn.stray_text, answer_marked=False)
        elif cut_short:
            yield self._finished("time_limit")
        else:
            yield self._finished("no_answer", budget=reason)

    def _ask_for_the_answer(self) -> None:
        """Put the wrap-up message in: its own message, or the reference's place.

        The reference agent writes it over the last message (usually the
        last tool result); this project appends it, so that the result the
        model asked for last is still read (`_make_room_for_answer` drops it
        first when it cannot fit). The question is never overwritten.
        """
        if not (self.limits.reference_run and self._overwrite_last(WRAP_UP_MESSAGE)):
            self.state.add({"role": "user", "content": WRAP_UP_MESSAGE})

    def _overwrite_last(self, text: str) -> bool:
        """Write ``text`` over the last message, as the reference agent does.

        The message keeps its role; the trajectory, which holds the same
        message, shows the overwrite as the lab's record does. The question
        is never overwritten (the lab's agent never gets there without a
        round after it): False, and nothing changes.
        """
        state = self.state
        if len(state.messages) - 1 <= self.state.opening:
            return False
        state.messages[-1]["content"] = text
        if len(state.messages) <= state.measured_upto:
            state.measured_tokens = None
        return True

    def _make_room_for_answer(self) -> None:
        """Drop tool results until the wrap-up and its reply fit.

        The last result goes first (the reference agent overwrote it with the
        wrap-up message); then the oldest, so the freshest evidence stays.
        """
        state = self.state
        fits = self._hard_limit() - self._reply_room()
        if state.context_tokens() <= fits:
            return
        dropped = wrap_response(DROPPED_RESULT)
        results = [
            index
            for index, message in enumerate(state.messages[:-1])
            if message.get("role") == "user"
            and isinstance(message.get("content"), str)
            and message["content"].startswith("<tool_response>")
            and message["content"] != dropped
        ]
        for index in [*results[-1:], *results[:-1]]:
            # A new message, not an edit: the trajectory keeps what was read.
            state.messages[index] = {**state.messages[index], "content": dropped}
            state.measured_tokens = None
            if state.context_tokens() <= fits:
                return

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


async def _just(event: Event) -> _Events:
    yield event


async def _parse_off_loop(raw: str) -> ToolCall | CallError:
    """Parse a call; the slow JSON5 fallback runs in a worker thread."""
    if needs_lenient_parse(raw):
        return await asyncio.to_thread(parse_tool_call, raw)
    return parse_tool_call(raw)
