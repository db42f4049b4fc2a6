"""What one research produced, and the records written of it (pure).

`Outcome` is a finished run as the runner keeps it; `answer_markdown`,
`outcome_json` and `batch_record` turn it into what ``ask`` prints and what
``batch`` writes.

A batch record is the lab's (``inference/react_agent.py`` and
``inference/run_multi_react.py`` in Alibaba-NLP/DeepResearch), so the lab's
scorers (``evaluation/evaluate_deepsearch_official.py``) read it unchanged:

- a run that ended: ``question``, ``answer`` (the reference answer from the
  input), ``messages`` (the whole trajectory, `Outcome.messages`),
  ``prediction``, ``termination``, in the lab's order and with its
  termination strings (`lab_ending`), then this project's
  ``rollout_id``, ``sources``, ``rounds``, ``tokens``, ``cost``, ``time``;
- a run that failed (an error stopped it): exactly the lab's error record,
  ``question``, ``answer``, ``rollout_idx``, ``rollout_id``, ``error``,
  ``messages`` (empty) and ``prediction`` ``"[Failed]"`` (`failed_record`).
  A batch run again asks it again (the lab skips only records without
  ``error``).

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

from ..core.events import (
    LAB_ANSWER_NOT_FOUND,
    LAB_CALLS_EXCEEDED,
    LAB_FORCED_ANSWER,
    LAB_TIME_LIMIT,
    RunFinished,
)
from ..core.phrasing import (
    UNMARKED_ANSWER_NOTE,
    no_answer_note,
    sources_list,
    stopped_note,
)
from ..core.sources import Paper, Source, SourceBook, rewrite_answer

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
    #: The run's messages, system prompt first: a single run's whole
    #: trajectory (`RunFinished.trajectory`: every turn and tool result,
    #: across consolidations); a heavy run's question and final answer.
    messages: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    #: The budget whose end made the run ask for the answer ("round_limit",
    #: "context_limit", "time_limit"), or "" when it never had to.
    wrapped_up: str = ""
    #: The scholarly records the run's searches found (for the exports).
    papers: tuple[Paper, ...] = ()

    @property
    def sources(self) -> tuple[Source, ...]:
        """The pages read, in citation order (what the run's end carries)."""
        return self.finished.sources

    @property
    def answer(self) -> str:
        """The answer with its citations numbered (empty without one)."""
        text = self.finished.answer.strip()
        return rewrite_answer(text, SourceBook(self.sources)).strip() if text else ""


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
    listed = sources_list(outcome.sources).strip()
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
    if finished.citations is not None:
        result["citations"] = finished.citations.as_dict()
    if finished.error:
        result["error"] = finished.error
    return result


# -- the lab's records ---------------------------------------------------------------

#: The prefix the lab's agent puts on the ending of a final reply without
#: ``<answer>…</answer>`` (inference/react_agent.py; its termination strings
#: are defined once, in `core.events`).
LAB_FORMAT_ERROR = "format error: "
#: The lab's prediction when the run found no answer.
LAB_NO_ANSWER = "No answer found."
#: The lab's prediction of a failed run (inference/run_multi_react.py).
LAB_FAILED = "[Failed]"


def lab_ending(
    finished: RunFinished, wrapped_up: str = "", last_reply: str = ""
) -> tuple[str, str]:
    """(termination, prediction) of a run that ended, in the lab's words.

    The termination is the one the run itself gives
    (`RunFinished.lab_termination`, set where the loop knows how it ended),
    else the runner's reading of the ending (`runner_termination`). The
    prediction follows the lab's agent: ``No answer found.`` for ``exceed
    available llm calls`` and ``answer not found``; the lab's time-limit
    string for ``No answer found after 2h30mins``; for a ``format error: ``
    ending without an answer, the last reply (the lab predicts that whole
    reply); else the answer.
    """
    termination = finished.lab_termination or runner_termination(finished, wrapped_up)
    answer = finished.answer.strip()
    if termination in (LAB_CALLS_EXCEEDED, LAB_ANSWER_NOT_FOUND):
        return termination, LAB_NO_ANSWER
    if termination == LAB_TIME_LIMIT:
        return termination, LAB_TIME_LIMIT
    if termination.startswith(LAB_FORMAT_ERROR) and not answer:
        return termination, last_reply
    return termination, answer


def runner_termination(finished: RunFinished, wrapped_up: str = "") -> str:
    """The lab's termination string for how a run ended, read from its end.

    An answer: the lab's ``answer``, or ``generate an answer as token limit
    reached`` when the context ran out and the model was asked for it. Our
    own budgets the lab has no answer for (the round limit and the time
    limit: the lab's agent never asks for an answer at either) keep our
    names, ``round_limit`` and ``time_limit``. An answer without
    ``<answer>`` tags gets the lab's ``format error: `` prefix on that name,
    as the lab marks its own unmarked final reply at the token limit.

    No answer: the lab's ending of the budget that ran out (`wrapped_up`):
    the context, ``format error: generate an answer as token limit
    reached``; the rounds, ``exceed available llm calls``; the time, ``No
    answer found after 2h30mins`` (the lab's string, whatever
    ``MAX_RESEARCH_MINUTES`` is: it names the ending, not the time); none,
    ``answer not found``.
    """
    if finished.reason == "answer" or finished.answer.strip():
        name = (
            LAB_FORCED_ANSWER if finished.reason == "context_limit" else finished.reason
        )
        return ("" if finished.answer_marked else LAB_FORMAT_ERROR) + name
    limit = wrapped_up if finished.reason == "no_answer" else finished.reason
    return {
        "context_limit": LAB_FORMAT_ERROR + LAB_FORCED_ANSWER,
        "round_limit": LAB_CALLS_EXCEEDED,
        "time_limit": LAB_TIME_LIMIT,
    }.get(limit, LAB_ANSWER_NOT_FOUND)


def last_reply(messages: list[dict[str, Any]]) -> str:
    """The content of the model's last message (the lab's ``messages[-1]``)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = message.get("content")
            return content.strip() if isinstance(content, str) else ""
    return ""


def failed_record(
    question: str, reference_answer: Any, rollout_id: int, error: str
) -> dict[str, Any]:
    """The record of a run that failed: the lab's, field for field.

    inference/run_multi_react.py writes these keys in this order, the
    rollout twice (``rollout_idx``, ``rollout_id``), no messages and the
    prediction ``[Failed]``; its scorers judge that prediction wrong and its
    runner asks the question again when run again (so does ours).
    """
    return {
        "question": question,
        "answer": reference_answer,
        "rollout_idx": rollout_id,
        "rollout_id": rollout_id,
        "error": error,
        "messages": [],
        "prediction": LAB_FAILED,
    }


def batch_record(
    outcome: Outcome, reference_answer: Any, rollout_id: int
) -> dict[str, Any]:
    """One line of ``batch``'s output, in the lab's shape (see the module doc)."""
    finished = outcome.finished
    if finished.reason == "error":
        return failed_record(
            outcome.question, reference_answer, rollout_id, finished.error
        )
    termination, prediction = lab_ending(
        finished, outcome.wrapped_up, last_reply(outcome.messages)
    )
    return {
        "question": outcome.question,
        "answer": reference_answer,
        "messages": outcome.messages,
        "prediction": prediction,
        "termination": termination,
        "rollout_id": rollout_id,
        "sources": source_items(outcome),
        "rounds": finished.stats.rounds,
        "tokens": _tokens(outcome),
        "cost": finished.stats.cost,
        "time": round(outcome.seconds, 3),
        **(
            {"citations": finished.citations.as_dict()}
            if finished.citations is not None
            else {}
        ),
    }


def is_failed(record: dict[str, Any]) -> bool:
    """Whether a record is a failed run's (the lab's test: it has ``error``)."""
    return "error" in record
