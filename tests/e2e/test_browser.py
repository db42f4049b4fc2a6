"""A user in headless Chromium: sign in, pick the model, ask, see the research.

Also: a research that reads three pages, as README's screenshot shows it
(the answer citing them, "Sources read", the research summary opened); the
Stop button ends a live research run (the model's connection is
dropped, the message is saved as done, no task is left); and, on 0.12, where
a user makes the per-chat choices: the chat input's tool selector (only the
scholar tool picked: the research offers the model that tool alone) and its
Valves dialog (the user's own time limit, saved for them). Their cropped
screenshots are README's (docs/screenshot-tools.png,
docs/screenshot-user-valves.png).

Chromium is Debian's ``/usr/bin/chromium`` (or ``TDR_CHROMIUM``) driven by
Playwright; ``playwright install`` is never used. Every request the page makes
to anything but 127.0.0.1 is aborted. The screenshot is saved in
``.e2e-artifacts/`` (CI uploads it).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.async_api import FloatRect, Page, Route, async_playwright, expect
from playwright.async_api import TimeoutError as PlaywrightTimeout

from tests.fakes.client_watch import ClientWatch
from tests.fakes.http import LocalServer, Response
from tests.fakes.openai_server import FakeOpenAI, Reply, StreamGate, answer, tool_call
from tests.fakes.pages import page_text_from_prompt
from tests.fakes.scholarly import FakeScholarly, openalex_work
from tests.fakes.searxng import FakeSearXNG, result
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.catalog import (
    prompt_lines,
)
from tongyi_deepresearch_openwebui_pipeline.core.prompts import system_prompt_with

from .conftest import ADMIN_EMAIL, ADMIN_PASSWORD, OwuiSession, pipe_valves, unavailable
from .owui import (
    ARTIFACTS,
    FUNCTION_ID,
    Api,
    ScriptedModel,
    owui_version_tuple,
    tool_responses,
)

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
    await sign_in_and_pick(page, owui, model_name)
    await page.locator("#chat-input").click()
    await page.keyboard.type(question)
    await page.keyboard.press("Enter")


async def sign_in_and_pick(page: Page, owui: OwuiSession, model_name: str) -> None:
    """Sign in as the admin and pick `model_name` for a new chat."""
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


# -- a research that reads pages (README's docs/screenshot.png) ---------------------

READ_QUESTION = "Why do large wind turbines have three blades rather than two?"
READ_KEY = "three blades rather than two"
#: The pages the research reads: path, title, the paragraphs of the article.
ARTICLES = (
    (
        "/energy-capture",
        "How blade count changes energy capture",
        (
            "A rotor's power coefficient rises with its number of blades, but "
            "the gain shrinks quickly.",
            "Going from two blades to three adds about 3% to the energy "
            "captured over a year; a fourth blade adds less than 1% more.",
            "Each extra blade also adds material, weight and cost to the rotor.",
        ),
    ),
    (
        "/two-bladed-rotors",
        "Two-bladed rotors: faster, louder, cheaper to lift",
        (
            "A two-bladed rotor must turn faster to capture the same wind.",
            "Its higher tip speed makes it louder, and the faster rotation "
            "wears the gearbox and the hub.",
            "It is lighter and easier to lift, which is why some offshore "
            "prototypes used two blades.",
        ),
    ),
    (
        "/yaw-loads",
        "Why three blades turn smoothly into the wind",
        (
            "When a rotor turns to face the wind (yaw), a two-bladed rotor's "
            "inertia changes twice per turn, shaking the tower.",
            "With three blades or more the rotor's inertia is the same in "
            "every direction, so it yaws without that wobble.",
            "This is the main mechanical reason three blades became standard.",
        ),
    ),
)
READ_EVIDENCE = (
    "Three blades capture about 3% more energy than two; a fourth adds under 1%.",
    "Two-bladed rotors spin faster, so they are louder and wear the gearbox.",
    "Three blades give the rotor the same inertia in every direction.",
)
#: What a user sees under the answer: the sources read and the summary open
#: (README's docs/screenshot.png is a copy, taken on 0.12.4).
RESEARCH_SCREENSHOT = ARTIFACTS / "browser-research.png"


def _article(title: str, paragraphs: tuple[str, ...]) -> Response:
    body = "".join(f"<p>{text}</p>" for text in paragraphs)
    return Response.text(
        f"<!doctype html><html><head><title>{title}</title></head><body>"
        f"<header><nav><a href='/'>Wind Energy Notes</a></nav></header>"
        f"<main><article><h1>{title}</h1>{body}</article></main></body></html>",
        content_type="text/html; charset=utf-8",
    )


@pytest.fixture
def wind_site() -> Iterator[LocalServer]:
    """The three articles, served on 127.0.0.1."""
    routes = {
        path: (lambda _r, t=title, p=paragraphs: _article(t, p))
        for path, title, paragraphs in ARTICLES
    }
    with LocalServer(routes) as site:
        yield site


async def test_user_sees_the_pages_read_cited_and_listed(
    page: Page,
    owui: OwuiSession,
    model: ScriptedModel,
    search: FakeSearXNG,
    wind_site: LocalServer,
) -> None:
    """Search, read three pages, answer citing them: what README shows."""
    urls = [wind_site.url(path) for path, _, _ in ARTICLES]
    titles = [title for _, title, _ in ARTICLES]
    search.script(
        "two vs three blade wind turbine",
        results=[
            result(url, title, paragraphs[0])
            for url, (_, title, paragraphs) in zip(urls, ARTICLES, strict=True)
        ],
    )

    def extract(prompt: str) -> Reply:
        text = page_text_from_prompt(prompt)
        (k,) = [k for k, (_, title, _) in enumerate(ARTICLES) if title in text]
        summary = f"The page explains: {ARTICLES[k][2][1]}"
        return Reply(
            content=json.dumps(
                {"rational": "r", "evidence": READ_EVIDENCE[k], "summary": summary}
            )
        )

    model.extractor = extract
    model.verdicts = lambda _statement, _body: Reply("SUPPORTED\nThe page says it.")
    model.conversation(
        READ_KEY,
        Reply(
            reasoning="I should find why three blades became the standard.",
            content=tool_call("search", {"query": ["two vs three blade wind turbine"]}),
        ),
        Reply(
            reasoning="Three articles look relevant: read all of them.",
            content=tool_call(
                "visit", {"url": urls, "goal": "why three blades are standard"}
            ),
        ),
        Reply(
            reasoning="The pages agree on energy, noise and yaw loads.",
            content=answer(
                "Large turbines use three blades because it balances energy, "
                "cost and mechanical loads best.\n\n"
                f"- **Energy**: a third blade adds [about 3% more energy]({urls[0]}) "
                "than two; a fourth adds under 1%.\n"
                f"- **Noise and wear**: two blades must spin faster, which [makes "
                f"them louder and harder on the gearbox]({urls[1]}).\n"
                f"- **Smooth yaw**: three blades [turn into the wind without the "
                f"wobble]({urls[2]}) of a two-bladed rotor."
            ),
        ),
    )
    # Tall enough for the whole message with its summary open (the chat
    # scrolls inside the page: a full-page screenshot is the window).
    await page.set_viewport_size({"width": 1280, "height": 1240})
    try:
        await sign_in_and_ask(page, owui, MODEL_NAME, READ_QUESTION)
        sources_read = page.get_by_text("Sources read", exact=True)
        await sources_read.wait_for(timeout=120_000)
        # Every page read is listed under the answer, as a link, in order.
        listed = page.locator("ol", has=page.get_by_role("link", name=titles[0]))
        await expect(listed.last.get_by_role("link")).to_have_text(titles)
        await page.get_by_text("Research summary", exact=True).click()
        await page.get_by_text(
            "Pages read: 3 of 3 requested (3 cited as sources)"
        ).wait_for()
        await page.get_by_text(
            re.compile(r"Citations: 3 of 3 statements supported")
        ).wait_for()
        await settled(page)
    finally:  # also what a failure looked like
        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(path=str(RESEARCH_SCREENSHOT), full_page=True)
        (ARTIFACTS / "browser-research.html").write_text(
            await page.content(), encoding="utf-8"
        )
    assert RESEARCH_SCREENSHOT.stat().st_size > 10_000
    # The research read each page once and answered from them.
    assert sorted(r.path for r in wind_site.requests) == sorted(
        p for p, _, _ in ARTICLES
    )
    assert len(model.bodies(READ_KEY)) == 3


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


# -- the Stop button ---------------------------------------------------------------

STOP_QUESTION = "How long do offshore turbine bearings last?"
STOP_KEY = "turbine bearings"
#: The answer streams this far, then the model server holds the rest.
STOP_SHOWN = "Bearings last long long long"
STOP_SCREENSHOT = ARTIFACTS / "browser-stop.png"
#: Generous upper bounds only: nothing here is a timed assertion.
STOP_WAIT_SECONDS = 120.0


VALVES = f"/api/v1/functions/id/{FUNCTION_ID}/valves/update"


@pytest.fixture
def patient_pipe(owui: OwuiSession, fake_model: FakeOpenAI) -> Iterator[None]:
    """The pipe never gives up on the model by itself while the test runs.

    The session's 60-second request timeout would drop a held stream on its
    own: only the Stop may end this run. The valves are put back afterwards.
    """
    owui.api.post(
        VALVES,
        {**pipe_valves(fake_model), "REQUEST_TIMEOUT_SECONDS": 3600, "MAX_RETRIES": 1},
    )
    try:
        yield
    finally:
        owui.api.post(VALVES, pipe_valves(fake_model))


async def until(check: Callable[[], bool], what: str) -> None:
    """Poll ``check()`` (run in a thread: it may block) until it holds."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(STOP_WAIT_SECONDS):
            while not await asyncio.to_thread(check):
                await asyncio.sleep(0.25)
    assert await asyncio.to_thread(check), f"still waiting for {what}"


