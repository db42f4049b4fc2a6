"""Sources the agent actually read, and citations that point only at them.

A page a tool read reaches the core as a `PageRead` (the front end's adapter
makes it from the tool's result). The run engine's `SourceLedger` makes each
distinct page a numbered source (in the order it was first read) and says so
in events; a renderer keeps its own `SourceBook` of them, learnt from those
events. The final answer's links and bare URLs are matched against them:

- a link to a page read in this run gets its citation number: ``[text](url) [3]``,
  which Open WebUI turns into a clickable chip showing the extracted evidence;
- a link to a page the agent never retrieved stays a link but is marked
  ``*(unverified)*`` so it is never presented as a source;
- bracketed numbers the model wrote itself (``[2]``) are escaped so Open WebUI
  does not turn them into chips pointing at an unrelated source, unless they
  are the text of a link that gets cited (too long, non-http and reference
  links are escaped too);
- after a citation it inserts, a following ``(`` or ``[`` is escaped, so the
  rewriter never creates link syntax itself;
- ``[`` and ``]`` in a URL are percent-encoded (but around an IPv6 host) and
  numbers in a link's title escaped, so no ``[7]`` hides there either.

Matching normalises URLs (scheme and host case, ``www.``, default ports,
trailing slashes, fragments, tracking parameters) and knows the redirects the
visit tool followed. `CitationRewriter` does this on a stream, holding back
only the few characters of a link or URL that is still being written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

UNVERIFIED_MARK = "*(unverified)*"

_TRACKING_PARAMS = re.compile(
    r"^(utm_[a-z_]+|fbclid|gclid|dclid|msclkid|mc_[a-z]+|igshid|_hs[a-z]+|ref_src|"
    r"spm|yclid|oly_[a-z_]+|vero_[a-z_]+)$",
    re.IGNORECASE,
)
_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalise_url(url: str) -> str:
    """A comparison key for ``url`` (not a URL to fetch)."""
    url = url.strip().strip("<>")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return url
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower().removeprefix("www.")
    if port and _DEFAULT_PORTS.get(scheme) != port:
        host = f"{host}:{port}"
    path = re.sub(r"/{2,}", "/", parts.path).rstrip("/")
    query = [
        (key, value)
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
        if not _TRACKING_PARAMS.match(key)
    ]
    scheme = "https" if scheme in ("http", "https") else scheme
    return urlunsplit((scheme, host, path, urlencode(sorted(query)), ""))


#: What a page's address starts with (anything else is not a page read).
PAGE_SCHEMES = ("http://", "https://")


def is_page_url(url: str) -> bool:
    """Whether ``url`` is an http(s) address, the only kind a page read has."""
    return url.startswith(PAGE_SCHEMES)


@dataclass(frozen=True)
class PageRead:
    """A page a tool read, as the core knows it.

    A front end's adapter makes one from what its tool returned, once (Open
    WebUI's tools say it as a source event's ``data``: `toolbox.page_read`);
    the core never reads a tool's own format.
    """

    #: The address the model asked for (http or https).
    url: str
    title: str = ""
    #: What the tool found on the page for the goal (shown with a citation).
    evidence: str = ""
    #: The tool's one-line summary of the page, if it wrote one.
    summary: str = ""
    #: Where the request ended after redirects ("" when it did not move).
    final_url: str = ""
    #: The addresses it was redirected through.
    redirects: tuple[str, ...] = ()
    #: What the page was read for.
    goal: str = ""

    def __post_init__(self) -> None:
        """Refuse an address that is not a page's (the type's one promise)."""
        if not is_page_url(self.url):
            raise ValueError(f"not an http(s) page: {self.url[:80]!r}")

    def citation_keys(self) -> list[str]:
        """The comparison keys of every address the page was reached by.

        In order (the URL asked for, where it ended, the redirects between),
        each once: an earlier one decides which known source a page is.
        """
        addresses = (self.url, self.final_url, *self.redirects)
        keys = (normalise_url(address) for address in addresses if address)
        return list(dict.fromkeys(keys))


@dataclass(frozen=True)
class Paper:
    """A scholarly record a search found: what an export needs to cite it.

    The front end's adapter makes one from the scholar tool's result; a
    source read at the paper's ``url`` (or ``pdf``) is exported as the paper.
    """

    url: str
    title: str = ""
    pdf: str = ""
    authors: tuple[str, ...] = ()
    year: str = ""
    venue: str = ""
    doi: str = ""

    def addresses(self) -> list[str]:
        """The comparison keys of every address the paper is read at."""
        return [normalise_url(a) for a in (self.url, self.pdf) if is_page_url(a)]


@dataclass
class Source:
    """One page read in this run.

    ``aliases`` are the comparison keys (`normalise_url`) of every address
    that cites it: its URL's, the redirects it was reached by, and those of
    later reads that reached it again from elsewhere.
    """

    number: int
    url: str
    title: str
    evidence: str
    summary: str = ""
    aliases: set[str] = field(default_factory=set)
    #: The heavy run's rollouts that read it (empty in a single run).
    readers: set[int] = field(default_factory=set)

    def citation_keys(self) -> list[str]:
        """Every comparison key that cites it, its URL's first."""
        return [normalise_url(self.url), *sorted(self.aliases)]


