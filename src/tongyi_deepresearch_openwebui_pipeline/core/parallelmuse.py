"""ParallelMuse, the lab's Heavy mode: its prompts, formats and measures.

ParallelMuse (arXiv 2510.24698; Alibaba-NLP/DeepResearch, WebAgent/ParallelMuse)
turns several research rollouts of one question into one answer in two stages:

- **functionality-specified partial rollouts**
  (``functionality_specified_partial_rollout.py``): the first rollouts run
  from the question with token log-probabilities; each assistant step that
  calls a tool gets an uncertainty, the perplexity of its tool call (the
  exponential of the mean token entropy over the ``<tool_call>`` region, the
  lab's default ``tool_call_ppl``), and new rollouts branch from the
  conversation before the most uncertain steps;
- **compressed reasoning aggregation** (``compressed_reasoning_aggregation.py``):
  the model writes one report per rollout from its trajectory (`REPORT_PROMPT`),
  then one call reads every report (`INTEGRATE_PROMPT`) and selects the answer.

This module is the pure part: the prompts and formats byte for byte as the lab
published them (tests/fixtures/lab/parallelmuse_prompts.json pins them), the
trajectory as the lab renders it, reading reports, the uncertainty of a step
and where branches start. The engine (``engine/runs.py``) makes the calls.

What a rollout, a page or a report wrote is made inert where it enters a
request: control tokens and protocol tags are defused, and a line that would
read as the request's own structure (a trajectory record such as
``**assistant:**``, or ``[Report 2]:``) gets a backslash before it. Ordinary
text is sent as the lab would send it.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any, Literal, Protocol, runtime_checkable

from .budget import estimate_text_tokens
from .events import ModelChunk, ModelPort
from .history import content_text
from .prompts import WRAP_UP_MESSAGE
from .protocol import TurnParser
from .toolcalls import PROMPT_TAGS, neutralise_control_tokens, neutralise_tags

# -- the lab's prompts (compressed_reasoning_aggregation.py), byte for byte --

#: The system message of the report and integrate calls.
CONVERGE_SYSTEM_PROMPT = (
    "Follow the user's instructions and present your answer in the format they request."
)

#: One rollout's report request: ``{traj}`` is the rendered trajectory.
REPORT_PROMPT = (
    "Given the following problem-solving trajectory:\n"
    "{traj}\n"
    "\n"
    "Your task is to distill this trajectory into a concise yet sufficiently "
    "detailed problem-solving report. \n"
    "You must only use the information contained within the provided "
    "trajectory — no additional or external information is allowed.\n"
    "\n"
    "The report must include:\n"
    "\n"
    "1. **Solution Planning**: Identify how the main problem is decomposed "
    "into subproblems, and describe the sequence and dependency "
    "relationships among those subproblems.\n"
    "2. **Solution Methods**: For each subproblem, indicate which tools were "
    "invoked to solve it, the parameters used in those tool calls, and any "
    "resulting partial answers that contributed directly or indirectly to "
    "progress toward the final answer.  \n"
    "   _Do not repeat the full output of the tools; only include the "
    "specific fragments of tool results that were essential in deriving the "
    "subanswers._\n"
    "3. **Final Reasoning**: Clearly outline the reasoning process by which "
    "the subproblems and their associated subanswers led to the derivation "
    "of the final answer.\n"
    "\n"
    "Additional requirements:\n"
    "- The report must remain **concise** and **focused**.  \n"
    "- Remove any content unrelated to problem-solving or any ineffective "
    "tool calls.  \n"
    "- Ensure the final report has clear logical structure, with each step "
    "traceable and analyzable.\n"
    "\n"
    "Finally, present the complete report in **Markdown format**, and wrap "
    "the entire report content within <report> </report> tags."
)

#: The integrate request: ``{question}``, then one `REPORT_ENTRY` per report.
INTEGRATE_PROMPT = (
    "You are tasked with solving the question: {question}.\n"
    "\n"
    "Multiple independent teams have provided detailed process reports "
    "describing their approaches to solving this problem. As the final "
    "analyst, your role is to consolidate these reports, carefully examine "
    "the problem-solving methods they contain, and identify the key "
    "information obtained in each.\n"
    "\n"
    "Your goal is to produce a final answer that perfectly resolves the "
    "question. Note that some of the reports may contain inconsistencies — "
    "you must critically evaluate which report(s) are reasonable and "
    "trustworthy.\n"
    "\n"
    "If multiple reports reach the same conclusion, this increases the "
    "likelihood that the conclusion is correct; however, this is not "
    "guaranteed. You must still carefully verify and reflect to ensure that "
    "the final selected answer is truly the most accurate possible.\n"
    "\n"
    "Wrap your final answer in <answer> </answer> tags.\n"
    "\n"
    "Important:\n"
    "- Every question has a definitive, certain answer.  \n"
    "- You are not allowed to decline answering on the grounds of "
    "uncertainty.\n"
    "- For any report that does not provide a clear and definite final "
    "answer, its confidence level should be significantly reduced.\n"
    "- You must ultimately select one report as having the most correct "
    "answer.\n"
    "- You are not allowed to call or use any external tools for "
    "verification. You must rely solely on the information already provided, "
    "conduct in-depth analysis, and then produce the final answer.\n"
    "- You are not allowed to merge multiple different answers, nor are you "
    "allowed to produce an overly broad answer that attempts to encompass all "
    "candidate answers — such an answer should be eliminated first.\n"
    "- You do not need to restate or summarize the reports; instead, provide "
    "a short-form answer that directly answers the question.\n"
    "\n"
    "Below is the content of these reports:"
)

#: One report in the integrate request, numbered from 1 (``call_info_integrate``).
REPORT_ENTRY = "\n\n[Report {number}]: {report}"

# The trajectory's records (``construct_interaction_from_record``): joined,
# then stripped.
TOOL_CALL_RECORD = "**{role}:**\n*Thinking:* {thinking}\n*Tool Call:* {tool_call}\n\n"
TOOL_RESPONSE_RECORD = "**Tool Response:**\n{tool_response}\n\n"
ANSWER_RECORD = "**{role}:**\n*Thinking:* {thinking}\n*Answer:* {prediction}\n\n"
MESSAGE_RECORD = "**{role}:**\n{content}\n\n"
#: What stands for the answer of a turn whose thinking is all it wrote.
NO_PREDICTION = "[No Prediction]"


@dataclass(frozen=True)
class Sampling:
    """How a call samples; ``stop`` empty sends no stop sequences."""

    temperature: float
    top_p: float
    presence_penalty: float | None
    stop: tuple[str, ...] = ()


#: ``get_llm_response``'s sampling, for the report and integrate calls (it
#: sends no stop sequences).
AGGREGATION_SAMPLING = Sampling(temperature=0.6, top_p=0.95, presence_penalty=1.1)
#: Longest report and integrate replies the lab asks for (each bounded here
#: by the context the server serves).
REPORT_MAX_TOKENS = 32 * 1024
INTEGRATE_MAX_TOKENS = 64 * 1024
#: Alternatives per token the partial rollouts ask for (``top_logprobs=16``).
TOP_LOGPROBS = 16
#: Most uncertain steps of an initial rollout that branches start from
#: (``--partial_sampling_topk 2``), and rollouts run from the question
#: before any branch (``--initial_rollout_num 1``).
BRANCH_STEPS = 2
INITIAL_ROLLOUTS = 1

# -- what a server returns when asked for log-probabilities --

#: Most tokens of one reply whose log-probabilities are kept (a server that
#: streams more than it was asked for is not followed further).
MAX_SCORED_TOKENS = 128 * 1024


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its text, log-probability and the top alternatives'."""

    text: str
    logprob: float
    top: tuple[float, ...] = ()


