"""Pages read through Open WebUI's own page loader (``PAGE_LOADER=openwebui``).

Open WebUI's loaders return text. On 0.8.12 the default one hands back a PDF's
raw bytes decoded as text, which loses the bytes of a Flate-compressed stream:
the PDF's text is then nowhere in what came back. Whatever the version, the
extractor must get the PDF's text and never its bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.fakes.openai_server import Reply, answer, tool_call
from tests.fakes.pages import (
    COMPRESSED_PDF_SECRET,
    PageSite,
    load_visit_tool,
    page_text_from_prompt,
)

from .conftest import OwuiSession
from .owui import ScriptedModel, stream_chat, tool_responses

pytestmark = pytest.mark.e2e

VALVES = "/api/v1/tools/id/deepresearch_visit/valves"


def visit_user_agent() -> str:
    """The User-Agent of the visit tool's own fetcher."""
    return load_visit_tool("visit_tool_e2e_loader")._USER_AGENT


@pytest.fixture
def openwebui_loader(owui: OwuiSession) -> Iterator[None]:
    """The visit tool set to read pages through Open WebUI's loader only."""
    if owui.visit_setup_problem:
        pytest.fail(owui.visit_setup_problem)
    before = owui.api.get(VALVES) or {}
    owui.api.post(f"{VALVES}/update", {**before, "PAGE_LOADER": "openwebui"})
    assert owui.api.get(VALVES).get("PAGE_LOADER") == "openwebui"
    yield
    owui.api.post(f"{VALVES}/update", before)


async def test_a_compressed_pdf_read_through_open_webuis_loader(
    owui: OwuiSession,
    model: ScriptedModel,
    page_site: PageSite,
    openwebui_loader: None,
) -> None:
    pdf_url, goal = page_site.url("/pdf-compressed"), "Find the vault code"

    def extract(prompt: str) -> Reply:
        page = page_text_from_prompt(prompt)
        found = COMPRESSED_PDF_SECRET if COMPRESSED_PDF_SECRET in page else "nothing"
        return Reply(
            content=json.dumps(
                {"rational": "r", "evidence": f"Code: {found}.", "summary": "s"}
            )
        )

    model.extractor = extract
    model.conversation(
        "Read the memo",
        Reply(content=tool_call("visit", {"url": [pdf_url], "goal": goal})),
        Reply(content=answer(f"The code is {COMPRESSED_PDF_SECRET}.")),
    )

    seen = len(page_site.server.requests)
    stream = await stream_chat(owui.base_url, owui.token, "Read the memo for me.")
    fetched_by = [
        request.headers.get("user-agent", "")
        for request in page_site.server.requests[seen:]
        if request.path == "/pdf-compressed"
    ]

    assert stream.done and not stream.errors
    # Open WebUI's loader fetched it (not only the tool's own fetcher).
    assert any(agent != visit_user_agent() for agent in fetched_by), fetched_by
    prompts = model.extractor_prompts()
    assert len(prompts) == 1, prompts
    page = page_text_from_prompt(prompts[0])
    # Read by the tool's PDF reader (0.6, 0.8: their loader returns the bytes
    # as text) or by Open WebUI's (0.11+), never handed on as bytes.
    assert COMPRESSED_PDF_SECRET in page
    assert "%PDF-" not in page and "endstream" not in page and "FlateDecode" not in page
    _, second = model.bodies("Read the memo")
    assert f"Code: {COMPRESSED_PDF_SECRET}." in tool_responses(second)[0]