@dataclass(frozen=True)
class Recorded:
    """What recording one page read did to the ledger.

    ``source`` is the page's source; ``new`` says the page was read for the
    first time (it got its number now); ``readdressed`` says an earlier
    source is now cited from an address it was not before.
    """

    source: Source
    new: bool = False
    readdressed: bool = False


class Citations(Protocol):
    """What the citation rewriter asks of the run's sources."""

    def match(self, url: str) -> Source | None:
        """The source ``url`` cites, if any."""
        ...


#: Most scholarly records a run keeps for its exports (the first found).
MAX_PAPERS = 500


class SourceLedger:
    """The run's sources, in citation order: the run engine's, numbered once."""

    def __init__(self) -> None:
        """Start empty."""
        self.sources: list[Source] = []
        #: Pages read successfully, re-reads included (sources are distinct).
        self.reads = 0
        #: Scholarly records the run's searches found, by URL (for exports,
        #: and kept by a checkpoint so a resumed run still has them).
        self.papers: dict[str, Paper] = {}
        self._by_key: dict[str, Source] = {}
        self._titles: set[str] = set()

    def __len__(self) -> int:
        """Number of sources read."""
        return len(self.sources)

    def match(self, url: str) -> Source | None:
        """The source for ``url`` (or any URL that redirected to it)."""
        return self._by_key.get(normalise_url(url))

    def _unique_title(self, title: str, url: str) -> str:
        # Open WebUI 0.6 merges sources with equal labels, which would shift
        # every citation number after them.
        title = " ".join(title.split()) or urlsplit(url).netloc or url
        candidate, counter = title, 2
        while candidate in self._titles:
            candidate = f"{title} ({counter})"
            counter += 1
        self._titles.add(candidate)
        return candidate

    def keep_papers(self, papers: Iterable[Paper]) -> None:
        """Keep the scholarly records a search found (the first of each URL)."""
        for paper in papers:
            if len(self.papers) >= MAX_PAPERS:
                return
            self.papers.setdefault(paper.url, paper)

    def restore(
        self, sources: Iterable[Source], reads: int, papers: Iterable[Paper] = ()
    ) -> None:
        """Take back a checkpoint's ``sources``, their numbers and titles kept."""
        self.keep_papers(papers)
        for source in sources:
            self.sources.append(source)
            self._titles.add(source.title)
            for key in source.citation_keys():
                self._by_key.setdefault(key, source)
        self.reads = reads

    def record(self, page: PageRead, reader: int = 0) -> Recorded:
        """Record a page read: a new source, or the one it was read as before.

        `reader` is the heavy run's rollout that read the page (0: none).
        """
        self.reads += 1
        keys = page.citation_keys()
        known = next((self._by_key[key] for key in keys if key in self._by_key), None)
        if known is None:
            return Recorded(self._new_source(page, keys, reader), new=True)
        # Read again (maybe for another goal): keep the richer evidence.
        if len(page.evidence) > len(known.evidence):
            known.evidence = page.evidence
        if reader:
            known.readers.add(reader)
        # An address another source already holds stays that source's.
        learned = [key for key in keys if key not in self._by_key]
        for key in learned:
            self._by_key[key] = known
        known.aliases.update(learned)
        return Recorded(known, readdressed=bool(learned))

    def _new_source(self, page: PageRead, keys: list[str], reader: int) -> Source:
        entry = Source(
            number=len(self.sources) + 1,
            url=page.url,
            title=self._unique_title(page.title, page.url),
            evidence=page.evidence,
            summary=page.summary,
            aliases=set(keys),
            readers={reader} if reader else set(),
        )
        self.sources.append(entry)
        for key in keys:
            self._by_key[key] = entry
        return entry


