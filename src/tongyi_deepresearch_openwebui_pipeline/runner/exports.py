"""The runner's ``--export``: each research's sources and report as files.

Beside the command's output: ``ask --output answer.md`` writes
``answer.sources.bib``, ``answer.sources.ris``, ``answer.sources.json`` and
``answer.report.md``; a batch writes one set per question and rollout into
``FILE.exports/`` (``--output FILE``) or ``DIR/exports/`` (``--output-dir``),
named by the question's input line and rollout (``line0007-r1.sources.bib``).
Numbers are the answer's ``[n]``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from ..adapters.export.bundle import ExportFile, export_files
from .results import Outcome

#: A file's name after the research's base name, by format.
_ENDINGS = {
    "bibtex": ".sources.bib",
    "ris": ".sources.ris",
    "csl-json": ".sources.json",
    "markdown": ".report.md",
}


def exports_of(
    outcome: Outcome, formats: tuple[str, ...], accessed: dt.date
) -> list[ExportFile]:
    """The chosen formats of one research."""
    return export_files(
        formats,
        question=outcome.question,
        answer=outcome.answer,
        sources=outcome.sources,
        accessed=accessed,
        papers=outcome.papers,
    )


def ask_base(output: Path) -> Path:
    """What ``ask``'s export files are named after: its output without suffix."""
    return output.with_suffix("") if output.suffix else output


def batch_directory(output: Path | None, output_dir: Path | None) -> Path:
    """Where a batch writes its exports."""
    if output_dir is not None:
        return output_dir / "exports"
    assert output is not None  # noqa: S101  (argparse requires one of them)
    return output.with_name(output.name + ".exports")


def batch_base(directory: Path, line: int, rollout: int) -> Path:
    """One question's and rollout's base name in a batch's export directory."""
    return directory / f"line{line:04d}-r{rollout}"


def export_paths(formats: tuple[str, ...], base: Path) -> list[Path]:
    """Where the files of ``formats`` go beside ``base``."""
    return [base.with_name(base.name + _ENDINGS[name]) for name in formats]


def write_exports(files: list[ExportFile], base: Path) -> list[Path]:
    """Write each file beside ``base`` (its directory made); the paths written."""
    base.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for file in files:
        (path,) = export_paths((file.format.name,), base)
        path.write_text(file.text, encoding="utf-8")
        written.append(path)
    return written
