"""Rendering loop events in Open WebUI (0.6 – 0.12).

What the user sees is streamed as text the pipe yields, because that is what
every version stores and renders (events that carry message text are
overwritten by the yielded text on 0.12):

- thinking: ``<think>…</think>``, which Open WebUI turns into a collapsible
  reasoning block ("Thought for N seconds"), one per round (where the host
  must get it apart, `ReasoningSplitter` takes it out for the pipe);
- each tool call: a ``<details type="tool_calls" done="true" …>`` card with
  its arguments and result (a blank line before it, which 0.6 needs);
- the answer: plain text, streamed token by token with citation numbers;
- then the sources read and a collapsible research summary.

Status lines (round n of N, what is being searched or read, tokens and cost),
sources and notifications are event payloads for the emitter. Rendering is
pure: `render(event)` returns a `Rendered` (the text to yield and the payloads
to emit) and the pipe, the only part that does I/O, yields and emits them.
The words it shares with the terminal runner (token counts, durations, the
round, the notes under an answer, the list of sources) are `core.phrasing`'s;
a call's status line is its tool's (`catalog.describe_call`).

Sources: the renderer knows them from the events alone (`SourcesAdded`,
`AliasesAdded`, `RunResumed`, `RunFinished`), in its own `SourceBook`, which
numbers its citations; each new one becomes Open WebUI's source event here
(`source_event`), the only place that shape is written.

Nothing the model or a page writes can forge this markup: reasoning text gets
a zero-width space after every ``<`` and ``◁`` (so ``</think>`` or
``<details type="tool_calls">`` inside it are plain text), tool results sit
HTML-escaped in an attribute, the answer's tags are defused by the citation
rewriter, and page titles and URLs in "Sources read" are escaped.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from ...core.citation_report import CitationReport
from ...core.events import (
    TERMINATION_TEXT,
    AliasesAdded,
    AnswerDelta,
    CitationsChecking,
    Consolidated,
    ConsolidationFailed,
    ConsolidationStarted,
    ContextWarning,
    Event,
    ModelRetrying,
    RolloutEvent,
    RolloutSummary,
    RoundStarted,
    RunEvent,
    RunFinished,
    RunResumed,
    RunStats,
    SourcesAdded,
    SynthesisStarted,
    ThinkingDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdated,
    WrappingUp,
)
from ...core.history import RESTART_NOTE
from ...core.phrasing import (
    UNMARKED_ANSWER_NOTE,
    checking_citations_text,
    defuse_tags,
    duration_text,
    markdown_text,
    no_answer_note,
    resumed_text,
    round_label,
    sources_list,
    stopped_note,
    tokens_text,
    unsupported_citations,
)
from ...core.sources import (
    CitationRewriter,
    Paper,
    Source,
    SourceBook,
    rewrite_answer,
)
from ..export.bundle import export_files
from ..export.report import fenced
from .catalog import describe_call
from .emitter import notification_payload, status_payload

#: Longest tool result shown in a card (the model always gets all of it).
CARD_RESULT_CHARS = 6000


@dataclass(frozen=True)
class Rendered:
    """What one event shows: text for the chat, then event payloads to emit."""

    text: str = ""
    events: tuple[dict[str, Any], ...] = ()


#: How the chat text frames a round's reasoning: ``<think>\n…\n</think>``, then
#: a blank line. The renderer writes each mark whole, in one piece.
THINK_START = "<think>\n"
THINK_END = "\n</think>"


@dataclass(frozen=True)
class TextPart:
    """A stretch of the chat text: the model's reasoning, or message text."""

    text: str
    reasoning: bool = False


class ReasoningSplitter:
    """Takes each round's reasoning out of the streamed chat text.

    For the hosts that must get it apart (`compat.reasoning_goes_apart`). The
    renderer writes every `THINK_START` and `THINK_END` whole in one yielded
    piece, and nothing the model or a page writes can forge one (see the
    module's docstring), so each piece is split at the marks alone; the marks
    themselves go, and the blank line after `THINK_END` stays message text
    (it is what ends the reasoning block there).
    """

    def __init__(self) -> None:
        """Start outside any reasoning."""
        self._in_reasoning = False

    def split(self, text: str) -> list[TextPart]:
        """The parts of one yielded piece, in order (no empty ones)."""
        parts: list[TextPart] = []
        while text:
            mark = THINK_END if self._in_reasoning else THINK_START
            before, found, text = text.partition(mark)
            if before:
                parts.append(TextPart(before, self._in_reasoning))
            if found:
                self._in_reasoning = not self._in_reasoning
        return parts