class SourceBook:
    """A front end's own copy of the run's sources, learnt from its events.

    The run engine's `SourceLedger` numbers the pages; a renderer is told of
    each source by the events (`SourcesAdded`, `AliasesAdded`, `RunResumed`,
    `RunFinished`) and adds it here, where the citation rewriter looks URLs
    up. An address cites the source the ledger gave it (the ledger never
    gives one to two; where a checkpoint does, the first told keeps it, as
    the ledger's `restore` does).
    """

    def __init__(self, sources: Iterable[Source] = ()) -> None:
        """Start with ``sources`` (those a finished run's end carries)."""
        self._by_number: dict[int, Source] = {}
        self._numbers: dict[str, int] = {}
        self.add(sources)

    def __len__(self) -> int:
        """Number of sources known."""
        return len(self._by_number)

    @property
    def sources(self) -> list[Source]:
        """The sources in citation order."""
        return [self._by_number[number] for number in sorted(self._by_number)]

    def add(self, sources: Iterable[Source]) -> None:
        """Learn ``sources``: new ones, or known ones cited from more addresses."""
        for source in sorted(sources, key=lambda source: source.number):
            self._by_number[source.number] = source
            for key in source.citation_keys():
                self._numbers.setdefault(key, source.number)

    def match(self, url: str) -> Source | None:
        """The source for ``url`` (or any URL that redirected to it)."""
        number = self._numbers.get(normalise_url(url))
        return None if number is None else self._by_number[number]


# -- rewriting the answer --

#: Longest Markdown link (from its "[" to its ")") and bare URL that get a
#: citation; longer ones are left as written. They also bound what the
#: streaming rewriter holds back.
MAX_LINK_CHARS = 2048
MAX_URL_CHARS = 2048
_GROUP = r"\([^()\s]{0,256}\)"  # "(planet)" inside a URL
_URL_PART = r"(?:[^()\s<>]|" + _GROUP + r"){1,2048}"
_MD_LINK = re.compile(
    r"(!?)\[([^\[\]\n]{0,2048})\]\((<?https?://"
    + _URL_PART
    + r">?)([ \t]+\"[^\"\n]{0,2048}\")?\)"
)
_URL_CHARS = r"(?:[^\s()\[\]<>\"']|" + _GROUP + r")"
_BARE_URL = re.compile(
    r"<https?://[^\s<>]{1,2048}>|(?<!\w)https?://" + _URL_CHARS + r"++"
)
#: What continues a URL from the start of a text (after an over-long one).
_URL_CONTINUATION = re.compile(_URL_CHARS + r"*+")
#: An unclosed "(" at the end of a URL that may still become a group.
_PARTIAL_GROUP = re.compile(r"\([^()\s]{0,256}")
_OPEN_AUTOLINK = re.compile(r"<https?://[^\s<>]*")
_IMAGE_BRACKET = re.compile(r"(?<=!)\[")
_URL_TRAILING = ".,;:!?'\"*_"

