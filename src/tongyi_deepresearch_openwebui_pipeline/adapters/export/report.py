"""The research as a Markdown report: question, answer, references, trace.

The question is quoted and the answer written as they are (the answer's
``[n]`` are the references' numbers);
only a code fence it leaves open is closed after it, or the rest of the
report would be code. Everything else the report says of a source is
escaped, so a title cannot make a link, a heading, an image, HTML or math:
URLs are autolinks (``<…>``, which the records' URL cleaning keeps
unbreakable), and the trace sits in a fenced block longer than any run of
backticks in it, inside a collapsed ``<details>``. Lone surrogates become
U+FFFD so that the report can be written as UTF-8.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .records import ExportSource, in_citation_order, replace_surrogates

#: Most characters of the trace kept (the rest is dropped, and the report says so).
TRACE_CHARS = 200_000
#: Characters that start Markdown (CommonMark, GFM, Open WebUI's math) inline
#: syntax: backslash-escaped in the text the report writes about a source.
_INLINE_SYNTAX = re.compile(r"([\\`*_\[\]<>&~$|#!])")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
#: A line that opens or closes a fenced code block (CommonMark: at most three
#: spaces of indent, then three or more backticks or tildes).
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
_BACKTICKS = re.compile(r"`+")


def escape_markdown(text: str) -> str:
    """``text`` shown as it is by a Markdown renderer (syntax escaped)."""
    return _INLINE_SYNTAX.sub(r"\\\1", text)


def _open_fence(text: str) -> str:
    """The fence a Markdown text leaves open at its end ("" when none)."""
    opened = ""
    for line in _LINE_BREAK.split(text):
        match = _FENCE.fullmatch(line)
        if match is None:
            continue
        fence, rest = match.groups()
        if not opened:
            # A backtick fence's info string may not hold a backtick.
            if not (fence[0] == "`" and "`" in rest):
                opened = fence
        elif fence[0] == opened[0] and len(fence) >= len(opened) and not rest.strip():
            opened = ""
    return opened


def _sentence(text: str) -> str:
    """``text`` escaped, ending in a full stop unless it has its own."""
    end = "" if text.endswith((".", "?", "!", "…")) else "."
    return escape_markdown(text) + end


def _link(url: str) -> str:
    # The records percent-encode spaces and "<>": an http(s) URL is an autolink.
    if url.startswith(("http://", "https://")):
        return f"<{url}>"
    return escape_markdown(url)


def reference_line(source: ExportSource) -> str:
    r"""One list item: "- \[n\] Title. Authors. Venue, year. <URL> (accessed …)"."""
    parts = [f"- \\[{source.number}\\]", _sentence(source.title)]
    if source.authors:
        parts.append(_sentence("; ".join(source.authors)))
    where = source.venue if source.kind == "article" else source.site
    where_and_when = ", ".join(part for part in (where, source.year) if part)
    if where_and_when:
        parts.append(_sentence(where_and_when))
    doi_link = f"https://doi.org/{source.doi}" if source.doi else ""
    links = dict.fromkeys(link for link in (doi_link, source.url) if link)
    parts.extend(_link(link) for link in links)  # the DOI's once, if it is the URL
    parts.append(f"(accessed {source.accessed.isoformat()})")
    return " ".join(parts)


def _quote(text: str) -> str:
    lines = _LINE_BREAK.split(text.strip())
    return "\n".join(f"> {line}" if line else ">" for line in lines)


def _answer(answer: str) -> str:
    text = answer if answer.endswith("\n") else answer + "\n"
    fence = _open_fence(text)
    return text + (fence + "\n" if fence else "")


def fenced(text: str, language: str) -> str:
    """``text`` in a code fence no line of it can close."""
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text}\n{fence}"


def _trace(trace: str) -> str:
    cut = len(trace) > TRACE_CHARS
    text = trace[:TRACE_CHARS].rstrip("\n")
    note = f"\n\n(The trace is cut at {TRACE_CHARS:,} characters.)" if cut else ""
    return (
        "<details>\n<summary>Research trace</summary>\n\n"
        f"{fenced(text, 'text')}{note}\n\n</details>\n"
    )


def to_markdown_report(
    question: str,
    answer: str,
    sources: Iterable[ExportSource],
    trace: str | None = None,
) -> str:
    """The research as one Markdown document.

    Args:
        question: What was asked (quoted as it is).
        answer: The final answer with its ``[n]`` citations (kept as it is).
        sources: The numbered sources the answer cites.
        trace: The research's steps as text, shown collapsed (None: no trace).

    Returns:
        The report: "# Research report", then "## Question", "## Answer",
        "## References" (one line per source, by number) and, with a trace,
        a collapsed "Research trace".
    """
    references = [reference_line(source) for source in in_citation_order(sources)]
    sections = [
        "# Research report\n",
        "## Question\n\n" + _quote(replace_surrogates(question)) + "\n",
        "## Answer\n\n" + _answer(replace_surrogates(answer)),
        "## References\n\n" + ("\n".join(references) or "(none)") + "\n",
    ]
    if trace is not None:
        sections.append(_trace(replace_surrogates(trace)))
    return "\n".join(sections)
