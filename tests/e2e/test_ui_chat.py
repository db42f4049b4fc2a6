"""A chat over the web UI's path (socket.io session, saved chat), read back."""

from __future__ import annotations

import re

import pytest

from tests.fakes.openai_server import Reply, answer, tool_call
from tests.fakes.searxng import FakeSearXNG, result

from .conftest import OwuiSession
from .owui import (
    ScriptedModel,
    output_texts,
    search_block,
    server_saves_answers_whole,
    server_streams_deltas,
    tool_response,
    tool_responses,
    ui_chat,
)

pytestmark = pytest.mark.e2e

QUESTION = "Why do wind turbines have three blades?"
REASONING_BLOCK = re.compile(
    r'<details type="reasoning"[^>]*>(.*?)</details>', re.DOTALL
)


async def test_ui_chat_is_saved_with_reasoning_tool_card_and_answer(
    owui: OwuiSession, model: ScriptedModel, search: FakeSearXNG
) -> None:
    hits = [("Blade count", "https://example.org/blades", "Three blades balance cost.")]
    search.script(
        "wind turbine three blades",
        results=[result(url, title, snippet) for title, url, snippet in hits],
    )
    model.conversation(
        "wind turbines",
        Reply(
            reasoning="Let me check why three blades are used.",
            content=tool_call("search", {"query": ["wind turbine three blades"]}),
            delay=0.005,  # a model writes over time; the UI must show it live
        ),
        Reply(
            reasoning="The result explains it.",
            content=answer("Three blades balance efficiency, cost and stability."),
            delay=0.005,
        ),
    )

    chat = await ui_chat(owui.api, QUESTION)

    message = chat.message
    if server_saves_answers_whole():
        assert message["done"] is True
    else:  # 0.6: the browser marks it done on the final event, which came
        assert chat.finished
    assert message["model"] == "tongyi_deepresearch.tongyi-deepresearch"
    # Reasoning became collapsible reasoning items, not message text
    # (0.6: `<details type="reasoning">` blocks, the form its UI renders).
    if server_saves_answers_whole():
        reasoning = output_texts(message, "reasoning")
    else:
        reasoning = REASONING_BLOCK.findall(message["content"])
        assert len(reasoning) == 2
    assert any("Let me check why three blades are used." in text for text in reasoning)
    assert any("The result explains it." in text for text in reasoning)
    content = message["content"]
    assert "<think>" not in content
    assert '<details type="tool_calls"' in content and 'name="search"' in content
    assert "Three blades balance efficiency, cost and stability." in content
    assert content.index('name="search"') < content.index("Three blades balance")
    # Status lines were saved and the last one closes the run.
    history = message["statusHistory"]
    assert history and history[-1]["done"] is True
    assert any("wind turbine three blades" in s["description"] for s in history)
    # Open WebUI's title task went to the pipe and got a title from the question.
    assert "wind turbines" in chat.chat["chat"]["title"].lower()
    assert "status" in chat.event_types() and "chat:completion" in chat.event_types()
    # The reasoning and the answer were streamed live to the browser session.
    if server_streams_deltas():
        assert "three blades are used" in "".join(chat.deltas("reasoning_text"))
        assert len(chat.deltas("output_text")) > 1
    else:  # each live update carries the content so far
        snapshots = chat.snapshots()
        # (the search result in the tool card also says "Three blades balance")
        answer_shown = [
            i for i, s in enumerate(snapshots) if "blades balance efficiency" in s
        ]
        reasoning_shown = [
            i for i, s in enumerate(snapshots) if "three blades are used" in s
        ]
        assert reasoning_shown and answer_shown
        assert reasoning_shown[0] < answer_shown[0]  # thinking seen before answer
        assert len({snapshots[i] for i in answer_shown}) > 1  # the answer grew

    # The model was called for research only (no title/tags/follow-up calls),
    # and received the search result in the reference format.
    bodies = model.bodies()
    assert len(bodies) == 2 == len(model.fake.bodies)
    expected = search_block("wind turbine three blades", hits)
    assert tool_responses(bodies[1]) == [tool_response(expected)]