def chat_task_ids(api: Api, chat_id: str) -> list[str]:
    """The chat's running task ids (``GET /api/tasks/chat/{chat_id}``, 0.12)."""
    return list(api.get(f"/api/tasks/chat/{chat_id}")["task_ids"])


def reply_is_saved_done(api: Api, chat_id: str) -> bool:
    """Whether the chat's current (assistant) message is saved as done."""
    history = api.get_chat(chat_id)["chat"]["history"]
    message = history["messages"].get(history.get("currentId")) or {}
    return message.get("role") == "assistant" and message.get("done") is True


async def test_stop_button_ends_the_research(
    page: Page, owui: OwuiSession, model: ScriptedModel, patient_pipe: None
) -> None:
    """Single-process Open WebUI: Stop cancels the chat's task and the run ends."""
    if owui_version_tuple() < (0, 12):
        pytest.skip("the Stop button's label and /api/tasks/chat are 0.12's")
    # The model server streams the answer's start, then holds the rest until
    # its client leaves: only a run that really ends releases it.
    gate = StreamGate(
        after=STOP_SHOWN,
        timeout=600.0,  # never reached by a passing test
        client_gone=ClientWatch(model.fake.server).connection_closed,
    )
    model.conversation(
        STOP_KEY,
        Reply(
            reasoning="The bearing studies should say.",
            content=answer(STOP_SHOWN + " long" * 3000),
            chunk_size=8,
            gates=(gate,),
        ),
    )
    try:
        await sign_in_and_ask(page, owui, MODEL_NAME, STOP_QUESTION)
        # The run is live: its answer is streaming in the page, the server
        # holds the rest, and Open WebUI lists the chat's task.
        await page.get_by_text(STOP_SHOWN).first.wait_for(timeout=90_000)
        assert await asyncio.to_thread(gate.reached.wait, STOP_WAIT_SECONDS)
        await page.wait_for_url(re.compile(r"/c/[^/?#]+$"), timeout=60_000)
        chat_id = urlsplit(page.url).path.rsplit("/", 1)[-1]
        assert await asyncio.to_thread(chat_task_ids, owui.api, chat_id)
        assert gate.released_by == ""

        await page.get_by_role("button", name="Stop", exact=True).click()

        # The pipe dropped the model's stream: the server saw its client leave
        # (not the gate's deadline, not the server stopping).
        await until(lambda: bool(gate.released_by), "the model stream to end")
        assert gate.released_by == "client left"
        # No task of the chat is left, and the reply is saved as done.
        await until(
            lambda: not chat_task_ids(owui.api, chat_id), "the chat's task to end"
        )
        await until(
            lambda: reply_is_saved_done(owui.api, chat_id), "the reply saved as done"
        )
        # The page shows the stopped answer as it was, with no Stop button.
        await page.get_by_role("button", name="Stop", exact=True).wait_for(
            state="hidden", timeout=60_000
        )
        await page.get_by_text(STOP_SHOWN).first.wait_for(timeout=10_000)
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(path=str(STOP_SCREENSHOT), full_page=True)
    # One request: nothing was retried after the stop.
    assert len(model.bodies(STOP_KEY)) == 1
    saved = await asyncio.to_thread(owui.api.get_chat, chat_id)
    history = saved["chat"]["history"]
    reply = history["messages"][history["currentId"]]
    assert STOP_SHOWN in str(reply.get("content") or reply.get("output"))


