r"""Sources as BibTeX, written by bibtexparser (2.x) from cleaned records.

A scholarly source is an ``@article`` (title, author, journal, year, doi,
url, urldate); a web page is a ``@misc`` (title, howpublished: the site, url,
urldate, and a note "Accessed YYYY-MM-DD"). ``@misc`` rather than biblatex's
``@online``: classic BibTeX styles (plain, natbib's) know ``@misc`` and print
its howpublished and note, while they drop an ``@online`` entry's type to a
warning; biblatex reads ``@misc`` with url and urldate natively. The key is
``ref{n}``, the answer's ``[n]``.

The file is UTF-8 and non-ASCII text stays as it is (biblatex with biber,
and bibtexu, read UTF-8; classic 8-bit BibTeX copies the bytes through).
Text fields have the LaTeX specials ``& % $ # _ { } ~ ^ \`` written as
commands, the braces as ``\textbraceleft{}``/``\textbraceright{}`` (BibTeX
counts even an escaped ``\{`` as a brace, so ``\{`` could unbalance the
entry). So the only braces in a value are balanced ones this module wrote,
and no title or name can end its field or entry. A name part holding a comma
or the word "and" is braced (BibTeX would split it there), as is a literal
name (an organisation), which BibTeX must not split into first and last
names. The url and doi fields are verbatim for biblatex: cleaned as URLs
(no braces, backslashes or spaces), they are written byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# bibtexparser's __init__ re-exports these without marking them public (no
# __all__), which a type checker reads as private: each from its own module.
from bibtexparser.entrypoint import write_string
from bibtexparser.library import Library
from bibtexparser.middlewares import AddEnclosingMiddleware
from bibtexparser.model import Entry, Field
from bibtexparser.writer import BibtexFormat

from .records import ExportSource, Name, in_citation_order

#: The LaTeX specials of a text field and how each is written.
LATEX_SPECIALS = {
    "\\": r"\textbackslash{}",
    "{": r"\textbraceleft{}",
    "}": r"\textbraceright{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    # Text-mode "<" and ">" print as other glyphs in LaTeX's default encoding.
    "<": r"\textless{}",
    ">": r"\textgreater{}",
}
_LATEX = str.maketrans(LATEX_SPECIALS)
#: "and" as a word: BibTeX splits an author list there, in any case.
_AND_WORD = re.compile(r"(?<!\S)and(?!\S)", re.IGNORECASE)
#: Fields in the order they are written.
_FIELD_ORDER = [
    "title",
    "author",
    "journal",
    "year",
    "howpublished",
    "doi",
    "url",
    "urldate",
    "note",
]


def latex_text(text: str) -> str:
    """``text`` as the value of a BibTeX text field (specials as commands)."""
    return text.translate(_LATEX)


def _name_part(part: str) -> str:
    written = latex_text(part)
    must_hold_together = "," in part or _AND_WORD.search(part) is not None
    return "{" + written + "}" if must_hold_together else written


def bibtex_name(name: Name) -> str:
    """One author as BibTeX reads it: "Family, Given", or a braced literal."""
    if name.literal:
        return "{" + latex_text(name.literal) + "}"
    return f"{_name_part(name.family)}, {_name_part(name.given)}"


def _entry(source: ExportSource) -> Entry:
    accessed = source.accessed.isoformat()
    values = {"title": latex_text(source.title)}
    if source.kind == "article":
        entry_type = "article"
        values |= {
            "author": " and ".join(bibtex_name(name) for name in source.names),
            "journal": latex_text(source.venue),
            "year": latex_text(source.year),
            "doi": source.doi,
        }
    else:
        entry_type = "misc"
        values |= {
            "howpublished": latex_text(source.site),
            "note": f"Accessed {accessed}",
        }
    values |= {"url": source.url, "urldate": accessed if source.url else ""}
    fields = [Field(name, values[name]) for name in _FIELD_ORDER if values.get(name)]
    return Entry(entry_type, source.key, fields)


def _bibtex_format() -> BibtexFormat:
    """Two-space fields, no trailing comma, one blank line between entries."""
    bibtex_format = BibtexFormat()
    bibtex_format.indent = "  "
    bibtex_format.value_column = 0
    bibtex_format.trailing_comma = False
    # Each entry ends in "}\n"; the separator adds the one blank line.
    bibtex_format.block_separator = "\n"
    return bibtex_format


def to_bibtex(sources: Iterable[ExportSource]) -> str:
    """The sources as a BibTeX file, one entry ``ref{n}`` per source, by number.

    Args:
        sources: The records to write (numbers distinct).

    Returns:
        The file's text ("" for no sources).
    """
    # Citation order, not "ref10" before "ref2": the library writes its
    # blocks, and each entry's fields, in the order they were given.
    library = Library([_entry(source) for source in in_citation_order(sources)])
    # Every value braced, the year too. The library is this call's own, so
    # the middleware may change it in place instead of copying each entry.
    enclose = AddEnclosingMiddleware(
        reuse_previous_enclosing=False,
        enclose_integers=True,
        default_enclosing="{",
        allow_inplace_modification=True,
    )
    return write_string(
        library, unparse_stack=[enclose], bibtex_format=_bibtex_format()
    )
