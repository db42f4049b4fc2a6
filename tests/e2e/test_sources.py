"""Sources users can trust, in a real Open WebUI: stored sources and `[n]` markers."""

from __future__ import annotations

import json
import re

import pytest

from tests.fakes.openai_server import Reply, answer, tool_call
from tests.fakes.pages import PageSite, page_text_from_prompt
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.render import (
    markdown_text,
)

from .conftest import OwuiSession
from .owui import ScriptedModel, ui_chat

pytestmark = pytest.mark.e2e


async def test_citations_index_the_pages_that_were_read(
    owui: OwuiSession, model: ScriptedModel, page_site: PageSite
) -> None:
    html_url, pdf_url = page_site.url("/article"), page_site.url("/pdf")
    never_read = "https://unread.example.org/claim"

    def extract(prompt: str) -> Reply:
        page = page_text_from_prompt(prompt)
        name = "pdf" if "Photosynthesis" in page else "html"
        evidence = f"Quoted evidence from the {name} page."
        return Reply(
            content=json.dumps(
                {"rational": "r", "evidence": evidence, "summary": f"{name} summary"}
            )
        )

    model.extractor = extract
    model.conversation(
        "cite",
        Reply(
            reasoning="Read both.",
            content=tool_call(
                "visit", {"url": [html_url, pdf_url], "goal": "facts to cite"}
            ),
        ),
        Reply(
            reasoning="Write it up.",
            content=answer(
                f"Plants make energy ([notes]({pdf_url})). Panels reach 22.8% "
                f"(see {html_url}). Some say otherwise ({never_read})."
            ),
        ),
    )

    chat = await ui_chat(owui.api, "Please cite what you read.")
    message = chat.message
    content = message["content"]

    # Both pages read are stored as sources, numbered in the order they were
    # read (the two reads run concurrently), each with the evidence quoted.
    sources = message.get("sources") or []
    urls = [s["metadata"][0]["source"] for s in sources]
    assert sorted(urls) == sorted([html_url, pdf_url]), owui.visit_setup_problem
    evidence = {s["metadata"][0]["source"]: s["document"] for s in sources}
    # Each card also says how much of the page was read.
    (html_card,) = evidence[html_url]
    (pdf_card,) = evidence[pdf_url]
    assert html_card.startswith("Quoted evidence from the html page.\n\n[Read: ")
    assert pdf_card.startswith(
        "Quoted evidence from the pdf page.\n\n[Read: whole document, "
    )
    assert len({s["source"]["name"] for s in sources}) == 2  # unique labels
    html_n, pdf_n = urls.index(html_url) + 1, urls.index(pdf_url) + 1

    # Each link's marker is the 1-based index of its source in that list.
    for url, marker in re.findall(r"\(?(https?://[^\s)]+)\)?\)? \[(\d+)\]", content):
        assert urls[int(marker) - 1] == url
    assert f"[notes]({pdf_url}) [{pdf_n}]" in content
    assert f"{html_url} [{html_n}]" in content
    # The page never read is not a source and is visibly marked.
    assert f"{never_read} *(unverified)*" in content
    assert never_read not in urls
    # The list of sources read and the summary close the answer.
    # The title is shown Markdown-escaped ("&" as "\\&"), so a page cannot forge links.
    title = markdown_text(sources[html_n - 1]["source"]["name"])
    assert f"{html_n}. [{title}]({html_url})" in content
    assert (
        "Research summary" in content
        and "- Pages read: 2 of 2 requested (2 cited as sources)" in content
    )
