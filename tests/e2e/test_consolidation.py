"""Research beyond the context window, in a real Open WebUI.

The model server serves 16,384 tokens and refuses anything longer with
vLLM's HTTP 400 (`FakeOpenAI(enforce_context=True)`). A scripted research of
40 rounds (`LongResearch`) reads one page per round through the real visit
tool, each page giving 2-3K tokens of evidence, so the conversation fills the
context many times over. The chat runs the way the browser runs it
(socket.io, saved chat) and is read back from Open WebUI's API: all 40 rounds
ran, the research consolidated, no request was refused or longer than the
served context, and the answer cites the page read first, before the first
consolidation, as source [1]. The citation check then asks about that
statement once, against what was recorded for page 1 long before.

The session's model server and the pipe's valves are shared by every e2e
test, and Open WebUI's process caches each server's context size for 10
minutes per (base URL, model). So this test brings a model server of its own,
on its own port and with a model name no other test uses: the pipe must learn
16,384 from it whatever ran before, and nothing shared changes but the pipe's
valves, which are put back afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.long_research import LongResearch, is_summary_request
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.pages import PageSite

from .conftest import OwuiSession, pipe_valves
from .owui import FUNCTION_ID, ui_chat

pytestmark = pytest.mark.e2e

SERVED = 16384
ROUNDS = 40
VALVES = f"/api/v1/functions/id/{FUNCTION_ID}/valves/update"


@pytest.fixture
def small_context(owui: OwuiSession, fake_model: FakeOpenAI) -> Iterator[FakeOpenAI]:
    """A model server serving 16,384 tokens, the pipe pointed at it meanwhile."""
    model_id = f"Tongyi-DeepResearch-16K-{uuid.uuid4().hex[:8]}"
    with FakeOpenAI(model_id, max_model_len=SERVED, enforce_context=True) as fake:
        owui.api.post(
            VALVES,
            {
                **pipe_valves(fake_model),
                "API_BASE_URL": fake.base_url,
                "MODEL_ID": fake.model,
                "MAX_TOOL_ROUNDS": 100,  # the reference's; the session uses 8
            },
        )
        try:
            yield fake
        finally:
            owui.api.post(VALVES, pipe_valves(fake_model))


def _statuses(message: dict[str, Any]) -> list[str]:
    return [str(s.get("description")) for s in message.get("statusHistory") or []]


async def test_forty_rounds_outlive_a_16k_context(
    owui: OwuiSession, small_context: FakeOpenAI, page_site: PageSite
) -> None:
    fake = small_context
    research = LongResearch(lambda k: page_site.url(f"/count/{k}"), rounds=ROUNDS)
    fake.respond_with(research)
    first = page_site.url("/count/1")
    fetched_before = page_site.hits("/count/1")

    chat = await ui_chat(
        owui.api, "What are the properties of the counted items?", timeout=240
    )
    message = chat.message
    content = message["content"]
    bodies = list(fake.bodies)

    # Every round ran, each page read through the real visit tool (the
    # citation check's call about the answer is counted apart: no round).
    assert research.turns == ROUNDS, owui.visit_setup_problem
    assert research.extractions == ROUNDS - 1, owui.visit_setup_problem
    assert page_site.hits("/count/1") - fetched_before == 1
    assert f"- Rounds: {ROUNDS}" in content
    # The context filled and the research went on from its state, every
    # request fitting what the server serves (none refused).
    assert research.summaries >= 1
    assert fake.refused == 0
    assert fake.sizes and all(p + r <= SERVED for p, r in fake.sizes)
    summaries = [b for b in bodies if is_summary_request(b["messages"])]
    assert len(summaries) == research.summaries
    # Page 1 was read before the first consolidation: that summary request
    # (ReSum's prompt, the history in it) holds page 1's result.
    assert first in summaries[0]["messages"][0]["content"]
    # The answer cites page 1, numbered as the first stored source.
    assert f"[page 1]({first}) [1]" in content
    sources = [s["metadata"][0]["source"] for s in message.get("sources") or []]
    assert sources[0] == first
    assert len(sources) == ROUNDS - 1
    assert f"1. [{first}]({first})" in content
    # The check asked about the one cited statement, and page 1 backs it.
    assert research.verdicts == 1
    assert "\n- Citations: 1 of 1 statement supported by the page it cites\n" in (
        content
    )
    # One card per page read: 0.6's middleware copied every earlier card at
    # each new `<think>` (667 cards for 39, until the pipe sent its reasoning
    # as `reasoning_content` there).
    assert content.count('<details type="tool_calls"') == ROUNDS - 1
    # One card per consolidation, and the summary's lines.
    assert content.count("<summary>Consolidation ") == research.summaries
    assert "<summary>Consolidation 1 · context " in content
    assert f"- Consolidations: {research.summaries} (summary calls: " in content
    assert f" of {SERVED:,} tokens served (" in content
    # The status lines were saved with the message.
    statuses = _statuses(message)
    assert any("consolidating the research (1 of at most 30)" in s for s in statuses)
    assert any("consolidated: context " in s for s in statuses)