#: Tags Open WebUI or the browser would act on: reasoning blocks and cards it
#: parses out of the text, and elements that load remote content. A "<"
#: starting one gets a zero-width space after it and shows as plain text.
_ACTIVE_TAG = re.compile(
    r"<(?=\||/?(?:details|summary|think|thinking|reason|reasoning|thought|img|"
    r"image|picture|source|video|audio|iframe|frame|frameset|embed|object|svg|"
    r"math|link|style|script|input|base|meta|track|form|body)(?![\w-]))",
    re.IGNORECASE,
)
#: The end of a text that may still become such a tag: "<", "</de", "<im".
_TAG_TAIL = re.compile(r"</?[A-Za-z]{0,12}$")
ZERO_WIDTH_SPACE = "\u200b"
_REASONING_MARK = str.maketrans({"◁": "◁" + ZERO_WIDTH_SPACE})


#: "[" and "]" in a URL the rewriter passes on. RFC 3986 allows them only
#: around an IPv6 host; anywhere else a "(…)" group lets the model put its own
#: "[7]" inside a URL ("https://x.org/y([7])"), where it would stay live text.
_URL_BRACKETS = str.maketrans({"[": "%5B", "]": "%5D"})
#: A URL's IPv6 host ("http://[::1]/", "<https://user@[2001:db8::1]:8080/"):
#: its brackets are kept. The ":" it needs means it is never a number.
_IPV6_HOST = re.compile(
    r"<?https?://(?:[^/?#@\[\]\s]*@)?\[[\w.%~-]*:[\w:.%~-]*\]", re.IGNORECASE
)


def _encode_brackets(url: str) -> str:
    """``url`` with "[" and "]" percent-encoded, but around an IPv6 host."""
    host = _IPV6_HOST.match(url)
    kept = host.end() if host else 0
    return url[:kept] + url[kept:].translate(_URL_BRACKETS)


def _cite(source: Source | None) -> str:
    return f" [{source.number}]" if source else f" {UNVERIFIED_MARK}"


class _Output:
    """Rewritten text, piece by piece, that never turns a citation into markup.

    A "(" or "[" right after a citation the rewriter inserted (" [n]" or the
    unverified mark) would make it link syntax: "https://x [2]( evil)" is a
    link labelled "2", and so is "[2][ref]" when the text defines "[ref]:".
    It is escaped, here and (`CitationRewriter._after_citation`) at the start
    of the next text released.
    """

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.after_citation = False

    def add(self, piece: str, *, citation: bool = False) -> None:
        if not piece:
            return
        if self.after_citation:
            piece = _escape_after_citation(piece)
        self.pieces.append(piece)
        self.after_citation = citation

    def text(self) -> str:
        return "".join(self.pieces)


def _escape_after_citation(text: str) -> str:
    """``text`` as it may follow an inserted citation: no "(" or "[" first."""
    return "\\" + text if text.startswith(("(", "[")) else text


def _links(text: str) -> list[re.Match[str]]:
    """The Markdown links/images in ``text``, left to right, none too long."""
    found: list[re.Match[str]] = []
    position = 0
    while (match := _MD_LINK.search(text, position)) is not None:
        bracket = match.start() + len(match.group(1))
        if match.end() - bracket > MAX_LINK_CHARS:
            position = match.start() + 1  # not a link: its "[" is plain text
            continue
        found.append(match)
        position = match.end()
    return found


def _rewrite_complete(text: str, citations: Citations) -> tuple[str, bool]:
    """Rewrite a piece of text that holds no unfinished link or URL.

    Also says whether the result ends with an inserted citation (what
    follows it must then not start with "(" or "[").
    """
    out = _Output()
    position = 0
    for match in _links(text):
        _rewrite_plain(text[position : match.start()], citations, out)
        _rewrite_link(match, citations, out)
        position = match.end()
    _rewrite_plain(text[position:], citations, out)
    rewritten = _ACTIVE_TAG.sub("<" + ZERO_WIDTH_SPACE, out.text())
    return rewritten, out.after_citation


