"""Citations that hold up, in a real Open WebUI: the check, its bounds, Stop, exports.

A chat as the web UI sends it (saved chat, socket.io session): the scripted
research reads two pages of the local site with the real visit tool (its
extractor calls go to the fake model server), then answers with three
statements citing them. The citation check's verdict calls (told apart by
their system message) reach the same fake server, which backs two statements
and refutes one. The stored assistant message then names the refuted
statement under the answer, its research summary says "2 of 3", and its
export block holds a BibTeX file that bibtexparser reads back with the pages'
URLs. The check asks at most CITATION_CHECK_MAX_STATEMENTS statements, stops
at CITATION_CHECK_SECONDS, and Stop during the check ends every verdict call.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from bibtexparser.entrypoint import parse_string

from tests.fakes.client_watch import ClientWatch
from tests.fakes.openai_server import FakeOpenAI, Reply, answer, tool_call
from tests.fakes.pages import PageSite, page_text_from_prompt

from .conftest import OwuiSession, pipe_valves
from .owui import (
    FUNCTION_ID,
    ScriptedModel,
    server_saves_answers_whole,
    started_ui_chat,
    ui_chat,
    verdict_statement,
)

pytestmark = pytest.mark.e2e

VALVES = f"/api/v1/functions/id/{FUNCTION_ID}/valves/update"
#: Bounds a failing test's waits; nothing here is a timed assertion.
PATIENCE = 120.0
GOAL = "efficiency and photosynthesis facts"
HTML_EVIDENCE = "Modern panels reach 22.8% efficiency, according to the annual report."
PDF_EVIDENCE = "Photosynthesis converts light into chemical energy."
#: The answer's statements, in order: (text as checked, page cited, backed).
STATEMENTS = (
    ("Modern solar panels reach 22.8% efficiency.", "/article", True),
    ("The same panels last eighty years.", "/article", False),
    ("Photosynthesis converts light into chemical energy.", "/pdf", True),
)
REFUTED_WHY = "The notes give no lifetime for the panels."
CHECKING = "Checking 3 cited statements against the pages they cite…"
#: A block of the export: its label, then its fenced text.
_FENCED = re.compile(
    r"\*\*(?P<label>[^*]+)\*\* \(`[^`]+`\)\n\n"
    r"(?P<fence>`{3,})\w+\n(?P<text>.*?)\n(?P=fence)",
    re.S,
)


def _script_research(model: ScriptedModel, site: PageSite, key: str) -> None:
    """Read the HTML page, then the PDF (so they are [1] and [2]), then answer."""
    html, pdf = site.url("/article"), site.url("/pdf")

    def extract(prompt: str) -> Reply:
        page = page_text_from_prompt(prompt)
        evidence = PDF_EVIDENCE if "Photosynthesis" in page else HTML_EVIDENCE
        return Reply(
            content=json.dumps(
                {"rational": "r", "evidence": evidence, "summary": "What it says."}
            )
        )

    model.extractor = extract
    model.conversation(
        key,
        Reply(content=tool_call("visit", {"url": [html], "goal": GOAL})),
        Reply(content=tool_call("visit", {"url": [pdf], "goal": GOAL})),
        Reply(
            reasoning="Both pages read.",
            content=answer(
                f"Modern solar panels reach [22.8% efficiency]({html}). "
                f"The same panels last [eighty years]({html}). "
                f"Photosynthesis converts light into [chemical energy]({pdf})."
            ),
        ),
    )


def _judge(statement: str, _body: dict[str, Any]) -> Reply:
    """The check's model: the pages back every statement but the lifetime."""
    if "eighty years" in statement:
        return Reply(f"NOT_SUPPORTED\n{REFUTED_WHY}")
    return Reply("SUPPORTED\nThe notes state it.")


def _evidence_asked(body: dict[str, Any]) -> str:
    """The extractor's evidence a verdict request quotes.

    The source's evidence is its card's text: the card's "[Read: …]" note on
    how much of the page was read follows it.
    """
    asked = str(body["messages"][-1]["content"])
    quoted = asked.partition("<evidence>\n")[2].partition("\n</evidence>")[0]
    return quoted.partition("\n\n[Read: ")[0]


