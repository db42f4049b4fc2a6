"""Page reading inside a real Open WebUI: the extractor gets the main content.

With the default loader setting (auto) and Open WebUI's default web loader
engine, the visit tool fetches the page itself, so it has the HTML and reads
its main content: the story, without the cookie banner, menu, related
stories and footer around it, and without hidden text. The status line and
the stored source card say how much of the page was kept.
"""

from __future__ import annotations

import json

import pytest

from tests.fakes.openai_server import Reply, answer, tool_call
from tests.fakes.pages import PageSite, page_text_from_prompt

from .conftest import OwuiSession
from .owui import ScriptedModel, ui_chat

pytestmark = pytest.mark.e2e

STORY = "The first commercial tidal array in the strait delivered 42 megawatts"
FURNITURE = ("COOKIE-BANNER", "MENU-LINK", "RELATED-ONE", "FOOTER-TEXT")
HIDDEN = ("HIDDEN-INSTRUCTION", "STYLE-HIDDEN")


async def test_the_extractor_reads_the_story_not_the_site_around_it(
    owui: OwuiSession, model: ScriptedModel, page_site: PageSite
) -> None:
    url = page_site.url("/news")

    def extract(prompt: str) -> Reply:
        page = page_text_from_prompt(prompt)
        found = "42 megawatts" if STORY in page else "nothing"
        return Reply(
            content=json.dumps(
                {"rational": "r", "evidence": f"Output: {found}.", "summary": "s"}
            )
        )

    model.extractor = extract
    model.conversation(
        "tidal",
        Reply(content=tool_call("visit", {"url": [url], "goal": "tidal output"})),
        Reply(content=answer(f"The array delivered 42 megawatts ({url}).")),
    )

    chat = await ui_chat(owui.api, "How much did the tidal array deliver?")

    prompts = model.extractor_prompts()
    assert len(prompts) == 1, owui.visit_setup_problem
    page = page_text_from_prompt(prompts[0])
    assert STORY in page
    assert "| February | 21.7 |" in page  # its table, as Markdown
    assert "(https://news.example/2026/reports/tidal-array.html)" in page
    for marker in FURNITURE + HIDDEN:
        assert marker not in page

    (source,) = chat.message.get("sources") or []
    document = source["document"][0]
    assert document.startswith("Output: 42 megawatts.\n\n[Read: main content, ")
    kept = document.removeprefix("Output: 42 megawatts.\n\n[Read: ").removesuffix("]")
    statuses = [
        str(((event.get("data") or {}).get("data") or {}).get("description"))
        for event in chat.events
        if (event.get("data") or {}).get("type") == "status"
    ]
    assert f"Reading {url}: {kept}" in statuses
