"""Inline REST chats: reasoning, tool cards, answers and what the model received."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.fakes.openai_server import Reply, answer, tool_call
from tests.fakes.pages import PageSite, page_text_from_prompt
from tests.fakes.searxng import FakeSearXNG, result

from .conftest import OwuiSession, pipe_valves
from .owui import (
    PIPE_MODEL_ID,
    ScriptedModel,
    search_block,
    stream_chat,
    tool_response,
    tool_responses,
    visit_block,
)

pytestmark = pytest.mark.e2e

SEPARATOR = "\n=======\n"
CARD = '<details type="tool_calls"'


def _hits(prefix: str) -> list[tuple[str, str, str]]:
    return [
        (
            f"{prefix} report",
            f"https://example.org/{prefix}/report",
            f"{prefix} snippet one",
        ),
        (
            f"{prefix} study",
            f"https://example.org/{prefix}/study",
            f"{prefix} snippet two",
        ),
    ]


def _script_search(
    search: FakeSearXNG, query: str, hits: list[tuple[str, str, str]]
) -> None:
    # Scores in descending order: Open WebUI ranks SearXNG results by score.
    search.script(
        query,
        results=[
            result(url, title, snippet, score=10.0 - rank)
            for rank, (title, url, snippet) in enumerate(hits)
        ],
    )


async def test_streamed_chat_shows_reasoning_tool_card_and_answer(
    owui: OwuiSession, model: ScriptedModel, search: FakeSearXNG
) -> None:
    hits = _hits("solar")
    _script_search(search, "solar panel efficiency 2024", hits)
    model.conversation(
        "solar panels",
        Reply(
            reasoning="I should look up recent efficiency figures.",
            content=tool_call(
                "search",
                {"query": ["solar panel efficiency 2024", "perovskite tandem record"]},
            ),
            delay=0.005,  # a model writes over time; the stream must show it live
        ),
        Reply(
            reasoning="The first result answers the question.",
            content=answer("Modern solar panels reach about 22.8% efficiency."),
            delay=0.005,
        ),
    )

    stream = await stream_chat(
        owui.base_url, owui.token, "How efficient are solar panels?"
    )

    assert stream.status == 200
    assert stream.done and not stream.errors
    assert stream.finish_reasons[-1] == "stop"
    text = stream.content
    assert "<think>" in text
    reasoning = "I should look up recent efficiency figures."
    assert reasoning in text
    # Streamed as it came, not buffered per turn.
    assert not any(reasoning in piece for piece in stream.pieces)
    assert text.count(CARD) == 1
    card = text[text.index(CARD) : text.index("</details>", text.index(CARD))]
    assert 'name="search"' in card
    assert "solar panel efficiency 2024" in card
    assert "Modern solar panels reach about 22.8% efficiency." in text
    assert text.index(CARD) < text.index("Modern solar panels")
    assert "<answer>" not in text and "<tool_call>" not in text
    assert "sk-e2e-test-key" not in text

    # What the model received: the reference prompt, then the search results in
    # the reference format (an empty result list gives the no-results text).
    first, second = model.bodies("solar panels")
    assert first["messages"][0]["role"] == "system"
    assert first["messages"][0]["content"].startswith(
        "You are a deep research assistant"
    )
    assert first["messages"][1:] == [
        {"role": "user", "content": "How efficient are solar panels?"}
    ]
    expected = (
        search_block("solar panel efficiency 2024", hits)
        + SEPARATOR
        + "No results found for 'perovskite tandem record'. "
        "Try with a more general query."
    )
    assert tool_responses(second) == [tool_response(expected)]
    # Each query searched once (in any order: the tool may run them together).
    assert sorted(search.queries()) == [
        "perovskite tandem record",
        "solar panel efficiency 2024",
    ]
    # The API key valve reached the model server (it is stored encrypted).
    assert {r.headers.get("authorization") for r in model.fake.requests} == {
        f"Bearer {pipe_valves(model.fake)['API_KEY']}"
    }


async def test_visit_reads_local_html_and_pdf_pages(
    owui: OwuiSession, model: ScriptedModel, page_site: PageSite
) -> None:
    html_url, pdf_url = page_site.url("/article"), page_site.url("/pdf")
    goal = "Find efficiency and photosynthesis facts"

    def extract(prompt: str) -> Reply:
        page = page_text_from_prompt(prompt)
        name = "pdf" if "Photosynthesis" in page else "html"
        return Reply(
            content=json.dumps(
                {
                    "rational": "relevant",
                    "evidence": f"Evidence from the {name} page.",
                    "summary": f"Summary of the {name} page.",
                }
            )
        )

    model.extractor = extract
    model.conversation(
        "Read these pages",
        Reply(
            reasoning="I will read both pages.",
            content=tool_call("visit", {"url": [html_url, pdf_url], "goal": goal}),
        ),
        Reply(reasoning="Both pages read.", content=answer("Panels reach 22.8% [1].")),
    )

    stream = await stream_chat(owui.base_url, owui.token, "Read these pages for me.")

    assert stream.done and not stream.errors
    assert 'name="visit"' in stream.content
    assert "Panels reach 22.8%" in stream.content
    expected = (
        visit_block(
            html_url, goal, "Evidence from the html page.", "Summary of the html page."
        )
        + SEPARATOR
        + visit_block(
            pdf_url, goal, "Evidence from the pdf page.", "Summary of the pdf page."
        )
    ).strip()
    _, second = model.bodies("Read these pages")
    assert tool_responses(second) == [tool_response(expected)], owui.visit_setup_problem

    # The extractor got each page's real text in the reference extractor prompt.
    prompts = model.extractor_prompts()
    assert len(prompts) == 2
    for prompt in prompts:
        assert prompt.startswith(
            "Please process the following webpage content and user goal to extract "
            "relevant information:\n\n## **Webpage Content** \n"
        )
        assert f"## **User Goal**\n{goal}\n" in prompt
    pages = sorted(page_text_from_prompt(prompt) for prompt in prompts)
    assert any(
        "Photosynthesis converts light into chemical energy." in p for p in pages
    )
    assert any("Solar panel efficiency in 2024" in p for p in pages)


async def test_title_task_is_answered_without_research(
    owui: OwuiSession, model: ScriptedModel
) -> None:
    reply = await asyncio.to_thread(
        owui.api.post,
        "/api/v1/tasks/title/completions",
        {
            "model": PIPE_MODEL_ID,
            "messages": [
                {"role": "user", "content": "Which battery chemistry lasts longest?"}
            ],
        },
    )

    content = reply["choices"][0]["message"]["content"]
    title = json.loads(content[content.index("{") : content.rindex("}") + 1])["title"]
    assert "battery" in title.lower()
    assert model.fake.requests == []


async def test_two_concurrent_chats_do_not_mix(
    owui: OwuiSession, model: ScriptedModel, search: FakeSearXNG
) -> None:
    chats = {
        "[chat-A]": ("tidal energy output", "Tidal answer: 1.2 GW."),
        "[chat-B]": ("geothermal energy output", "Geothermal answer: 16 GW."),
    }
    for key, (query, final) in chats.items():
        _script_search(search, query, _hits(query.split()[0]))
        model.conversation(
            key,
            Reply(
                reasoning=f"Searching for {query}.",
                content=tool_call("search", {"query": [query]}),
            ),
            Reply(reasoning="Enough.", content=answer(final)),
        )
    # Neither chat's first turn is answered until both are in flight together.
    model.hold_first_turns(len(chats))

    streams = await asyncio.gather(
        *(
            stream_chat(
                owui.base_url, owui.token, f"{key} How much power does it give?"
            )
            for key in chats
        )
    )

    for (key, (query, final)), stream in zip(chats.items(), streams, strict=True):
        other_key = next(k for k in chats if k != key)
        other_query, other_final = chats[other_key]
        assert stream.done and not stream.errors
        assert final in stream.content
        assert other_final not in stream.content
        assert other_query not in stream.content
        bodies = model.bodies(key)
        assert len(bodies) == 2
        expected = search_block(query, _hits(query.split()[0]))
        assert tool_responses(bodies[1]) == [tool_response(expected)]