def _export_block(content: str) -> dict[str, str]:
    """The export block's formats, by label (empty: no block)."""
    start = content.find("<details>\n<summary>Export: ")
    if start < 0:
        return {}
    block = content[start : content.index("\n</details>", start)]
    return {m["label"]: m["text"] for m in _FENCED.finditer(block)}


def _statuses(message: dict[str, Any]) -> list[str]:
    return [str(s.get("description")) for s in message.get("statusHistory") or []]


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition()`` (run in a thread: it may block) holds."""
    deadline = time.monotonic() + PATIENCE
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {PATIENCE:.0f} s")
        await asyncio.sleep(0.1)


@pytest.fixture
def pipe_with(owui: OwuiSession, fake_model: FakeOpenAI) -> Iterator[Callable]:
    """Set some of the pipe's valves for one test (all put back after)."""

    def set_valves(**overrides: Any) -> None:
        owui.api.post(VALVES, {**pipe_valves(fake_model), **overrides})

    try:
        yield set_valves
    finally:
        owui.api.post(VALVES, pipe_valves(fake_model))


async def test_a_refuted_citation_is_marked_and_counted_in_the_summary(
    owui: OwuiSession, model: ScriptedModel, page_site: PageSite
) -> None:
    html, pdf = page_site.url("/article"), page_site.url("/pdf")
    _script_research(model, page_site, "[cite-all]")
    model.verdicts = _judge

    chat = await ui_chat(owui.api, "[cite-all] How efficient are solar panels?")

    message = chat.message
    content = str(message["content"])
    sources = message.get("sources") or []
    urls = [s["metadata"][0]["source"] for s in sources]
    assert urls == [html, pdf], owui.visit_setup_problem
    # The answer streamed with its citations numbered as the pages were read.
    assert (
        f"Modern solar panels reach [22.8% efficiency]({html}) [1]. "
        f"The same panels last [eighty years]({html}) [1]. "
        f"Photosynthesis converts light into [chemical energy]({pdf}) [2]."
    ) in content
    # One verdict call per (statement, page), each quoting what the extractor
    # recorded for the page the statement cites.
    verdicts = model.verdict_bodies()
    evidence = {"/article": HTML_EVIDENCE, "/pdf": PDF_EVIDENCE}
    assert sorted(
        (verdict_statement(body), _evidence_asked(body)) for body in verdicts
    ) == sorted((text, evidence[page]) for text, page, _ in STATEMENTS)
    assert {(b["model"], b["temperature"]) for b in verdicts} == {
        (model.fake.model, 0.0)
    }
    # The refuted statement is named under the answer, with the model's reason.
    assert (
        "\n\n> ⚠️ **Citation check:** 1 of 3 cited statements not supported by the "
        "pages cited:\n"
        f"> - “The same panels last eighty years.” \\[1\\]: {REFUTED_WHY}\n"
    ) in content
    assert "\n- Citations: 2 of 3 statements supported by the pages they cite\n" in (
        content
    )
    assert CHECKING in _statuses(message)
    if server_saves_answers_whole():
        assert message["done"] is True
    # The export block's BibTeX reads back: one entry per source, as numbered.
    block = _export_block(content)
    assert list(block) == ["BibTeX", "RIS", "CSL-JSON", "Markdown report"]
    bib = parse_string(block["BibTeX"])
    assert bib.failed_blocks == []
    assert [(e.key, e.fields_dict["url"].value) for e in bib.entries] == [
        ("ref1", html),
        ("ref2", pdf),
    ]
    # It closes the message, after the research summary.
    assert content.rindex("<summary>Export: ") > content.rindex("Research summary")


async def test_statements_over_the_cap_are_counted_not_checked(
    owui: OwuiSession,
    model: ScriptedModel,
    page_site: PageSite,
    pipe_with: Callable[..., None],
) -> None:
    pipe_with(CITATION_CHECK_MAX_STATEMENTS=2)
    _script_research(model, page_site, "[cite-cap]")
    model.verdicts = _judge

    chat = await ui_chat(owui.api, "[cite-cap] How efficient are solar panels?")

    content = str(chat.message["content"])
    # The first two statements were asked about, the third was not.
    assert sorted(verdict_statement(body) for body in model.verdict_bodies()) == sorted(
        text for text, _, _ in STATEMENTS[:2]
    ), owui.visit_setup_problem
    assert (
        "\n\n> ⚠️ **Citation check:** 1 of 2 cited statements not supported by the "
        "pages cited:\n"
        f"> - “The same panels last eighty years.” \\[1\\]: {REFUTED_WHY}\n"
    ) in content
    assert (
        "\n- Citations: 1 of 2 statements supported by the pages they cite "
        "(1 more not checked)\n"
    ) in content
    assert "Checking 2 cited statements against the pages they cite…" in _statuses(
        chat.message
    )


