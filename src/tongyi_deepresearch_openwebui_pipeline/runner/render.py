"""Terminal text for a research run, a batch's progress and its table (pure).

`TerminalRenderer.render(event)` turns each event of a run (and each tool
status line, `ToolStatus`) into the text to show; it keeps only what it must
to lay the lines out (the round, token totals, an unfinished line of
reasoning). The functions below format a batch's progress line and final
table. Token counts, durations and the round are said in the chat's words
(`core.phrasing`); a call is described by its tool's catalog entry. Nothing
here writes anywhere: the CLI does the I/O.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..adapters.openwebui.catalog import describe_call
from ..core.events import (
    TERMINATION_TEXT,
    AnswerDelta,
    Consolidated,
    ConsolidationFailed,
    ConsolidationStarted,
    ContextWarning,
    Event,
    ModelRetrying,
    RolloutEvent,
    RoundStarted,
    RunEvent,
    RunFinished,
    SourcesAdded,
    SynthesisStarted,
    ThinkingDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdated,
    WrappingUp,
)
from ..core.phrasing import duration_text, round_label, tokens_text


@dataclass(frozen=True)
class ToolStatus:
    """A status line a tool reported while it ran (rollout 0: a single run)."""

    text: str
    rollout: int = 0
    kind: str = "tool_status"


def plural(count: int, noun: str) -> str:
    """``1 round``, ``3 rounds``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class _Lane:
    """The layout state of one run (or one rollout of a heavy run)."""

    prefix: str = ""
    round: int = 0
    max_rounds: int = 0
    usage: str = ""
    #: Reasoning text not yet ended by a newline.
    partial: str = ""
    answering: bool = False
    #: The latest calls' lines (a tool's status repeating one is not shown).
    calls: tuple[str, ...] = ()


@dataclass
class TerminalRenderer:
    """Events of one run -> terminal text (reasoning only with `thinking`)."""

    thinking: bool = False
    _lanes: dict[int, _Lane] = field(default_factory=dict)

    def _lane(self, rollout: int = 0, rollouts: int = 0) -> _Lane:
        if rollout not in self._lanes:
            prefix = f"[rollout {rollout}/{rollouts}] " if rollout else ""
            self._lanes[rollout] = _Lane(prefix=prefix)
        return self._lanes[rollout]

    def render(self, event: RunEvent | ToolStatus) -> str:
        """The text `event` shows (often ""); lines end with a newline."""
        if isinstance(event, ToolStatus):
            lane = self._lane(event.rollout, max(event.rollout, 1))
            text = _one_line(event.text)
            if text in lane.calls:  # the call's own line says it already
                return ""
            return self._flush(lane) + f"{lane.prefix}  · {text}\n"
        if isinstance(event, RolloutEvent):
            return self._event(self._lane(event.rollout, event.rollouts), event.event)
        if isinstance(event, SynthesisStarted):
            lane = self._lane()
            lane.round = 0
            return (
                f"── Synthesis of the answers of {event.reports} of "
                f"{event.rollouts} rollouts\n"
            )
        return self._event(self._lane(), event)

    def _flush(self, lane: _Lane) -> str:
        """End an unfinished line of reasoning."""
        if not lane.partial:
            return ""
        text, lane.partial = lane.partial, ""
        return f"{lane.prefix}  │ {text}\n"

    def _think(self, lane: _Lane, text: str) -> str:
        if not self.thinking:
            return ""
        lines = (lane.partial + text).split("\n")
        lane.partial = lines.pop()
        return "".join(f"{lane.prefix}  │ {line}\n" for line in lines if line.strip())

    def _event(self, lane: _Lane, event: Event) -> str:
        if isinstance(event, ThinkingDelta):
            return self._think(lane, event.text)
        out = self._flush(lane)
        if isinstance(event, AnswerDelta):
            if lane.answering or not event.text.strip():
                return out
            lane.answering = True
            return out + f"{lane.prefix}  ✎ writing the answer…\n"
        lane.answering = lane.answering and not isinstance(event, RoundStarted)
        return out + self._line(lane, event)

    def _line(self, lane: _Lane, event: Event) -> str:  # noqa: PLR0911  (a switch)
        p = lane.prefix
        if isinstance(event, RoundStarted):
            lane.round, lane.max_rounds = event.round, event.max_rounds
            usage = f" · {lane.usage}" if lane.usage else ""
            return f"{p}── {round_label(event.round, event.max_rounds)}{usage}\n"
        if isinstance(event, ToolCallStarted):
            call = _one_line(describe_call(event.name, event.arguments))
            lane.calls = (*lane.calls[-4:], call)
            return f"{p}  → {call}\n"
        if isinstance(event, ToolCallFinished):
            mark = "✓" if event.ok else "✗ failed:"
            return f"{p}  {mark} {event.name} ({event.seconds:.1f} s)\n"
        if isinstance(event, SourcesAdded):
            return "".join(
                f"{p}  + [{s.number}] {_one_line(s.title, 80)} <{s.url}>\n"
                for s in event.sources
            )
        if isinstance(event, UsageUpdated):
            lane.usage = tokens_text(
                event.total_prompt_tokens,
                event.total_completion_tokens,
                event.total_cost,
            )
            return ""
        if isinstance(event, ModelRetrying):
            return (
                f"{p}  ⟳ model server problem ({_one_line(event.reason)}); retry "
                f"{event.attempt}/{event.max_attempts} in {event.delay:.0f} s\n"
            )
        if isinstance(event, RunFinished):
            return self._finished(lane, event)
        return self._limit_line(p, event)

    def _limit_line(self, p: str, event: Event) -> str:
        if isinstance(event, WrappingUp):
            return f"{p}  ⚑ {TERMINATION_TEXT[event.reason]}: asking for the answer\n"
        if isinstance(event, ContextWarning):
            return f"{p}  ⚠ {_one_line(event.text, 400)}\n"
        if isinstance(event, ConsolidationStarted):
            return (
                f"{p}  ⇣ context full ({event.context_tokens:,} of "
                f"{event.context_limit:,} tokens): consolidating "
                f"({event.number}/{event.max_consolidations})\n"
            )
        if isinstance(event, Consolidated):
            return (
                f"{p}  ⇣ consolidated: {event.tokens_before:,} → "
                f"{event.tokens_after:,} tokens\n"
            )
        if isinstance(event, ConsolidationFailed):
            return f"{p}  ⚠ consolidation failed ({_one_line(event.reason)})\n"
        return ""

    def _finished(self, lane: _Lane, event: RunFinished) -> str:
        stats = event.stats
        ending = TERMINATION_TEXT.get(event.reason, event.reason)
        text = (
            f"{lane.prefix}── Done: {ending} · {plural(stats.rounds, 'round')} · "
            f"{plural(len(event.sources), 'source')} · "
            f"{tokens_text(stats.prompt_tokens, stats.completion_tokens, stats.cost)}"
            f" · {duration_text(stats.seconds)}\n"
        )
        if event.error:
            text += f"{lane.prefix}  ✗ {_one_line(event.error, 600)}\n"
        return text


