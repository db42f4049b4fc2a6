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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from .budget import messages_tokens
from .events import (
    AnswerDelta,
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
from .prompts import WRAP_UP_MESSAGE
from .protocol import Fragment, Turn, TurnParser
from .toolcalls import (
    CallError,
    ToolCall,
    check_call,
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

    def context_tokens(self) -> int:
        """Best estimate of the conversation's size in tokens."""
        if self.measured_tokens is None:
            return messages_tokens(self.messages)
        return self.measured_tokens + messages_tokens(
            self.messages[self.measured_upto :]
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
        )


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


class ResearchLoop:
    """Drives one run: ``async for event in loop.run(): …``."""

    def __init__(
        self,
        state: RunState,
        model: ModelPort,
        tools: ToolPort,
        limits: Limits,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Bind the run state to its ports and budgets."""
        self.state = state
        self.model = model
        self.tools = tools
        self.limits = limits
        self.clock = clock

    # -- the loop --
    async def run(self) -> AsyncIterator[Event]:
        """Yield the run's events until it finishes (always with RunFinished)."""
        state = self.state
        while True:
            exhausted = self._exhausted_budget()
            if exhausted:
                async for event in self._wrap_up(exhausted):
                    yield event
                return
            state.round += 1
            yield RoundStarted(state.round, self.limits.max_rounds)
            result = _TurnResult(TurnParser().finish())
            try:
                async for event in self._model_turn(result):
                    yield event
            except ModelError as error:
                yield self._finished("error", error=error.message)
                return
            turn = result.turn
            state.messages.append({"role": "assistant", "content": turn.history_text})
            if turn.answer is not None:
                yield self._finished("answer", answer=turn.answer.strip())
                return
            if turn.calls:
                state.stalls = 0
                async for event in self._run_calls(turn.calls):
                    yield event
                continue
            state.stalls += 1
            if state.stalls >= 2 and turn.stray_text:
                yield self._finished(
                    "answer", answer=turn.stray_text, answer_marked=False
                )
                return
            nudge = CUT_OFF_NUDGE if result.finish_reason == "length" else NO_CALL_NUDGE
            state.messages.append({"role": "user", "content": wrap_response(nudge)})

    # -- one model call --
    async def _model_turn(self, result: _TurnResult) -> AsyncIterator[Event]:
        state = self.state
        parser = TurnParser()
        sent = len(state.messages)
        async for chunk in self.model.stream(list(state.messages)):
            if isinstance(chunk, ModelDelta):
                fragments = parser.feed_reasoning(chunk.reasoning) + parser.feed(
                    chunk.content
                )
                for event in _fragment_events(fragments):
                    yield event
            elif isinstance(chunk, ModelUsage):
                yield self._count_usage(chunk, sent)
            elif isinstance(chunk, ModelFinish):
                result.finish_reason = chunk.reason
            elif isinstance(chunk, ModelRetry):
                parser = TurnParser()
                yield ModelRetrying(
                    chunk.attempt, chunk.max_attempts, chunk.reason, chunk.delay
                )
        for event in _fragment_events(parser.flush()):
            yield event
        result.turn = parser.finish()

    def _count_usage(self, usage: ModelUsage, sent: int) -> UsageUpdated:
        state, counters = self.state, self.state.counters
        counters.prompt_tokens += usage.prompt_tokens
        counters.completion_tokens += usage.completion_tokens
        if usage.cost is not None:
            counters.cost = (counters.cost or 0.0) + usage.cost
        state.measured_tokens = usage.prompt_tokens + usage.completion_tokens
        state.measured_upto = sent + 1  # the prompt plus the reply being streamed
        return UsageUpdated(
            usage.prompt_tokens,
            usage.completion_tokens,
            counters.prompt_tokens,
            counters.completion_tokens,
            counters.cost,
            state.measured_tokens,
        )

    # -- tools --
    async def _run_calls(self, raw_calls: tuple[str, ...]) -> AsyncIterator[Event]:
        available = self.tools.available()
        limit = self.limits.max_calls_per_turn
        planned: list[ToolCall | CallError] = []
        for index, raw in enumerate(raw_calls):
            if index >= limit:
                planned.append(CallError(TOO_MANY_CALLS.format(limit=limit)))
                continue
            parsed = parse_tool_call(raw)
            planned.append(
                check_call(parsed, available)
                if isinstance(parsed, ToolCall)
                else parsed
            )
        for index, call in enumerate(planned):
            yield ToolCallStarted(index, call.name, dict(call.arguments))
        started = self.clock()
        outcomes = await asyncio.gather(*(self._run_one(call) for call in planned))
        seconds = self.clock() - started
        for index, (call, outcome) in enumerate(zip(planned, outcomes, strict=True)):
            self._tally(call, outcome)
            yield ToolCallFinished(
                index,
                call.name,
                dict(call.arguments),
                outcome.text,
                outcome.ok,
                seconds,
            )
        self.state.messages.append(
            {"role": "user", "content": wrap_responses(o.text for o in outcomes)}
        )

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
        counters = self.state.counters
        if isinstance(call, CallError):
            return
        counters.tool_calls += 1
        if call.name in ("search", "google_scholar"):
            counters.searches += len(call.arguments.get("query", []))
        elif call.name == "visit":
            # Which pages were actually read is known from their sources.
            counters.pages_requested += len(call.arguments.get("url", []))

    # -- budgets --
    def _context_limit(self) -> int:
        limits = self.limits
        limit = limits.max_context_tokens
        if limits.model_context_tokens > 0:
            limit = min(limit, limits.model_context_tokens - limits.max_output_tokens)
        return max(limit, 1)

    def _exhausted_budget(self) -> Termination | None:
        state, limits = self.state, self.limits
        if state.round >= limits.max_rounds:
            return "round_limit"
        if self.clock() - state.started >= limits.max_seconds:
            return "time_limit"
        if state.round > 0 and state.context_tokens() > self._context_limit():
            return "context_limit"
        return None

    async def _wrap_up(self, reason: Termination) -> AsyncIterator[Event]:
        state = self.state
        yield WrappingUp(reason)
        state.messages.append({"role": "user", "content": WRAP_UP_MESSAGE})
        self._make_room_for_answer()
        result = _TurnResult(TurnParser().finish())
        try:
            async for event in self._model_turn(result):
                yield event
        except ModelError as error:
            yield self._finished("error", error=error.message)
            return
        turn = result.turn
        state.messages.append({"role": "assistant", "content": turn.history_text})
        if turn.answer is not None:
            yield self._finished(reason, answer=turn.answer.strip())
        elif turn.stray_text:
            yield self._finished(reason, answer=turn.stray_text, answer_marked=False)
        else:
            yield self._finished("no_answer")

    def _make_room_for_answer(self) -> None:
        """Drop the last tool result when even the wrap-up would not fit."""
        state, limits = self.state, self.limits
        hard_limit = limits.model_context_tokens or (
            limits.max_context_tokens + limits.max_output_tokens
        )
        if state.context_tokens() + limits.max_output_tokens <= hard_limit:
            return
        for message in reversed(state.messages[:-1]):
            content = message.get("content")
            if message.get("role") == "user" and isinstance(content, str):
                if content.startswith("<tool_response>"):
                    message["content"] = wrap_response(DROPPED_RESULT)
                    state.measured_tokens = None
                return

    def _finished(
        self,
        reason: Termination,
        *,
        answer: str = "",
        error: str = "",
        answer_marked: bool = True,
    ) -> RunFinished:
        return RunFinished(
            reason=reason,
            answer=answer,
            stats=self.state.stats(self.clock()),
            error=error,
            answer_marked=answer_marked,
        )
