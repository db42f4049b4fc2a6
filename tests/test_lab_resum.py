"""ReSum as published: what the summary model and the research model see.

The lab's ReSum (arXiv 2509.13313) is kept as test data in
``tests/fixtures/lab/resum_prompts.json`` (its prompt strings, restart
message pieces and settings, from ``WebAgent/WebResummer/src`` of
Alibaba-NLP/DeepResearch; see the NOTICE there). The oracles below build, from
that data alone, what the lab's method sends: the prompt with its slots
replaced, the history as ``str()`` of each message joined by line breaks, the
reply read as ``summary_utils.py`` reads it, and the restart message. The
project must send the same bytes.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.core.test_loop import RecordingTools, call
from tests.fakes.chat import drive
from tests.fakes.long_research import EvidenceTools, LongResearch, page_url
from tests.fakes.openai_server import FakeOpenAI, Reply, answer
from tests.fakes.pages import PageSite
from tests.fakes.scripted_model import ScriptedModel
from tests.test_pipe_with_tools import local_tools, make_pipe
from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    OpenAIModelClient,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.valves import (
    Valves,
    model_settings,
    summary_settings,
)
from tongyi_deepresearch_openwebui_pipeline.core import prompts
from tongyi_deepresearch_openwebui_pipeline.core.budget import messages_tokens
from tongyi_deepresearch_openwebui_pipeline.core.consolidation import (
    rendered_message,
    state_from_reply,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    LAB_ANSWER,
    Consolidated,
    ConsolidationStarted,
    ModelDelta,
    ModelFinish,
    ModelUsage,
    RunFinished,
)
from tongyi_deepresearch_openwebui_pipeline.core.loop import (
    Limits,
    ResearchLoop,
    RunState,
)
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import wrap_responses

LAB = json.loads(
    (Path(__file__).parent / "fixtures/lab/resum_prompts.json").read_text("utf-8")
)
SLOTS = LAB["placeholders"]


# -- the lab's method, from its published data (the oracles) ---------------------------


def lab_history(messages: list[dict[str, Any]]) -> str:
    """``summary_utils.py``: each message's ``str()``, joined."""
    assert all(set(m) == {"role", "content"} for m in messages)
    return LAB["history_separator"].join(str(m) for m in messages)


def lab_summary_request(
    question: str, history: list[dict[str, Any]], last_summary: str = ""
) -> str:
    """The prompt as ``summarize_conversation`` fills it."""
    if not last_summary:
        return (
            LAB["QUERY_SUMMARY_PROMPT"]
            .replace(SLOTS["question"], question)
            .replace(SLOTS["recent_history_messages"], lab_history(history))
        )
    return (
        LAB["QUERY_SUMMARY_PROMPT_LAST"]
        .replace(SLOTS["question"], question)
        .replace(SLOTS["recent_history_messages"], lab_history(history))
        .replace(SLOTS["last_summary"], last_summary)
    )


def lab_summary(reply: str) -> str:
    """``call_resum_server``'s reading of a reply: the summary, tags included."""
    text = re.sub(r"<think>.*?</think>", "", reply, flags=re.DOTALL).strip()
    wrapping = LAB["summary_wrapping"]
    if wrapping["open"] in text:
        text = text.split(wrapping["open"])[1].split(wrapping["close"])[0]
    return wrapping["open"] + text + wrapping["close"]


def lab_restart(question: str, tagged_summary: str) -> str:
    """``react_agent.py``'s restart message (the summary as returned, tags included)."""
    restart = LAB["restart"]
    return (
        restart["before_question"]
        + question
        + restart["after_question"]
        + restart["before_summary"]
        + tagged_summary
        + restart["after_summary"]
    )


def is_summary_request(body: dict[str, Any]) -> bool:
    """ReSum's request: one user message holding one of its prompts."""
    messages = body["messages"]
    head = LAB["QUERY_SUMMARY_PROMPT"].split("\n", 1)[0]
    return (
        len(messages) == 1
        and messages[0]["role"] == "user"
        and messages[0]["content"].startswith(head)
    )


# -- the prompts, byte for byte --------------------------------------------------------


def test_the_summary_prompts_are_the_labs_bytes():
    assert LAB["QUERY_SUMMARY_PROMPT"] == prompts.QUERY_SUMMARY_PROMPT
    assert LAB["QUERY_SUMMARY_PROMPT_LAST"] == prompts.QUERY_SUMMARY_PROMPT_LAST
    assert (
        SLOTS["question"],
        SLOTS["recent_history_messages"],
        SLOTS["last_summary"],
    ) == (prompts.QUESTION_SLOT, prompts.HISTORY_SLOT, prompts.LAST_SUMMARY_SLOT)


