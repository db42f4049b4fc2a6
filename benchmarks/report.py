"""Result rows and the final table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One benchmark figure next to its baseline.

    ``ratio`` is always measured / baseline; ``target`` says in words what
    ``passed`` checked. ``passed`` is None for figures without a target
    (reported only). ``timing`` is False for correctness checks, which fail
    a quick run too.
    """

    name: str
    measured: str
    baseline: str
    ratio: float | None
    target: str
    passed: bool | None
    timing: bool = True

    def fails(self, quick: bool) -> bool:
        """Whether this row makes the run exit non-zero."""
        return self.passed is False and not (quick and self.timing)

    def status(self, quick: bool) -> str:
        """PASS / FAIL / INFO (quick runs never fail on timing)."""
        if self.passed is None:
            return "INFO"
        if self.passed:
            return "PASS"
        return "FAIL" if self.fails(quick) else "FAIL (not enforced: --quick)"


def ms(seconds: float) -> str:
    """Seconds shown in milliseconds."""
    return f"{seconds * 1000:.1f} ms"


def secs(seconds: float) -> str:
    """Seconds shown as seconds."""
    return f"{seconds:.3f} s"


def median(values: Sequence[float]) -> float:
    """The median (the benchmarks repeat each measurement)."""
    return statistics.median(values)


def table(rows: Sequence[Row], quick: bool) -> str:
    """The rows as a Markdown table."""
    header = ("name", "measured", "baseline", "ratio", "target", "result")
    cells = [header] + [
        (
            row.name,
            row.measured,
            row.baseline,
            "—" if row.ratio is None else f"{row.ratio:.2f}",
            row.target,
            row.status(quick),
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]

    def line(values: Sequence[str]) -> str:
        padded = (v.ljust(w) for v, w in zip(values, widths, strict=True))
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), rule, *(line(c) for c in cells[1:])])
