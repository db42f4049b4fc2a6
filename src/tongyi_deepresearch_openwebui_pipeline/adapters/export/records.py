r"""What an export holds: one `ExportSource` per numbered source, made safe once.

Every writer (`bibtex`, `ris`, `csl_json`, `report`) reads the same records,
so the formats agree with each other and with the answer's ``[n]``: source
``n`` is the entry keyed ``ref{n}`` in every file.

A record is cleaned when it is made, the same way for every format, and the
writers then only encode it for their syntax:

- text fields (title, site, venue, authors, year): lone surrogates become
  U+FFFD (UTF-8 cannot hold them), control characters go, every run of
  whitespace (newlines included) becomes one space, and the field is cut to
  its cap with "…". So no field can start a line of a line-based format (RIS)
  or hide in a multi-line value;
- URL and DOI: control characters and surrounding spaces go, the characters
  RFC 3986 never allows in a URL (space, ``"<>\^`{|}``) are percent-encoded,
  so a URL cannot close a brace, an autolink or a line; a valid URL (query
  strings, ``%``, ``#`` included) is kept byte for byte. One longer than its
  cap is left out rather than cut: a cut URL points somewhere else.
"""

from __future__ import annotations

import datetime
import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import quote, urlsplit

from ...core.sources import Source, normalise_url

#: Caps, in characters, of each field of a record (longer text is cut to the
#: cap, with "…" as its last character).
TITLE_CHARS = 1000
SITE_CHARS = 300
VENUE_CHARS = 300
AUTHOR_CHARS = 200
YEAR_CHARS = 32
#: Authors kept per record (the first ones; large collaborations list thousands).
MAX_AUTHORS = 100
#: Longest URL and DOI kept; a longer one is left out (never cut).
URL_CHARS = 4096
DOI_CHARS = 256