def test_the_restart_message_is_the_labs_bytes():
    summary = "\n- Essential Information: the bridge opened in 1932.\n"
    wrapping = LAB["summary_wrapping"]
    assert prompts.resumption_message("Who built it?", summary) == lab_restart(
        "Who built it?", wrapping["open"] + summary + wrapping["close"]
    )


#: Messages that exercise how Python writes a dict: quotes of both kinds,
#: backslashes, line breaks, tabs, non-ASCII text and a control character.
AWKWARD_HISTORY = [
    {
        "role": "assistant",
        "content": "<think>\nplan\n</think>\n\n<tool_call>\n{}\n</tool_call>",
    },
    {
        "role": "user",
        "content": (
            '<tool_response>\nIt\'s "quoted" \\ C:\\path\t→ 東京\x07\n</tool_response>'
        ),
    },
    {"role": "assistant", "content": "only 'single' quotes"},
    {"role": "user", "content": 'only "double" quotes'},
]


def test_the_history_is_written_as_the_lab_writes_it():
    assert "\n".join(rendered_message(m) for m in AWKWARD_HISTORY) == lab_history(
        AWKWARD_HISTORY
    )


@pytest.mark.parametrize(
    "last", ["", "<summary>\n- Essential Information: X.\n</summary>"]
)
def test_the_summary_request_is_the_labs_prompt_filled(last: str):
    question = "Which 'bridge' opened in 1932?"
    request, _ = _request(question, AWKWARD_HISTORY, last)
    assert request == [
        {
            "role": "user",
            "content": lab_summary_request(question, AWKWARD_HISTORY, last),
        }
    ]


def _request(question: str, history: list[dict[str, Any]], last: str):
    from tongyi_deepresearch_openwebui_pipeline.core.consolidation import (
        summary_request,
    )

    return summary_request(question, history, last, hard_limit=1_000_000)


def test_text_put_in_a_slot_is_not_filled_again():
    # The lab chains str.replace: a question holding "{{{recent_history_messages}}}"
    # got the whole history spliced into it, and a page holding
    # "{{{last_summary}}}" the last summary. Here a slot is filled once.
    question = "What does {{{recent_history_messages}}} mean?"
    history = [
        {
            "role": "user",
            "content": "<tool_response>\n{{{last_summary}}}\n</tool_response>",
        }
    ]
    text = prompts.summary_prompt(
        question, lab_history(history), "<summary>S</summary>"
    )
    expected = (
        LAB["QUERY_SUMMARY_PROMPT_LAST"]
        .replace(SLOTS["last_summary"], "<summary>S</summary>")
        .replace(SLOTS["recent_history_messages"], lab_history(history))
        .replace(SLOTS["question"], question)
    )
    assert text == expected
    assert text.count("<summary>S</summary>") == 1


# -- the reply, read as the lab reads it -----------------------------------------------

LAB_READ_REPLIES = [
    "<think>\nplan it\n</think>\n\n<summary>\n- Essential Information: A.\n</summary>",
    "<summary>- Essential Information: A is 3.</summary> and text after it",
    "Before it. <summary>\n- Essential Information: A is 3 (https://a.org/x)\n",
    "<summary>first part of it, long enough<summary>second part</summary>",
    "<think>a</think>kept <think>b</think>\n- Essential Information: no tags at all.",
    "<think>never closed, so kept <summary>inside the thought, still read</summary>",
    "  \n- Essential Information: untagged, with blanks around it.\n\n  ",
    "<think>1</think><think>2<think>3</think><summary>after those thoughts</summary>",
]


@pytest.mark.parametrize("reply", LAB_READ_REPLIES)
def test_a_reply_is_read_as_the_lab_reads_it(reply: str):
    wrapping = LAB["summary_wrapping"]
    assert wrapping["open"] + state_from_reply(reply) + wrapping[
        "close"
    ] == lab_summary(reply)


# -- when: ReSum's point, on the served context ----------------------------------------


@pytest.mark.parametrize(
    ("served", "budget", "point"),
    [
        (32768, 110 * 1024, 0.9 * (32 * 1024 - 1000)),  # 28,591.2: MAX_CONTEXT=32
        (65536, 110 * 1024, 0.9 * (64 * 1024 - 1000)),
        (131072, 110 * 1024, 0.9 * (110 * 1024 - 1000)),  # within the budget
        (0, 110 * 1024, 0.9 * (110 * 1024 - 1000)),  # unknown: the budget
        (131072, 32 * 1024, 0.9 * (32 * 1024 - 1000)),  # run_resum.sh on 128K
    ],
)
def test_the_consolidation_point_is_resums(served: int, budget: int, point: float):
    limits = Limits(model_context_tokens=served, max_context_tokens=budget)
    assert limits.consolidation_point() == pytest.approx(point, abs=1e-9)