def stream_pieces(text: str) -> tuple[str, ...]:
    """``text`` as the pieces to stream: the end of a reasoning block alone.

    Open WebUI 0.6 to 0.11 strip both ends of the text that arrives in the
    same piece as the end of a reasoning block (0.12 only its start), so an
    answer whose first piece ends in a space, as one before a link the
    citations hold back does ("on " + "[page 1](…)"), was saved as
    "on[page 1](…)". Streamed after the end, the text is kept as it is.
    """
    head, end, rest = text.partition(THINK_END + "\n\n")
    return (head + end, rest) if end and rest else (text,)


@dataclass(frozen=True)
class Display:
    """What to show (from the valves and the user's own valves)."""

    thinking: bool = True
    tool_cards: bool = True
    summary: bool = True
    usage: bool = True
    #: A heavy run's rollout blocks (live-only, like the cards).
    rollouts: bool = True


#: Breaks every tag-like sequence in reasoning text while displaying the same.
def source_event(source: Source) -> dict[str, Any]:
    """The ``source`` event that numbers citations right on 0.6 – 0.12.

    One event per distinct URL, one document, and ``metadata[0].source`` set to
    the URL with a unique ``name``: 0.12 keys citations by ``metadata.source``
    and 0.6 by label, so ``[n]`` is the n-th emitted source on both.
    """
    return {
        "type": "source",
        "data": {
            "source": {"name": source.title, "url": source.url},
            "document": [source.evidence or source.summary or source.title],
            "metadata": [
                {"source": source.url, "name": source.title, "url": source.url}
            ],
        },
    }


def _attribute(value: Any) -> str:
    return html.escape(json.dumps(value, ensure_ascii=False), quote=True)


def tool_card(
    card_id: str, name: str, arguments: dict[str, Any], result: str, ok: bool
) -> str:
    """A finished tool-call card, as Open WebUI's own middleware writes it."""
    shown = result
    if len(shown) > CARD_RESULT_CHARS:
        shown = shown[:CARD_RESULT_CHARS] + f"\n… ({len(result):,} characters in all)"
    payload: Any = shown if ok else {"error": shown}
    return (
        f'\n\n<details type="tool_calls" done="true" id="{html.escape(card_id)}" '
        f'name="{html.escape(name)}" arguments="{_attribute(arguments)}" '
        f'result="{_attribute(payload)}" files="" embeds="">\n'
        "<summary>Tool Executed</summary>\n</details>\n\n"
    )


def consolidation_card(event: Consolidated) -> str:
    """A collapsible card with the state a consolidation wrote.

    The state is the model's text: every line is shown literally (Markdown
    and HTML escaped, tags broken as in reasoning), so it can neither forge
    markup, nor load an image, nor end the card when a follow-up turn strips
    the message's ``<details>`` blocks.
    """
    lines = "\n".join(f"> {markdown_text(line)}" for line in event.summary.splitlines())
    title = (
        f"Consolidation {event.number} · context {event.tokens_before:,} → "
        f"{event.tokens_after:,} tokens"
    )
    return (
        f"\n\n<details>\n<summary>{html.escape(title)}</summary>\n\n"
        f"{lines}\n\n</details>\n\n"
    )


def _context_lines(stats: RunStats) -> list[str]:
    """The summary's lines on consolidations and the peak context."""
    lines: list[str] = []
    if stats.consolidations:
        calls = tokens_text(
            stats.consolidation_prompt_tokens, stats.consolidation_completion_tokens
        )
        lines.append(
            f"- Consolidations: {stats.consolidations} (summary calls: {calls})"
        )
    if stats.peak_context_tokens and stats.served_context_tokens:
        share = stats.peak_context_tokens / stats.served_context_tokens
        lines.append(
            f"- Peak context: {stats.peak_context_tokens:,} of "
            f"{stats.served_context_tokens:,} tokens served ({share:.0%})"
        )
    elif stats.peak_context_tokens:
        lines.append(f"- Peak context: {stats.peak_context_tokens:,} tokens")
    return lines