def _rewrite_link(match: re.Match[str], citations: Citations, out: _Output) -> None:
    image, text, target, title = match.group(1, 2, 3, 4)
    source = citations.match(target.strip("<>"))  # matched as written
    target = _encode_brackets(target)
    if not image or source is not None:
        # A link, or an image the agent itself read: its title stays inside
        # it, where Markdown shows an escaped "\[7\]" as "[7]".
        out.add(f"{image}[{text}]({target}{_escape_numbers(title or '')})")
        if not image:
            out.add(_cite(source), citation=True)
        return
    # Any other remote image would be fetched by the browser as the chat
    # renders: a page can ask the model to put data in its URL. It is shown
    # as text (the URL stays visible and clickable), never loaded; its title
    # is then text too, rewritten as such (an image in it stays no image).
    out.add(f"!\\[{text}\\]({target}")
    _rewrite_plain(title or "", citations, out)
    out.add(")")
    out.add(f" {UNVERIFIED_MARK}", citation=True)


#: A number the model wrote in brackets ("[2]", "[1-3]", "[2, 4]") and did
#: not escape (an odd run of backslashes before it does). Whatever follows or
#: precedes it: "[2](…)" here is a link that gets no citation (too long, not
#: to an http(s) page), "][2][ref]" a reference link, "\\[2]" a citation.
_MODEL_NUMBER = re.compile(r"(?<!\\)((?:\\\\)*)\[(\d{1,3}(?:\s*[,\-–]\s*\d{1,3})*)\]")


def _escape_numbers(text: str) -> str:
    """``text`` with every "[n]" the model wrote (and did not escape) escaped."""
    return _MODEL_NUMBER.sub(r"\1\\[\2\\]", text)


def _escape_plain(text: str, before: str) -> str:
    """Escape the model's own "[n]" and stray "![" in text between URLs.

    ``before`` is what precedes ``text`` as far as the patterns look back (see
    `_context_before`), so escaping a segment gives what escaping the whole
    would. Every "[n]" here is the model's own: links that get a citation
    never reach this text.
    """
    text = _escape_numbers(before + text)
    # "![" that is not a complete image link (reference images and the like).
    text = _IMAGE_BRACKET.sub(r"\\[", text)
    return text[len(before) :]


def _context_before(text: str, position: int) -> str:
    """What escaping ``text[position:]`` needs to know of ``text[:position]``.

    Its last character, but a run of backslashes by its parity: one if odd
    (the next character is escaped), two if even.
    """
    start = position
    while start and text[start - 1] == "\\":
        start -= 1
    if start < position:
        return "\\" * (2 - (position - start) % 2)
    return text[position - 1] if position else ""


def _context_after(text: str, previous: str) -> str:
    """The context released ``text`` (after context ``previous``) leaves.

    A word character is kept as "a", a run of backslashes by its parity (it
    may continue one released before), any other character as itself.
    """
    run = len(text) - len(text.rstrip("\\"))
    if run == len(text) and previous.startswith("\\"):
        run += len(previous)
    if run:
        return "\\" * (2 - run % 2)
    return "a" if _word_char(text[-1]) else text[-1]


def _rewrite_plain(text: str, citations: Citations, out: _Output) -> None:
    # URLs are found in the text as written, before anything is escaped: an
    # inserted backslash must never become part of a URL.
    position = 0
    for match in _BARE_URL.finditer(text):
        before = _context_before(text, position)
        out.add(_escape_plain(text[position : match.start()], before))
        _cite_bare(match.group(0), citations, out)
        position = match.end()
    out.add(_escape_plain(text[position:], _context_before(text, position)))


