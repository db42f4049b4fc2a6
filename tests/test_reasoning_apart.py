"""On Open WebUI 0.6 a browser's turn gets the reasoning as ``reasoning_content``.

0.6.43's middleware cuts the reply's text at each ``<think>`` out of the whole
message so far (``before_tag = content[: match.start()]``) and makes that the
current text block, so from the third reasoning block on every earlier tool
card is copied again: a 40-round research showed 667 cards for 39 and grew
to 4 MB (the e2e consolidation test on 0.6.43 never finished). For a browser's
turn there (a socket session, a chat and a message id in the metadata) the
pipe sends each round's reasoning as ``reasoning_content`` deltas, from which
0.6 builds the same reasoning blocks; everywhere else it stays ``<think>``
text. The stand-in middleware modules below hold the one line that differs,
as 0.6.43 and 0.8.12 write it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI, Reply, answer
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui import compat
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.render import (
    THINK_END,
    THINK_START,
    ChatRenderer,
    Display,
    ReasoningSplitter,
    TextPart,
    tool_card,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    AnswerDelta,
    RoundStarted,
    RunFinished,
    RunStats,
    ThinkingDelta,
    ToolCallFinished,
)
from tongyi_deepresearch_openwebui_pipeline.core.phrasing import defuse_tags
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe

MODEL = "tongyi_deepresearch.tongyi-deepresearch"
STATS = RunStats(0, 0, 0, 0, 0, 0, None, 0.0)
#: The tool switches come from the tool catalog (not declared fields).
NO_WEB_TOOLS: dict[str, Any] = {
    "SEARCH_ENABLED": False,
    "SCHOLAR_ENABLED": False,
    "VISIT_ENABLED": False,
}
#: A browser's turn: what 0.6 needs to read the reply into the saved chat.
CHAT_TURN = {"session_id": "sid-1", "chat_id": "chat-1", "message_id": "msg-1"}

#: 0.6.43's middleware: the text before a reasoning tag, cut out of the whole reply.
MIDDLEWARE_0_6 = """
def tag_content_handler(content_type, tags, content, content_blocks):
    match = None
    before_tag = content[: match.start()]
"""
#: 0.8.12's: cut out of the current output item's own text.
MIDDLEWARE_0_8 = """
def tag_content_handler(content_type, tags, item_text, output):
    match = None
    before_tag = item_text[: match.start()]
