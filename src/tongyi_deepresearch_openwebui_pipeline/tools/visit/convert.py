"""Convert: downloaded bytes -> readable text (HTML, PDF, plain text), in budget.

This module is also the whole program of the visit tool's converter process:
the generator writes its source, as it is, into visit_tool.py, and the worker
sends it to each new process, which then runs `_converter_main`. So it uses
only the standard library (pypdf and trafilatura imported where used) and
names it defines itself; it never imports `logging` (10 ms of every worker's
start). tests/test_visit_process.py runs it in a process.
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code.

import codecs
import io
import json
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

# --- snippet ---

TRUNCATION_NOTE = "[Page truncated to fit the reading budget]"


def _debug(message: str) -> None:
    """Log the exception being handled at DEBUG, where the process logs at all.

    In the server that is the tool's logger; a converter process never imports
    `logging` for it (a library it loads may: then its records go nowhere).
    """
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger(__name__).debug(message, exc_info=True)


class _PageError(Exception):
    """The page could not be read or converted; the message is a short reason."""


class _MangledFileError(Exception):
    """Open WebUI's loader returned a file's bytes decoded as text, lossily.

    A compressed PDF's text exists only in its exact bytes, so such a file is
    downloaded again by the built-in fetcher (same checked URL, same checks).
    """


@dataclass
class _RawPage:
    """Bytes as downloaded, before conversion."""

    final_url: str
    body: bytes
    content_type: str
    truncated: bool = False
    redirects: list[str] = field(default_factory=list)


@dataclass
class _Page:
    """A readable page: text within the budget, plus where it came from.

    `reading` says what of the page `text` is: "main" (its main content),
    "whole" (the whole readable page), "document" (a PDF or a text file,
    unchanged), "loader" (the text Open WebUI's loader returned, unchanged)
    or "" (not known); `page_chars` is the length of the whole readable page,
    for the status line and the source card.
    """

    final_url: str
    title: str
    text: str
    redirects: list[str] = field(default_factory=list)
    reading: str = ""
    page_chars: int = 0


_BINARY_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"PK\x03\x04", "a ZIP archive or Office document"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf", "a 7-Zip archive"),
    (b"Rar!", "a RAR archive"),
    (b"ID3", "an MP3 audio file"),
    (b"OggS", "an Ogg media file"),
    (b"\x00asm", "a WebAssembly binary"),
    (b"\x7fELF", "an executable"),
    (b"\xd0\xcf\x11\xe0", "a legacy Office document"),
)
_HTML_MARKER = re.compile(
    rb"<(!doctype\s+html|html|head|body|title|meta|p|div)[\s>/]", re.I
)
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml")
_HTML_TYPES = ("text/html", "application/xhtml+xml")
_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([\w.:-]+)""", re.I)
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def _classify(content_type: str, body: bytes) -> tuple[str, str]:
    """("pdf" | "html" | "text" | "binary", label) from headers AND the bytes."""
    mime = content_type.split(";", maxsplit=1)[0].strip().lower()
    head = body[:2048].lstrip(b"\xef\xbb\xbf \t\r\n")
    if b"%PDF-" in body[:1024]:
        return "pdf", "a PDF"
    label = next((name for magic, name in _BINARY_MAGIC if head.startswith(magic)), "")
    if head[4:8] == b"ftyp" or (
        head.startswith(b"RIFF") and head[8:12] in (b"WEBP", b"WAVE", b"AVI ")
    ):
        label = "a media file"
    looks_html = bool(_HTML_MARKER.search(head))
    declared_text = mime.startswith(_TEXT_TYPES) or mime.endswith(("+json", "+xml"))
    wide = body.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    if not (label or looks_html or wide):
        sample = body[:4096]
        garbled = sample.decode("utf-8", "replace").count("\ufffd") > 8
        if b"\x00" in sample or (garbled and not declared_text):
            label = f"a binary file ({mime or 'unknown type'})"
    if not label and mime.startswith(("image/", "audio/", "video/", "font/")):
        label = f"a binary file ({mime})"
    if label:
        return "binary", label
    if mime in _HTML_TYPES or (looks_html and not declared_text):
        return "html", "an HTML page"
    return "text", mime or "text"