def _cite_bare(url: str, citations: Citations, out: _Output) -> None:
    if len(url) > MAX_URL_CHARS:
        out.add(_encode_brackets(url))  # too long to cite: passed on
        return
    if url.startswith("<"):  # an autolink: <https://…>
        out.add(_encode_brackets(url))
        out.add(_cite(citations.match(url[1:-1])), citation=True)
        return
    trailing = ""
    while url and url[-1] in _URL_TRAILING:
        trailing = url[-1] + trailing
        url = url[:-1]
    out.add(_encode_brackets(url))
    out.add(_cite(citations.match(url)), citation=True)
    out.add(trailing)


def rewrite_answer(text: str, citations: Citations) -> str:
    """Rewrite a whole answer at once (same result as streaming it)."""
    rewriter = CitationRewriter(citations)
    return rewriter.feed(text) + rewriter.flush()


class CitationRewriter:
    """Streaming `rewrite_answer`: ``feed`` pieces, then ``flush``.

    Work is amortised linear in the input: held-back text (at most about
    `MAX_LINK_CHARS`) is examined again at once only while it is short, and
    otherwise only after as much new text again has arrived. Releasing later
    never changes the output, only when it appears.
    """

    #: Held-back text this short is re-examined on every piece.
    RECHECK_AT_ONCE = 64

    def __init__(self, citations: Citations) -> None:
        """Rewrite against ``citations``."""
        self._citations = citations
        self._pending = ""
        self._arrived: list[str] = []
        self._unexamined = 0
        # What matters of the text already released (`_context_after`): its
        # last character decides whether what follows starts a new word (and
        # so may start a URL); a run of backslashes, whether it escapes it.
        self._before = " "
        # The released text ends inside a URL too long to cite, which the
        # next text may continue.
        self._in_long_url = False
        # The released text ends with a citation the rewriter inserted: the
        # next text must not start with "(" or "[" (see `_Output`).
        self._after_citation = False

    def feed(self, text: str) -> str:
        """Consume a piece; return what is now safe to show."""
        if not text:
            return ""
        self._arrived.append(text)
        self._unexamined += len(text)
        held = len(self._pending)
        if held > self.RECHECK_AT_ONCE and self._unexamined < held:
            return ""
        return self._release_safe(final=False)

    def flush(self) -> str:
        """Release the rest."""
        return self._release_safe(final=True)

    def _take_arrived(self) -> None:
        if self._arrived:
            self._pending += "".join(self._arrived)
            self._arrived = []
        self._unexamined = 0

    def _release_safe(self, *, final: bool) -> str:
        self._take_arrived()
        out = ""
        if self._in_long_url:
            out = self._continue_long_url(final=final)
            if self._in_long_url:
                return out
        if final:
            return out + self._release(len(self._pending))
        cut, long_url = self._safe_prefix(self._pending)
        out += self._release(cut)
        self._in_long_url = long_url
        return out

    def _continue_long_url(self, *, final: bool) -> str:
        """Pass on, unchanged, the rest of a URL too long to cite."""
        text = self._pending
        continuation = _URL_CONTINUATION.match(text)  # matches "" at least
        end = continuation.end() if continuation else 0
        partial = _PARTIAL_GROUP.fullmatch(text, end)
        still_growing = end == len(text) or partial is not None
        # An unclosed "(" at the end stays held: it decides where the URL ends.
        if final or not still_growing:
            self._in_long_url = False
        ready, self._pending = text[:end], text[end:]
        if ready:
            self._after_citation = False  # a URL too long to cite gets none
            self._before = _context_after(ready, self._before)
        # The continuation never holds the URL's host: all its brackets go.
        return ready.translate(_URL_BRACKETS).translate(_REASONING_MARK)

    def _release(self, cut: int) -> str:
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        if not ready:
            return ""
        # The context (one or two characters) is rewritten with the text and
        # cut off again: each comes out as itself, a tag's "<" included (the
        # zero-width space after it stays with the text).
        before = self._before
        rewritten, cited = _rewrite_complete(before + ready, self._citations)
        rewritten = rewritten[len(before) :]
        if self._after_citation:
            rewritten = _escape_after_citation(rewritten)
        self._after_citation = cited
        # Keep only what matters about the end: is it a word character (a URL
        # cannot start right after it), punctuation that the patterns look
        # at, or backslashes. A letter is kept as "a" so that it can never
        # join the next piece into a scheme ("h" + "ttps://").
        self._before = _context_after(ready, before)
        return rewritten.translate(_REASONING_MARK)

    def _safe_prefix(self, text: str) -> tuple[int, bool]:
        """(length of the prefix safe to release, whether it ends in a long URL).

        Holds back an unfinished ``[text](url)`` on the current line (links
        never span lines), a URL that may still grow, the start of a scheme
        or of a tag in the last few characters — each bounded in length.
        """
        hold = len(text)
        bracket = _open_link(text)
        if bracket >= 0:
            # An image's "!" belongs to its link: released alone, it could end
            # a URL just before it ("https://x!"), which the finished link
            # would not have.
            hold = bracket - 1 if bracket and text[bracket - 1] == "!" else bracket
        word_start = max(text.rfind(" "), text.rfind("\n"), text.rfind("\t")) + 1
        autolink = text.rfind("<", word_start)
        if (
            autolink >= 0
            and len(text) - autolink <= MAX_URL_CHARS + 2
            and _OPEN_AUTOLINK.fullmatch(text, autolink)
        ):
            hold = min(hold, autolink)
        growing = _growing_url(text, word_start, self._before[-1])
        if growing is not None:
            start, end = growing
            if end - start <= MAX_URL_CHARS:
                hold = min(hold, start)
            elif hold > start:
                # Too long to cite: release it, and pass on its continuation.
                return end, True
        hold = min(hold, _partial_tail(text, word_start, self._before[-1]))
        hold = min(hold, _scheme_then_open_group(text, word_start, self._before[-1]))
        # Never cut through a finished link or URL: each was matched as a whole
        # ("<https://x[a](>" is one autolink, whatever "[a](" becomes, and
        # "https://x!" one URL, whether or not "![" becomes an image).
        finished = [*_MD_LINK.finditer(text), *_BARE_URL.finditer(text)]
        for span in sorted(finished, key=lambda match: match.start(), reverse=True):
            if span.start() < hold < span.end():
                hold = span.start()  # spans starting later cannot hold it now
        return hold, False


