"""A page read travels typed: a tool's page → the engine's ledger → events → chat.

The toolbox makes each page a tool returns a `PageRead`, once; the run engine
numbers it in its ledger and says so in events; the chat's renderer cites from
what those events told it (its own `SourceBook`), never from the ledger.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.openai_server import answer, tool_call
from tests.fakes.scripted_model import ScriptedModel
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.render import (
    ChatRenderer,
    Display,
    HeavyRenderer,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    AliasesAdded,
    AnswerDelta,
    RolloutEvent,
    RunEvent,
    RunFinished,
    RunResumed,
    RunStats,
    SourcesAdded,
    ToolOutcome,
)
from tongyi_deepresearch_openwebui_pipeline.core.loop import Limits
from tongyi_deepresearch_openwebui_pipeline.core.sources import (
    PageRead,
    SourceLedger,
    normalise_url,
)
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import ToolCall
from tongyi_deepresearch_openwebui_pipeline.engine.runs import RunPlan, research

ARTICLE = "https://news.example/article"
SHORT = "https://short.example/1"
PLAN = RunPlan(
    messages=[
        {"role": "system", "content": "You are a deep research assistant."},
        {"role": "user", "content": "Where is it written?"},
    ],
    limits=Limits(max_rounds=10),
    today=dt.date(2026, 11, 26),
)
STATS = RunStats(0, 0, 0, 0, 0, 0, None, 0.0)


class Redirecting:
    """`ToolPort`: visit reads any page; the short address ends at the article."""

    def available(self) -> list[str]:
        return ["visit"]

    async def run(self, call: ToolCall) -> ToolOutcome:
        url = call.arguments["url"][0]
        final = ARTICLE if url == SHORT else url
        read = PageRead(url, "Article", f"evidence via {url}", final_url=final)
        counts = (("pages_requested", 1),)
        return ToolOutcome(f"content of {url}", pages=(read,), counts=counts)


def visit(url: str) -> str:
    return tool_call("visit", {"url": [url], "goal": "where"})


@dataclass
class Chat:
    """What a chat renderer made of a run: its text, payloads and the events."""

    text: str = ""
    payloads: list[dict[str, Any]] = field(default_factory=list)
    events: list[RunEvent] = field(default_factory=list)

    def source_urls(self) -> list[str]:
        return [p["data"]["source"]["url"] for p in self.payloads if _is_source(p)]


async def chat_of(events: AsyncIterator[RunEvent], renderer: ChatRenderer) -> Chat:
    chat = Chat()
    async for event in events:
        chat.events.append(event)
        rendered = renderer.render(event)
        chat.text += rendered.text
        chat.payloads += rendered.events
    return chat


def _is_source(payload: dict[str, Any]) -> bool:
    return payload.get("type") == "source"


async def test_a_page_read_again_from_a_redirect_is_cited_in_the_chat() -> None:
    model = ScriptedModel(
        visit(ARTICLE),
        visit(SHORT),
        answer(f"It is in [the piece]({SHORT}) and {SHORT}."),
    )
    chat = await chat_of(
        research(PLAN, model, lambda _: Redirecting(), SourceLedger()),
        ChatRenderer(Display()),
    )
    assert chat.source_urls() == [ARTICLE]  # read twice, one source
    readdressed = [e for e in chat.events if isinstance(e, AliasesAdded)]
    assert [[s.number for s in e.sources] for e in readdressed] == [[1]]
    assert normalise_url(SHORT) in readdressed[0].sources[0].aliases
    lines = chat.text.splitlines()
    assert f"It is in [the piece]({SHORT}) [1] and {SHORT} [1]." in lines
    assert "- Pages read: 2 of 2 requested (1 cited as sources)" in lines
    end = chat.events[-1]
    assert isinstance(end, RunFinished) and end.pages_read == 2


def test_a_resumed_chat_cites_the_sources_kept_from_the_event() -> None:
    kept = SourceLedger().record(PageRead(ARTICLE, "Article", "ev")).source
    chat = ChatRenderer(Display())
    resumed = chat.render(RunResumed(2, (kept,)))
    assert [p["data"]["source"]["url"] for p in resumed.events[1:]] == [ARTICLE]
    shown = chat.render(AnswerDelta(f"See {ARTICLE}.")).text
    # The run's end carries no sources here: what the chat cites is its own.
    shown += chat.render(RunFinished("answer", f"See {ARTICLE}.", STATS)).text
    assert shown.splitlines()[0] == f"See {ARTICLE} [1]."


def test_every_part_of_a_heavy_chat_cites_a_page_any_rollout_read() -> None:
    read = SourceLedger().record(PageRead(ARTICLE, "Article", "ev")).source
    chat = HeavyRenderer(Display())
    chat.render(RolloutEvent(1, 2, SourcesAdded((read,))))
    other = chat.render(RolloutEvent(2, 2, AnswerDelta(f"Rollout 2 saw {ARTICLE}.")))
    other_end = chat.render(RolloutEvent(2, 2, RunFinished("answer", "x", STATS)))
    synthesis = chat.render(AnswerDelta(f"All agree: {ARTICLE}.")).text
    synthesis += chat.render(RunFinished("answer", "y", STATS)).text
    assert other.text == ""  # a rollout's text is shown in its block at its end
    assert f"Rollout 2 saw {ARTICLE} [1]." in other_end.text.splitlines()
    assert synthesis.splitlines()[0] == f"All agree: {ARTICLE} [1]."
