"""The converter without a process: a thread that stops when its caller does.

Only when no converter process can run (none starts, no process support, an
event loop that cannot watch pipes) are pages converted in a worker thread. A
thread cannot be killed, so HTML is read by a linear-time reader with hard
caps (it ends soon whatever the page), and a PDF page by page, stopping when
the caller stopped waiting.
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import asyncio
import contextvars
import functools
import re
import threading
from collections.abc import Awaitable, Callable
from html import unescape
from typing import Any

from .convert import _convert, _HtmlToText, _Page, _pdf_to_text, _RawPage

# --- snippet ---

# A backstop for callers without a deadline of their own, in a thread or in a
# converter process (which also ends itself after this long on one page,
# should the server be gone).
_MAX_CONVERT_SECONDS = 600


# Without a worker process, HTML is read up to this many characters and tags
# (a 1 MB article has ~40,000): the reader is linear at ~10 µs a tag, so this
# caps the thread's time at about half a second whatever the page.
_FALLBACK_MAX_HTML_CHARS = 1_500_000
_FALLBACK_MAX_TAGS = 50_000
_FALLBACK_TAG = re.compile(r"(/?)([a-zA-Z][^\s/>]*)")
# An unterminated quote runs to the end of the tag instead of failing, so no
# attribute is ever scanned twice.
_FALLBACK_ATTRIBUTE = re.compile(
    r"""([^\s"'>/=]+)(?:\s*=\s*(?:"([^"]*)"?|'([^']*)'?|([^\s>]*)))?"""
)


# The stop signal of the conversion running in a thread: `_convert_in_thread`
# sets it when its caller stops waiting. asyncio.to_thread runs a function in
# a copy of its caller's context, so the thread finds the event here.
_THREAD_CONVERSION_STOP: contextvars.ContextVar[threading.Event | None] = (
    contextvars.ContextVar("visit_thread_conversion_stop", default=None)
)


async def _convert_in_thread(
    raw: _RawPage,
    max_tokens: int,
    run_in_thread: Callable[..., Awaitable[Any]] = asyncio.to_thread,
) -> _Page:
    """`_convert_budgeted` in a worker thread that stops when its caller does.

    A thread cannot be killed. HTML is read within hard caps; a PDF is read
    page by page, and when this call ends (the page timed out, the chat was
    stopped, or `_MAX_CONVERT_SECONDS` passed) the thread stops at its next
    page instead of reading on after the tool answered.

    Args:
        raw: The page as downloaded.
        max_tokens: The reading budget.
        run_in_thread: Runs `func(*args)` in another thread, in a copy of the
            current context (asyncio.to_thread; a seam for tests).

    Returns:
        The converted page.
    """
    stop = threading.Event()
    context_token = _THREAD_CONVERSION_STOP.set(stop)
    try:
        async with asyncio.timeout(_MAX_CONVERT_SECONDS):
            return await run_in_thread(_convert_budgeted, raw, max_tokens)
    finally:
        stop.set()  # done, timed out or cancelled: nothing more to read
        _THREAD_CONVERSION_STOP.reset(context_token)


def _convert_budgeted(raw: _RawPage, max_tokens: int) -> _Page:
    """`_convert` without a worker process (in a thread): HTML in linear time.

    The whole readable page, without main-content extraction: a thread cannot
    be stopped, and the library's cost is not linear in the page. PDFs still
    go through pypdf here (only when no worker process can run at all, as
    before there was one), page by page until `_convert_in_thread`'s stop.
    """
    read_pdf = functools.partial(_pdf_to_text, stop=_THREAD_CONVERSION_STOP.get())
    return _convert(
        raw, max_tokens, _html_to_text_linear, read_main=None, read_pdf=read_pdf
    )


def _html_to_text_linear(html: str, base_url: str, char_limit: int) -> tuple[str, str]:
    """`_html_to_text` with a tokenizer that looks at every character O(1) times.

    Tags, comments and script bodies are found with `str.find` from where the
    last one ended; a `<` without a `>` after it makes the rest text. The
    reader's nesting caps (`_MAX_NESTING`) keep the text building linear.
    """
    parser = _HtmlToText(base_url)
    html = html[:_FALLBACK_MAX_HTML_CHARS]
    lower = html.lower()
    pos, end = 0, len(html)
    for _tag in range(_FALLBACK_MAX_TAGS):
        if pos >= end or parser.main.size > char_limit:
            break
        start = html.find("<", pos)
        start = end if start < 0 else start
        if start > pos:  # text; more than the limit is never needed
            parser.handle_data(unescape(html[pos : min(start, pos + char_limit + 1)]))
        pos = _read_markup(parser, html, lower, start) if start < end else end
    parser.handle_data("")
    return parser.result()


def _read_markup(parser: _HtmlToText, html: str, lower: str, start: int) -> int:
    """Handle the markup at `html[start] == "<"`; where reading goes on."""
    if html.startswith("<!--", start):
        close = html.find("-->", start + 2)  # "<!-->" is an empty comment too
        return len(html) if close < 0 else close + 3
    tag = _FALLBACK_TAG.match(html, start + 1)
    if tag is None and html[start + 1 : start + 2] not in ("!", "?"):
        parser.handle_data("<")  # a lone "<" in text
        return start + 1
    close = html.find(">", start + 1)
    if close < 0:
        parser.handle_data(unescape(html[start:]))
        return len(html)
    if tag is None:  # <!doctype …>, <?xml …?>
        return close + 1
    if tag.group(1):
        parser.handle_endtag(tag.group(2).lower())
        return close + 1
    return _read_start_tag(parser, html, lower, tag, close)


def _read_start_tag(
    parser: _HtmlToText, html: str, lower: str, tag: re.Match[str], close: int
) -> int:
    """Handle a start tag ending at `close` (and a script's or style's text)."""
    name = tag.group(2).lower()
    inside = html[tag.end() : close]
    attrs: list[tuple[str, str | None]] = [
        (m.group(1).lower(), unescape(next((v for v in m.groups()[1:] if v), "")))
        for m in _FALLBACK_ATTRIBUTE.finditer(inside)
    ]
    if inside.endswith("/"):
        parser.handle_startendtag(name, attrs)
        return close + 1
    parser.handle_starttag(name, attrs)
    if name not in ("script", "style"):
        return close + 1
    finish = lower.find(f"</{name}", close + 1)  # raw text up to its end tag
    if finish < 0:
        return len(html)
    parser.handle_data(html[close + 1 : finish])
    parser.handle_endtag(name)
    after = html.find(">", finish)
    return len(html) if after < 0 else after + 1