@dataclass(frozen=True)
class TokenLogprobs:
    """A model chunk: the log-probabilities of tokens just streamed.

    Only `TunableModelPort.stream_scored` yields it; the loop never sees it.
    """

    tokens: tuple[TokenLogprob, ...]


#: What a scored stream yields.
ScoredChunk = ModelChunk | TokenLogprobs


@runtime_checkable
class TunableModelPort(Protocol):
    """A model port that can sample differently and return log-probabilities."""

    def stream(
        self, messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> AsyncIterator[ModelChunk]:
        """Stream the reply to ``messages`` (see `ModelPort`)."""
        ...

    def tuned(self, sampling: Sampling) -> ModelPort:
        """The same model and endpoint, sampled with ``sampling``."""
        ...

    def stream_scored(
        self,
        messages: list[dict[str, Any]],
        max_tokens: int | None = None,
        *,
        top_logprobs: int,
    ) -> AsyncIterator[ScoredChunk]:
        """Stream the reply, with `TokenLogprobs` chunks when the server has them."""
        ...


def token_entropy(token: TokenLogprob) -> float:
    """The uncertainty of one token, as the lab's partial rollouts measure it.

    The top alternatives' probabilities are renormalised and weigh their
    log-probabilities as served: ``-Σ p̂ᵢ · log pᵢ`` (``call_llm``). With one
    alternative it is the token's own surprise, the term of the paper's
    perplexity. Values that are no log-probability (positive, infinite, NaN)
    are not counted.
    """
    values = [min(v, 0.0) for v in token.top or (token.logprob,) if math.isfinite(v)]
    if not values:
        return 0.0
    peak = max(values)
    weights = [math.exp(v - peak) for v in values]  # renormalised, overflow-free
    total = sum(weights)
    return -sum(w / total * v for w, v in zip(weights, values, strict=True))


class ReplyUncertainty:
    """The log-probabilities of one reply, and its tool call's uncertainty."""

    def __init__(self, max_tokens: int = MAX_SCORED_TOKENS) -> None:
        """Keep at most ``max_tokens`` tokens."""
        self._texts: list[str] = []
        self._entropies: list[float] = []
        self._max_tokens = max_tokens

    @property
    def served(self) -> bool:
        """Whether the server sent any log-probabilities for the reply."""
        return bool(self._texts)

    def add(self, chunk: TokenLogprobs) -> None:
        """Take the tokens of one chunk."""
        room = self._max_tokens - len(self._texts)
        for token in chunk.tokens[: max(room, 0)]:
            self._texts.append(token.text)
            self._entropies.append(token_entropy(token))

    def tool_call_uncertainty(self) -> float | None:
        """``exp(mean entropy)`` of the tokens inside the reply's tool call.

        The lab's ``tool_call_ppl``: the tokens strictly between the first
        ``<tool_call>`` and the ``</tool_call>`` after it. The call is looked
        for after the reasoning (a call written while thinking is not one).
        None when the reply calls no tool.
        """
        text = "".join(self._texts)
        thought = text.rfind("</think>")
        opening = text.find(
            "<tool_call>", thought + len("</think>") if thought >= 0 else 0
        )
        if opening < 0:
            return None
        inside = opening + len("<tool_call>")
        closing = text.find("</tool_call>", inside)
        if closing < 0:
            return None
        entropies: list[float] = []
        end = 0
        for token, entropy in zip(self._texts, self._entropies, strict=True):
            start, end = end, end + len(token)
            if start >= inside and end <= closing:
                entropies.append(entropy)
            if start >= closing:
                break
        return math.exp(fmean(entropies)) if entropies else None


@dataclass(frozen=True)
class Step:
    """An assistant step a branch can start from.

    ``messages`` is the conversation the step answered (what the branch
    continues from), ``round`` the step's round, ``pages`` the pages read
    before it (url, title).
    """

    uncertainty: float
    round: int
    messages: tuple[dict[str, Any], ...]
    pages: tuple[tuple[str, str], ...] = ()


def branch_points(
    steps: Sequence[Sequence[Step]], branches: int, top_k: int = BRANCH_STEPS
) -> list[Step | None]:
    """Where each of ``branches`` new rollouts starts (None: from the question).

    ``steps`` holds each initial rollout's steps. Branch j goes to initial
    rollout ``j mod len(steps)``, at its ``(j div len(steps)) mod top_k``-th
    most uncertain step (ties: the earlier step), so the most uncertain steps
    get a branch first and each of the top ``top_k`` gets its share, as the
    lab's ``partial_sampling_times_per_pos`` does. An initial rollout with
    fewer uncertain steps than that leaves the rest to rollouts from the
    question, as the lab fills its budget with whole-trajectory rollouts.
    """
    if not steps:
        return [None] * branches
    top_k = max(top_k, 1)
    ranked = [sorted(own, key=lambda step: -step.uncertainty)[:top_k] for own in steps]
    points: list[Step | None] = []
    for branch in range(branches):
        parent = ranked[branch % len(ranked)]
        rank = (branch // len(ranked)) % top_k
        points.append(parent[rank] if rank < len(parent) else None)
    return points


def is_wrap_up(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether ``messages`` ends with the wrap-up (a step no branch starts from)."""
    return bool(messages) and messages[-1].get("content") == WRAP_UP_MESSAGE


# -- the trajectory, as the report request holds it --

#: What ends a line for `str.splitlines` (and so, possibly, for a reader).
_LINE_BREAKS = r"\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029"
#: A line that starts (after blanks) as one of the trajectory's records.
_RECORD_LINE = re.compile(
    rf"(\A|[{_LINE_BREAKS}])([^\S{_LINE_BREAKS}]*+)"
    r"(?=\*\*(?:system|user|assistant|tool|tool response):\*\*"
    r"|\*(?:thinking|tool call|answer):\*)",
    re.IGNORECASE,
)
#: A line that starts (after blanks) as a report of the integrate request.
_REPORT_LINE = re.compile(
    rf"(\A|[{_LINE_BREAKS}])([^\S{_LINE_BREAKS}]*+)"
    r"(?=\[[ \t]*+report[ \t]*+[0-9]++[ \t]*+\])",
    re.IGNORECASE,
)
#: The protocol's tags and the report's own, defused in model and page text.
_MODEL_TAGS = (*PROMPT_TAGS, "report")

#: What stands in for a tool response left out to fit the context.
LEFT_OUT_RESPONSE = "(This tool response was left out to fit the context.)"
#: What stands in for steps left out to fit the context (``{count}`` steps).
LEFT_OUT_STEPS = "(… {count} steps of the trajectory left out to fit the context …)\n\n"

#: Passes that shrink a cut trajectory until it fits.
_CUT_PASSES = 8

RecordKind = Literal["given", "turn", "response"]


@dataclass(frozen=True)
class Record:
    """One record of the trajectory: its text, and what it holds."""

    text: str
    kind: RecordKind


def _escape_lines(pattern: re.Pattern[str], text: str) -> str:
    """A backslash before every line of ``text`` that ``pattern`` finds."""
    return pattern.sub(lambda line: f"{line[1]}{line[2]}\\", text)


def _model_text(text: str) -> str:
    """What a model or a page wrote, inert in the trajectory."""
    text = neutralise_tags(neutralise_control_tokens(text), _MODEL_TAGS)
    return _escape_lines(_RECORD_LINE, text)


def _own_text(text: str) -> str:
    """A message of the run's own (prompt, question, wrap-up), inert as well.

    Its tags stay (the system prompt holds the protocol's own, as the lab's
    trajectory shows them); control tokens and record lines are defused.
    """
    return _escape_lines(_RECORD_LINE, neutralise_control_tokens(text))


def _after_last(text: str, tag: str) -> str:
    """``text`` after the last ``tag`` (all of it without one)."""
    return text.rpartition(tag)[2]


def _before_first(text: str, tag: str) -> str:
    """``text`` before the first ``tag`` (all of it without one)."""
    return text.partition(tag)[0]


def _thinking(content: str) -> str:
    """The lab's reading of a turn's thinking: after ``<think>``, to ``</think>``."""
    return _before_first(_after_last(content, "<think>"), "</think>").strip()


def _tool_responses(content: str) -> list[str]:
    """The ``<tool_response>`` blocks of a tool-result message, in order."""
    responses: list[str] = []
    for piece in content.split("<tool_response>")[1:]:
        response, closed, _ = piece.partition("</tool_response>")
        if closed:
            responses.append(response.strip())
    return responses


def _tool_call_record(role: str, content: str, calls: tuple[str, ...]) -> Record:
    """An assistant turn that called tools: its thinking, then its calls.

    The lab's turns ran one call and it shows it; this loop runs every call
    of a turn, so each is shown, one a line (one call reads the same).
    """
    shown = "\n".join(_model_text(call.strip()) for call in calls)
    thinking = _model_text(_thinking(content))
    text = TOOL_CALL_RECORD.format(role=role, thinking=thinking, tool_call=shown)
    return Record(text, "turn")


def _answer_record(role: str, content: str, answer: str | None) -> Record:
    """An assistant turn without calls: its thinking, then its answer.

    ``answer`` is the answer the loop read in the turn. Without one, as the
    lab reads a turn: what follows the thinking; a turn that wrote nothing
    else (no ``<think>`` either) has `NO_PREDICTION`.
    """
    thinking = _thinking(content)
    if answer is None:
        answer = _before_first(
            _after_last(_after_last(content, "</think>"), "<answer>"), "</answer>"
        )
    prediction = answer.strip()
    shown = NO_PREDICTION if prediction == thinking else _model_text(prediction)
    text = ANSWER_RECORD.format(
        role=role, thinking=_model_text(thinking), prediction=shown
    )
    return Record(text, "turn")


def _message_record(message: dict[str, Any], kind: RecordKind) -> Record:
    """A message shown whole: its role, then its content."""
    role = str(message.get("role", ""))
    content = _own_text(content_text(message.get("content")))
    return Record(MESSAGE_RECORD.format(role=role, content=content), kind)


def _records(message: dict[str, Any]) -> list[Record]:
    """One message of the rollout as the lab's trajectory holds it.

    An assistant turn is read as the loop read it (`TurnParser`): its answer,
    else its calls. The lab tells them apart by the tags the text holds, the
    same on every turn it ran; here a ``<tool_call>`` written inside an
    answer stays part of the answer and poses as no call.
    """
    role = str(message.get("role", ""))
    content = content_text(message.get("content"))
    if role == "assistant":
        parser = TurnParser()
        parser.feed(content)
        turn = parser.finish()
        if turn.answer is None and turn.calls:
            return [_tool_call_record(role, content, turn.calls)]
        return [_answer_record(role, content, turn.answer)]
    if (
        role == "user"
        and "<tool_response>" in content
        and "</tool_response>" in content
    ):
        return [
            Record(
                TOOL_RESPONSE_RECORD.format(tool_response=_model_text(response)),
                "response",
            )
            for response in _tool_responses(content)
        ]
    return [_message_record(message, "turn")]


def message_records(message: dict[str, Any], *, given: bool) -> list[Record]:
    """One message of a rollout's conversation as the lab's trajectory records.

    A ``given`` message is one the run started from (system prompt, earlier
    chat, question): it is shown as it is, as the lab shows the system prompt
    and the question. The rollout's own messages follow the lab's reading of
    them (``construct_interaction_from_record``).
    """
    if given:
        return [_message_record(message, "given")]
    return _records(message)


def trajectory_records(messages: Sequence[dict[str, Any]], given: int) -> list[Record]:
    """A rollout's conversation as records; its first ``given`` messages given."""
    return [
        record
        for index, message in enumerate(messages)
        for record in message_records(message, given=index < given)
    ]


def fit_trajectory(records: Sequence[Record], budget_tokens: int) -> str:
    """The trajectory text, within ``budget_tokens`` (estimated).

    What does not fit gives way in this order: tool responses, oldest first
    (each leaves a note); then whole steps after the given messages, oldest
    first (one note says how many), the last one kept; then the middle of
    what is left.
    """
    texts = [record.text for record in records]
    sizes = [estimate_text_tokens(text) for text in texts]
    total = sum(sizes)
    note = TOOL_RESPONSE_RECORD.format(tool_response=LEFT_OUT_RESPONSE)
    for index, record in enumerate(records):
        if total <= budget_tokens:
            break
        if record.kind == "response":
            total += estimate_text_tokens(note) - sizes[index]
            texts[index], sizes[index] = note, estimate_text_tokens(note)
    steps = [i for i, r in enumerate(records) if r.kind != "given"][:-1]
    dropped: list[int] = []
    for index in steps:
        if total <= budget_tokens:
            break
        if not dropped:  # the note that says how many
            total += estimate_text_tokens(LEFT_OUT_STEPS.format(count=len(steps)))
        dropped.append(index)
        total -= sizes[index]
    if dropped:
        texts[dropped[0]] = LEFT_OUT_STEPS.format(count=len(dropped))
        for index in dropped[1:]:
            texts[index] = ""
    return _cut_middle("".join(texts).strip(), budget_tokens)


def _cut_middle(text: str, budget_tokens: int) -> str:
    """``text``, or its start and end around a cut, within ``budget_tokens``.

    The cut is sized from the estimate and shrunk until it fits (the
    estimate weighs characters unevenly); a few passes at most.
    """
    size = estimate_text_tokens(text)
    if size <= budget_tokens:
        return text
    keep = len(text) // 2
    for _ in range(_CUT_PASSES):
        keep = keep * budget_tokens // size - 1
        if keep <= 0:
            return ""
        cut = _around(text, keep)
        size = estimate_text_tokens(cut)
        if size <= budget_tokens:
            return cut
    return ""


def _around(text: str, keep: int) -> str:
    """The first and last ``keep`` characters of ``text``, a cut between."""
    return f"{text[:keep]}\n…\n{text[len(text) - keep :]}"


def report_request(trajectory: str) -> list[dict[str, Any]]:
    """The report call's messages for a rendered trajectory."""
    return [
        {"role": "system", "content": CONVERGE_SYSTEM_PROMPT},
        {"role": "user", "content": REPORT_PROMPT.format(traj=trajectory)},
    ]


def report_from_reply(content: str) -> str:
    """The report in a reply: after ``</think>``, within ``<report>…</report>``.

    As the lab reads it: without the tags, all that follows the thinking.
    """
    after = _after_last(content, "</think>").strip()
    return _before_first(_after_last(after, "<report>"), "</report>").strip()


# -- the integrate request --


def inert_report(report: str) -> str:
    """A report as the integrate request holds it.

    Control tokens and tags defused; a line that reads as another report
    (``[Report 3]:``) escaped, so a report cannot add, end or renumber one.
    """
    text = neutralise_tags(neutralise_control_tokens(report), _MODEL_TAGS)
    return _escape_lines(_REPORT_LINE, text)


def integrate_request(question: str, reports: Sequence[str]) -> list[dict[str, Any]]:
    """The integrate call's messages: the question, then every report, inert.

    The question is the user's own: control tokens and report lines are
    defused, as in every text that goes into this request.
    """
    asked = _escape_lines(_REPORT_LINE, neutralise_control_tokens(question))
    text = INTEGRATE_PROMPT.format(question=asked) + "".join(
        REPORT_ENTRY.format(number=number, report=inert_report(report))
        for number, report in enumerate(reports, start=1)
    )
    return [
        {"role": "system", "content": CONVERGE_SYSTEM_PROMPT},
        {"role": "user", "content": text},
    ]


def fit_reports(reports: Sequence[str], budget_tokens: int) -> list[str]:
    """``reports`` within ``budget_tokens`` together (estimated).

    Short reports stay whole; the long ones share what is left equally,
    each cut at its end (``" …"`` marks a cut).
    """
    sizes = [estimate_text_tokens(report) for report in reports]
    share, left, waiting = 0, budget_tokens, len(reports)
    for size in sorted(sizes):
        fair = left // waiting if waiting else 0
        if size > fair:
            share = fair
            break
        left -= size
        waiting -= 1
    else:
        return list(reports)
    return [
        report if size <= share else _cut_end(report, size, share)
        for report, size in zip(reports, sizes, strict=True)
    ]


def _cut_end(text: str, size: int, tokens: int) -> str:
    keep = int(len(text) * tokens / size) if size else 0
    return text[:keep].rstrip() + " …"