ELLIPSIS = "…"
REPLACEMENT_CHARACTER = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
#: Control characters (Unicode category Cc) that are not whitespace: they go.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]")
#: Every control character (whitespace ones too): none belongs in a URL.
_URL_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: What a URL may not hold as is (RFC 3986 never allows them, nor any
#: whitespace): percent-encoded.
_URL_UNSAFE = re.compile(r'[\s"<>\\^`{|}]')
_DOI_PREFIX = re.compile(r"^(?:https?://(?:dx\.)?doi\.org/|doi:)", re.IGNORECASE)

Kind = Literal["article", "webpage"]


def replace_surrogates(text: str) -> str:
    """``text`` with each lone surrogate as U+FFFD, so UTF-8 can encode it."""
    return _SURROGATE.sub(REPLACEMENT_CHARACTER, text)


def clean_text(text: str, cap: int) -> str:
    """``text`` as one line of at most ``cap`` characters (see the module note).

    Args:
        text: Any text (a title, a name, a site).
        cap: The most characters kept; a longer result ends in "…".

    Returns:
        The text without control characters or lone surrogates, its
        whitespace folded to single spaces, stripped and capped.
    """
    text = _CONTROL.sub("", replace_surrogates(text))
    text = " ".join(text.split())
    if len(text) <= cap:
        return text
    return text[: cap - 1].rstrip() + ELLIPSIS


def clean_url(url: str, cap: int = URL_CHARS) -> str:
    """``url`` safe in every format, or "" when it is longer than ``cap``.

    Args:
        url: An address as a tool reported it.
        cap: The longest URL kept.

    Returns:
        The URL without control characters, surrounding spaces or lone
        surrogates (U+FFFD), with the characters no URL may hold
        percent-encoded; a valid URL comes back unchanged.
    """
    url = _URL_CONTROL.sub("", replace_surrogates(url)).strip()
    if len(url) > cap:  # before encoding: the work stays bounded by the cap
        return ""
    url = _URL_UNSAFE.sub(lambda match: quote(match.group(), safe=""), url)
    return url if len(url) <= cap else ""


def clean_doi(doi: str) -> str:
    """``doi`` cleaned as a URL, without a resolver's prefix ("" if too long).

    The scholar backends give a DOI bare (``10.1000/x``) or as its resolver's
    URL (``https://doi.org/10.1000/x``); the formats want it bare.
    """
    doi = _DOI_PREFIX.sub("", clean_url(doi))
    return doi if len(doi) <= DOI_CHARS else ""


def site_of(url: str) -> str:
    """The host of ``url`` ("" when it has none)."""
    try:
        return urlsplit(url).hostname or ""
    except ValueError:  # an unbalanced "[" of an IPv6 host
        return ""


@dataclass(frozen=True)
class Name:
    """An author: a person's family and given names, or one literal name."""

    family: str = ""
    given: str = ""
    #: A name taken whole (an organisation, a name whose parts are unknown).
    literal: str = ""

    @property
    def display(self) -> str:
        """The name as one string: "Family, Given", or the literal."""
        return self.literal or f"{self.family}, {self.given}"


def parse_name(author: str) -> Name:
    """The `Name` an author string means.

    Args:
        author: "Family, Given" (split at its first comma) or a single
            literal name; already cleaned.

    Returns:
        A person's name when both parts are there, otherwise the literal.
    """
    family, comma, given = author.partition(",")
    family, given = family.strip(), given.strip()
    if comma and family and given:
        return Name(family=family, given=given)
    return Name(literal=" ".join(part for part in (family, given) if part))


@dataclass(frozen=True)
class Scholarly:
    """What a scholar backend says of a paper, besides its URL and title."""

    doi: str = ""
    #: "Family, Given" or a single literal name each (a display name is literal).
    authors: tuple[str, ...] = ()
    year: str = ""
    venue: str = ""


@dataclass(frozen=True)
class ExportSource:
    """One numbered source as every export writes it (cleaned when made).

    ``number`` is the answer's ``[n]``; the entry's key is ``ref{n}``. The
    fields are cleaned and capped on construction (see the module note): a
    record read back from any format equals this one, field for field.
    """

    number: int
    url: str
    title: str
    accessed: datetime.date
    #: The site's name; the URL's host when not given.
    site: str = ""
    doi: str = ""
    #: "Family, Given" or a single literal name each.
    authors: tuple[str, ...] = ()
    year: str = ""
    venue: str = ""
    #: The authors as `Name`s (made from ``authors``, which then say them
    #: as `Name.display`: "Family, Given" or the literal).
    names: tuple[Name, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        """Clean every field (a frozen record is written once, here)."""
        if isinstance(self.number, bool) or self.number < 1:
            raise ValueError(f"a source number is a positive int: {self.number!r}")
        url = clean_url(self.url)
        site = clean_text(self.site, SITE_CHARS) or clean_text(site_of(url), SITE_CHARS)
        authors = (clean_text(author, AUTHOR_CHARS) for author in self.authors)
        parsed = (parse_name(author) for author in authors)
        # An author that says no name (only a comma) is no author.
        names = tuple(itertools.islice((n for n in parsed if n != Name()), MAX_AUTHORS))
        accessed = self.accessed
        if isinstance(accessed, datetime.datetime):  # a date, not a moment
            accessed = accessed.date()
        cleaned = {
            "url": url,
            "site": site,
            "title": clean_text(self.title, TITLE_CHARS) or site or url,
            "doi": clean_doi(self.doi),
            "names": names,
            "authors": tuple(name.display for name in names),
            "year": clean_text(self.year, YEAR_CHARS),
            "venue": clean_text(self.venue, VENUE_CHARS),
            "accessed": accessed,
        }
        for name, value in cleaned.items():
            object.__setattr__(self, name, value)

    @property
    def key(self) -> str:
        """The entry's key in every format: ``ref{number}``."""
        return f"ref{self.number}"

    @property
    def kind(self) -> Kind:
        """Article for a scholarly work (a DOI, venue or authors), else web page."""
        return "article" if self.doi or self.venue or self.authors else "webpage"


def in_citation_order(sources: Iterable[ExportSource]) -> list[ExportSource]:
    """``sources`` by number; two with one number would make a broken file.

    Raises:
        ValueError: Two sources have the same number.
    """
    ordered = sorted(sources, key=lambda source: source.number)
    for before, after in itertools.pairwise(ordered):
        if before.number == after.number:
            raise ValueError(f"two sources are numbered {after.number}")
    return ordered


def export_sources(
    sources: Iterable[Source],
    accessed: datetime.date,
    scholarly: Mapping[str, Scholarly] | None = None,
) -> list[ExportSource]:
    """The run's sources as export records, in citation order.

    Args:
        sources: The run's numbered sources (the ledger's or a `SourceBook`'s).
        accessed: The day the pages were read.
        scholarly: What the scholar tool reported, by the paper's URL; a
            source gets it when any address it was read by matches (as
            `core.sources.normalise_url` compares them).

    Returns:
        One `ExportSource` per source, with its number.
    """
    papers = {normalise_url(url): paper for url, paper in (scholarly or {}).items()}
    records = []
    for source in sources:
        paper = next(
            (papers[key] for key in source.citation_keys() if key in papers),
            Scholarly(),
        )
        records.append(
            ExportSource(
                number=source.number,
                url=source.url,
                title=source.title,
                accessed=accessed,
                doi=paper.doi,
                authors=paper.authors,
                year=paper.year,
                venue=paper.venue,
            )
        )
    return in_citation_order(records)
