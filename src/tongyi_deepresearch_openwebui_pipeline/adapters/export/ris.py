"""Sources as RIS, written by rispy from cleaned records.

A scholarly source is ``TY  - JOUR`` (TI, AU, PY, T2: the venue, DO, UR,
Y2: the access date); a web page is ``TY  - ELEC`` (TI, T2: the site, UR,
Y2). ``ID`` is ``ref{n}``, the answer's ``[n]``. Every value is one line (the
records fold newlines), so no title can start a line of its own, such as
``ER  - `` or ``TY  - ``. RIS separates several URLs in one UR line with
";", and readers split there: a ";" in a URL is written as ``%3B``.
"""

from __future__ import annotations

from collections.abc import Iterable

import rispy

from .records import ExportSource, in_citation_order


class _PlainRisWriter(rispy.RisWriter):
    """rispy's writer without its "1." line before each record (not RIS)."""

    def set_header(self, count: int) -> str:
        """No header line."""
        del count
        return ""


def ris_url(url: str) -> str:
    """``url`` as a UR value: a ";" would split it into two URLs."""
    return url.replace(";", "%3B")


def _record(source: ExportSource) -> dict[str, object]:
    article = source.kind == "article"
    fields: dict[str, object] = {
        "type_of_reference": "JOUR" if article else "ELEC",
        "id": source.key,
        "title": source.title,
        "authors": list(source.authors),  # each "Family, Given" or literal
        "year": source.year,
        "secondary_title": source.venue if article else source.site,
        "doi": source.doi,
        "urls": [ris_url(source.url)] if source.url else [],
        "access_date": source.accessed.strftime("%Y/%m/%d"),
    }
    return {name: value for name, value in fields.items() if value}


def to_ris(sources: Iterable[ExportSource]) -> str:
    """The sources as an RIS file, one record per source, by number.

    Args:
        sources: The records to write (numbers distinct).

    Returns:
        The file's text ("" for no sources).
    """
    records = [_record(source) for source in in_citation_order(sources)]
    return rispy.dumps(records, implementation=_PlainRisWriter) if records else ""