def _rollout_line(rollout: RolloutSummary) -> str:
    stats = rollout.stats
    ending = rollout.error or TERMINATION_TEXT.get(rollout.reason, rollout.reason)
    return (
        f"  - Rollout {rollout.rollout}: {stats.rounds} rounds, "
        f"{stats.searches} searches, "
        f"{tokens_text(stats.prompt_tokens, stats.completion_tokens, stats.cost)}; "
        f"{ending}"
    )


def summary_block(
    stats: RunStats,
    reason: str,
    *,
    pages_read: int,
    cited: int,
    rollouts: tuple[RolloutSummary, ...] = (),
    citations: str = "",
) -> str:
    """The collapsible research summary shown under the answer.

    `pages_read` counts re-reads, `cited` the distinct sources. A heavy
    run's figures are its totals, followed by each rollout's own.
    """
    lines = []
    if rollouts:
        answered = sum(rollout.answered for rollout in rollouts)
        lines.append(
            f"- Rollouts: {len(rollouts)} ({answered} answered, synthesised into "
            "this answer)"
        )
        lines.extend(_rollout_line(rollout) for rollout in rollouts)
    lines += [
        f"- Rounds: {stats.rounds}",
        f"- Searches: {stats.searches}",
        f"- Pages read: {pages_read} of {stats.pages_requested} requested "
        f"({cited} cited as sources)",
        f"- Tokens: {stats.prompt_tokens:,} in / {stats.completion_tokens:,} out",
        *_context_lines(stats),
    ]
    if stats.cost is not None:
        lines.append(f"- Cost: ${stats.cost:.4f}")
    if citations:
        lines.append(f"- {citations}")
    lines.append(f"- Time: {duration_text(stats.seconds)}")
    lines.append(f"- Ended because {TERMINATION_TEXT.get(reason, reason)}.")
    body = "\n".join(lines)
    return (
        f"\n\n<details>\n<summary>Research summary</summary>\n\n{body}\n\n</details>\n"
    )


@dataclass(frozen=True)
class Exports:
    """What a chat's answer offers to take elsewhere (`adapters.export`)."""

    #: Format names (`bundle.FORMAT_NAMES`); empty: no export block.
    formats: tuple[str, ...]
    #: The question, for the Markdown report.
    question: str
    #: The day the pages were read.
    accessed: dt.date


def export_block(
    exports: Exports,
    answer: str,
    sources: list[Source],
    papers: Iterable[Paper] = (),
) -> str:
    """The collapsed block under the answer with each chosen format to copy."""
    files = export_files(
        exports.formats,
        question=exports.question,
        answer=answer,
        sources=sources,
        accessed=exports.accessed,
        papers=papers,
    )
    if not files:
        return ""
    labels = " · ".join(file.format.label for file in files)
    parts = "\n\n".join(
        f"**{file.format.label}** (`{file.format.suffix}`)\n\n"
        + fenced(defuse_tags(file.text).rstrip(), file.format.language)
        for file in files
    )
    return (
        f"\n\n<details>\n<summary>Export: {labels}</summary>\n\n{parts}\n\n</details>\n"
    )


def _citations_note(report: CitationReport | None) -> str:
    """The note under the answer naming each statement its pages do not support."""
    lines = unsupported_citations(report) if report is not None else []
    if report is None or not lines:
        return ""
    statements = "statement" if report.checked == 1 else "statements"
    items = "\n".join(f"> - {line}" for line in lines)
    return (
        f"\n\n> ⚠️ **Citation check:** {len(lines)} of {report.checked} cited "
        f"{statements} not supported by the pages cited:\n{items}\n"
    )


