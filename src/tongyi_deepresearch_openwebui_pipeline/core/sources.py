"""Sources the agent actually read, and citations that point only at them.

Every page the visit tool read becomes a numbered source (in the order it was
first read); the final answer's links and bare URLs are matched against them:

- a link to a page read in this run gets its citation number: ``[text](url) [3]``,
  which Open WebUI turns into a clickable chip showing the extracted evidence;
- a link to a page the agent never retrieved stays a link but is marked
  ``*(unverified)*`` so it is never presented as a source;
- bracketed numbers the model wrote itself (``[2]``) are escaped so Open WebUI
  does not turn them into chips pointing at an unrelated source.

Matching normalises URLs (scheme and host case, ``www.``, default ports,
trailing slashes, fragments, tracking parameters) and knows the redirects the
visit tool followed. `CitationRewriter` does this on a stream, holding back
only the few characters of a link or URL that is still being written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
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


@dataclass
class Source:
    """One page read in this run."""

    number: int
    url: str
    title: str
    evidence: str
    summary: str = ""
    aliases: set[str] = field(default_factory=set)


class SourceLedger:
    """The run's sources, in citation order."""

    def __init__(self) -> None:
        """Start empty."""
        self.sources: list[Source] = []
        #: Pages read successfully, re-reads included (sources are distinct).
        self.reads = 0
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

    def add_read_page(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """Record a tool's source event; return the event to emit, if new."""
        source = data.get("source") or {}
        metadata = (data.get("metadata") or [{}])[0] or {}
        url = str(
            metadata.get("url") or metadata.get("source") or source.get("url") or ""
        )
        if not url.startswith(("http://", "https://")):
            return None
        self.reads += 1
        documents = data.get("document") or [""]
        evidence = str(documents[0]) if documents else ""
        aliases = {normalise_url(url)}
        for extra in [metadata.get("final_url"), *(metadata.get("redirects") or [])]:
            if isinstance(extra, str) and extra:
                aliases.add(normalise_url(extra))
        known = next(
            (self._by_key[key] for key in aliases if key in self._by_key), None
        )
        if known is not None:
            # Read again (maybe for another goal): keep the richer evidence.
            if len(evidence) > len(known.evidence):
                known.evidence = evidence
            for key in aliases:
                self._by_key.setdefault(key, known)
            return None
        title = self._unique_title(
            str(source.get("name") or metadata.get("name") or ""), url
        )
        entry = Source(
            number=len(self.sources) + 1,
            url=url,
            title=title,
            evidence=evidence,
            summary=str(metadata.get("summary") or ""),
            aliases=aliases,
        )
        self.sources.append(entry)
        for key in aliases:
            self._by_key[key] = entry
        return source_event(entry)


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


# -- rewriting the answer --

_URL_PART = r"(?:[^()\s<>]|\([^()\s]*\))+"
_MD_LINK = re.compile(
    r"(!?)\[([^\[\]\n]*)\]\((<?https?://" + _URL_PART + r">?)(\s+\"[^\"]*\")?\)"
)
_BARE_URL = re.compile(
    r"<https?://[^\s<>]+>|(?<!\w)https?://(?:[^\s()\[\]<>\"']|\([^\s()]*\))+"
)
_MODEL_CITE = re.compile(r"(?<![\\\]])\[(\d{1,3}(?:\s*[,\-–]\s*\d{1,3})*)\](?!\()")
_URL_TRAILING = ".,;:!?'\"*_"


def _cite(source: Source | None) -> str:
    return f" [{source.number}]" if source else f" {UNVERIFIED_MARK}"


def _rewrite_complete(text: str, ledger: SourceLedger) -> str:
    """Rewrite a piece of text that holds no unfinished link or URL."""
    pieces: list[str] = []
    position = 0
    for match in _MD_LINK.finditer(text):
        pieces.append(_rewrite_plain(text[position : match.start()], ledger))
        link = match.group(0)
        if match.group(1):  # an image: leave it alone
            pieces.append(link)
        else:
            url = match.group(3).strip("<>")
            pieces.append(link + _cite(ledger.match(url)))
        position = match.end()
    pieces.append(_rewrite_plain(text[position:], ledger))
    return "".join(pieces)


def _rewrite_plain(text: str, ledger: SourceLedger) -> str:
    text = _MODEL_CITE.sub(r"\\[\1\\]", text)

    def bare(match: re.Match[str]) -> str:
        url = match.group(0)
        if url.startswith("<"):  # an autolink: <https://…>
            return url + _cite(ledger.match(url[1:-1]))
        trailing = ""
        while url and url[-1] in _URL_TRAILING:
            trailing = url[-1] + trailing
            url = url[:-1]
        return url + _cite(ledger.match(url)) + trailing

    return _BARE_URL.sub(bare, text)


def rewrite_answer(text: str, ledger: SourceLedger) -> str:
    """Rewrite a whole answer at once (same result as streaming it)."""
    rewriter = CitationRewriter(ledger)
    return rewriter.feed(text) + rewriter.flush()


class CitationRewriter:
    """Streaming `rewrite_answer`: ``feed`` pieces, then ``flush``."""

    def __init__(self, ledger: SourceLedger) -> None:
        """Rewrite against ``ledger``."""
        self._ledger = ledger
        self._pending = ""
        # The last character already released: the context that decides
        # whether what follows starts a new word (and so may start a URL).
        self._before = " "

    def feed(self, text: str) -> str:
        """Consume a piece; return what is now safe to show."""
        self._pending += text
        cut = self._safe_prefix_length(self._pending)
        return self._release(cut)

    def flush(self) -> str:
        """Release the rest."""
        return self._release(len(self._pending))

    def _release(self, cut: int) -> str:
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        if not ready:
            return ""
        rewritten = _rewrite_complete(self._before + ready, self._ledger)[1:]
        # Keep only what matters about the last character: is it a word
        # character (a URL cannot start right after it), or punctuation that
        # the patterns look at. A letter is kept as "a" so that it can never
        # join the next piece into a scheme ("h" + "ttps://").
        last = ready[-1]
        self._before = "a" if _word_char(last) else last
        return rewritten

    def _safe_prefix_length(self, text: str) -> int:
        """Length of the prefix that cannot be part of an unfinished link/URL.

        Holds back an unfinished ``[text](url)`` on the current line (links
        never span lines) and a URL, or the start of one, in the last word.
        """
        hold = len(text)
        bracket = text.rfind("[")
        if bracket >= 0 and _OPEN_LINK.match(text, bracket):
            hold = bracket
        url = _url_start(text, self._before)
        if url is not None:
            hold = min(hold, url)
        # Never cut through a finished link: its URL was matched as a whole.
        for link in _MD_LINK.finditer(text):
            if link.start() < hold < link.end():
                return link.start()
        return hold


def _url_start(text: str, previous: str) -> int | None:
    """Where a URL that may still be growing starts in ``text``, if anywhere."""
    word_start = max(text.rfind(" "), text.rfind("\n"), text.rfind("\t")) + 1
    word = text[word_start:]
    context = previous if word_start == 0 else " "
    starts = [match.start() - 1 for match in _SCHEME.finditer(context + word)]
    if starts:
        return word_start + max(starts[0], 0)
    for size in range(min(len(_LONGEST_SCHEME), len(word)), 0, -1):
        tail = word[-size:]
        before = word[-size - 1] if size < len(word) else context
        if _word_char(before):
            continue
        if any(scheme.startswith(tail) for scheme in _SCHEMES):
            return len(text) - size
    return None


def _word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


_SCHEMES = ("http://", "https://", "<http://", "<https://")
_LONGEST_SCHEME = "<https://"
_SCHEME = re.compile(r"<?(?<!\w)https?://")
# An opening bracket whose link may still be growing: "[te", "[text]", "[t](htt".
_OPEN_LINK = re.compile(
    r"\[[^\[\]\n]*(\](\((?:[^()\s]|\([^()\s]*\))*(\([^()\s]*)?(\s+\"[^\"\n]*\"?)?)?)?$"
)