# -- where a user makes the per-chat choices (README's screenshots) -----------------

TOOLS_QUESTION = "What does strain do to graphene?"
TOOLS_KEY = "strain do to graphene"
TOOLS_ANSWER = "Strain stretches the graphene lattice."
PAPER_TITLE = "Graphene under strain"
OUR_TOOLS = ("DeepResearch Scholar", "DeepResearch Search", "DeepResearch Visit")
#: Cropped for README (docs/screenshot-tools.png is a copy).
TOOLS_SCREENSHOT = ARTIFACTS / "browser-tools.png"
#: Cropped for README (docs/screenshot-user-valves.png is a copy).
USER_VALVES_SCREENSHOT = ARTIFACTS / "browser-user-valves.png"
USER_VALVES = f"/api/v1/functions/id/{FUNCTION_ID}/valves/user"
#: Room left around a cropped part of the page, in CSS pixels.
CROP_MARGIN = 24


def around(*boxes: FloatRect | None) -> FloatRect:
    """The part of the page that holds ``boxes``, with a margin."""
    shown = [box for box in boxes if box is not None]
    assert shown, "nothing to show"
    left = max(0.0, min(box["x"] for box in shown) - CROP_MARGIN)
    top = max(0.0, min(box["y"] for box in shown) - CROP_MARGIN)
    right = max(box["x"] + box["width"] for box in shown) + CROP_MARGIN
    bottom = max(box["y"] + box["height"] for box in shown) + CROP_MARGIN
    return {"x": left, "y": top, "width": right - left, "height": bottom - top}


