"""Typed events the research loop yields, and the ports it talks through.

The loop never renders anything: it yields these frozen dataclasses, and the
Open WebUI adapter, the logs and the tests all consume the same stream. Each
event has a ``kind`` string so consumers can switch on it cheaply.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .citation_report import CitationReport
from .sources import PageRead, Paper, Source
from .toolcalls import ToolCall

Termination = Literal[
    "answer", "round_limit", "context_limit", "time_limit", "error", "no_answer"
]

#: Human wording of each termination reason (shown in the research summary).
TERMINATION_TEXT: dict[str, str] = {
    "answer": "the model gave its answer",
    "round_limit": "the round limit was reached",
    "context_limit": "the context budget was reached",
    "time_limit": "the time limit was reached",
    "error": "an error stopped the research",
    "no_answer": "the model gave no final answer",
}

# The lab's names for how a run ended: the ``termination`` of the records
# inference/react_agent.py writes (Alibaba-NLP/DeepResearch), which its
# scorers count. `RunFinished.lab_termination` holds one of them, or "" for
# an ending the lab's agent has no name for (it never gets there).

#: The model gave its answer in ``<answer></answer>``.
LAB_ANSWER = "answer"
#: The context ran out and the wrap-up got an answer in ``<answer></answer>``.
LAB_FORCED_ANSWER = "generate an answer as token limit reached"
#: The context ran out and the wrap-up got no marked answer.
LAB_FORCED_FORMAT_ERROR = "format error: " + LAB_FORCED_ANSWER
#: The last available model call gave no answer.
LAB_CALLS_EXCEEDED = "exceed available llm calls"
#: An answer was given but a tool result followed it (never here: a turn
#: with a call and an answer ends with the answer).
LAB_ANSWER_NOT_FOUND = "answer not found"
#: The time limit passed (the lab's words whatever the limit is).
LAB_TIME_LIMIT = "No answer found after 2h30mins"


# -- what the model port yields --


@dataclass(frozen=True)
class ModelDelta:
    """A streamed piece of the reply: reasoning channel and/or content."""

    reasoning: str = ""
    content: str = ""


@dataclass(frozen=True)
class ModelUsage:
    """Token usage (and cost, when the provider reports it) of one call."""

    prompt_tokens: int
    completion_tokens: int
    cost: float | None = None


@dataclass(frozen=True)
class ModelFinish:
    """The server's finish reason (``stop``, ``length`` …)."""

    reason: str | None


@dataclass(frozen=True)
class ModelRetry:
    """The call failed transiently and is being retried from the start."""

    attempt: int
    max_attempts: int
    reason: str
    delay: float


ModelChunk = ModelDelta | ModelUsage | ModelFinish | ModelRetry


class ModelError(Exception):
    """The model call failed for good; ``message`` is written for the user."""

    def __init__(self, message: str) -> None:
        """Keep the user-facing message."""
        super().__init__(message)
        self.message = message


class ContextOverflowError(ModelError):
    """The server refused the request for its length (prompt + reply too long).

    ``limit`` is the context the server said it holds (0 when it did not say).
    The loop recovers from it: it makes room and asks for the answer.
    """

    def __init__(self, message: str, limit: int = 0) -> None:
        """Keep the user-facing message and the server's context, if given."""
        super().__init__(message)
        self.limit = limit