def _decode(body: bytes, content_type: str, html: bool) -> str:
    """Decode by BOM, then header charset, then <meta charset>, else UTF-8."""
    for bom, codec in (
        (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF32_LE, "utf-32"),
        (codecs.BOM_UTF32_BE, "utf-32"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
        if body.startswith(bom):
            return body.decode(codec, errors="replace")
    declared = re.findall(r"charset\s*=\s*[\"']?([\w.:-]+)", content_type, re.I)
    if html:
        declared += [m.decode("ascii", "ignore") for m in _CHARSET.findall(body[:4096])]
    for name in declared:
        codec = _page_codec(name)
        if codec is None:
            continue
        try:
            return body.decode(codec, errors="replace")
        except (UnicodeError, LookupError, ValueError):  # a codec without "replace"
            continue
    return body.decode("utf-8", errors="replace")


# Text codecs Python has but no web page is written in: they transform text
# (escapes, host names) rather than encode it, and some refuse errors="replace".
_NOT_PAGE_CODECS = {"idna", "punycode", "unicode-escape", "raw-unicode-escape", "utf-7"}


def _page_codec(name: str) -> str | None:
    """The codec a declared charset names, if a page can be decoded with it.

    Only real text encodings: "rot13", "base64", "zlib", "hex" … are bytes or
    str transforms (`bytes.decode` raises on them). A BOM-less UTF-16/32
    declaration is almost always wrong, so it is ignored too.
    """
    try:
        info = codecs.lookup(name)
    except LookupError:
        return None
    codec = info.name
    if not getattr(info, "_is_text_encoding", True) or codec in _NOT_PAGE_CODECS:
        return None
    if codec.startswith(("utf-16", "utf-32")):
        return None
    return codec


def _estimate_tokens(text: str) -> float:
    """~4 characters per token for Latin text, one token per CJK character."""
    cjk = len(text) - len(_CJK.sub("", text))
    return cjk + (len(text) - cjk) / 4


def _fit_budget(
    text: str,
    max_tokens: int,
    estimate: "Callable[[str], float]" = _estimate_tokens,
) -> tuple[str, bool]:
    """Cut text to the token budget.

    Args:
        text: The page text.
        max_tokens: The reading budget.
        estimate: Counts the tokens of a piece of text (`_estimate_tokens`;
            tests watch what it is given).

    Returns:
        The text that fits, and True when something was cut.
    """
    # Every character costs at least a quarter token, so a longer text cannot
    # fit: skip the estimate, a regex pass over megabytes that holds the GIL.
    if len(text) <= 4 * max_tokens and estimate(text) <= max_tokens:
        return text, False
    used, end, block = 0.0, 0, 4096
    while end < len(text):
        cost = estimate(text[end : end + block])
        if used + cost > max_tokens:
            for char in text[end : end + block]:
                used += 1 if _CJK.match(char) else 0.25
                if used > max_tokens:
                    break
                end += 1
            break
        used += cost
        end += block
    return text[:end].rstrip(), True


class _Buffer:
    """Text sink that collapses whitespace the way a browser would."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0
        self._newlines = 2  # trailing newlines so far (start counts as a break)
        self._space = False  # a collapsed space is pending

    def text(self, data: str, pre: bool = False) -> None:
        if not pre:
            pending = self._space or data[:1].isspace()
            self._space = data[-1:].isspace()
            data = " ".join(data.split())
            if not data:
                self._space = pending
                return
            if pending and self.parts and not self.parts[-1][-1:].isspace():
                data = " " + data
        self._add(data)

    def markup(self, data: str) -> None:
        self._space = False
        self._add(data)

    def newline(self, count: int = 1) -> None:
        self._space = False
        self._add("\n" * max(count - self._newlines, 0))

    def _add(self, data: str) -> None:
        if data:
            self.parts.append(data)
            self.size += len(data)
            body = data.rstrip("\n")
            tail = len(data) - len(body)
            self._newlines = tail if body else self._newlines + tail

    def value(self) -> str:
        return "".join(self.parts)


@dataclass
class _Table:
    """A table being read: finished rows as markdown, the open row and cell."""

    rows: list[str] = field(default_factory=list)
    row: list[str] | None = None
    cell: _Buffer | None = None
    header: bool = False


_SKIP_TAGS = {
    "script", "style", "noscript", "template", "svg", "nav", "aside",
    "iframe", "object", "canvas", "select", "button", "textarea",
}  # fmt: skip
_CHROME_TAGS = {"header", "footer"}  # dropped unless inside <article>/<main>
_CHROME_ROLES = {"navigation", "banner", "contentinfo", "complementary"}
_VOID_TAGS = {
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link",
    "meta", "param", "source", "track", "wbr",
}  # fmt: skip
_PARAGRAPH_TAGS = {
    "p", "blockquote", "figure", "section", "article", "main", "dl",
    "address", "details", "h1", "h2", "h3", "h4", "h5", "h6",
}  # fmt: skip
_LINE_TAGS = {"div", "dt", "dd", "figcaption", "summary", "caption", "form", "br"}
_HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.I)
# Links, tables and list indents nest at most this deep: each level copies the
# text inside it once more, so unbounded nesting costs quadratic time or worse
# (hostile pages nest thousands deep; real pages a handful). Deeper ones are
# read as plain text.
_MAX_NESTING = 32


class _HtmlToText(HTMLParser):
    """HTML -> markdown-ish text: headings, lists, tables, links; no boilerplate."""

    def __init__(self, base_url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.base_url = base_url
        self.main = _Buffer()
        self._sinks = [self.main]  # text goes to the last one (links, cells)
        self._links: list[tuple[str, _Buffer]] = []
        self._tables: list[_Table] = []
        self._deep_tables = 0  # <table>s open beyond _MAX_NESTING (read as text)
        self._lists: list[list[int]] = []  # per open list: [ordered, items so far]
        self._skip: tuple[str, int] | None = None  # skipped tag and its nesting
        self._content = 0  # depth of <article>/<main>
        self._pre = 0
        self._titles = {"title": "", "og": ""}
        self._in_title = False

    def _hidden(self, tag: str, attrs: dict[str, str | None]) -> bool:
        chrome = tag in _CHROME_TAGS or attrs.get("role") in _CHROME_ROLES
        return (
            tag in _SKIP_TAGS
            or (chrome and not self._content)
            or "hidden" in attrs
            or (attrs.get("aria-hidden") or "").lower() == "true"
            or bool(_HIDDEN_STYLE.search(attrs.get("style") or ""))
        )

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skip is not None:
            if tag == self._skip[0]:
                self._skip = (tag, self._skip[1] + 1)
            return
        attr = {key.lower(): value for key, value in attrs}
        if tag == "title":
            self._in_title = True
        elif tag == "base" and attr.get("href"):
            # A malformed one is ignored, as browsers do.
            self.base_url = _resolved(self.base_url, attr.get("href") or "") or (
                self.base_url
            )
        elif tag == "meta" and attr.get("property") == "og:title":
            self._titles["og"] = " ".join((attr.get("content") or "").split())
        elif tag not in _VOID_TAGS and self._hidden(tag, attr):
            self._skip = (tag, 1)
        else:
            self._open(tag, attr)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID_TAGS:
            self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if self._skip is not None:
            if tag == self._skip[0]:
                depth = self._skip[1] - 1
                self._skip = (tag, depth) if depth else None
        elif tag == "title":
            self._in_title = False
        else:
            self._close(tag)

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self._titles["title"] += data
        elif self._skip is None:
            self._sinks[-1].text(data, pre=self._pre > 0)

    def _open(self, tag: str, attr: dict[str, str | None]) -> None:  # noqa: PLR0912
        sink = self._sinks[-1]
        if tag in ("article", "main"):
            self._content += 1
        if tag in _PARAGRAPH_TAGS:
            sink.newline(2)
            if tag[0] == "h" and tag[1:].isdigit():
                sink.markup("#" * int(tag[1]) + " ")
        elif tag in ("ul", "ol"):
            sink.newline(1 if self._lists else 2)
            self._lists.append([tag == "ol", 0])
        elif tag == "li":
            sink.newline(1)
            entry = self._lists[-1] if self._lists else [False, 0]
            entry[1] += 1
            bullet = f"{entry[1]}. " if entry[0] else "- "
            depth = min(len(self._lists) - 1, _MAX_NESTING)
            sink.markup("  " * max(depth, 0) + bullet)
        elif tag == "table":
            sink.newline(2)
            if len(self._tables) < _MAX_NESTING:
                self._tables.append(_Table())
            else:
                self._deep_tables += 1
        elif tag == "tr" and self._tables:
            self._end_row()
            self._tables[-1].row = []
        elif tag in ("td", "th") and self._tables:
            table = self._tables[-1]
            self._end_cell()
            if table.row is None:
                table.row = []
            table.header |= tag == "th" and not table.rows
            table.cell = _Buffer()
            self._sinks.append(table.cell)
        elif tag == "a" and len(self._links) < _MAX_NESTING:
            buffer = _Buffer()
            self._links.append((attr.get("href") or "", buffer))
            self._sinks.append(buffer)
        elif tag == "img" and self._links and attr.get("alt"):
            sink.text(f" {attr.get('alt')} ")
        elif tag == "pre":
            sink.newline(2)
            sink.markup("```\n")
            self._pre += 1
        elif tag in _LINE_TAGS or tag == "hr":
            sink.newline(1)

    def _close(self, tag: str) -> None:
        if tag in ("article", "main"):
            self._content = max(self._content - 1, 0)
        if tag == "a" and self._links and self._sinks[-1] is self._links[-1][1]:
            self._end_link()
        elif tag in ("td", "th"):
            self._end_cell()
        elif tag == "tr" and self._tables:
            self._end_row()
        elif tag == "table" and self._deep_tables:
            self._deep_tables -= 1
            self._sinks[-1].newline(2)
        elif tag == "table" and self._tables:
            self._end_row()
            rows = self._tables.pop().rows
            self._sinks[-1].markup("\n".join(rows))
            self._sinks[-1].newline(2)
        elif tag in ("ul", "ol") and self._lists:
            self._lists.pop()
            self._sinks[-1].newline(1 if self._lists else 2)
        elif tag == "pre" and self._pre:
            self._pre -= 1
            self._sinks[-1].newline(1)
            self._sinks[-1].markup("```")
            self._sinks[-1].newline(2)
        elif tag in _PARAGRAPH_TAGS:
            self._sinks[-1].newline(2)
        elif tag in _LINE_TAGS:
            self._sinks[-1].newline(1)

    def _end_link(self) -> None:
        href, buffer = self._links.pop()
        self._sinks.pop()
        raw = buffer.value()
        text, href = " ".join(raw.split()), href.strip()
        target = _resolved(self.base_url, href)
        useful = (
            text
            and href
            and not href.startswith("#")
            and urlsplit(target).scheme in ("http", "https")
            and text != target
        )
        if useful:  # keep the spacing around the link as it was
            lead = " " if raw[:1].isspace() else ""
            raw = f"{lead}[{text}]({target}){' ' if raw[-1:].isspace() else ''}"
        self._sinks[-1].text(raw)

    def _end_cell(self) -> None:
        table = self._tables[-1] if self._tables else None
        if table is None or table.cell is None or table.cell not in self._sinks:
            return
        while self._sinks[-1] is not table.cell:  # a link left open inside the cell
            self._end_link()
        self._sinks.pop()
        text = " ".join(table.cell.value().split()).replace("|", "\\|")
        table.cell = None
        if table.row is not None:
            table.row.append(text)

    def _end_row(self) -> None:
        self._end_cell()
        table = self._tables[-1]
        if table.row and any(table.row):
            table.rows.append("| " + " | ".join(table.row) + " |")
            if len(table.rows) == 1 and table.header:
                table.rows.append("|" + " --- |" * len(table.row))
        table.row = None

    def result(self) -> tuple[str, str]:
        """(text, title) once parsing is done."""
        while self._links and self._sinks[-1] is self._links[-1][1]:
            self._end_link()  # unclosed <a> at the end of the document
        while self._tables:
            self._close("table")
        lines = [line.rstrip() for line in self.main.value().splitlines()]
        lines = [ln for ln in lines if not re.fullmatch(r"\s*(-|#+|\d+\.)", ln)]
        text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
        heading = re.search(r"^# (.+)$", text, re.M)
        title = " ".join(self._titles["title"].split()) or self._titles["og"]
        return text, title or (heading.group(1) if heading else "")


def _resolved(base_url: str, href: str) -> str:
    """`urljoin`, or "" for a URL it cannot parse (an unbalanced IPv6 bracket).

    One malformed link or `<base href>` must not end the reading of the page.
    """
    try:
        target = urljoin(base_url, href)
        urlsplit(target)  # what the callers do next; it raises on the same URLs
    except ValueError:
        return ""
    return target


def _html_to_text(html: str, base_url: str, char_limit: int) -> tuple[str, str]:
    """Convert HTML, stopping early once far more text than needed is collected."""
    parser = _HtmlToText(base_url)
    try:
        for start in range(0, len(html), 65536):
            parser.feed(html[start : start + 65536])
            if parser.main.size > char_limit:
                break
        parser.close()
    except Exception:  # malformed markup: keep what was parsed
        _debug("HTML parser stopped early")
    return parser.result()


class _ConversionStoppedError(BaseException):
    """The caller of a conversion in a thread stopped waiting for it.

    A BaseException, as asyncio.CancelledError: raised from inside pypdf (see
    `_StoppableBytes`), it must not be caught by pypdf's own recovery from
    broken files (`except Exception`).
    """


class _StoppableBytes(io.BytesIO):
    """A PDF's bytes for pypdf that end the reading once `stop` is set.

    pypdf reads the file lazily, object by object, with `read`: the page tree
    (read whole before the first page: seconds for 20,000 pages) as well as
    each page's contents. Every read is a point where a thread can stop.
    """

    def __init__(self, data: bytes, stop: "threading.Event") -> None:
        """Serve `data` until `stop` is set."""
        super().__init__(data)
        self._stop = stop

    def read(self, size: "int | None" = -1, /) -> bytes:
        """`BytesIO.read`, or _ConversionStoppedError once `stop` is set."""
        if self._stop.is_set():
            raise _ConversionStoppedError
        return super().read(size)


def _pdf_to_text(
    data: bytes, char_limit: int, stop: "threading.Event | None" = None
) -> tuple[str, str]:
    """Extract a PDF's text page by page with pypdf (optional dependency).

    Args:
        data: The PDF's bytes.
        char_limit: Pages are read until their text is longer than this.
        stop: Checked before every page and every read of the file: once set,
            the reading ends with a `_PageError` (a thread converting the PDF
            cannot be killed, but it stops when its caller stopped waiting).

    Returns:
        The pages' text, each under a "--- Page n ---" line, and the title.

    Raises:
        _PageError: The PDF cannot be read, has no text, or `stop` was set.
    """
    try:
        from pypdf import PdfReader  # noqa: PLC0415  (optional dependency)
    except ImportError as exc:
        raise _PageError(
            "reading PDFs needs the optional 'pypdf' package (pip install pypdf)"
        ) from exc
    source = io.BytesIO(data) if stop is None else _StoppableBytes(data, stop)
    try:
        reader = PdfReader(source)
        if reader.is_encrypted:
            reader.decrypt("")
        pages: list[str] = []
        total = 0
        for number, page in enumerate(reader.pages, start=1):
            if stop is not None and stop.is_set():
                raise _ConversionStoppedError
            text = (page.extract_text() or "").strip()
            if text:
                pages.append(f"--- Page {number} ---\n{text}")
                total += len(text)
            if total > char_limit:
                break
        title = str((reader.metadata.title if reader.metadata else "") or "").strip()
    except _ConversionStoppedError:
        raise _PageError("the conversion was stopped") from None
    except Exception as exc:  # pypdf raises many kinds on bad files
        raise _PageError(f"the PDF could not be read ({type(exc).__name__})") from exc
    if not pages:
        raise _PageError("the PDF has no extractable text")
    return "\n\n".join(pages), title


# Main content is looked for only in pages of at most this many tags: the
# library's cost grows with the tags (up to ~100 µs each on hostile shapes),
# so a page costs the worker about two seconds at most. Real articles have a
# few thousand; bigger pages are read whole.
_MAIN_MAX_TAGS = 25_000
# Main content shorter than this (in characters, link targets not counted)
# means the library found none: the whole readable page is used.
_MIN_MAIN_CHARS = 250
# When this share of the main content was link text in the page that lost its
# link (the library drops links in tables and link lists), the page is an
# index, a list of results or a table of links: its links are its content, so
# the whole readable page is used. Articles lose under 0.1 (the page-reading
# benchmark's 91 pages); a front page of headlines over 0.5.
_MAX_LOST_LINK_SHARE = 0.25
_LINK_TARGET = re.compile(r"\]\([^()\s]*(?:\([^()\s]*\)[^()\s]*)*\)")
_ANCHOR = re.compile(r"\[([^\[\]\n]{1,500})\]\(")
_WORD = re.compile(r"\w+")


def _main_content(html: str, base_url: str) -> str:
    """The page's main content as Markdown with links ("" if none or no library).

    trafilatura (optional: installed with the package) drops navigation,
    footers, banners and related-article lists. It reads the tree
    `_cleaned_tree` leaves: what the whole-page reader would never show is
    gone first, whatever the library thinks of it. Its fast mode skips the
    fallback extractors, which cost time without better scores here
    (benchmarks/page_reading.py); `favor_recall` keeps borderline paragraphs.
    """
    if html.count("<") > _MAIN_MAX_TAGS:
        return ""
    try:
        import trafilatura  # noqa: PLC0415  (optional dependency)
    except Exception:  # absent, or broken (lxml without lxml_html_clean)
        return ""
    try:
        tree = trafilatura.load_html(html)
        if tree is None:
            return ""
        text = trafilatura.extract(
            _cleaned_tree(tree, base_url),
            url=base_url or None,
            output_format="markdown",
            include_links=True,
            include_tables=True,
            include_comments=True,
            include_images=False,
            fast=True,
            favor_recall=True,
        )
    except Exception:  # the library failed on this page: the whole page instead
        _debug("main content extraction failed")
        return ""
    if not isinstance(text, str):
        return ""
    return _TRAILING_SPACE.sub("\n", text).strip()


_TRAILING_SPACE = re.compile(r"[ \t]+\n")
# Never read as main content, as the whole-page reader never reads them:
# code, invisible or interactive parts. Navigation, asides, headers and
# footers are left to the library: it tells an article's own from the site's.
_NEVER_MAIN_TAGS = _SKIP_TAGS - {"nav", "aside"}


def _cleaned_tree(tree: Any, base_url: str) -> Any:
    """The lxml tree without what is never shown, its links absolute or gone.

    Hidden elements (the `hidden` attribute, `aria-hidden`, `display:none`)
    carry text no reader sees, a place for instructions aimed at the model.
    A link keeps its target only for http(s) URLs, resolved against the page
    (and its `<base href>`), as the whole-page reader does; other links
    (`javascript:`, in-page anchors) keep only their text.
    """
    for base in tree.iter("base"):
        if base.get("href"):
            base_url = _resolved(base_url, base.get("href") or "") or base_url
            break
    doomed, unlinked = [], []
    for element in tree.iter():
        tag = element.tag
        if not isinstance(tag, str):  # comments, processing instructions
            continue
        if tag.lower() in _NEVER_MAIN_TAGS or _hidden_element(element):
            doomed.append(element)
        elif tag.lower() == "a" and not _resolve_link(element, base_url):
            unlinked.append(element)
    for element in doomed:
        if element.getparent() is not None:
            element.drop_tree()  # keeps the text after it (its tail)
    for element in unlinked:
        if element.getparent() is not None:
            element.drop_tag()  # keeps its text and children
    return tree


def _hidden_element(element: Any) -> bool:
    """Whether the whole-page reader would skip this element as hidden."""
    return (
        element.get("hidden") is not None
        or (element.get("aria-hidden") or "").lower() == "true"
        or bool(_HIDDEN_STYLE.search(element.get("style") or ""))
    )


def _resolve_link(element: Any, base_url: str) -> bool:
    """Make a link's target absolute; False when it leads nowhere useful."""
    href = (element.get("href") or "").strip()
    target = _resolved(base_url, href) if href else ""
    if href.startswith("#") or urlsplit(target).scheme not in ("http", "https"):
        return False
    element.set("href", target)
    return True


def _plain_size(markdown: str) -> int:
    """Characters of text in Markdown, without link targets."""
    return len(_LINK_TARGET.sub("]", markdown))


def _lost_link_share(whole: str, main: str) -> float:
    """Share of `main` that was link text in `whole` and is no longer a link.

    Linear: a lost link counts when its first three words are three words of
    the main content in a row (shorter link texts, "Home", "user42", are
    never what makes a page an index).
    """
    words = _WORD.findall(_LINK_TARGET.sub("]", main))
    runs = set(zip(words, words[1:], words[2:], strict=False))
    kept = set(_ANCHOR.findall(main))
    lost = 0
    for anchor in set(_ANCHOR.findall(whole)) - kept:
        first = tuple(_WORD.findall(anchor)[:3])
        if len(first) == 3 and first in runs:
            lost += len(anchor)
    return lost / max(_plain_size(main), 1)


def _read_html(
    html: str,
    base_url: str,
    char_limit: int,
    read_whole: "Callable[[str, str, int], tuple[str, str]]" = _html_to_text,
    read_main: "Callable[[str, str], str] | None" = _main_content,
) -> tuple[str, str, str, int]:
    """(text, title, reading, page_chars): the main content, else the whole page.

    The whole page when the library found too little, dropped the links that
    make the page what it is, or saved nothing (a page that is all article
    reads better in the whole-page reader's own format).
    """
    whole, title = read_whole(html, base_url, char_limit)
    main = read_main(html, base_url) if read_main is not None else ""
    whole_complete = len(whole) < char_limit  # else the reader stopped early
    if (
        _plain_size(main) < _MIN_MAIN_CHARS
        or _lost_link_share(whole, main) >= _MAX_LOST_LINK_SHARE
        or (whole_complete and len(main) >= len(whole))
    ):
        return whole, title, "whole", len(whole)
    return main, title, "main", len(whole)


def _convert(
    raw: _RawPage,
    max_tokens: int,
    read_whole: "Callable[[str, str, int], tuple[str, str]]" = _html_to_text,
    read_main: "Callable[[str, str], str] | None" = _main_content,
    read_pdf: "Callable[[bytes, int], tuple[str, str]]" = _pdf_to_text,
) -> _Page:
    """Bytes -> `_Page` (in a worker process, or a thread: never on the loop)."""
    if not raw.body or raw.body.isspace():  # no copy of a multi-MB body
        raise _PageError("the page is empty")
    kind, label = _classify(raw.content_type, raw.body)
    char_limit = max_tokens * 5
    reading, page_chars = "document", 0
    if kind == "binary":
        raise _PageError(f"the URL points to {label}, not a readable page")
    if kind == "pdf":
        if raw.truncated:
            raise _PageError("the PDF is larger than the download limit")
        text, title = read_pdf(raw.body, char_limit)
    elif kind == "html":
        html = _decode(raw.body, raw.content_type, html=True)
        text, title, reading, page_chars = _read_html(
            html, raw.final_url, char_limit, read_whole, read_main
        )
    else:
        text, title = _decode(raw.body, raw.content_type, html=False).strip(), ""
    if not text.strip():
        raise _PageError("the page has no readable text")
    if reading == "document":
        page_chars = len(text)
    page = _Page(raw.final_url, title, text, raw.redirects, reading, page_chars)
    return _fitted(page, max_tokens, raw.truncated)


def _fitted(page: _Page, max_tokens: int, already_cut: bool = False) -> _Page:
    """The page cut to the token budget, with a note when anything was cut."""
    text, cut = _fit_budget(page.text, max_tokens)
    if cut or already_cut:
        text = f"{text}\n\n{TRUNCATION_NOTE}"
    return _Page(
        page.final_url,
        page.title,
        text,
        page.redirects,
        page.reading,
        page.page_chars,
    )


def _converter_main() -> None:
    """The converter worker: converts page after page until its stdin closes.

    After the program itself (read by `_CHILD_BOOT`), stdin holds one setup
    line ({"path": the server's sys.path, "warm": modules to import now, so
    every page after the first finds them loaded}); the worker answers
    "ready". Then, per page: a JSON header line (size, url, content_type,
    cut, max_tokens, seconds), the body, and one JSON answer line out:
    {"title", "text", "reading", "page_chars"}, or {"error"} when the page
    itself cannot be converted.
    A page error never ends the worker; the server kills it when a page takes
    too long, and `seconds` makes it end itself should the server be gone.
    """
    stdin = sys.stdin.buffer
    setup = json.loads(stdin.readline())
    sys.path[:] = setup["path"]  # import pypdf from where the server would
    for name in setup["warm"]:
        try:
            __import__(name)
        except Exception:  # optional: the page that needs it reports it
            _debug(f"no {name} in the converter")
    # From here on stderr goes nowhere: nobody drains the pipe while pages are
    # converted, and a library's warnings would fill it and block the worker.
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    _answer({"ready": True})
    while True:
        line = stdin.readline()
        if not line:
            return  # the server closed the pipe (or exited): so do we
        job = json.loads(line)
        raw = _RawPage(
            job["url"], stdin.read(job["size"]), job["content_type"], job["cut"]
        )
        if hasattr(signal, "alarm"):
            signal.alarm(job["seconds"])  # SIGALRM ends an orphaned worker
        try:
            page = _convert(raw, job["max_tokens"])
            answer = {
                "title": page.title,
                "text": page.text,
                "reading": page.reading,
                "page_chars": page.page_chars,
            }
        except _PageError as exc:
            answer = {"error": str(exc)}
        except Exception as exc:  # the page broke the converter: still a page error
            reason = type(exc).__name__
            answer = {"error": f"the page could not be converted ({reason})"}
        if hasattr(signal, "alarm"):
            signal.alarm(0)
        _answer(answer)


def _answer(answer: dict) -> None:
    # ASCII JSON: any text (lone surrogates from odd PDF fonts included) survives.
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