async def settled(page: Page) -> None:
    """Until every animation that ends has ended (a screenshot shows it all)."""
    await page.wait_for_function(
        "() => document.getAnimations().every(a => a.playState !== 'running'"
        " || a.effect?.getComputedTiming().iterations === Infinity)"
    )


async def test_user_picks_the_scholar_tool_in_the_chat_input(
    page: Page,
    owui: OwuiSession,
    model: ScriptedModel,
    search: FakeSearXNG,
    scholar_apis: FakeScholarly,
) -> None:
    """The chat input's Integrations → Tools lists the three; only Scholar is on."""
    if owui_version_tuple() < (0, 12):
        pytest.skip("the chat input's Integrations menu is 0.12's")
    scholar_apis.openalex["graphene strain"] = [
        openalex_work(PAPER_TITLE, year=2021, cited=12)
    ]
    model.conversation(
        TOOLS_KEY,
        Reply(
            reasoning="Papers first.",
            content=tool_call("google_scholar", {"query": ["graphene strain"]}),
        ),
        Reply(reasoning="The paper says it.", content=answer(TOOLS_ANSWER)),
    )
    try:
        await sign_in_and_pick(page, owui, MODEL_NAME)
        chat_input = page.locator("#chat-input")
        await chat_input.click()
        await page.keyboard.type(TOOLS_QUESTION)
        integrations = page.get_by_role("button", name="Integrations")
        await integrations.click()
        await page.get_by_role("menuitem", name="Tools").click()
        menu = page.get_by_role("menu")
        for name in OUR_TOOLS:
            await menu.get_by_role("menuitemcheckbox", name=name).wait_for()
        scholar = menu.get_by_role("menuitemcheckbox", name="DeepResearch Scholar")
        await scholar.click()
        await expect(scholar).to_have_attribute("aria-checked", "true")
        for name in OUR_TOOLS[1:]:
            tool = menu.get_by_role("menuitemcheckbox", name=name)
            await expect(tool).to_have_attribute("aria-checked", "false")
        await settled(page)
        model_button = page.get_by_role(
            "button", name=f"Selected model: {MODEL_NAME}"
        ).first
        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(
            path=str(TOOLS_SCREENSHOT),
            clip=around(
                await chat_input.bounding_box(),
                await model_button.bounding_box(),
                await menu.bounding_box(),
            ),
        )

        await page.keyboard.press("Escape")
        await menu.wait_for(state="hidden")
        await chat_input.click()
        await page.keyboard.press("End")
        await page.keyboard.press("Enter")
        await page.get_by_text(TOOLS_ANSWER).wait_for(timeout=90_000)
        await page.get_by_text("View Result from google_scholar").wait_for()
    finally:  # also what a failure looked like
        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(
            path=str(ARTIFACTS / "browser-tools-chat.png"), full_page=True
        )
    assert TOOLS_SCREENSHOT.stat().st_size > 10_000
    # The research offered the model the scholar tool alone (the date is the
    # browser's), which found the paper; nothing was searched on the web.
    first, second = model.bodies(TOOLS_KEY)
    system = str(first["messages"][0]["content"])
    today = dt.date.fromisoformat(system[-10:])
    assert system == system_prompt_with(prompt_lines(["google_scholar"]), today)
    (result,) = tool_responses(second)
    assert f"[{PAPER_TITLE}]" in result
    assert search.queries() == []