def _growing_url(text: str, word_start: int, previous: str) -> tuple[int, int] | None:
    """(start, end) of a bare URL in the last word that may still grow.

    A URL grows if it reaches the end of the text, or if an unclosed "(" that
    may still become a group follows it to the end. That unclosed group can
    hold URLs of its own ("https://b.org/y(https://b.org/y"): the first URL
    that may grow is the one held back, or releasing it would end it before a
    group that the whole text gives it.
    """
    context = previous if word_start == 0 else " "
    probe = context + text[word_start:]
    # The only "(" that may still open a group: the last one, if nothing after
    # it (")", "(", whitespace, too many characters) rules the group out.
    paren = probe.rfind("(")
    if paren < 0 or _PARTIAL_GROUP.fullmatch(probe, paren) is None:
        paren = len(probe)
    for match in _BARE_URL.finditer(probe):
        end = match.end()
        if match.group(0).startswith("<") or end not in (paren, len(probe)):
            continue  # an autolink's ">" ends it; so does anything but "("
        offset = word_start - 1
        return max(match.start() + offset, 0), end + offset
    return None


def _open_link(text: str) -> int:
    """Where the first "[" whose link may still be growing starts (-1: none).

    Only the last "[" can still be in its link text ("[te", "[text]"). An
    earlier one needs a "](" whose URL runs to the end, and that URL may hold
    brackets: "[a](https://b.org/y[2" is one link, not "[2" after a URL. The
    URL (then maybe a title) ends the text, so its "(" is found from the end.
    """
    low = max(0, len(text) - MAX_LINK_CHARS)
    starts = [text.rfind("[", low)]
    if text.find("](", low) < 0:
        return starts[0] if starts[0] >= 0 and _OPEN_LINK.match(text, starts[0]) else -1
    for end in _url_ends(text, low):
        for paren in _link_parens(text, end, low):
            if paren > low and text[paren - 1] == "]":
                starts.append(text.rfind("[", low, paren - 1))
    opened = [start for start in starts if start >= 0 and _OPEN_LINK.match(text, start)]
    return min(opened, default=-1)


