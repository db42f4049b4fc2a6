"""The words both front ends use for a run's figures and endings (pure).

The chat (`adapters/openwebui/render.py`) and the terminal (`runner/render.py`,
`runner/results.py`) lay a run out differently, but they say its token counts,
its duration, its round and the notes under an answer that did not end as
asked in the same words, and both list the sources read in the same Markdown
(`sources_list`, titles and URLs escaped). Those words are written here once;
what each front end puts around them (emoji, prefixes, line ends) stays with
it. How a tool call is described is the tool's own business: its `ToolDef` in
`adapters/openwebui/catalog.py`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import quote

from .citation_report import CitationReport, Support
from .events import TERMINATION_TEXT
from .sources import ZERO_WIDTH_SPACE, Source

#: Under an answer the model wrote without ``<answer>`` tags.
UNMARKED_ANSWER_NOTE = "*(The model did not mark this as its final answer.)*"


def tokens_text(prompt: int, completion: int, cost: float | None = None) -> str:
    """``1,234 tokens in / 56 out``, then `` · $0.0123`` when the cost is known."""
    text = f"{prompt:,} tokens in / {completion:,} out"
    return text + (f" · ${cost:.4f}" if cost is not None else "")


def duration_text(seconds: float) -> str:
    """``4 s`` or ``2 min 5 s`` (whole seconds)."""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def round_label(number: int, max_rounds: int) -> str:
    """``Round 3/100``: the round under way, of the most the run may take."""
    return f"Round {number}/{max_rounds}"


def stopped_note(error: str) -> str:
    """The note under a run that an error stopped (Markdown)."""
    return f"**The research stopped:** {error}"


def no_answer_note(reason: str) -> str:
    """The note under a run that ended without an answer, saying why."""
    ending = TERMINATION_TEXT.get(reason, reason)
    return f"The model ended without a final answer ({ending})."


def resumed_text(rounds: int, pages: int) -> str:
    """What a resumed run says first: where it goes on from, what it kept."""
    kept = f"{rounds} round{'s' * (rounds != 1)} and {pages} page{'s' * (pages != 1)}"
    return (
        f"Resuming the research from round {rounds + 1}: {kept} read before "
        "the interruption are kept."
    )


#: What can start markup inside link text (emphasis, code, links, images,
#: HTML, tables, strikethrough, entities); other punctuation is left readable.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]()<>!|~&])")
_URL_UNSAFE = re.compile(r"[\s()<>\[\]\"'`\\]")
#: Control characters (C0 but tab and newline, DEL, C1): never meaningful in
#: a title or a message, and escape sequences to a terminal that shows the
#: list (the runner). Removed before escaping, so that Markdown's backslash
#: cannot turn ``ESC ]`` into ``ESC \\`` (a terminal's string terminator).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


#: A zero-width space after every "<" and "◁": Open WebUI looks for its
#: reasoning and block tags (``<think>``, ``◁think▷``, ``<details``) in the
#: raw text, escaped or not.
_TAG_STARTS = str.maketrans({"<": "<" + ZERO_WIDTH_SPACE, "◁": "◁" + ZERO_WIDTH_SPACE})


def defuse_tags(text: str) -> str:
    """``text`` in which no tag can open or close a block of the chat.

    Open WebUI ends a reasoning block at ``</think>`` (or ``◁/think▷``…) and
    renders ``<details …>`` cards anywhere in the content; a zero-width
    space after each ``<`` and ``◁`` stops every such tag, per character, so
    it holds however the text is split into deltas.
    """
    return text.translate(_TAG_STARTS)


def markdown_text(text: str) -> str:
    """``text`` shown literally inside Markdown (link text included).

    Markup is escaped, and no tag Open WebUI reads in the raw text (a
    reasoning block's, a ``<details>``) can open or close there.
    """
    return defuse_tags(_MARKDOWN_SPECIAL.sub(r"\\\1", _CONTROL.sub("", text)))


def markdown_url(url: str) -> str:
    """An http(s) URL safe inside ``[text](url)``: no way out of the parens."""
    return _URL_UNSAFE.sub(lambda m: quote(m.group(0), safe=""), url)


def sources_list(sources: Iterable[Source]) -> str:
    """A numbered Markdown list of the sources read, with links ("" for none)."""
    items = "\n".join(
        f"{source.number}. [{markdown_text(source.title)}]({markdown_url(source.url)})"
        for source in sources
    )
    return f"\n\n**Sources read**\n\n{items}\n" if items else ""


#: Longest statement quoted in the note of unsupported citations.
QUOTED_STATEMENT_CHARS = 160


def checking_citations_text(statements: int) -> str:
    """The status while the answer's citations are checked."""
    noun = "statement" if statements == 1 else "statements"
    return f"Checking {statements} cited {noun} against the pages they cite…"


def unsupported_citations(report: CitationReport) -> list[str]:
    """One Markdown line per cited statement its pages do not support.

    The statement is quoted (cut at `QUOTED_STATEMENT_CHARS`) with the
    citations it carries, then why, as the check's model said it; both are
    shown literally.
    """
    lines = []
    for item in report.verdicts:
        if item.verdict.support is not Support.NOT_SUPPORTED:
            continue
        text = item.statement.text
        if len(text) > QUOTED_STATEMENT_CHARS:
            text = text[: QUOTED_STATEMENT_CHARS - 1].rstrip() + "…"
        cited = " ".join(f"[{number}]" for number in item.statement.numbers)
        if item.statement.unverified:
            cited = f"{cited} (a page never read)".strip()
        why = item.verdict.reason.strip()
        lines.append(
            f"“{markdown_text(text)}” {markdown_text(cited)}".rstrip()
            + (f": {markdown_text(why)}" if why else "")
        )
    return lines
