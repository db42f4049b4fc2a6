"""Terminal text for a research run, a batch's progress and its table (pure).

`TerminalRenderer.render(event)` turns each event of a run (and each tool
status line, `ToolStatus`) into the text to show; it keeps only what it must
to lay the lines out (the round, token totals, an unfinished line of
reasoning). The functions below format a batch's progress line and final
table. Token counts, durations and the round are said in the chat's words
(`core.phrasing`); a call is described by its tool's catalog entry. Nothing
here writes anywhere: the CLI does the I/O, and passes every text it shows
through `terminal_safe` (a page, the model or a server may write control
sequences into a title, a query, the reasoning or an error).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..adapters.openwebui.catalog import describe_call
from ..core.events import (
    TERMINATION_TEXT,
    AnswerDelta,
    CitationsChecking,
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
    RunResumed,
    SourcesAdded,
    SynthesisStarted,
    ThinkingDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdated,
    WrappingUp,
)
from ..core.phrasing import (
    checking_citations_text,
    duration_text,
    resumed_text,
    round_label,
    tokens_text,
    unsupported_citations,
)
from .results import well_formed


@dataclass(frozen=True)
class ToolStatus:
    """A status line a tool reported while it ran (rollout 0: a single run)."""

    text: str
    rollout: int = 0
    kind: str = "tool_status"


# -- text for a terminal ---------------------------------------------------------

#: What a terminal acts on instead of showing: C0 controls but tab and newline,
#: DEL and C1 controls (each may start a control sequence), and the bidi
#: embeddings, overrides and isolates (they reorder what is shown around them).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
#: What goes, from an unsafe character on: the run of control sequences and
#: characters that starts there. Each alternative starts with a control
#: character, its body never holds ESC or a C1 control and every quantifier
#: is possessive, so no attempt scans past the next control character and
#: nothing is scanned again by backtracking.
_CONTROLS = re.compile(
    "(?:"
    # CSI: parameter bytes, intermediate bytes, a final byte.
    "(?:\x1b\\[|\x9b)[\x30-\x3f]*+[\x20-\x2f]*+[\x40-\x7e]"
    # A control string (OSC, DCS, SOS, PM, APC) with its payload, to its end:
    # BEL, ST (8-bit, or ESC and a backslash), CAN or SUB.
    "|(?:\x1b[\\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x18\x1a\x1b\x80-\x9f]*+"
    "(?:[\x07\x18\x1a\x9c]|\x1b\\\\)"
    # Any other ESC sequence, and the introducer of a CSI or string that never
    # ends (so what follows it is shown, not hidden).
    "|\x1b[\x20-\x2f]*+[\x30-\x7e]"
    # Any other unsafe character, alone.
    "|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]"
    ")++"
)

Counted = Callable[[int], None]


def _uncounted(_characters: int) -> None:
    """The default work counter of `terminal_safe`: counts nothing."""


def terminal_safe(text: str, count: Counted = _uncounted) -> str:
    """`text` as a terminal may show it: no control character reaches it.

    Escape sequences (CSI, and OSC, DCS, SOS, PM, APC strings with their
    payloads: window titles, clipboard writes, screen clears), in their
    7-bit and 8-bit forms, are removed whole; any other C0 control but tab
    and newline, DEL, C1 control and bidi embedding, override or isolate is
    removed alone. A sequence that never ends loses only its introducer, so
    nothing after it is hidden. Lone surrogates become U+FFFD (a split pair
    its character). Linear: the text is scanned once for surrogates, then
    once for controls; each run of them goes in one match.

    Args:
        text: What the model, a page, a server or a file wrote.
        count: Told how many characters each scan went over (tests prove
            the work linear with it).
    """
    count(len(text))
    text = well_formed(text)
    pieces: list[str] = []
    position = 0
    while (found := _UNSAFE.search(text, position)) is not None:
        start = found.start()
        run = _CONTROLS.match(text, start)
        end = run.end() if run else start + 1  # it always matches
        count(end - position)
        pieces.append(text[position:start])
        position = end
    count(len(text) - position)
    if not position:
        return text
    pieces.append(text[position:])
    return "".join(pieces)


# -- events -----------------------------------------------------------------------


def plural(count: int, noun: str) -> str:
    """``1 round``, ``3 rounds``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def one_line(text: str, limit: int = 200) -> str:
    """`text` on one line, cut to `limit` characters (an ellipsis marks a cut)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class _Lane:
    """The layout state of one run (or one rollout of a heavy run)."""

    prefix: str = ""
    #: The heavy run's rollout this lane shows (0: the run itself).
    rollout: int = 0
    round: int = 0
    max_rounds: int = 0
    usage: str = ""
    #: Pieces of reasoning not yet ended by a newline (joined once, when the
    #: line ends: re-joining on every piece would copy a long line again and
    #: again).
    partial: list[str] = field(default_factory=list)
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
            self._lanes[rollout] = _Lane(prefix=prefix, rollout=rollout)
        return self._lanes[rollout]

    def render(self, event: RunEvent | ToolStatus) -> str:
        """The text `event` shows (often ""); lines end with a newline."""
        if isinstance(event, ToolStatus):
            lane = self._lane(event.rollout, max(event.rollout, 1))
            text = one_line(event.text, 400)
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
        text, lane.partial = "".join(lane.partial), []
        return f"{lane.prefix}  │ {text}\n"

    def _think(self, lane: _Lane, text: str) -> str:
        if not self.thinking:
            return ""
        if "\n" not in text:
            if text:
                lane.partial.append(text)
            return ""
        first, *lines = text.split("\n")
        rest = lines.pop()
        lines.insert(0, "".join([*lane.partial, first]))
        lane.partial = [rest] if rest else []
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
            call = one_line(describe_call(event.name, event.arguments))
            lane.calls = (*lane.calls[-4:], call)
            return f"{p}  → {call}\n"
        if isinstance(event, ToolCallFinished):
            mark = "✓" if event.ok else "✗ failed:"
            return f"{p}  {mark} {event.name} ({event.seconds:.1f} s)\n"
        if isinstance(event, RunResumed):
            kept = "".join(
                f"{p}  = [{s.number}] {one_line(s.title, 80)} <{s.url}>\n"
                for s in event.sources
            )
            return f"{p}↻ {resumed_text(event.rounds, len(event.sources))}\n{kept}"
        if isinstance(event, SourcesAdded):
            return "".join(
                f"{p}  + [{s.number}] {one_line(s.title, 80)} <{s.url}>\n"
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
                f"{p}  ⟳ model server problem ({one_line(event.reason)}); retry "
                f"{event.attempt}/{event.max_attempts} in {event.delay:.0f} s\n"
            )
        if isinstance(event, RunFinished):
            return self._finished(lane, event)
        if isinstance(event, CitationsChecking):
            return f"{p}  ✓ {checking_citations_text(event.statements)}\n"
        return self._limit_line(p, event)

    def _limit_line(self, p: str, event: Event) -> str:
        if isinstance(event, WrappingUp):
            return f"{p}  ⚑ {TERMINATION_TEXT[event.reason]}: asking for the answer\n"
        if isinstance(event, ContextWarning):
            return f"{p}  ⚠ {one_line(event.text, 400)}\n"
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
            return f"{p}  ⚠ consolidation failed ({one_line(event.reason)})\n"
        return ""

    def _finished(self, lane: _Lane, event: RunFinished) -> str:
        stats = event.stats
        ending = TERMINATION_TEXT.get(event.reason, event.reason)
        text = (
            f"{lane.prefix}── Done: {ending} · {plural(stats.rounds, 'round')} · "
            f"{plural(_sources_read(lane, event), 'source')} · "
            f"{tokens_text(stats.prompt_tokens, stats.completion_tokens, stats.cost)}"
            f" · {duration_text(stats.seconds)}\n"
        )
        if event.error:
            text += f"{lane.prefix}  ✗ {one_line(event.error, 600)}\n"
        if event.citations is not None:
            text += f"{lane.prefix}  {event.citations.summary_line()}\n"
            for line in unsupported_citations(event.citations):
                text += f"{lane.prefix}    ⚠ {one_line(line, 400)}\n"
        return text


def _sources_read(lane: _Lane, event: RunFinished) -> int:
    """The pages the lane's run read: a rollout's own, not the whole run's.

    A rollout ends with the run's sources so far (the rollouts share one
    ledger); each source records the rollouts that read it.
    """
    if not lane.rollout:
        return len(event.sources)
    return sum(1 for source in event.sources if lane.rollout in source.readers)


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
    # A failed run's record has no figures: it counts as a record only.
    rounds = [float(r["rounds"]) for r in records if r.get("rounds") is not None]
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