def _url_ends(text: str, low: int) -> set[int]:
    """Where an open link's URL may end: at the end, or before a title."""
    blanks_start = low + len(text[low:].rstrip(" \t"))
    ends = {len(text), blanks_start}
    # A title's opening quote is the last one, or the one before the closing
    # quote that (but for blanks) ends the text.
    last = text.rfind('"', low)
    openers = [last]
    if last >= 0 and last + 1 == blanks_start:
        openers.append(text.rfind('"', low, last))
    for quote in openers:
        if quote > low:
            ends.add(low + len(text[low:quote].rstrip(" \t")))
    return ends


def _link_parens(text: str, end: int, low: int) -> list[int]:
    """Where the "(" of a link whose URL ends at ``end`` may be.

    Read from its end, a URL is: maybe an unclosed "(", then characters and
    "(…)" groups. The link's "(" is that unclosed one or the first "(" that
    cannot open a group; the text between it and ``end`` is then a URL.
    """
    found: list[int] = []
    unclosed_allowed, in_group = True, False
    marks = [mark.start() for mark in _PAREN_OR_SPACE.finditer(text, low, end)]
    for index in reversed(marks):
        char = text[index]
        if char not in "()":
            break  # whitespace: no URL reaches back over it
        if char == ")":
            if in_group:
                break  # "))": no group closes the first, so no URL holds it
            in_group, unclosed_allowed = True, False
        elif char == "(":
            if in_group:
                in_group = False
                continue
            found.append(index)
            if not unclosed_allowed:
                break
            unclosed_allowed = False
    return found


_PAREN_OR_SPACE = re.compile(r"[()\s]")


def _scheme_then_open_group(text: str, word_start: int, previous: str) -> int:
    """Where "https://(x" starts at the end: the "(…)" may make it a URL yet."""
    context = previous if word_start == 0 else " "
    match = _SCHEME_OPEN_GROUP.search(context + text[word_start:])
    return len(text) if match is None else word_start + match.start() - 1


_SCHEME_OPEN_GROUP = re.compile(r"(?<!\w)https?://\([^()\s]{0,256}$")


def _partial_tail(text: str, word_start: int, previous: str) -> int:
    """Where a scheme ("htt") or a tag ("<ifr") may be starting at the end."""
    tag = _TAG_TAIL.search(text, max(0, len(text) - 16))
    hold = tag.start() if tag else len(text)
    word = text[word_start:]
    context = previous if word_start == 0 else " "
    for size in range(min(len(_LONGEST_SCHEME), len(word)), 0, -1):
        tail = word[-size:]
        before = word[-size - 1] if size < len(word) else context
        if _word_char(before) and not tail.startswith("<"):
            continue  # "xhttp" starts no URL, but "x<https://…>" is an autolink
        if any(scheme.startswith(tail) for scheme in _SCHEMES):
            return min(hold, len(text) - size)
    return hold


def _word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


_SCHEMES = ("http://", "https://", "<http://", "<https://")
_LONGEST_SCHEME = "<https://"
# An opening bracket whose link may still be growing: "[te", "[text]", "[t](htt".
_OPEN_LINK = re.compile(
    r"\[[^\[\]\n]*(\](\((?:[^()\s]|\([^()\s]*\))*(\([^()\s]*)?"
    r"([ \t]+(\"[^\"\n]*\"?[ \t]*)?)?)?)?$"
)
