"""Sources as CSL-JSON, which citation processors format in any CSL style.

Citeproc-js, pandoc and Zotero read it.

A scholarly source is an ``article-journal``, a web page a ``webpage``; ``id``
is ``ref{n}``, the answer's ``[n]``. Authors are ``{"family", "given"}`` or
``{"literal"}``; a year that is a number is ``issued.date-parts``, any other
year text ``issued.literal``; the access date is ``accessed.date-parts``.
JSON's own escaping (the standard library's writer) keeps every character
of every field.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterable

from .records import ExportSource, Name, in_citation_order

_YEAR = re.compile(r"[0-9]{1,4}")


def _name(name: Name) -> dict[str, str]:
    if name.literal:
        return {"literal": name.literal}
    return {"family": name.family, "given": name.given}


def _date_parts(day: datetime.date) -> dict[str, list[list[int]]]:
    return {"date-parts": [[day.year, day.month, day.day]]}


def _issued(year: str) -> dict[str, object]:
    if _YEAR.fullmatch(year):
        return {"date-parts": [[int(year)]]}
    return {"literal": year} if year else {}


def csl_item(source: ExportSource) -> dict[str, object]:
    """One source as a CSL-JSON item (empty fields left out)."""
    article = source.kind == "article"
    fields: dict[str, object] = {
        "id": source.key,
        "type": "article-journal" if article else "webpage",
        "title": source.title,
        "author": [_name(name) for name in source.names],
        "issued": _issued(source.year),
        "container-title": source.venue if article else source.site,
        "DOI": source.doi,
        "URL": source.url,
        "accessed": _date_parts(source.accessed),
    }
    return {name: value for name, value in fields.items() if value}


def to_csl_json(sources: Iterable[ExportSource]) -> str:
    """The sources as a CSL-JSON array, one item per source, by number.

    Args:
        sources: The records to write (numbers distinct).

    Returns:
        The JSON text (UTF-8 characters as they are), ending in a newline.
    """
    items = [csl_item(source) for source in in_citation_order(sources)]
    text = json.dumps(items, ensure_ascii=False, indent=2)
    # The same JSON values, with no "<" or "◁" a chat could read as a tag.
    return text.replace("<", "\\u003c").replace("◁", "\\u25c1") + "\n"