def _usage_to_reach(context: int, result: str) -> int:
    """Prompt tokens a turn must report for the conversation to be ``context``.

    After the turn the loop counts the reported prompt and completion, the
    reply's framing and the tool result it adds (estimated).
    """
    added = messages_tokens([{"content": wrap_responses([result])}])
    return context - 5 - added


async def test_the_run_consolidates_when_a_round_reaches_resums_point():
    # 32K served: ReSum's point is 28,591.2 tokens. A round that leaves the
    # conversation at 28,591 goes on; one that leaves it at 28,592 consolidates.
    result = "RESULT for search"

    def turn(context: int) -> list[Any]:
        prompt = _usage_to_reach(context, result)
        return [
            ModelDelta(content=call("search", query=["q"])),
            ModelUsage(prompt, 0),
            ModelFinish("stop"),
        ]

    summary = "<summary>\n- Essential Information: the search found RESULT.\n</summary>"
    model = ScriptedModel(turn(28591), turn(28592), summary, "<answer>RESULT</answer>")
    state = RunState(
        messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
        started=time.monotonic(),
    )
    limits = Limits(model_context_tokens=32768, at_limit="consolidate")
    events = [
        e async for e in ResearchLoop(state, model, RecordingTools(), limits).run()
    ]

    started = [e for e in events if isinstance(e, ConsolidationStarted)]
    assert [(e.context_tokens, e.context_limit) for e in started] == [(28592, 28591)]
    # The third request is the summary's: the lab's, of the rounds after the question.
    history = [
        *model.seen[1][2:],
        {"role": "assistant", "content": call("search", query=["q"])},
        {"role": "user", "content": wrap_responses([result])},
    ]
    assert model.seen[2] == [
        {"role": "user", "content": lab_summary_request("Q", history)}
    ]
    assert model.seen[3] == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": lab_restart("Q", summary)},
    ]
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.reason, end.answer, end.lab_termination) == (
        "answer",
        "RESULT",
        LAB_ANSWER,
    )


# -- a research on a 32K server, over HTTP ---------------------------------------------

QUESTION = "What are the properties of the items?"
SYSTEM = {"role": "system", "content": "You are a deep research assistant."}
SERVED = 32768


class LabResearch:
    """A scripted research whose summaries follow ReSum's prompt.

    Research turns and page extractions are `LongResearch`'s (one page a
    round, then the answer citing page 1 if its URL is still in the
    conversation). A summary request gets what a summary model following
    the lab's prompt writes: the essential information, here the first
    finding with the page it came from (the first URL of the request: the
    history's, or the last summary's) and the latest page; ``forgetful``
    keeps only the latest page; ``fails``: the summary server answers 500.
    ``answers_after_restart``: a conversation that restarted from a summary
    is answered at once (as is any request without the research prompt), so
    that concurrent rollouts each consolidate once, however their turns
    interleave.
    """

    def __init__(
        self,
        url_of: Any,
        rounds: int,
        *,
        forgetful: bool = False,
        fails: bool = False,
        answers_after_restart: bool = False,
    ) -> None:
        self.url_of = url_of
        self.answers_after_restart = answers_after_restart
        self.research = LongResearch(url_of, rounds=rounds)
        self.forgetful = forgetful
        self.fails = fails
        self.summary_bodies: list[dict[str, Any]] = []
        #: Each summary written, the text between its tags.
        self.written: list[str] = []

    @property
    def turns(self) -> int:
        """Research turns answered."""
        return self.research.turns

    @property
    def summaries(self) -> int:
        """Summary requests answered."""
        return len(self.summary_bodies)

    def __call__(self, body: dict[str, Any]) -> Reply:
        if not is_summary_request(body):
            if body.get("stream") and self._answers_now(body["messages"]):
                return self._answer(body["messages"])
            return self.research(body)
        self.summary_bodies.append(body)
        if self.fails:
            return Reply(status=500, error="summary model down")
        content = body["messages"][0]["content"]
        urls = re.findall(r"https?://[^\s'\"\\]+?/count/\d+", content)
        first = "" if self.forgetful else f"the first finding is on {urls[0]}; "
        summary = (
            f"\n- Essential Information: {first}items have numbered properties "
            f"(latest page: {urls[-1]}).\n"
        )
        self.written.append(summary)
        return Reply(
            reasoning="Condense the history.", content=f"<summary>{summary}</summary>"
        )

    def _answers_now(self, messages: list[dict[str, Any]]) -> bool:
        if not self.answers_after_restart:
            return False
        opening = str(messages[1]["content"]) if len(messages) > 1 else ""
        research = "<tools>" in str(messages[0].get("content"))
        return not research or opening.startswith("Question: ")

    def _answer(self, messages: list[dict[str, Any]]) -> Reply:
        """`LongResearch`'s answer: page 1 cited if its URL is in the conversation."""
        first = self.url_of(1)
        seen = any(first in str(m.get("content")) for m in messages)
        cited = f"The first finding is on [page 1]({first})." if seen else "No source."
        return Reply(reasoning="Enough.", content=answer(cited))


