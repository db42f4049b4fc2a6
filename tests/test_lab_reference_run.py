"""The reference run: inference/react_agent.py at its limits, exactly.

``CONTEXT_STRATEGY=reference`` (`Limits.reference_run`) ends a run as the
lab's agent does: the wrap-up is written over the last message, no call
follows the last available round (its last message becomes the lab's
"Sorry" text), the time limit is checked between rounds and ends without a
call, and every ending carries the lab's termination string. The lab's words
are kept as test data in ``tests/fixtures/lab/reference_run.json`` (see the
NOTICE there). The default keeps its kinder endings; each difference is
pinned here too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.core.test_loop import Clock, RecordingTools, call
from tests.fakes.chat import drive, make_pipe
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.scripted_model import ScriptedModel
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.valves import (
    Valves,
    research_limits,
)
from tongyi_deepresearch_openwebui_pipeline.core import events as run_events
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    LAB_ANSWER,
    LAB_CALLS_EXCEEDED,
    LAB_FORCED_ANSWER,
    LAB_FORCED_FORMAT_ERROR,
    LAB_TIME_LIMIT,
    ModelDelta,
    ModelFinish,
    ModelUsage,
    RunFinished,
    ToolOutcome,
    WrappingUp,
)
from tongyi_deepresearch_openwebui_pipeline.core.loop import (
    Limits,
    ResearchLoop,
    RunState,
    lab_termination,
)
from tongyi_deepresearch_openwebui_pipeline.core.prompts import (
    CALLS_EXCEEDED_MESSAGE,
    WRAP_UP_MESSAGE,
)
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import ToolCall

LAB = json.loads(
    (Path(__file__).parent / "fixtures/lab/reference_run.json").read_text("utf-8")
)
SYSTEM = {"role": "system", "content": "S"}
QUESTION = {"role": "user", "content": "Q"}
RESULT = {
    "role": "user",
    "content": "<tool_response>\nRESULT for search\n</tool_response>",
}
FIRST_TURN = {"role": "assistant", "content": call("search", query=["a"])}


def test_the_reference_words_are_the_labs_bytes():
    assert LAB["WRAP_UP_MESSAGE"] == WRAP_UP_MESSAGE
    assert LAB["CALLS_EXCEEDED_MESSAGE"] == CALLS_EXCEEDED_MESSAGE
    terminations = LAB["terminations"]
    assert [
        terminations["answer"],
        terminations["token_limit_answer"],
        terminations["token_limit_format_error"],
        terminations["calls_exceeded"],
        terminations["answer_not_found"],
        terminations["time_limit"],
    ] == [
        LAB_ANSWER,
        LAB_FORCED_ANSWER,
        LAB_FORCED_FORMAT_ERROR,
        LAB_CALLS_EXCEEDED,
        run_events.LAB_ANSWER_NOT_FOUND,
        LAB_TIME_LIMIT,
    ]
    defaults = Limits()
    assert (defaults.max_rounds, defaults.max_context_tokens, defaults.max_seconds) == (
        LAB["max_llm_calls"],
        LAB["max_context_tokens"],
        LAB["time_limit_seconds"],
    )


def _loop(model: ScriptedModel, limits: Limits, tools: Any = None, clock: Any = None):
    clock = clock or Clock()
    state = RunState(messages=[dict(SYSTEM), dict(QUESTION)], started=clock())
    return ResearchLoop(state, model, tools or RecordingTools(), limits, clock)


async def _run(loop: ResearchLoop) -> tuple[list[Any], RunFinished]:
    events = [event async for event in loop.run()]
    end = events[-1]
    assert isinstance(end, RunFinished)
    return events, end


def _full_turn() -> list[Any]:
    """A call, after which the conversation is over the 4,096-token budget."""
    return [
        ModelDelta(content=call("search", query=["a"])),
        ModelUsage(5000, 0),
        ModelFinish("stop"),
    ]


# -- the context limit -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "answer", "termination"),
    [
        ("<think>x</think>\n<answer>best</answer>", "best", LAB_FORCED_ANSWER),
        ("best guess, no tags", "best guess, no tags", LAB_FORCED_FORMAT_ERROR),
        ("<answer>cut before its end", "cut before its end", LAB_FORCED_FORMAT_ERROR),
        ("<think>only thinking</think>", "", LAB_FORCED_FORMAT_ERROR),
    ],
    ids=["answer", "untagged", "unclosed", "none"],
)
async def test_the_reference_wrap_up_overwrites_the_last_message(
    reply: str, answer: str, termination: str
):
    model = ScriptedModel(_full_turn(), reply)
    limits = Limits(max_context_tokens=4096, reference_run=True)
    _, end = await _run(_loop(model, limits))

    wrap_up = [
        SYSTEM,
        QUESTION,
        FIRST_TURN,
        {"role": "user", "content": WRAP_UP_MESSAGE},
    ]
    assert model.seen == [[SYSTEM, QUESTION], wrap_up]
    assert (end.answer, end.lab_termination) == (answer, termination)
    assert end.reason == ("context_limit" if answer else "no_answer")
    assert list(end.trajectory[:-1]) == wrap_up
    assert end.trajectory[-1]["role"] == "assistant"


async def test_the_default_wrap_up_keeps_the_last_result():
    model = ScriptedModel(_full_turn(), "<answer>best</answer>")
    _, end = await _run(_loop(model, Limits(max_context_tokens=4096)))
    assert model.seen[1] == [
        SYSTEM,
        QUESTION,
        FIRST_TURN,
        RESULT,
        {"role": "user", "content": WRAP_UP_MESSAGE},
    ]
    assert (end.reason, end.lab_termination) == ("context_limit", LAB_FORCED_ANSWER)


# -- the round limit -------------------------------------------------------------------


async def test_the_reference_round_limit_makes_no_further_call():
    model = ScriptedModel(call("search", query=["a"]), call("search", query=["b"]))
    tools = RecordingTools()
    limits = Limits(max_rounds=2, reference_run=True)
    events, end = await _run(_loop(model, limits, tools))

    assert len(model.seen) == 2  # the lab makes no call past its last one
    assert len(tools.calls) == 2  # its last turn's call still runs, as there
    assert not any(isinstance(e, WrappingUp) for e in events)
    assert (end.reason, end.answer, end.lab_termination) == (
        "round_limit",
        "",
        LAB_CALLS_EXCEEDED,
    )
    assert list(end.trajectory) == [
        SYSTEM,
        QUESTION,
        FIRST_TURN,
        RESULT,
        {"role": "assistant", "content": call("search", query=["b"])},
        {"role": "user", "content": CALLS_EXCEEDED_MESSAGE},
    ]


@pytest.mark.parametrize(
    ("reply", "answer", "termination"),
    [
        ("<answer>late</answer>", "late", ""),
        ("<think>no</think>", "", LAB_CALLS_EXCEEDED),
    ],
    ids=["answered", "not-answered"],
)
async def test_the_default_round_limit_asks_once_more(
    reply: str, answer: str, termination: str
):
    # An answer at the round limit is kinder to a chat user; the lab's records
    # have no name for it ("").
    model = ScriptedModel(call("search", query=["a"]), reply)
    _, end = await _run(_loop(model, Limits(max_rounds=1)))
    assert model.seen[1][-1] == {"role": "user", "content": WRAP_UP_MESSAGE}
    assert (end.answer, end.lab_termination) == (answer, termination)


async def test_a_full_context_at_the_round_limit_gets_the_wrap_up_over_the_sorry():
    # The lab writes "Sorry" over the last message, then finds the context full
    # and writes the wrap-up over it: one more call, the token-limit ending.
    model = ScriptedModel(_full_turn(), "<answer>best</answer>")
    limits = Limits(max_rounds=1, max_context_tokens=4096, reference_run=True)
    _, end = await _run(_loop(model, limits))
    assert model.seen[1] == [
        SYSTEM,
        QUESTION,
        FIRST_TURN,
        {"role": "user", "content": WRAP_UP_MESSAGE},
    ]
    assert (end.reason, end.lab_termination) == ("context_limit", LAB_FORCED_ANSWER)


# -- the time limit --------------------------------------------------------------------


class SlowTools(RecordingTools):
    """Each call takes the run past its time limit (on the injected clock)."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        super().__init__()
        self.clock = clock
        self.seconds = seconds

    async def run(self, call: ToolCall) -> ToolOutcome:
        self.clock.now += self.seconds
        return await super().run(call)