class ChatRenderer:
    """Turns events into yielded text and event payloads for one chat."""

    def __init__(
        self,
        display: Display,
        *,
        book: SourceBook | None = None,
        status_prefix: str = "",
        nested: bool = False,
        exports: Exports | None = None,
        papers: dict[str, Paper] | None = None,
    ) -> None:
        """Render one run, citing the sources its events tell of.

        ``book`` keeps those sources (a new one by default); renderers of one
        run's parts share it. A ``nested`` renderer shows one rollout of a
        heavy run: its end is the rollout's answer alone (no sources list,
        summary or final status), and its tool cards' ids start with
        ``status_prefix``'s rollout.
        """
        self.book = SourceBook() if book is None else book
        self.exports = exports
        #: The scholarly records found, by URL (shared like the book).
        self.papers: dict[str, Paper] = {} if papers is None else papers
        self.display = display
        self.status_prefix = status_prefix
        self._payloads: list[dict[str, Any]] = []
        self.nested = nested
        self._in_think = False
        self._answer_started = False
        self._rewriter = CitationRewriter(self.book)
        self._round = 0
        self._max_rounds = 0
        self._usage = ""
        self._warnings: list[str] = []

    @property
    def answer_streamed(self) -> bool:
        """Whether any answer text has been shown."""
        return self._answer_started

    def _close_think(self) -> str:
        if self._in_think:
            self._in_think = False
            return THINK_END + "\n\n"
        return ""

    def _think(self, text: str) -> str:
        if not self.display.thinking:
            return ""
        text = defuse_tags(text)
        if self._in_think:
            return text
        if not text.strip():
            # Whitespace between blocks must not open an empty reasoning block.
            return ""
        self._in_think = True
        return THINK_START + text.lstrip("\n")

    def _answer(self, text: str) -> str:
        prefix = self._close_think()
        if not self._answer_started:
            text = text.lstrip()
            if not text:
                return prefix
            self._answer_started = True
        return prefix + self._rewriter.feed(text)

    def _restart(self) -> str:
        """The model's reply starts over (a retry): close what the broken one showed.

        Text already yielded cannot be taken back, so a cut-off answer is ended
        with a note and the retried reply starts on its own lines instead of
        running on from the middle of a sentence.
        """
        out = self._close_think()
        if self._answer_started:
            out += self._rewriter.flush() + f"\n\n{RESTART_NOTE}\n\n"
            self._answer_started = False
            self._rewriter = CitationRewriter(self.book)
        return out

    def _prefix(self) -> str:
        return round_label(self._round, self._max_rounds)

    def render(self, event: RunEvent) -> Rendered:
        """What one event shows: text to yield, payloads to emit (in that order)."""
        self._payloads = []
        if isinstance(event, RolloutEvent | SynthesisStarted):
            return Rendered()  # a heavy run's: HeavyRenderer shows them
        if isinstance(event, SourcesAdded):
            self.book.add(event.sources)
            # In the order they are numbered: Open WebUI numbers them so too.
            return Rendered(events=tuple(source_event(s) for s in event.sources))
        if isinstance(event, AliasesAdded):
            self.book.add(event.sources)  # already shown: cited from more URLs
            return Rendered()
        if isinstance(event, RunResumed):
            self.book.add(event.sources)
            for paper in event.papers:  # found before: still exported as papers
                self.papers.setdefault(paper.url, paper)
            # The new message gets the sources read before the interruption,
            # numbered as they were cited.
            note = resumed_text(event.rounds, len(event.sources))
            return Rendered(
                f"*{note}*\n\n",
                (
                    status_payload(self.status_prefix + note),
                    *(source_event(s) for s in event.sources),
                ),
            )
        if isinstance(event, RunFinished):
            text = self._finish(event)
        elif isinstance(event, CitationsChecking):
            # The answer is whole before the check: nothing of it waits.
            text = self._close_think() + self._rewriter.flush()
            self._status(checking_citations_text(event.statements))
        else:
            status = self._status_for(event)
            if status:
                self._status(self.status_prefix + status)
            text = self._text_for(event)
        return Rendered(text, tuple(self._payloads))

    def _status(self, description: str, done: bool = False) -> None:
        self._payloads.append(status_payload(description, done))

    def _text_for(self, event: Event) -> str:
        if isinstance(event, ModelRetrying):
            return self._restart()
        if isinstance(event, ThinkingDelta):
            return self._think(event.text)
        if isinstance(event, AnswerDelta):
            return self._answer(event.text)
        if isinstance(event, Consolidated):
            text = self._close_think()
            if self.display.tool_cards:
                text += consolidation_card(event)
            return text
        if isinstance(event, ToolCallFinished):
            for paper in event.papers:
                self.papers.setdefault(paper.url, paper)
            text = self._close_think()
            if self.display.tool_cards:
                card_id = f"call_{self.card_scope}{self._round}_{event.index}"
                text += tool_card(
                    card_id, event.name, event.arguments, event.result, event.ok
                )
            return text
        if isinstance(event, UsageUpdated) and self.display.usage:
            self._usage = tokens_text(
                event.total_prompt_tokens,
                event.total_completion_tokens,
                event.total_cost,
            )
        return ""

    def _status_for(self, event: Event) -> str:
        if isinstance(event, RoundStarted):
            self._round, self._max_rounds = event.round, event.max_rounds
            suffix = f" · {self._usage}" if self._usage else ""
            return f"{self._prefix()} · thinking…{suffix}"
        if isinstance(event, ToolCallStarted):
            return f"{self._prefix()} · {describe_call(event.name, event.arguments)}"
        if isinstance(event, ModelRetrying):
            return (
                f"{self._prefix()} · model server problem ({event.reason}); retrying "
                f"{event.attempt}/{event.max_attempts} in {event.delay:.0f} s"
            )
        if isinstance(event, ContextWarning):
            self._warnings.append(event.text)
            return f"⚠️ {event.text}"
        if isinstance(
            event,
            WrappingUp | ConsolidationStarted | Consolidated | ConsolidationFailed,
        ):
            return self._at_limit_status(event)
        return ""

    def _at_limit_status(
        self,
        event: WrappingUp | ConsolidationStarted | Consolidated | ConsolidationFailed,
    ) -> str:
        """A budget ran out: the wrap-up, or a consolidation's progress."""
        if isinstance(event, WrappingUp):
            return (
                f"{self._prefix()} · {TERMINATION_TEXT[event.reason]}: asking for the "
                "final answer"
            )
        if isinstance(event, ConsolidationStarted):
            return (
                f"{self._prefix()} · context full ({event.context_tokens:,} of "
                f"{event.context_limit:,} tokens): consolidating the research "
                f"({event.number} of at most {event.max_consolidations})…"
            )
        if isinstance(event, Consolidated):
            return (
                f"{self._prefix()} · consolidated: context {event.tokens_before:,} "
                f"→ {event.tokens_after:,} tokens; the research goes on"
            )
        warning = (
            f"Consolidation {event.number} failed ({event.reason}); asking for "
            "the final answer."
        )
        self._warnings.append(warning)
        return f"⚠️ {warning}"

    @property
    def card_scope(self) -> str:
        """What makes this renderer's card ids unique in the message."""
        return "".join(c for c in self.status_prefix if c.isalnum()) + "_" * bool(
            self.status_prefix
        )

    def _finish(self, event: RunFinished) -> str:
        self.book.add(event.sources)
        out = self._close_think()
        if event.answer and not self._answer_started:
            out += self._answer(event.answer)
        out += self._rewriter.flush()
        if self.nested:
            return out + self._nested_ending(event)
        for warning in dict.fromkeys(self._warnings):  # each said once
            out += f"\n\n> ⚠️ {markdown_text(warning)}\n"
        if event.reason == "error":
            out += f"\n\n> ⚠️ {stopped_note(event.error)}\n"
            self._payloads.append(notification_payload("error", event.error))
        elif not event.answer:
            out += f"\n\n> ⚠️ {no_answer_note(event.reason)}\n"
        elif not event.answer_marked:
            out += f"\n\n{UNMARKED_ANSWER_NOTE}\n"
        out += _citations_note(event.citations)
        out += sources_list(self.book.sources)
        if self.display.summary:
            out += summary_block(
                event.stats,
                event.reason,
                pages_read=event.pages_read,
                cited=len(self.book),
                rollouts=event.rollouts,
                citations=event.citations.summary_line() if event.citations else "",
            )
        if self.exports is not None and self.exports.formats and self.book.sources:
            shown = rewrite_answer(event.answer, self.book) if event.answer else ""
            out += export_block(
                self.exports, shown, self.book.sources, self.papers.values()
            )
        usage = tokens_text(
            event.stats.prompt_tokens, event.stats.completion_tokens, event.stats.cost
        )
        self._status(
            f"Done: {TERMINATION_TEXT[event.reason]} · {event.stats.rounds} rounds · "
            f"{len(self.book)} sources · {usage}",
            done=True,
        )
        return out

    def _nested_ending(self, event: RunFinished) -> str:
        """How a rollout ended, when that is not simply its answer."""
        if event.reason == "error":
            return f"\n\n> ⚠️ **This rollout stopped:** {markdown_text(event.error)}\n"
        if not event.answer:
            return (
                "\n\n> ⚠️ This rollout ended without an answer "
                f"({TERMINATION_TEXT[event.reason]}).\n"
            )
        return ""


