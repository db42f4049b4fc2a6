"""Heavy mode in a real Open WebUI: ParallelMuse's rollouts, reports, integration.

The chat runs the way the browser runs it (socket.io, saved chat). The fake
server returns no log-probabilities, so after the first rollout's first reply
the other two start from the question (the fallback); each reads pages through
the real visit tool, two of them the same page (fetched once), the model
writes a report of each, and the integrate call (the lab's prompt, one
``[Report n]:`` per rollout) cites pages two different rollouts read,
numbered as the stored sources.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.fakes.openai_server import Reply, answer, tool_call
from tests.fakes.pages import PageSite, page_text_from_prompt

from .conftest import OwuiSession
from .owui import HEAVY_MODEL_ID, ScriptedModel, ui_chat

pytestmark = pytest.mark.e2e


async def test_a_heavy_run_researches_three_ways_and_synthesises(
    owui: OwuiSession, model: ScriptedModel, page_site: PageSite
) -> None:
    article, news, plain = (
        page_site.url("/article"),
        page_site.url("/news"),
        page_site.url("/plain"),
    )

    def extract(prompt: str) -> Reply:
        page = page_text_from_prompt(prompt)
        fact = "tidal 42 MW" if "tidal" in page else page.split("\n", 1)[0][:60]
        return Reply(
            content=json.dumps({"rational": "r", "evidence": fact, "summary": "s"})
        )

    def visit(urls: list[str], rollout: int) -> Reply:
        goal = f"facts for rollout {rollout}"
        return Reply(
            reasoning=f"Rollout plan {rollout}.",
            content=tool_call("visit", {"url": urls, "goal": goal}),
        )

    model.extractor = extract
    model.heavy_conversation(
        "heavy energy",
        [
            [visit([news], 1), Reply(content=answer(f"Tidal gives 42 MW ({news})."))],
            [visit([news, article], 2), Reply(content=answer(f"Panels ({article})."))],
            [visit([plain], 3), Reply(content=answer(f"Water boils ({plain})."))],
        ],
        Reply(
            reasoning="The runs agree.",
            content=answer(
                f"Tidal power gives 42 MW ([tidal]({news})) and panels reach 22.8% "
                f"([panels]({article}))."
            ),
        ),
    )

    chat = await ui_chat(owui.api, "Tell me about heavy energy.", model=HEAVY_MODEL_ID)
    message = chat.message
    content = message["content"]

    # Three rollouts, one block each, all answered; then the integrate call.
    blocks = re.findall(
        r"<summary>Rollout (\d) of 3 · 2 rounds · ([^<]*)</summary>", content
    )
    assert sorted(blocks) == [(str(k), "the model gave its answer") for k in (1, 2, 3)]
    (synthesis,) = model.synthesis_bodies
    request = synthesis["messages"][-1]["content"]
    assert request.startswith(
        "You are tasked with solving the question: Tell me about heavy energy."
    )
    reports = re.findall(r"\n\n\[Report (\d)\]: (.*)", request)
    assert sorted(n for n, _ in reports) == ["1", "2", "3"]
    said = sorted(text for _, text in reports)
    answers = [
        f"Tidal gives 42 MW ({news}).",
        f"Panels ({article}).",
        f"Water boils ({plain}).",
    ]
    assert said == sorted(answers)
    # The page two rollouts read at the same time was fetched once.
    assert page_site.hits("/news") == 1, owui.visit_setup_problem
    # One numbering across rollouts: the stored sources, and the answer's [n].
    urls = [s["metadata"][0]["source"] for s in message.get("sources") or []]
    assert sorted(urls) == sorted([news, article, plain])
    news_n, article_n = urls.index(news) + 1, urls.index(article) + 1
    assert f"([tidal]({news}) [{news_n}])" in content
    assert f"([panels]({article}) [{article_n}])" in content
    assert content.index("<summary>Rollout") < content.index("Tidal power gives")
    assert "- Rollouts: 3 (3 answered, synthesised into this answer)" in content