@pytest.mark.parametrize("reference", [True, False], ids=["reference", "default"])
async def test_the_time_limit(reference: bool):
    clock = Clock()
    model = ScriptedModel(call("search", query=["a"]), "<answer>in time</answer>")
    limits = Limits(max_seconds=60, reference_run=reference)
    _, end = await _run(_loop(model, limits, SlowTools(clock, 61), clock))
    if reference:
        # Checked before the next round: the run ends there, without a call.
        assert len(model.seen) == 1
        assert (end.reason, end.answer, end.lab_termination) == (
            "time_limit",
            "",
            LAB_TIME_LIMIT,
        )
        assert list(end.trajectory) == [SYSTEM, QUESTION, FIRST_TURN, RESULT]
    else:
        # The default asks for the answer within its grace.
        assert model.seen[1][-1] == {"role": "user", "content": WRAP_UP_MESSAGE}
        assert (end.reason, end.answer, end.lab_termination) == (
            "time_limit",
            "in time",
            "",
        )


# -- the lab's names for every ending --------------------------------------------------


@pytest.mark.parametrize(
    ("ending", "answered", "name"),
    [
        ("answer", "closed", LAB_ANSWER),
        ("answer", "unmarked", ""),
        ("context_limit", "closed", LAB_FORCED_ANSWER),
        ("context_limit", "unmarked", LAB_FORCED_FORMAT_ERROR),
        ("context_limit", "none", LAB_FORCED_FORMAT_ERROR),
        ("round_limit", "none", LAB_CALLS_EXCEEDED),
        ("round_limit", "closed", ""),
        ("time_limit", "none", LAB_TIME_LIMIT),
        ("time_limit", "unmarked", ""),
        ("error", "none", ""),
    ],
)
def test_each_ending_has_the_labs_name_or_none(ending: Any, answered: Any, name: str):
    assert lab_termination(ending, answered) == name


# -- the valve, through the pipe -------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "at_limit", "reference"),
    [
        ("consolidate", "consolidate", False),
        ("wrap_up", "wrap_up", False),
        ("reference", "wrap_up", True),
    ],
)
def test_the_context_strategy_valve(strategy: Any, at_limit: str, reference: bool):
    limits = research_limits(Valves(CONTEXT_STRATEGY=strategy), 0)
    assert (limits.at_limit, limits.reference_run) == (at_limit, reference)


async def test_a_reference_run_through_the_pipe_stops_at_its_round_limit():
    with FakeOpenAI() as fake:
        fake.script(
            Reply(reasoning="Search first.", content=call("search", query=["q"])),
            Reply(content="<answer>never asked for</answer>"),
        )
        pipe = make_pipe(fake, CONTEXT_STRATEGY="reference", MAX_TOOL_ROUNDS=1)
        text, _, _ = await drive(pipe, [{"role": "user", "content": "Q?"}])
        bodies = list(fake.bodies)

    assert len(bodies) == 1
    assert (
        "The model ended without a final answer (the round limit was reached)." in text
    )
    assert "never asked for" not in text
