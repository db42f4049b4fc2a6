"""A user in headless Chromium: sign in, pick the model, ask, see the research.

Chromium is Debian's ``/usr/bin/chromium`` (or ``TDR_CHROMIUM``) driven by
Playwright; ``playwright install`` is never used. Every request the page makes
to anything but 127.0.0.1 is aborted. The screenshot is saved in
``.e2e-artifacts/`` (CI uploads it).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.async_api import Page, Route, async_playwright
from playwright.async_api import TimeoutError as PlaywrightTimeout

from tests.fakes.openai_server import Reply, answer, tool_call
from tests.fakes.searxng import FakeSearXNG, result

from .conftest import ADMIN_EMAIL, ADMIN_PASSWORD, OwuiSession, unavailable
from .owui import ARTIFACTS, ScriptedModel

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
QUESTION = "Why do wind turbines usually have three blades?"
REASONING = "I should search for why three blades are standard."
ANSWER = "Three blades balance efficiency, cost and smooth rotation."
SNIPPET = "Three-bladed rotors balance cost and stability."
SCREENSHOT = ARTIFACTS / "browser-chat.png"
MODEL_NAME = "Tongyi DeepResearch"


def chromium_path() -> Path:
    """The Chromium binary (``TDR_CHROMIUM``, default /usr/bin/chromium)."""
    return Path(os.environ.get("TDR_CHROMIUM") or "/usr/bin/chromium")


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    """A fresh page in headless Chromium that can reach only 127.0.0.1."""
    executable = chromium_path()
    if not executable.is_file():
        unavailable(f"no Chromium at {executable} (apt-get install -y chromium)")

    async def loopback_only(route: Route) -> None:
        url = route.request.url
        host = urlsplit(url).hostname
        if url.startswith(("data:", "blob:")) or host in ("127.0.0.1", "localhost"):
            await route.continue_()
        else:
            await route.abort()

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(executable), args=CHROMIUM_ARGS
        )
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            await context.route("**/*", loopback_only)
            yield await context.new_page()
        finally:
            await browser.close()


async def sign_in_and_ask(
    page: Page, owui: OwuiSession, model_name: str, question: str
) -> None:
    """Sign in as the admin, pick `model_name` and send `question`."""
    await page.goto(f"{owui.base_url}/auth")
    await page.fill("#email", ADMIN_EMAIL)
    await page.fill("#password", ADMIN_PASSWORD)
    await page.get_by_role("button", name="Sign in").click()
    # 0.11+: "Selected model: …"; 0.6: "Select a model" showing the name.
    selector = (
        page.get_by_role("button", name=f"Selected model: {MODEL_NAME}")
        .or_(page.locator("#model-selector-0-button", has_text=MODEL_NAME))
        .first
    )
    await selector.wait_for(timeout=60_000)
    # The "What's New" dialog (0.6 shows it a moment after the page).
    with contextlib.suppress(PlaywrightTimeout):
        await page.get_by_role("button", name="Okay, Let's Go!").click(timeout=5_000)

    # Pick the model and ask.
    await selector.click()
    await (
        page.get_by_role("option", name=f"Select {model_name} model", exact=True)
        .or_(page.get_by_role("button", name=model_name, exact=True))  # 0.6
        .first.click()
    )
    # 0.6 keeps its model menu open after a pick; typing would go to its
    # search box.
    menu = page.get_by_role("menu")
    if await menu.is_visible():
        await page.keyboard.press("Escape")
        await menu.wait_for(state="hidden")
    await page.locator("#chat-input").click()
    await page.keyboard.type(question)
    await page.keyboard.press("Enter")


async def test_user_sees_reasoning_tool_card_and_answer(
    page: Page, owui: OwuiSession, model: ScriptedModel, search: FakeSearXNG
) -> None:
    search.script(
        "wind turbine three blades",
        results=[result("https://example.org/rotors", "Rotor design", SNIPPET)],
    )
    model.conversation(
        "wind turbines",
        Reply(
            reasoning=REASONING,
            content=tool_call("search", {"query": ["wind turbine three blades"]}),
        ),
        Reply(reasoning="The search result explains it.", content=answer(ANSWER)),
    )

    try:
        await sign_in_and_ask(page, owui, MODEL_NAME, QUESTION)

        # The answer, a reasoning block and the tool card appear.
        await page.get_by_text(ANSWER).wait_for(timeout=90_000)
        # 0.8 folds the reasoning and tool calls before an answer into one
        # collapsed "Explored …" group: open it first.
        explored = page.get_by_text("Explored", exact=True)
        if await explored.count():
            await explored.first.click()
        thoughts = page.get_by_text("Thought for", exact=False)
        assert await thoughts.count() == 2
        card = page.get_by_text("View Result from search")
        await card.wait_for()

        # Opening them shows the model's reasoning and the search result.
        await thoughts.first.click()
        await page.get_by_text(REASONING).wait_for()
        await card.click()
        await page.get_by_text(SNIPPET, exact=False).first.wait_for()
    finally:  # also what a failure looked like
        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(path=str(SCREENSHOT), full_page=True)
        (ARTIFACTS / "browser-chat.html").write_text(
            await page.content(), encoding="utf-8"
        )
    assert SCREENSHOT.stat().st_size > 10_000
    assert len(model.bodies("wind turbines")) == 2


HEAVY_QUESTION = "Which blade material lasts longest offshore?"
HEAVY_ANSWER = (
    "Carbon-glass hybrid blades last longest offshore, by every run's sources."
)
HEAVY_SCREENSHOT = ARTIFACTS / "browser-heavy.png"


async def test_user_sees_a_heavy_run_rollouts_and_synthesis(
    page: Page, owui: OwuiSession, model: ScriptedModel, search: FakeSearXNG
) -> None:
    search.script(
        "offshore blade material",
        results=[result("https://example.org/blades", "Blade study", SNIPPET)],
    )

    def rollout(k: int) -> list[Reply]:
        return [
            Reply(
                reasoning=f"Rollout {k}: search for blade materials.",
                content=tool_call("search", {"query": ["offshore blade material"]}),
            ),
            Reply(
                reasoning=f"Rollout {k} has enough.",
                content=answer(f"Run {k}: carbon-glass hybrids last longest."),
            ),
        ]

    model.heavy_conversation(
        "blade material",
        [rollout(1), rollout(2), rollout(3)],
        Reply(reasoning="All three runs agree.", content=answer(HEAVY_ANSWER)),
    )
    try:
        await sign_in_and_ask(page, owui, f"{MODEL_NAME} Heavy", HEAVY_QUESTION)
        await page.get_by_text(HEAVY_ANSWER).wait_for(timeout=120_000)
        explored = page.get_by_text("Explored", exact=True)
        if await explored.count():
            await explored.first.click()
        blocks = page.get_by_text(re.compile(r"Rollout \d of 3 · 2 rounds"))
        await blocks.first.wait_for()
        assert await blocks.count() == 3
        # Opening a rollout shows its own answer and tool card.
        await page.get_by_text("Rollout 1 of 3 · 2 rounds").click()
        own = page.get_by_text(re.compile(r"Run \d: carbon-glass hybrids"))
        await own.filter(visible=True).first.wait_for()
        # The block's opening animation has ended: the screenshot shows it all
        # (looping ones, such as a spinner, never do).
        await page.wait_for_function(
            "() => document.getAnimations().every(a => a.playState !== 'running'"
            " || a.effect?.getComputedTiming().iterations === Infinity)"
        )
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(path=str(HEAVY_SCREENSHOT), full_page=True)
        (ARTIFACTS / "browser-heavy.html").write_text(
            await page.content(), encoding="utf-8"
        )
    assert HEAVY_SCREENSHOT.stat().st_size > 10_000
    assert len(model.synthesis_bodies) == 1
