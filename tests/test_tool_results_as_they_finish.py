"""Each tool call's result is yielded as that call finishes, not with the turn's.

A turn's calls run together; a quick search's card must not wait for the slow
page read beside it. The model still gets all the results in one message, in
the order of its calls. No sleeps: the slow call waits on an `asyncio.Event`
that the test sets only once the quick call's result has come out, so code
that holds the results until the slowest call finishes never gets there (the
test's `asyncio.timeout` is only a bound that turns that hang into a failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from tests.fakes.scripted_model import ScriptedModel
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    Event,
    RunFinished,
    ToolCallFinished,
    ToolCallStarted,
    ToolOutcome,
)
from tongyi_deepresearch_openwebui_pipeline.core.loop import (
    Limits,
    ResearchLoop,
    RunState,
)
from tongyi_deepresearch_openwebui_pipeline.core.sources import PageRead
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import ToolCall

#: Upper bound on waiting for an event that the code under test owes.
WAIT_SECONDS = 10.0
SLOW_PAGE = PageRead("https://slow.example/page", "Slow page")
QUICK_PAGE = PageRead("https://quick.example/page", "Quick page")


def call(name: str, **arguments: Any) -> str:
    payload = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{payload}\n</tool_call>"


#: One turn, two calls: the slow page read first, the quick search second.
TWO_CALLS = call("visit", url=[SLOW_PAGE.url], goal="g") + call(
    "search", query=["quick"]
)


class HeldVisit:
    """A tool port: `visit` waits until ``release`` is set; `search` answers at once.

    Records each call's cancellation (the call's name), as a tool would see it.
    """

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cancelled: list[str] = []

    def available(self) -> list[str]:
        return ["search", "visit"]

    async def run(self, call: ToolCall) -> ToolOutcome:
        if call.name == "search":
            return ToolOutcome(
                "quick result", pages=(QUICK_PAGE,), counts=(("searches", 1),)
            )
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(call.name)
            raise
        return ToolOutcome(
            "slow result", pages=(SLOW_PAGE,), counts=(("pages_requested", 1),)
        )


def research(model: ScriptedModel, tools: HeldVisit) -> ResearchLoop:
    state = RunState(
        messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
        started=0.0,
    )
    return ResearchLoop(state, model, tools, Limits(), clock=lambda: 0.0)


def tool_event(event: Event) -> tuple[str, int] | None:
    """("started" | "finished", the call's index) for a tool event, else None."""
    if isinstance(event, ToolCallStarted):
        return ("started", event.index)
    if isinstance(event, ToolCallFinished):
        return ("finished", event.index)
    return None


async def next_event(events: AsyncGenerator[Event, None], waiting_for: str) -> Event:
    """The run's next event, or a failure naming what never came."""
    try:
        async with asyncio.timeout(WAIT_SECONDS):
            return await anext(events)
    except TimeoutError:
        pytest.fail(f"the run hung waiting for {waiting_for}")


async def test_a_quick_calls_result_comes_before_the_slow_call_beside_it_ends() -> None:
    tools = HeldVisit()
    model = ScriptedModel(TWO_CALLS, "<answer>done</answer>")
    loop = research(model, tools)
    events = loop.run()
    assert isinstance(events, AsyncGenerator)
    seen: list[Event] = []
    pages_when_quick_finished: list[tuple[str, str]] = []
    searches_when_quick_finished = -1
    async with contextlib.aclosing(events):
        event = await next_event(events, "the run's first event")
        while not isinstance(event, RunFinished):
            seen += [event] if tool_event(event) else []
            if tool_event(event) == ("finished", 1):
                # Counted as it finished, before the slow call ends.
                pages_when_quick_finished = list(loop.state.pages)
                searches_when_quick_finished = loop.state.counters.searches
                tools.release.set()
            event = await next_event(
                events, "the quick search's result while the page read is held"
            )
    visit = {"url": [SLOW_PAGE.url], "goal": "g"}
    search = {"query": ["quick"]}
    assert seen == [
        ToolCallStarted(0, "visit", visit),
        ToolCallStarted(1, "search", search),
        ToolCallFinished(1, "search", search, "quick result", True, 0.0, (QUICK_PAGE,)),
        ToolCallFinished(0, "visit", visit, "slow result", True, 0.0, (SLOW_PAGE,)),
    ]
    assert pages_when_quick_finished == [(QUICK_PAGE.url, QUICK_PAGE.title)]
    assert searches_when_quick_finished == 1
    assert event.answer == "done"
    assert event.stats.tool_calls == 2
    assert (event.stats.searches, event.stats.pages_requested) == (1, 1)
    # The model gets the results in the order of its calls, in one message.
    assert model.seen[1][-1] == {
        "role": "user",
        "content": "<tool_response>\nslow result\n</tool_response>\n"
        "<tool_response>\nquick result\n</tool_response>",
    }


async def test_closing_the_run_while_a_call_runs_cancels_that_call() -> None:
    tools = HeldVisit()  # never released: only closing the run ends the visit
    loop = research(ScriptedModel(TWO_CALLS), tools)
    events = loop.run()
    assert isinstance(events, AsyncGenerator)
    event = await next_event(events, "the quick search's result")
    while tool_event(event) != ("finished", 1):
        assert not isinstance(event, RunFinished)
        event = await next_event(events, "the quick search's result")
    assert tools.cancelled == []
    await events.aclose()
    # The call was cancelled, and waited for, inside aclose(): nothing runs on.
    assert tools.cancelled == ["visit"]
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
