"""The export formats a front end offers, by name, and one research's files.

Both front ends take the same names (``bibtex``, ``ris``, ``csl-json``,
``markdown``): the pipe's ``EXPORT_FORMATS`` valves and the runner's
``--export``. `export_files` writes the chosen ones for one research; the
chat shows them in a collapsed block (`report.fenced`), the runner writes them to
files named with each format's suffix.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ...core.sources import Paper, Source
from .bibtex import to_bibtex
from .csl_json import to_csl_json
from .records import ExportSource, Scholarly, export_sources
from .report import to_markdown_report
from .ris import to_ris


@dataclass(frozen=True)
class ExportFormat:
    """One format: its name, what it is called, its file suffix, its fence tag."""

    name: str
    label: str
    suffix: str
    language: str


FORMATS: tuple[ExportFormat, ...] = (
    ExportFormat("bibtex", "BibTeX", ".bib", "bibtex"),
    ExportFormat("ris", "RIS", ".ris", "text"),
    ExportFormat("csl-json", "CSL-JSON", ".json", "json"),
    ExportFormat("markdown", "Markdown report", ".md", "markdown"),
)
#: Every format's name, in the order they are offered.
FORMAT_NAMES = tuple(f.name for f in FORMATS)


def parse_formats(text: str) -> tuple[str, ...]:
    """The format names of a comma-separated list, each once, in list order.

    Raises:
        ValueError: A name is not a format (the message names the formats).
    """
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    for name in names:
        if name not in FORMAT_NAMES:
            raise ValueError(
                f"no export format {name[:40]!r}: choose from {', '.join(FORMAT_NAMES)}"
            )
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class ExportFile:
    """One format's text for one research."""

    format: ExportFormat
    text: str


def scholarly_of(papers: Iterable[Paper]) -> dict[str, Scholarly]:
    """What the scholar tool found, by each address a paper is read at."""
    found: dict[str, Scholarly] = {}
    for paper in papers:
        record = Scholarly(
            doi=paper.doi, authors=paper.authors, year=paper.year, venue=paper.venue
        )
        for address in (paper.url, paper.pdf):
            if address:
                found.setdefault(address, record)
    return found


def export_files(
    formats: Sequence[str],
    *,
    question: str,
    answer: str,
    sources: Iterable[Source],
    accessed: datetime.date,
    papers: Iterable[Paper] = (),
) -> list[ExportFile]:
    """The chosen formats of one research, in `FORMATS` order.

    ``answer`` is the answer as shown, its citations numbered ``[n]`` as the
    sources are; a source read at a paper's address (``papers``: what the
    scholar tool found) is exported as that paper.
    """
    records = export_sources(sources, accessed, scholarly_of(papers))
    writers: dict[str, Callable[[list[ExportSource]], str]] = {
        "bibtex": to_bibtex,
        "ris": to_ris,
        "csl-json": to_csl_json,
        "markdown": lambda items: to_markdown_report(question, answer, items),
    }
    return [
        ExportFile(spec, writers[spec.name](records))
        for spec in FORMATS
        if spec.name in formats
    ]
