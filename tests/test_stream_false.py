"""``stream: false`` (API callers): the whole answer with its sources, in one reply.

Open WebUI joins whatever the pipe yields into one ``chat.completion``; the
reply must read as an answer, not as the live chat's markup (reasoning blocks,
tool cards, the collapsible summary) and not as a false start plus a retry.
"""

from __future__ import annotations

from typing import Any

from tests.fakes.chat import QUESTION, fake_tools, make_pipe
from tests.fakes.events import Events
from tests.fakes.openai_server import FakeOpenAI, Reply, answer
from tests.fakes.waits import Waits
from tests.test_pipe import research_script
from tongyi_deepresearch_openwebui_pipeline.core.history import RESTART_NOTE
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe


async def call(pipe: Pipe, messages: list[dict[str, Any]]) -> list[str]:
    body = {"model": "tdr.tongyi-deepresearch", "messages": messages, "stream": False}
    return [
        chunk
        async for chunk in pipe.pipe(
            body, __user__={"id": "u1", "role": "user"}, __event_emitter__=Events()
        )
    ]


async def test_one_reply_with_the_answer_and_its_sources():
    with FakeOpenAI() as fake:
        fake.script(*research_script("reasoning_content"))
        chunks = await call(make_pipe(fake), QUESTION)
    assert len(chunks) == 1
    reply = chunks[0]
    assert reply.startswith("It was written by Ada [see](https://example.org/who) [1].")
    assert reply.endswith(
        "**Sources read**\n\n"
        "1. [Title of https://example.org/who](https://example.org/who)"
    )
    for markup in ("<think>", "<details", "I should search.", "data: "):
        assert markup not in reply


async def test_a_broken_stream_leaves_only_the_retried_answer():
    with FakeOpenAI() as fake:
        fake.script(
            Reply(content=answer("Half an ans" + "wer that breaks"), fault="drop"),
            Reply(content=answer("The whole answer.")),
        )
        waits = Waits()
        pipe = make_pipe(
            fake, Pipe(tool_resolver=fake_tools(), sleep=waits), MAX_RETRIES=2
        )
        chunks = await call(pipe, QUESTION)
    assert chunks == ["The whole answer."]
    assert len(waits) == 1  # the one retry, after a back-off not slept
    assert RESTART_NOTE not in chunks[0]


async def test_streamed_requests_are_unchanged():
    with FakeOpenAI() as fake:
        fake.script(*research_script("inline"))
        pipe = make_pipe(fake)
        body = {"messages": QUESTION, "stream": True}
        chunks = [chunk async for chunk in pipe.pipe(body)]
    text = "".join(chunks)
    assert len(chunks) > 5 and "<think>" in text and "<details" in text
