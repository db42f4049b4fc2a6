"""A lone surrogate a server streams does not end the run at the next request.

JSON may escape half of a surrogate pair (``"\\ud83d"`` alone): Python decodes
it to a lone surrogate, which UTF-8 cannot encode. It then sits in the model's
turn in the history, and httpx's own ``json=`` raised UnicodeEncodeError when
the next request was built, ending the research with "Unexpected error". The
client sends each one as U+FFFD and everything else unchanged.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.fakes.http import LocalServer, Request, Response
from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    ModelSettings,
    OpenAIModelClient,
    json_body,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import RunFinished, ToolOutcome
from tongyi_deepresearch_openwebui_pipeline.core.loop import (
    Limits,
    ResearchLoop,
    RunState,
)
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import ToolCall

MODEL = "surrogate-model"
#: A turn whose thinking holds a lone high surrogate, escaped as JSON allows.
TURN_WITH_LONE_SURROGATE = (
    '{"choices":[{"index":0,"delta":{"content":"<think>\\nA broken emoji '
    '\\ud83d here.\\n</think>\\n\\n<tool_call>\\n{\\"name\\": \\"search\\", '
    '\\"arguments\\": {\\"query\\": [\\"q\\"]}}\\n</tool_call>"},'
    '"finish_reason":"stop"}]}'
)
ANSWER_TURN = (
    '{"choices":[{"index":0,"delta":{"content":"<answer>\\nDone.\\n</answer>"},'
    '"finish_reason":"stop"}]}'
)


def sse(*events: str) -> bytes:
    """An event stream of ``events`` and the end marker."""
    return b"".join(f"data: {e}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


class Tools:
    """A tool port whose only tool answers with a fixed text."""

    def available(self) -> list[str]:
        """The search tool only."""
        return ["search"]

    async def run(self, call: ToolCall) -> ToolOutcome:
        """A result for any call."""
        return ToolOutcome("RESULT")


async def no_sleep(_delay: float) -> None:
    """No back-off between attempts."""


async def test_a_lone_surrogate_in_a_turn_is_sent_back_as_a_replacement_character():
    replies = [sse(TURN_WITH_LONE_SURROGATE), sse(ANSWER_TURN)]

    def chat(_request: Request) -> Response:
        return Response(200, {"Content-Type": "text/event-stream"}, replies.pop(0))

    with LocalServer({"/v1/chat/completions": chat}) as server:
        settings = ModelSettings(
            base_url=f"{server.base_url}/v1", model=MODEL, request_usage=False
        )
        state = RunState(
            messages=[{"role": "user", "content": "question"}], started=0.0
        )
        async with httpx.AsyncClient() as http:
            client = OpenAIModelClient(settings, http, no_sleep)
            loop = ResearchLoop(state, client, Tools(), Limits(), clock=lambda: 0.0)
            events = [event async for event in loop.run()]
        second: dict[str, Any] = json.loads(server.requests[1].body)

    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.reason, end.answer) == ("answer", "Done.")
    assert second["messages"][1] == {
        "role": "assistant",
        "content": (
            "<think>\nA broken emoji \ufffd here.\n</think>\n\n<tool_call>\n"
            '{"name": "search", "arguments": {"query": ["q"]}}\n</tool_call>'
        ),
    }


def test_the_body_is_what_httpx_sends_when_nothing_needs_replacing():
    value = {"model": "m", "text": "café 😀 <tag>", "n": [1, 2.5, None, True]}
    request = httpx.Request("POST", "http://127.0.0.1/", json=value)
    assert json_body(value) == request.content


def test_a_surrogate_pair_written_as_two_characters_stays_one_character():
    # An escaped pair decodes to one character; only a half is replaced.
    assert json_body(json.loads('["\\ud83d\\ude00", "\\ude00"]')) == (
        '["\U0001f600","\ufffd"]'.encode()
    )