async def test_verdicts_not_in_by_the_deadline_are_out_of_time(
    owui: OwuiSession,
    model: ScriptedModel,
    page_site: PageSite,
    pipe_with: Callable[..., None],
) -> None:
    # The check's model never answers: it holds each call until its client
    # leaves, so only the check's own deadline can end it.
    watch = ClientWatch(model.fake.server)

    def never(_statement: str, _body: dict[str, Any]) -> Reply:
        watch.hold()
        return Reply(status=503, error="released")

    pipe_with(CITATION_CHECK_SECONDS=1.0)
    _script_research(model, page_site, "[cite-late]")
    model.verdicts = never

    chat = await ui_chat(owui.api, "[cite-late] How efficient are solar panels?")

    message = chat.message
    content = str(message["content"])
    assert (
        "\n- Citations: 0 of 3 statements supported by the pages they cite "
        "(3 out of time)\n"
    ) in content, owui.visit_setup_problem
    assert "**Citation check:**" not in content  # none was refuted
    assert "Modern solar panels reach [22.8% efficiency]" in content
    if server_saves_answers_whole():
        assert message["done"] is True
    # Every verdict call that reached the model was dropped by the check.
    asked = len(model.verdict_bodies())
    assert 1 <= asked <= 3
    await until(lambda: len(watch.released_by) == asked, "the held calls to end")
    assert watch.released_by == ["client left"] * asked


async def test_stop_during_the_check_ends_every_verdict_call(
    owui: OwuiSession,
    model: ScriptedModel,
    page_site: PageSite,
    pipe_with: Callable[..., None],
) -> None:
    watch = ClientWatch(model.fake.server)

    def held(_statement: str, _body: dict[str, Any]) -> Reply:
        watch.hold()
        return Reply(status=503, error="released")

    # Only the Stop may end the check: no request timeout or deadline first.
    pipe_with(REQUEST_TIMEOUT_SECONDS=3600, CITATION_CHECK_SECONDS=1800.0)
    _script_research(model, page_site, "[cite-stop]")
    model.verdicts = held

    async with started_ui_chat(
        owui.api, "[cite-stop] How efficient are solar panels?", timeout=PATIENCE
    ) as chat:
        # The check is running: all three verdict calls are held.
        await until(lambda: watch.holding == 3, "three verdict calls held")
        assert await chat.task_ids()
        assert watch.released_by == []

        await chat.stop()

        # The run ended the verdict calls: the server saw each client leave.
        await until(lambda: len(watch.released_by) == 3, "the held calls to end")
        assert watch.released_by == ["client left"] * 3
        await asyncio.wait_for(chat.cancelled.wait(), PATIENCE)

        def stopped() -> bool:
            saved = owui.api.get_chat(chat.chat_id)
            message = saved["chat"]["history"]["messages"][chat.message_id]
            statuses = message.get("statusHistory") or [{}]
            return statuses[-1].get("description") == "Stopped" and (
                message.get("done") is True or not server_saves_answers_whole()
            )

        await until(stopped, "the stopped message saved")
        assert await chat.task_ids() == []

    saved = await asyncio.to_thread(owui.api.get_chat, chat.chat_id)
    message = saved["chat"]["history"]["messages"][chat.message_id]
    # The message is not left in progress: its status line ends with the Stop.
    assert message["statusHistory"][-1] == {
        **message["statusHistory"][-1],
        "description": "Stopped",
        "done": True,
    }
    assert CHECKING in _statuses(message)
    content = str(message.get("content") or "")
    # The answer as it streamed; the check's report never came.
    assert "Photosynthesis converts light into [chemical energy]" in content
    assert "Citations:" not in content
    # Nothing was asked after the Stop.
    assert len(model.verdict_bodies()) == 3
    assert len(model.bodies("[cite-stop]")) == 3