# -- a batch ----------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """Where a batch stands."""

    done: int
    total: int
    errors: int
    running: int
    skipped: int
    seconds: float


def progress_line(progress: Progress) -> str:
    """One line: records done of the total, errors, rate."""
    rate = progress.done / progress.seconds * 60 if progress.seconds > 0 else 0.0
    skipped = f" · {progress.skipped} already done" if progress.skipped else ""
    return (
        f"[{progress.done}/{progress.total}] {progress.running} running · "
        f"{progress.errors} errors{skipped} · {rate:.1f} per min · "
        f"{duration_text(progress.seconds)}"
    )


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "—"
    mean, middle = statistics.fmean(values), statistics.median(values)
    return f"mean {mean:,.1f} · median {middle:,.0f} · max {max(values):,.0f}"


def summary_table(records: Sequence[Mapping[str, Any]]) -> str:
    """The final table of a batch: terminations, rounds and tokens."""
    if not records:
        return "No records were written in this run.\n"
    endings = Counter(str(r.get("termination")) for r in records)
    rounds = [float(r.get("rounds") or 0) for r in records]
    tokens = [
        float((r.get("tokens") or {}).get("total") or 0)
        for r in records
        if isinstance(r.get("tokens"), dict)
    ]
    costs = [float(r["cost"]) for r in records if r.get("cost") is not None]
    rows: list[tuple[str, str]] = [
        (f"termination: {name}", str(count)) for name, count in endings.most_common()
    ]
    rows += [
        ("records", str(len(records))),
        ("rounds", _spread(rounds)),
        ("tokens", f"{sum(tokens):,.0f} in all · {_spread(tokens)}"),
    ]
    if costs:
        rows.append(("cost", f"${sum(costs):.4f}"))
    width = max(len(name) for name, _ in rows)
    return "".join(f"  {name.ljust(width)}  {value}\n" for name, value in rows)