async def test_user_sets_their_own_time_limit_in_the_chat_input_s_valves(
    page: Page, owui: OwuiSession
) -> None:
    """The chat input's Valves: the pipe's user valves, saved for this user.

    (The session's only user who may use the pipe's model is its admin; the
    dialog is every user's own.)
    """
    if owui_version_tuple() < (0, 12):
        pytest.skip("the chat input's Valves button is 0.12's")
    try:
        await sign_in_and_pick(page, owui, MODEL_NAME)
        await page.get_by_role("button", name="Valves", exact=True).click()
        dialog = page.get_by_role("dialog")
        for label in (
            "Show Thinking",
            "Max Research Minutes",
            "Max Tool Rounds",
            "Answer Language",
        ):
            await dialog.get_by_text(label, exact=True).wait_for()
        # The valve's row: its name, its Default/Custom switch, its description
        # (inner locators of `has` are relative to each candidate: from `page`).
        row = (
            dialog.locator(
                "div", has=page.get_by_text("Max Research Minutes", exact=True)
            )
            .filter(has=page.get_by_text("Your time limit for one research"))
            .last
        )
        await row.get_by_role("button", name="Default").click()
        await row.get_by_role("textbox").fill("20")
        panel = (
            dialog.locator("div", has=page.get_by_text("Valves", exact=True))
            .filter(has=page.get_by_role("button", name="Save"))
            .last
        )
        await settled(page)
        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(
            path=str(USER_VALVES_SCREENSHOT), clip=around(await panel.bounding_box())
        )
        await dialog.get_by_role("button", name="Save").click()
        await until(
            lambda: owui.api.get(USER_VALVES) == {"MAX_RESEARCH_MINUTES": 20.0},
            "the user's valves to be saved",
        )
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(
            path=str(ARTIFACTS / "browser-user-valves-page.png"), full_page=True
        )
        # The admin's own valves as they were (the other tests' runs).
        await asyncio.to_thread(owui.api.post, f"{USER_VALVES}/update", {})
    assert USER_VALVES_SCREENSHOT.stat().st_size > 10_000
