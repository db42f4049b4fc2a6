"""What one research produced, and the records written of it (pure).

`Outcome` is a finished run as the runner keeps it; `answer_markdown`,
`outcome_json` and `batch_record` turn it into what ``ask`` prints and what
``batch`` writes. A batch record has the fields the lab's runner writes
(``question``, ``answer`` — the reference answer from the input —,
``prediction``, ``termination``, ``messages``) plus ``rollout_id``,
``sources``, ``rounds``, ``tokens``, ``cost``, ``time`` and, when the run
failed, ``error``.

What is written is data, kept as the model and the pages wrote it, and
always well-formed: `json_line` gives a JSON line that decodes to exactly
the value but holds no raw character a terminal acts on or a line splitter
takes for a line end (JSON escapes instead), and `answer_markdown` is
UTF-8-encodable text (a lone surrogate a broken stream left becomes U+FFFD).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..adapters.openwebui.render import sources_list
from ..core.events import RunFinished
from ..core.phrasing import UNMARKED_ANSWER_NOTE, no_answer_note, stopped_note
from ..core.sources import Source, SourceLedger, rewrite_answer

#: What ``json.dumps(ensure_ascii=False)`` leaves raw but a JSON line must not
#: hold: DEL and the C1 controls (a terminal acts on them; U+0085 ends a line
#: for `str.splitlines`), U+2028/U+2029 (line ends for JavaScript and
#: `str.splitlines`), the bidi embeddings, overrides and isolates (they
#: reorder a terminal's text) and surrogates (UTF-8 cannot hold a lone one).
_RAW_IN_JSON = (
    (0x7F, 0xA0),
    (0x2028, 0x202F),
    (0x2066, 0x206A),
    (0xD800, 0xE000),
)
_JSON_ESCAPES = {
    code: f"\\u{code:04x}" for low, high in _RAW_IN_JSON for code in range(low, high)
}
_NEEDS_ESCAPE = re.compile(
    "[" + "".join(f"{chr(low)}-{chr(high - 1)}" for low, high in _RAW_IN_JSON) + "]"
)
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_line(value: Any) -> str:
    """`value` as one line of JSON (ending in a newline), safe anywhere.

    The line decodes to `value` (a surrogate pair a stream split in two
    decodes as its one character); control characters, line and
    paragraph separators, bidi controls and surrogates are written as JSON
    escapes (``json.dumps`` escapes C0 controls itself), so it can be printed
    to a terminal, split by any line splitter and written as UTF-8.
    """
    text = json.dumps(value, ensure_ascii=False, default=str)
    if _NEEDS_ESCAPE.search(text) is not None:
        text = text.translate(_JSON_ESCAPES)
    return text + "\n"


def well_formed(text: str) -> str:
    """`text` with a split surrogate pair joined and a lone one as U+FFFD."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


@dataclass(frozen=True)
class Outcome:
    """A finished research run."""

    question: str
    finished: RunFinished
    #: The conversation as the model saw it last (system prompt first).
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: The run's sources (numbered as cited).
    ledger: SourceLedger = field(default_factory=SourceLedger)
    seconds: float = 0.0

    @property
    def sources(self) -> tuple[Source, ...]:
        """The pages read, in citation order."""
        return self.finished.sources or tuple(self.ledger.sources)

    @property
    def answer(self) -> str:
        """The answer with its citations numbered (empty without one)."""
        text = self.finished.answer.strip()
        return rewrite_answer(text, self.ledger).strip() if text else ""


def source_items(outcome: Outcome) -> list[dict[str, Any]]:
    """The sources as JSON: number, title, URL."""
    return [
        {"number": source.number, "title": source.title, "url": source.url}
        for source in outcome.sources
    ]


def _tokens(outcome: Outcome) -> dict[str, int]:
    stats = outcome.finished.stats
    return {
        "prompt": stats.prompt_tokens,
        "completion": stats.completion_tokens,
        "total": stats.prompt_tokens + stats.completion_tokens,
    }


def answer_markdown(outcome: Outcome) -> str:
    """The answer and its sources as Markdown (what ``ask`` prints)."""
    finished = outcome.finished
    parts = [outcome.answer] if outcome.answer else []
    if finished.reason == "error":
        parts.append(f"> {stopped_note(finished.error)}")
    elif not finished.answer:
        parts.append(f"> {no_answer_note(finished.reason)}")
    elif not finished.answer_marked:
        parts.append(UNMARKED_ANSWER_NOTE)
    ledger = SourceLedger()
    ledger.sources = list(outcome.sources)
    listed = sources_list(ledger).strip()
    if listed:
        parts.append(listed)
    return well_formed("\n\n".join(parts) + "\n")


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    """One JSON object for scripts (``ask --json``)."""
    finished = outcome.finished
    result: dict[str, Any] = {
        "question": outcome.question,
        "answer": outcome.answer,
        "sources": source_items(outcome),
        "termination": finished.reason,
        "rounds": finished.stats.rounds,
        "tokens": _tokens(outcome),
        "cost": finished.stats.cost,
        "seconds": round(outcome.seconds, 3),
    }
    if finished.error:
        result["error"] = finished.error
    return result


def batch_record(
    outcome: Outcome, reference_answer: Any, rollout_id: int
) -> dict[str, Any]:
    """One line of ``batch``'s output, in the lab's runner's shape."""
    finished = outcome.finished
    record: dict[str, Any] = {
        "question": outcome.question,
        "answer": reference_answer,
        "rollout_id": rollout_id,
        "prediction": finished.answer.strip(),
        "termination": finished.reason,
        "messages": outcome.messages,
        "sources": source_items(outcome),
        "rounds": finished.stats.rounds,
        "tokens": _tokens(outcome),
        "cost": finished.stats.cost,
        "time": round(outcome.seconds, 3),
    }
    if finished.error:
        record["error"] = finished.error
    return record
