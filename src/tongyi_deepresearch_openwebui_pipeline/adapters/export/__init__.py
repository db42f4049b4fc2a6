"""The research to take elsewhere: sources as BibTeX, RIS, CSL-JSON; a report.

The sources of a research go out in the three formats reference managers
read, and the whole of it as a Markdown report.

`export_sources` makes the records (`records.ExportSource`) from the run's
numbered sources and what the scholar tool reported; each writer turns them
into one format with a well-kept library (bibtexparser, rispy, the standard
library's json), keyed ``ref{n}`` so that every file agrees with the
answer's ``[n]``. The writers are pure: the caller writes the files.
"""

from __future__ import annotations

from .bibtex import to_bibtex
from .csl_json import to_csl_json
from .records import ExportSource, Name, Scholarly, export_sources
from .report import to_markdown_report
from .ris import to_ris

__all__ = [
    "ExportSource",
    "Name",
    "Scholarly",
    "export_sources",
    "to_bibtex",
    "to_csl_json",
    "to_markdown_report",
    "to_ris",
]
