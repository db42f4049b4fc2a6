"""A research run's budgets (`Limits`) and its state (`RunState`).

`RunState` is everything one run owns: the conversation as the model will see
it, the trajectory across consolidations, what was spent and read. It is the
run's one state object: the loop (`core.loop.ResearchLoop`) reads and writes
it, and a checkpoint (`core.checkpoint`) saves and loads it, so a field added
here is saved too. The loop decides what happens; the state's methods are the
changes it makes (usage and calls counted, the conversation restarted after a
consolidation, a message overwritten, tool results dropped for room).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .budget import MESSAGE_OVERHEAD_TOKENS, messages_tokens
from .consolidation import consolidation_point
from .events import Counters, ModelUsage, RunStats, ToolOutcome, UsageUpdated
from .history import content_text
from .toolcalls import CallError, ToolCall

#: The counters a tool's outcome may add to (`ToolOutcome.counts`).
TALLIES = ("searches", "pages_requested")
#: What a run does when the conversation fills the usable context.
AtLimit = Literal["consolidate", "wrap_up"]


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
    #: (url, title) of every page read, in the order the calls finished.
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

    def find_opening(self) -> None:
        """Find the opening: the last user message, the question (a new run)."""
        users = (i for i, m in enumerate(self.messages) if m.get("role") == "user")
        self.opening = max(users, default=-1)
        self.question = (
            content_text(self.messages[self.opening].get("content"))
            if self.opening >= 0
            else ""
        )

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

    def count_usage(self, usage: ModelUsage, sent: int) -> UsageUpdated:
        """Add a research turn's usage to the totals; the conversation is measured.

        ``sent``: how many messages the request held (the reply follows them).
        """
        self._add_to_totals(usage)
        self.measured_tokens = usage.prompt_tokens + usage.completion_tokens
        self.measured_upto = sent + 1  # the prompt plus the reply being streamed
        return self._usage_updated(usage, self.measured_tokens)

    def count_summary_usage(self, usage: ModelUsage) -> UsageUpdated:
        """Add a summary call's usage to the totals and to the summaries' own."""
        self.counters.consolidation_prompt_tokens += usage.prompt_tokens
        self.counters.consolidation_completion_tokens += usage.completion_tokens
        self._add_to_totals(usage)
        return self._usage_updated(usage, self.context_tokens())

    def _add_to_totals(self, usage: ModelUsage) -> None:
        counters = self.counters
        counters.prompt_tokens += usage.prompt_tokens
        counters.completion_tokens += usage.completion_tokens
        if usage.cost is not None:
            counters.cost = (counters.cost or 0.0) + usage.cost
        self.note_peak(usage.prompt_tokens + usage.completion_tokens)

    def _usage_updated(self, usage: ModelUsage, context_tokens: int) -> UsageUpdated:
        counters = self.counters
        return UsageUpdated(
            usage.prompt_tokens,
            usage.completion_tokens,
            counters.prompt_tokens,
            counters.completion_tokens,
            counters.cost,
            context_tokens,
        )

    def count_call(self, call: ToolCall | CallError, outcome: ToolOutcome) -> None:
        """Count a call that ran, what its tool says it adds, and the pages read."""
        self.pages.extend((page.url, page.title) for page in outcome.pages)
        if isinstance(call, CallError):
            return
        self.counters.tool_calls += 1
        for name, count in outcome.counts:
            if name in TALLIES:
                setattr(self.counters, name, getattr(self.counters, name) + count)

    def cap_context(self, tokens: int) -> None:
        """Hold the run to ``tokens`` of context (the server showed no more)."""
        tokens = max(tokens, 1)
        self.context_cap = min(self.context_cap or tokens, tokens)

    def overwrite_last(self, text: str) -> bool:
        """Write ``text`` over the last message, as the reference agent does.

        The message keeps its role; the trajectory, which holds the same
        message, shows the overwrite as the lab's record does. The question
        is never overwritten (the lab's agent never gets there without a
        round after it): False, and nothing changes.
        """
        if len(self.messages) - 1 <= self.opening:
            return False
        self.messages[-1]["content"] = text
        if len(self.messages) <= self.measured_upto:
            self.measured_tokens = None
        return True

    def restart(self, restarted: list[dict[str, Any]], summary: str) -> None:
        """Go on from ``restarted``; its last message opens the conversation now.

        The restart message joins the trajectory after the conversation it
        replaces, as in ReSum's ``full_trajectory``; ``summary`` is the next
        summary request's last summary. A refusal for length that led to the
        consolidation is answered by it: the state (a checkpoint saves it
        now) no longer says so.
        """
        self.messages[:] = restarted
        self.trajectory.append(restarted[-1])
        self.measured_tokens, self.measured_upto = None, 0
        self.counters.consolidations += 1
        self.opening = len(restarted) - 1
        self.last_summary = summary
        self.refused_for_length = False

    def drop_tool_results(self, fits: int, placeholder: str) -> None:
        """Put ``placeholder`` in tool results' place until ``fits`` tokens hold it.

        The last result goes first (the reference agent overwrote it with the
        wrap-up message); then the oldest, so the freshest evidence stays.
        """
        if self.context_tokens() <= fits:
            return
        results = [
            index
            for index, message in enumerate(self.messages[:-1])
            if message.get("role") == "user"
            and isinstance(message.get("content"), str)
            and message["content"].startswith("<tool_response>")
            and message["content"] != placeholder
        ]
        for index in [*results[-1:], *results[:-1]]:
            # A new message, not an edit: the trajectory keeps what was read.
            self.messages[index] = {**self.messages[index], "content": placeholder}
            self.measured_tokens = None
            if self.context_tokens() <= fits:
                return