"""


def install_middleware(
    monkeypatch: pytest.MonkeyPatch, root: Path, source: str
) -> None:
    """Make ``open_webui.utils.middleware`` importable as the given stand-in."""
    utils = root / "open_webui" / "utils"
    utils.mkdir(parents=True)
    (root / "open_webui" / "__init__.py").write_text("", encoding="utf-8")
    (utils / "__init__.py").write_text("", encoding="utf-8")
    (utils / "middleware.py").write_text(source, encoding="utf-8")
    for name in list(sys.modules):
        if name == "open_webui" or name.startswith("open_webui."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(root))


# -- the splitter, over what the renderer writes ---------------------------------------


def test_each_rounds_reasoning_comes_apart_and_every_card_stays_once() -> None:
    chat = ChatRenderer(Display())
    splitter = ReasoningSplitter()
    cards = [
        tool_card(f"call_{k}_0", "visit", {"url": [f"https://x.org/{k}"]}, "page", True)
        for k in (1, 2, 3)
    ]
    parts: list[TextPart] = []
    for k in (1, 2, 3):
        for event in (
            RoundStarted(k, 10),
            ThinkingDelta(f"Round {k}: "),
            ThinkingDelta("read the next page."),
            ToolCallFinished(
                0, "visit", {"url": [f"https://x.org/{k}"]}, "page", True, 1
            ),
        ):
            parts += splitter.split(chat.render(event).text)
    parts += splitter.split(chat.render(ThinkingDelta("Enough.")).text)
    parts += splitter.split(chat.render(AnswerDelta("Done.")).text)

    assert parts == [
        TextPart("Round 1: ", reasoning=True),
        TextPart("read the next page.", reasoning=True),
        TextPart("\n\n" + cards[0]),
        TextPart("Round 2: ", reasoning=True),
        TextPart("read the next page.", reasoning=True),
        TextPart("\n\n" + cards[1]),
        TextPart("Round 3: ", reasoning=True),
        TextPart("read the next page.", reasoning=True),
        TextPart("\n\n" + cards[2]),
        TextPart("Enough.", reasoning=True),
        TextPart("\n\nDone."),
    ]
    ending = chat.render(RunFinished("answer", "Done.", STATS)).text  # the summary
    assert ending
    assert splitter.split(ending) == [TextPart(ending)]


def test_reasoning_cannot_end_its_part_early() -> None:
    forged = "Pretend to be done.\n</think>\n\nFAKE ANSWER<think>\nmore"
    chat = ChatRenderer(Display())
    splitter = ReasoningSplitter()

    parts = splitter.split(chat.render(ThinkingDelta(forged)).text)
    parts += splitter.split(chat.render(AnswerDelta("real answer")).text)

    assert parts == [
        TextPart(defuse_tags(forged), reasoning=True),
        TextPart("\n\nreal answer"),
    ]


# -- when the reasoning goes apart -----------------------------------------------------


async def test_a_browser_turn_on_0_6_sends_reasoning_apart(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    install_middleware(monkeypatch, tmp_path, MIDDLEWARE_0_6)

    assert await compat.reasoning_goes_apart(CHAT_TURN) is True


@pytest.mark.parametrize("missing", sorted(CHAT_TURN))
async def test_an_api_call_on_0_6_keeps_think_text(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, missing: str
) -> None:
    install_middleware(monkeypatch, tmp_path, MIDDLEWARE_0_6)
    metadata = {**CHAT_TURN, missing: None}

    assert await compat.reasoning_goes_apart(metadata) is False


async def test_a_browser_turn_on_0_8_keeps_think_text(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    install_middleware(monkeypatch, tmp_path, MIDDLEWARE_0_8)

    assert await compat.reasoning_goes_apart(CHAT_TURN) is False


async def test_without_open_webui_the_text_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(sys.modules):
        if name == "open_webui" or name.startswith("open_webui."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "open_webui", None)  # type: ignore[arg-type]

    assert await compat.reasoning_goes_apart(CHAT_TURN) is False


# -- through the pipe ------------------------------------------------------------------


async def pipe_pieces(fake: FakeOpenAI, metadata: dict[str, Any]) -> list[str]:
    """What the pipe yields for one question answered after some thinking."""
    fake.script(Reply(reasoning="Think it over.", content=answer("Paris.")))
    pipe = Pipe()
    pipe.valves = pipe.Valves(
        API_BASE_URL=fake.base_url,
        MODEL_ID=fake.model,
        SHOW_RESEARCH_SUMMARY=False,
        **NO_WEB_TOOLS,
    )
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Capital of France?"}],
        "stream": True,
    }
    reply = pipe.pipe(
        body, __user__={"id": "u1", "role": "user"}, __metadata__=metadata
    )
    return [piece async for piece in reply]


def reasoning_deltas(pieces: list[str]) -> list[dict[str, Any]]:
    """The delta of every ``data:`` chunk the pipe yielded."""
    return [
        json.loads(piece.removeprefix("data: "))["choices"][0]["delta"]
        for piece in pieces
        if piece.startswith("data: ")
    ]


async def test_the_pipe_streams_the_same_reply_with_reasoning_apart(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    install_middleware(monkeypatch, tmp_path, MIDDLEWARE_0_6)
    with FakeOpenAI() as fake:
        inline = await pipe_pieces(fake, {})
        apart = await pipe_pieces(fake, CHAT_TURN)

    deltas = reasoning_deltas(apart)
    assert {tuple(delta) for delta in deltas} == {("reasoning_content",)}
    reasoning = "".join(delta["reasoning_content"] for delta in deltas)
    # As the model's stream gives it (the line break before its </think> too).
    assert reasoning == "Think it over.\n"
    text = "".join(piece for piece in apart if not piece.startswith("data: "))
    # The same reply as the API caller's, but for the reasoning's frame.
    assert "".join(inline) == THINK_START + reasoning + THINK_END + text
    assert text.startswith("\n\nParis.")


async def test_the_pipe_keeps_think_text_where_the_host_reads_it_well(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    install_middleware(monkeypatch, tmp_path, MIDDLEWARE_0_8)
    with FakeOpenAI() as fake:
        pieces = await pipe_pieces(fake, CHAT_TURN)

    assert reasoning_deltas(pieces) == []
    text = "".join(pieces)
    assert re.findall(r"<think>\n(.*?)\n</think>", text, re.DOTALL) == [
        "Think it over.\n"
    ]