_THINK_BLOCK = re.compile(r"<think>\n(.*?)\n</think>\n\n", re.DOTALL)


def _reasoning_block(match: re.Match[str]) -> str:
    """A streamed ``<think>`` block as the finished reasoning card Open WebUI shows.

    Inside a rollout's block the text is shown after the fact, so it is given
    in the form Open WebUI stores a finished one (lines quoted, HTML-escaped;
    the text was defused as it streamed, so it cannot end the card).
    """
    lines = "\n".join(
        f"> {html.escape(line, quote=False)}" for line in match.group(1).splitlines()
    )
    return (
        '\n\n<details type="reasoning" done="true" duration="0">\n'
        f"<summary>Thought</summary>\n{lines}\n</details>\n\n"
    )


#: A finished reasoning block as it streams, at the end of the text or not.
_STREAMED_THINK = re.compile(r"<think>\n(.*?)\n</think>(?:\n\n)?", re.DOTALL)


def stored_form(text: str) -> str:
    """A message's streamed text as Open WebUI stores it once finished.

    Open WebUI turns each ``<think>`` block of a streamed reply into its
    reasoning card when it saves the message; a message written directly
    (a research continued after a restart) needs the same form. A block
    still open at the end is left out until it closes.
    """
    text = _STREAMED_THINK.sub(_reasoning_block, text)
    opened = text.rfind(THINK_START)
    return text[:opened] if opened != -1 else text