class ModelPort(Protocol):
    """Streams one chat completion (retries are the port's business)."""

    def stream(
        self, messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> AsyncIterator[ModelChunk]:
        """Stream the reply to ``messages``, at most ``max_tokens`` long.

        ``max_tokens`` None: the port's own setting. The loop lowers it so
        that prompt and reply fit the served context.
        """
        ...


@dataclass(frozen=True)
class ToolOutcome:
    """What a tool returned, as the tool itself said it.

    ``text`` is for the model; ``ok`` says whether the call worked; ``pages``
    are the pages it read (the tool port makes them from the tool's own
    format); ``counts`` adds to the run's tallies (``searches``,
    ``pages_requested``).
    """

    text: str
    ok: bool = True
    pages: tuple[PageRead, ...] = ()
    counts: tuple[tuple[str, int], ...] = ()
    #: Scholarly records a search found (for the exports).
    papers: tuple[Paper, ...] = ()


class ToolPort(Protocol):
    """Runs tool calls; never raises for tool failures (returns ok=False)."""

    def available(self) -> list[str]:
        """Names of the tools offered to the model in this run."""
        ...

    async def run(self, call: ToolCall) -> ToolOutcome:
        """Run one validated call."""
        ...


# -- what the loop yields --


@dataclass(frozen=True)
class RoundStarted:
    """A new model call begins."""

    round: int
    max_rounds: int
    kind: str = "round_started"


@dataclass(frozen=True)
class RunResumed:
    """The run goes on from a checkpoint: `rounds` finished before, `sources` kept.

    ``papers``: the scholarly records its searches had found (for exports).
    """

    rounds: int
    sources: tuple[Source, ...]
    papers: tuple[Paper, ...] = ()
    kind: str = "resumed"


@dataclass(frozen=True)
class ThinkingDelta:
    """Reasoning text (or text outside any block), streamed live."""

    text: str
    kind: str = "thinking"


@dataclass(frozen=True)
class AnswerDelta:
    """Final-answer text, streamed live as the model writes it."""

    text: str
    kind: str = "answer"


@dataclass(frozen=True)
class ModelRetrying:
    """The model call is retried after a transient failure."""

    attempt: int
    max_attempts: int
    reason: str
    delay: float
    kind: str = "model_retrying"


@dataclass(frozen=True)
class ToolCallStarted:
    """A tool call is about to run."""

    index: int
    name: str
    arguments: dict[str, Any]
    kind: str = "tool_started"


@dataclass(frozen=True)
class ToolCallFinished:
    """A tool call finished (or could not run: ``ok`` is False).

    ``pages`` are the pages it read.
    """

    index: int
    name: str
    arguments: dict[str, Any]
    result: str
    ok: bool
    seconds: float
    pages: tuple[PageRead, ...] = ()
    #: Scholarly records the call found (a renderer keeps them for exports).
    papers: tuple[Paper, ...] = ()
    kind: str = "tool_finished"


@dataclass(frozen=True)
class SourcesAdded:
    """Pages read for the first time in this run, numbered (run engine)."""

    sources: tuple[Source, ...]
    kind: str = "sources_added"


@dataclass(frozen=True)
class AliasesAdded:
    """Sources read before, now also cited from an address they were not.

    A page read again from another address that redirected to it (run
    engine); each source comes with every address it is cited from.
    """

    sources: tuple[Source, ...]
    kind: str = "aliases_added"


@dataclass(frozen=True)
class UsageUpdated:
    """Running token and cost totals after a model call."""

    prompt_tokens: int
    completion_tokens: int
    total_prompt_tokens: int
    total_completion_tokens: int
    total_cost: float | None
    context_tokens: int
    kind: str = "usage"


@dataclass(frozen=True)
class WrappingUp:
    """A budget ran out; the model is asked for its final answer."""

    reason: Termination
    kind: str = "wrapping_up"


@dataclass(frozen=True)
class ContextWarning:
    """Something about the run the user should know and can act on.

    The served context (too small, silently cut), or saved progress that
    could not be used or written.
    """

    text: str
    kind: str = "context_warning"


@dataclass(frozen=True)
class ConsolidationStarted:
    """The conversation filled the usable context: its state is being written."""

    number: int
    max_consolidations: int
    context_tokens: int
    context_limit: int
    kind: str = "consolidation_started"


@dataclass(frozen=True)
class Consolidated:
    """The conversation restarted from the question and the `summary` state.

    Tokens before and after are the conversation's; prompt and completion
    tokens are what the summary call spent.
    """

    number: int
    summary: str
    tokens_before: int
    tokens_after: int
    prompt_tokens: int
    completion_tokens: int
    kind: str = "consolidated"


@dataclass(frozen=True)
class ConsolidationFailed:
    """No usable state came back: the run falls back to the wrap-up."""

    number: int
    reason: str
    kind: str = "consolidation_failed"


@dataclass(frozen=True)
class RunStats:
    """Figures for the research summary.

    Token totals include the consolidations' summary calls, which are also
    given on their own. The peak context is the largest prompt plus reply of
    any call; the served context is 0 when the server did not say.
    """

    rounds: int
    searches: int
    pages_requested: int
    tool_calls: int
    prompt_tokens: int
    completion_tokens: int
    cost: float | None
    seconds: float
    consolidations: int = 0
    consolidation_prompt_tokens: int = 0
    consolidation_completion_tokens: int = 0
    peak_context_tokens: int = 0
    served_context_tokens: int = 0


@dataclass(frozen=True)
class RolloutSummary:
    """How one rollout of a heavy run went (for the research summary)."""

    rollout: int
    reason: Termination
    stats: RunStats
    answered: bool
    error: str = ""


@dataclass(frozen=True)
class RunFinished:
    """The run is over: the answer (if any), why it ended, and its figures.

    A heavy run's `stats` are its totals (rollouts and synthesis) and
    `rollouts` holds each rollout's own figures; empty for a single run.
    """

    reason: Termination
    answer: str
    stats: RunStats
    error: str = ""
    answer_marked: bool = True
    rollouts: tuple[RolloutSummary, ...] = ()
    #: The run's sources in citation order (set by the run engine).
    sources: tuple[Source, ...] = ()
    #: Pages read successfully, re-reads included (set by the run engine).
    pages_read: int = 0
    #: How the lab's agent names this ending (one of the ``LAB_*`` strings),
    #: "" when it has no name for it: the ``termination`` of a lab record.
    lab_termination: str = ""
    #: Every message of the run in order, as ReSum keeps its
    #: ``full_trajectory``: the opening conversation, each turn and each tool
    #: result, and each consolidation's restart message after the
    #: conversation it replaced (the summary requests are not in it). A
    #: message the reference run overwrote shows the overwrite, as the lab's
    #: ``messages`` do; a tool result dropped to make room for the final
    #: answer is kept as it was read.
    trajectory: tuple[dict[str, Any], ...] = ()
    #: The answer's cited statements checked against their pages (set by the
    #: run engine after the answer; None: not checked).
    citations: CitationReport | None = None
    kind: str = "finished"


@dataclass(frozen=True)
class CitationsChecking:
    """The answer is out; its `statements` cited statements are being checked."""

    statements: int
    kind: str = "citations_checking"


# -- what a heavy run adds --


@dataclass(frozen=True)
class RolloutEvent:
    """An event of rollout `rollout` (1-based) of `rollouts` in a heavy run."""

    rollout: int
    rollouts: int
    event: Event
    kind: str = "rollout"


@dataclass(frozen=True)
class SynthesisStarted:
    """The rollouts are over; one call integrates the `reports` that answered."""

    reports: int
    rollouts: int
    kind: str = "synthesis_started"


Event = (
    RoundStarted
    | ThinkingDelta
    | AnswerDelta
    | ModelRetrying
    | ToolCallStarted
    | ToolCallFinished
    | UsageUpdated
    | WrappingUp
    | ContextWarning
    | ConsolidationStarted
    | Consolidated
    | ConsolidationFailed
    | SourcesAdded
    | AliasesAdded
    | RunResumed
    | CitationsChecking
    | RunFinished
)
#: What a run of either kind yields: a heavy run adds its rollouts' events and
#: the start of its synthesis to the events of a single run.
RunEvent = Event | RolloutEvent | SynthesisStarted


@dataclass
class Counters:
    """Mutable tallies kept by the loop (part of the run state)."""

    searches: int = 0
    pages_requested: int = 0
    tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None
    consolidations: int = 0
    consolidation_prompt_tokens: int = 0
    consolidation_completion_tokens: int = 0