async def _research_on_32k(rounds: int) -> tuple[LabResearch, FakeOpenAI, list[Any]]:
    research = LabResearch(page_url, rounds=rounds)
    with FakeOpenAI(max_model_len=SERVED, enforce_context=True) as fake:
        fake.respond_with(research)
        valves = Valves(API_BASE_URL=fake.base_url, MODEL_ID=fake.model)
        settings = model_settings(valves, "")
        async with httpx.AsyncClient() as http:
            state = RunState(
                messages=[SYSTEM, {"role": "user", "content": QUESTION}],
                started=time.monotonic(),
            )
            loop = ResearchLoop(
                state,
                OpenAIModelClient(settings, http),
                EvidenceTools(),
                Limits(model_context_tokens=SERVED, at_limit="consolidate"),
                summarizer=OpenAIModelClient(
                    summary_settings(valves, settings, ""), http
                ),
            )
            events = [event async for event in loop.run()]
    return research, fake, events


async def test_a_32k_research_consolidates_with_the_labs_request_and_restart():
    research, fake, events = await _research_on_32k(rounds=30)
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.reason, end.lab_termination) == ("answer", LAB_ANSWER)
    assert end.stats.rounds == 30
    assert fake.refused == 0
    summaries = research.written
    assert len(summaries) >= 2, "the context must have filled twice"
    assert [e.context_limit for e in events if isinstance(e, ConsolidationStarted)] == [
        28591
    ] * len(summaries)

    # The trajectory holds each conversation, then the restart that replaced it.
    trajectory = list(end.trajectory)
    restarts = [
        i for i, m in enumerate(trajectory) if m["content"].startswith("Question: ")
    ]
    assert len(restarts) == len(summaries)
    opening = 1  # the question; after a consolidation, the restart
    last = ""
    for index, (body, summary) in enumerate(
        zip(research.summary_bodies, summaries, strict=True)
    ):
        history = trajectory[opening + 1 : restarts[index]]
        messages = [
            {"role": "user", "content": lab_summary_request(QUESTION, history, last)}
        ]
        assert body == {
            "model": fake.model,
            "messages": messages,
            "stream": True,
            "temperature": 0.6,
            "top_p": 0.95,
            "max_tokens": min(4096, SERVED - messages_tokens(messages)),
            "stream_options": {"include_usage": True},
        }
        last = lab_summary(
            f"<think>\nCondense the history.\n</think>\n\n<summary>{summary}</summary>"
        )
        assert trajectory[restarts[index]] == {
            "role": "user",
            "content": lab_restart(QUESTION, last),
        }
        opening = restarts[index]
    # The research model went on from the system prompt and the restart alone.
    after_first = fake.bodies[fake.bodies.index(research.summary_bodies[0]) + 1]
    assert after_first["messages"] == [SYSTEM, trajectory[restarts[0]]]
    # Page 1 was read before the first consolidation and is still cited.
    assert f"[page 1]({page_url(1)})" in end.answer
    assert trajectory[-1]["role"] == "assistant"
    assert [e.number for e in events if isinstance(e, Consolidated)] == list(
        range(1, len(summaries) + 1)
    )


# -- citations across consolidations, through the pipe ---------------------------------


@pytest.mark.parametrize(
    "forgetful", [False, True], ids=["summary-keeps-url", "summary-drops-url"]
)
async def test_pages_read_before_a_consolidation_keep_their_numbers(forgetful: bool):
    # The run's source ledger spans consolidations: a URL the summary kept is
    # cited with the number it got when it was read; a page whose URL the
    # summary dropped is still listed with its number under the answer.
    with (
        PageSite() as site,
        FakeOpenAI(max_model_len=SERVED, enforce_context=True) as fake,
    ):
        # Pages 101-116: no page's URL starts with another's.
        research = LabResearch(
            lambda k: site.url(f"/count/{100 + k}"), rounds=16, forgetful=forgetful
        )
        fake.respond_with(research)
        pipe = make_pipe(fake, local_tools("", allow_private=True), API_KEY="")
        text, _, _ = await drive(pipe, [{"role": "user", "content": QUESTION}])

    first = site.url("/count/101")
    assert research.summaries >= 1, "the context must have filled"
    assert fake.refused == 0
    assert f"1. [{first}]({first})" in text
    if forgetful:
        assert "No source." in text
        assert f"[page 1]({first})" not in text
    else:
        assert f"[page 1]({first}) [1]" in text
