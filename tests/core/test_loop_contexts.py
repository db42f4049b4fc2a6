"""The loop against the context the server really serves (issue 17).

A small served context is said at the start; a server that processed far
fewer prompt tokens than were sent (a silent cut) is said and the run wraps
up; a request refused for its length makes room and still asks for the
answer, a bounded number of times.
"""

from __future__ import annotations

from tests.core.test_loop import (
    RecordingTools,
    call,
    collect,
    finished,
    make_loop,
)
from tests.fakes.scripted_model import ScriptedModel
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    ContextOverflowError,
    ContextWarning,
    ModelDelta,
    ModelFinish,
    ModelUsage,
    WrappingUp,
)
from tongyi_deepresearch_openwebui_pipeline.core.loop import (
    DROPPED_RESULT,
    MIN_RESEARCH_CONTEXT,
    OVERFLOW_RETRIES,
    Limits,
)
from tongyi_deepresearch_openwebui_pipeline.core.prompts import WRAP_UP_MESSAGE

DROPPED = f"<tool_response>\n{DROPPED_RESULT}\n</tool_response>"
PAGE = "evidence " * 4000  # ~36k characters: ~9k tokens


def warnings(events) -> list[str]:
    return [e.text for e in events if isinstance(e, ContextWarning)]


async def test_a_small_served_context_is_said_at_the_start():
    model = ScriptedModel("<answer>a</answer>")
    limits = Limits(model_context_tokens=8192, max_output_tokens=2000)
    events = await collect(make_loop(model, limits=limits))
    assert isinstance(events[0], ContextWarning)
    assert "8,192" in events[0].text and "num_ctx" in events[0].text
    assert finished(events).answer == "a"


async def test_a_served_context_big_enough_is_not_warned_about():
    model = ScriptedModel("<answer>a</answer>")
    limits = Limits(model_context_tokens=MIN_RESEARCH_CONTEXT)
    assert warnings(await collect(make_loop(model, limits=limits))) == []


async def test_a_silent_cut_is_said_and_the_run_wraps_up_with_an_answer():
    # Round 2 sends the page (~9k tokens) and the server says it processed
    # 2,000: it dropped the start of the conversation.
    model = ScriptedModel(
        call("visit", url=["https://a.org"], goal="g"),
        [
            ModelDelta(content=call("search", query=["more"])),
            ModelFinish("stop"),
            ModelUsage(prompt_tokens=2000, completion_tokens=50),
        ],
        "<answer>what I have</answer>",
    )
    tools = RecordingTools(result=PAGE)
    events = await collect(make_loop(model, tools))
    said = warnings(events)
    assert len(said) == 1 and "processed only 2,000" in said[0]
    end = finished(events)
    assert end.reason == "context_limit" and end.answer == "what I have"
    assert any(isinstance(e, WrappingUp) for e in events)
    assert model.seen[-1][-1]["content"] == WRAP_UP_MESSAGE


async def test_usage_close_to_the_estimate_is_not_a_cut():
    model = ScriptedModel(
        call("visit", url=["https://a.org"], goal="g"),
        [
            ModelDelta(content="<answer>done</answer>"),
            ModelFinish("stop"),
            # The estimate errs high: a real count of 85% of it is normal.
            ModelUsage(prompt_tokens=7800, completion_tokens=10),
        ],
    )
    events = await collect(make_loop(model, RecordingTools(result=PAGE)))
    assert warnings(events) == []
    assert finished(events).reason == "answer"


async def test_a_short_prompt_never_counts_as_cut():
    model = ScriptedModel(
        [
            ModelDelta(content="<answer>done</answer>"),
            ModelFinish("stop"),
            ModelUsage(prompt_tokens=1, completion_tokens=1),
        ]
    )
    assert warnings(await collect(make_loop(model))) == []


async def test_an_overflow_makes_room_and_still_asks_for_the_answer():
    model = ScriptedModel(
        call("visit", url=["https://a.org"], goal="g"),
        call("visit", url=["https://b.org"], goal="g"),
        ContextOverflowError("The server refused the conversation as too long.", 12000),
        "<answer>from what fits</answer>",
    )
    events = await collect(make_loop(model, RecordingTools(result=PAGE)))
    end = finished(events)
    assert end.reason == "context_limit" and end.answer == "from what fits"
    assert any("too long" in text for text in warnings(events))
    final = model.seen[-1]
    assert final[-1]["content"] == WRAP_UP_MESSAGE
    # Two ~9k-token pages cannot fit in 12k with room for the reply: both go.
    results = [m["content"] for m in final if m["role"] == "user"][1:-1]
    assert results == [DROPPED, DROPPED]


async def test_an_overflow_of_the_wrap_up_shrinks_again():
    model = ScriptedModel(
        call("visit", url=["https://a.org"], goal="g"),
        call("visit", url=["https://b.org"], goal="g"),
        ContextOverflowError("too long", 0),  # no limit given: shrink by itself
        ContextOverflowError("too long", 0),
        "<answer>at last</answer>",
    )
    events = await collect(make_loop(model, RecordingTools(result=PAGE)))
    assert finished(events).answer == "at last"
    sizes = [len(str(seen)) for seen in model.seen[2:]]
    assert sizes[0] > sizes[-1]  # each attempt sent less


async def test_overflow_retries_are_bounded():
    overflows = [ContextOverflowError("too long", 500)] * (OVERFLOW_RETRIES + 2)
    model = ScriptedModel(call("search", query=["a"]), *overflows)
    events = await collect(make_loop(model))
    end = finished(events)
    assert end.reason == "error" and "too long" in end.error
    # The round, then the wrap-up and its retries: nothing more.
    assert len(model.seen) == 2 + OVERFLOW_RETRIES + 1
