"""What the citation check found: verdicts, statements and the report (pure).

Kept apart from the check itself (`core.citation_check`) so that the run's
events (`core.events.RunFinished.citations`) can carry a report without the
events module importing the check, which uses the events' ports.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Support(enum.StrEnum):
    """What the recorded evidence says of a statement."""

    SUPPORTED = "supported"
    NOT_SUPPORTED = "not_supported"
    CANNOT_TELL = "cannot_tell"


# Reasons the check gives itself (the model's own reasons are its words).
OUT_OF_TIME = "out of time"
NO_SUCH_SOURCE = "no such source"
NOTHING_RECORDED = "nothing was recorded for this page"
CALL_FAILED = "the check's model call failed"
NO_VERDICT = "the reply gave no verdict"
CONFLICTING_VERDICTS = "the reply gave conflicting verdicts"
NOT_ALL_SOURCES = "only its first {checked} of {cited} sources were checked"


@dataclass(frozen=True)
class Verdict:
    """One judgement: the support and why (may be empty)."""

    support: Support
    reason: str = ""

    @property
    def supported(self) -> bool:
        """Whether the evidence supports the statement."""
        return self.support is Support.SUPPORTED


@dataclass(frozen=True)
class CitedStatement:
    """A statement of the answer and the citations it carries.

    ``answer[start:end]`` is the statement as it stands, its citations
    included; ``text`` is what is checked: without the citations, links
    reduced to their text, escapes and emphasis marks dropped, blanks
    collapsed, cut to `core.citation_check.MAX_STATEMENT_CHARS` (``cut`` says so).
    """

    text: str
    #: The numbers it cites, in order, each once.
    numbers: tuple[int, ...]
    start: int
    end: int
    #: It carries the mark of a link to a page never read.
    unverified: bool = False
    cut: bool = False

    @property
    def span(self) -> tuple[int, int]:
        """(start, end) of the statement in the answer."""
        return self.start, self.end


@dataclass(frozen=True)
class StatementScan:
    """The cited statements of an answer: the first ones, and how many in all."""

    statements: tuple[CitedStatement, ...]
    found: int

    @property
    def skipped(self) -> int:
        """Statements found beyond the cap."""
        return self.found - len(self.statements)


@dataclass(frozen=True)
class SourceVerdict:
    """The verdict of one cited source (``number`` None: the unverified mark)."""

    number: int | None
    verdict: Verdict


@dataclass(frozen=True)
class StatementVerdict:
    """A statement, its verdict, and each checked source's own."""

    statement: CitedStatement
    verdict: Verdict
    sources: tuple[SourceVerdict, ...]

    @property
    def span(self) -> tuple[int, int]:
        """(start, end) of the statement in the answer."""
        return self.statement.span

    @property
    def numbers(self) -> tuple[int, ...]:
        """The numbers the statement cites."""
        return self.statement.numbers


@dataclass(frozen=True)
class CitationReport:
    """What the check found, and what it cost.

    Tokens are those the server reported (a call without usage adds none).
    """

    verdicts: tuple[StatementVerdict, ...] = ()
    #: Statements found beyond the cap, not checked.
    skipped: int = 0
    #: Model calls made.
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None

    @property
    def checked(self) -> int:
        """Statements given a verdict (within the cap)."""
        return len(self.verdicts)

    @property
    def supported(self) -> int:
        """Statements the pages they cite support."""
        return self._count(Support.SUPPORTED)

    @property
    def not_supported(self) -> int:
        """Statements the pages they cite do not support."""
        return self._count(Support.NOT_SUPPORTED)

    @property
    def cannot_tell(self) -> int:
        """Statements the check could not decide (out of time included)."""
        return self._count(Support.CANNOT_TELL)

    @property
    def out_of_time(self) -> int:
        """Statements left undecided by the deadline."""
        return sum(item.verdict.reason == OUT_OF_TIME for item in self.verdicts)

    @property
    def support_rate(self) -> float | None:
        """Supported over checked (None: nothing checked)."""
        return self.supported / self.checked if self.checked else None

    def _count(self, support: Support) -> int:
        return sum(item.verdict.support is support for item in self.verdicts)

    def summary_line(self) -> str:
        """The research summary's line, e.g. "Citations: 11 of 12 statements …"."""
        if not self.checked:
            if not self.skipped:
                return "Citations: no cited statements to check"
            noun = "statement" if self.skipped == 1 else "statements"
            return f"Citations: {self.skipped} cited {noun} not checked"
        line = f"Citations: {self.supported} of {self.checked} {self._supported_by()}"
        notes = []
        if self.out_of_time:
            notes.append(f"{self.out_of_time} out of time")
        if self.skipped:
            notes.append(f"{self.skipped} more not checked")
        return f"{line} ({'; '.join(notes)})" if notes else line

    def _supported_by(self) -> str:
        if self.checked > 1:
            return "statements supported by the pages they cite"
        statement = self.verdicts[0].statement
        cited = len(statement.numbers) + statement.unverified
        return (
            f"statement supported by the {'page' if cited == 1 else 'pages'} it cites"
        )

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (for JSON records)."""
        return {
            "supported": self.supported,
            "checked": self.checked,
            "skipped": self.skipped,
            "support_rate": self.support_rate,
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": self.cost,
            "statements": [_verdict_dict(item) for item in self.verdicts],
        }


def _verdict_dict(item: StatementVerdict) -> dict[str, Any]:
    statement = item.statement
    return {
        "start": statement.start,
        "end": statement.end,
        "numbers": list(statement.numbers),
        "unverified": statement.unverified,
        "text": statement.text,
        "verdict": str(item.verdict.support),
        "reason": item.verdict.reason,
        "sources": [
            {
                "number": source.number,
                "verdict": str(source.verdict.support),
                "reason": source.verdict.reason,
            }
            for source in item.sources
        ],
    }