class HeavyRenderer:
    """Renders a heavy run: each rollout in its own block, then the synthesis.

    Rollouts run at once, but a chat message is one text: each rollout's
    reasoning, tool cards and answer are kept until it ends and then shown as
    one collapsible block. Status lines say which rollout is doing what as
    it happens; the synthesis streams as the answer, with the sources read by
    all rollouts and the research summary with every rollout's figures.
    """

    def __init__(self, display: Display, exports: Exports | None = None) -> None:
        """Render a heavy run; its rollouts and synthesis cite from one book."""
        self.book = SourceBook()
        self.papers: dict[str, Paper] = {}
        self.display = display
        self.main = ChatRenderer(
            display, book=self.book, exports=exports, papers=self.papers
        )
        self._rollouts: dict[int, ChatRenderer] = {}
        self._shown: dict[int, list[str]] = {}

    def render(self, event: RunEvent) -> Rendered:
        """What one event shows: text to yield, payloads to emit."""
        if isinstance(event, RolloutEvent):
            return self._rollout(event)
        if isinstance(event, SynthesisStarted):
            self.main.status_prefix = "Synthesis · "
            status = (
                f"Synthesis · integrating the answers of {event.reports} of "
                f"{event.rollouts} rollouts"
            )
            return Rendered(events=(status_payload(status),))
        return self.main.render(event)

    def _renderer(self, rollout: int, rollouts: int) -> ChatRenderer:
        if rollout not in self._rollouts:
            self._rollouts[rollout] = ChatRenderer(
                replace(self.display, summary=False),
                book=self.book,
                status_prefix=f"Rollout {rollout}/{rollouts} · ",
                nested=True,
                papers=self.papers,
            )
            self._shown[rollout] = []
        return self._rollouts[rollout]

    def _rollout(self, event: RolloutEvent) -> Rendered:
        rendered = self._renderer(event.rollout, event.rollouts).render(event.event)
        if rendered.text:
            self._shown[event.rollout].append(rendered.text)
        if not isinstance(event.event, RunFinished):
            return Rendered(events=rendered.events)
        block = self._block(event.rollout, event.rollouts, event.event)
        return Rendered(block if self.display.rollouts else "", rendered.events)

    def _block(self, rollout: int, rollouts: int, finished: RunFinished) -> str:
        """The finished rollout as one collapsible block."""
        body = _THINK_BLOCK.sub(_reasoning_block, "".join(self._shown.pop(rollout)))
        ending = (
            "stopped by an error"
            if finished.reason == "error"
            else TERMINATION_TEXT[finished.reason]
        )
        summary = (
            f"Rollout {rollout} of {rollouts} · {finished.stats.rounds} rounds · "
            f"{ending}"
        )
        return (
            f"\n\n<details>\n<summary>{html.escape(summary)}</summary>\n\n"
            f"{body.strip()}\n\n</details>\n\n"
        )
