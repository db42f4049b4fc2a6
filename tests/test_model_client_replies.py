"""The model client against what servers really send.

Every server here is real HTTP on 127.0.0.1 (`LocalServer`): an error event
after the reply's finish or inside a stream that refuses the request, a reply
compressed although the client asked for none, a charset no event stream may
have, and usage counts that are no numbers.
"""

from __future__ import annotations

import gzip
import json
import logging
import zlib
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.fakes.http import LocalServer, Request, Response
from tongyi_deepresearch_openwebui_pipeline.adapters import model_client
from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    ModelSettings,
    OpenAIModelClient,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    ContextOverflowError,
    ModelChunk,
    ModelDelta,
    ModelError,
    ModelFinish,
    ModelRetry,
    ModelUsage,
)

MESSAGES = [{"role": "user", "content": "question"}]
SSE = {"Content-Type": "text/event-stream"}
DONE = b"data: [DONE]\n\n"
Responder = Callable[[Request], Response]


def event(payload: dict[str, Any]) -> bytes:
    """One SSE event carrying ``payload`` (text unescaped, as vLLM sends it)."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def choice(content: str = "", finish: str | None = None) -> dict[str, Any]:
    """A chunk with one choice: ``content`` and ``finish`` as its finish reason."""
    return {"choices": [{"delta": {"content": content}, "finish_reason": finish}]}


ANSWER = [event(choice("<answer>ok</answer>")), event(choice(finish="stop")), DONE]


def stream_of(*parts: bytes, headers: dict[str, str] | None = None) -> Responder:
    """A 200 event stream sending ``parts``, one per write."""
    return lambda _request: Response(200, headers or dict(SSE), list(parts))


class Chat:
    """A chat-completions server answering request n with responder n.

    The last responder answers every further request (a retry gets what the
    server sent the first time).
    """

    def __init__(self, *responders: Responder) -> None:
        """Answer with ``responders`` in order."""
        self._responders = list(responders)
        self.requests: list[Request] = []
        self.server = LocalServer({"/v1/chat/completions": self._answer})

    def _answer(self, request: Request) -> Response:
        self.requests.append(request)
        index = min(len(self.requests), len(self._responders)) - 1
        return self._responders[index](request)

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (``…/v1``)."""
        return self.server.url("/v1")

    def __enter__(self) -> Chat:
        """Start serving."""
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop serving."""
        self.server.stop()


async def no_sleep(_delay: float) -> None:
    """Retries in tests wait for nothing."""


async def collect(
    chat: Chat, **fields: Any
) -> tuple[list[ModelChunk], ModelError | None]:
    """The chunks of one reply through the real client, and its error if any."""
    options: dict[str, Any] = {
        "base_url": chat.base_url,
        "model": "m",
        "max_attempts": 3,
        "backoff_seconds": 0.0,
    }
    options.update(fields)
    chunks: list[ModelChunk] = []
    async with httpx.AsyncClient() as http:
        client = OpenAIModelClient(ModelSettings(**options), http, no_sleep)
        try:
            async for chunk in client.stream(MESSAGES):
                chunks.append(chunk)
        except ModelError as error:
            return chunks, error
    return chunks, None


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the model client logged."""
    return [r.getMessage() for r in caplog.records if r.name == model_client.__name__]


def where(chat: Chat) -> str:
    """How messages name the server and the model."""
    return f"{chat.base_url} (model 'm')"


# -- error events: after the finish, and refusals inside the stream ---------------


async def test_an_error_after_the_finish_keeps_the_reply_and_its_usage(caplog):
    caplog.set_level(logging.INFO)
    late = {
        "error": {"code": 502, "message": "Upstream closed"},
        "choices": [{"delta": {"content": ""}, "finish_reason": None}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3},
    }
    parts = (event(choice("<answer>ok</answer>")), event(choice(finish="stop")))
    with Chat(stream_of(*parts, event(late), DONE)) as chat:
        chunks, error = await collect(chat)
    assert (error, len(chat.requests)) == (None, 1)
    assert chunks == [
        ModelDelta("", "<answer>ok</answer>"),
        ModelFinish("stop"),
        ModelUsage(12, 3, None),
    ]
    assert logged(caplog) == [
        "The model server reported an error after its reply had finished; "
        "the reply is kept: Upstream closed"
    ]


async def test_an_error_in_the_event_that_finishes_keeps_the_cut_reply():
    cut = {
        **choice("<think>cut sho", finish="length"),
        "error": {"code": 400, "message": "Token limit reached"},
    }
    with Chat(stream_of(event(cut), DONE)) as chat:
        chunks, error = await collect(chat)
    assert (error, len(chat.requests)) == (None, 1)
    assert chunks == [ModelDelta("", "<think>cut sho"), ModelFinish("length")]


def error_event(code: Any, message: str) -> bytes:
    """vLLM's in-stream error: the request failed after the stream began."""
    error = {"object": "error", "message": message, "type": "BadRequestError"}
    return event({"error": {**error, "param": None, "code": code}})


async def test_a_4xx_error_before_the_finish_is_refused_but_429_is_retried():
    busy = stream_of(error_event(429, "busy"), DONE)
    refused = stream_of(error_event(400, "top_p must be in (0, 1]"), DONE)
    with Chat(busy, refused) as chat:
        chunks, error = await collect(chat)
    assert len(chat.requests) == 2
    assert chunks == [ModelRetry(2, 3, "server error in stream: busy", 0.0)]
    assert error is not None and not isinstance(error, ContextOverflowError)
    assert error.message == (
        f"The model server at {where(chat)} rejected the request (error 400 in "
        "its stream). Check the MODEL_ID, MAX_TOKENS and sampling valves. "
        "Server said: top_p must be in (0, 1]"
    )


@pytest.mark.parametrize(("limit", "read"), [(32768, 32768), (123456789, 0)])
async def test_an_overflow_error_in_the_stream_is_a_context_overflow(limit, read):
    said = (
        "Requested token count exceeds the model's maximum context length of "
        f"{limit} tokens. You requested a total of 40000 tokens."
    )
    with Chat(stream_of(error_event(400, said), DONE)) as chat:
        chunks, error = await collect(chat)
    assert (chunks, len(chat.requests)) == ([], 1)
    assert isinstance(error, ContextOverflowError)
    assert error.limit == read
    held = f" (it holds {read:,} tokens)" if read else ""
    assert error.message == (
        f"The model server at {chat.base_url} refused the conversation as too "
        f"long for its context{held}. Serve a longer context or lower "
        f"MAX_CONTEXT_TOKENS. Server said: {said}"
    )


# -- compressed replies and charsets ----------------------------------------------


async def test_the_chat_request_asks_for_an_uncompressed_reply():
    headers = {"accept-encoding": "gzip, br", "X-Team": "research"}
    with Chat(stream_of(*ANSWER)) as chat:
        _, error = await collect(chat, headers=headers)
    sent = chat.requests[0].headers
    assert error is None
    assert (sent["accept-encoding"], sent["x-team"]) == ("identity", "research")


def deflated(data: bytes) -> bytes:
    """``data`` as a ``Content-Encoding: deflate`` body (zlib-wrapped)."""
    return zlib.compress(data)


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [("gzip", gzip.compress), ("deflate", deflated), ("identity, gzip", gzip.compress)],
)
async def test_a_compressed_reply_is_refused_unread(encoding, pack):
    body = pack(b"".join(ANSWER))
    headers = {**SSE, "Content-Encoding": encoding}
    with Chat(stream_of(body, headers=headers)) as chat:
        chunks, error = await collect(chat)
    assert (chunks, len(chat.requests)) == ([], 1)
    assert error is not None
    assert error.message == (
        f"The model server at {chat.base_url} sent its reply compressed "
        f"('{encoding}') although the request asked for an uncompressed one; a "
        "compressed reply is not read, as one read of it can inflate a "
        "thousandfold. Turn off compression for this endpoint in the proxy in "
        "front of the server, or point API_BASE_URL at the server itself."
    )


async def test_a_compressed_error_body_is_not_read(caplog):
    caplog.set_level(logging.WARNING)
    body = gzip.compress(json.dumps({"error": {"message": "no such key"}}).encode())
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    with Chat(lambda _request: Response(401, headers, body)) as chat:
        chunks, error = await collect(chat)
    assert (chunks, len(chat.requests)) == ([], 1)
    assert error is not None
    assert error.message == (
        f"The model server at {where(chat)} refused the request (HTTP 401). "
        "Check the API_KEY valve (leave it empty for a local server that needs "
        "no key)."
    )
    assert logged(caplog) == [
        f"The model server at {chat.base_url} answered HTTP 401 with a body "
        "compressed ('gzip') although the request asked for an uncompressed "
        "one; the body is not read."
    ]


@pytest.mark.parametrize("charset", ["hex", "zlib", "rot13", "utf-16", "latin-1"])
async def test_an_event_stream_is_utf8_whatever_charset_it_declares(charset):
    """The SSE format has one encoding: a declared charset is no codec to run.

    A bytes-to-bytes codec named there (``zlib``, ``hex``) would inflate or
    crash inside the HTTP library; another text codec garbles the reply.
    """
    headers = {"Content-Type": f"text/event-stream; charset={charset}"}
    parts = (event(choice("<answer>café</answer>")), event(choice(finish="stop")))
    with Chat(stream_of(*parts, DONE, headers=headers)) as chat:
        chunks, error = await collect(chat)
    assert error is None
    assert chunks == [ModelDelta("", "<answer>café</answer>"), ModelFinish("stop")]


# -- usage counts -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("usage", "counted"),
    [
        ({"prompt_tokens": True, "completion_tokens": 7}, ModelUsage(0, 7, None)),
        ({"prompt_tokens": 3, "completion_tokens": True}, ModelUsage(3, 0, None)),
        ({"prompt_tokens": 3, "completion_tokens": 7, "cost": True}, None),
        ({"prompt_tokens": 3, "completion_tokens": 7, "cost": float("nan")}, None),
        ({"prompt_tokens": 3, "completion_tokens": 7, "cost": float("inf")}, None),
        ({"prompt_tokens": 10**400, "completion_tokens": 7}, ModelUsage(0, 7, None)),
        ({"prompt_tokens": 3, "completion_tokens": 1e300}, ModelUsage(3, 0, None)),
        ({"prompt_tokens": 3, "completion_tokens": 7, "cost": 10**400}, None),
    ],
    ids=[
        "bool-prompt",
        "bool-completion",
        "bool-cost",
        "nan-cost",
        "inf-cost",
        "huge-int-prompt",
        "huge-completion",
        "huge-int-cost",
    ],
)
async def test_usage_that_is_no_number_counts_nothing(usage, counted):
    counted = counted or ModelUsage(3, 7, None)
    last = {**choice(finish="stop"), "usage": usage}
    with Chat(stream_of(event(choice("<answer>ok</answer>")), event(last))) as chat:
        chunks, error = await collect(chat)
    assert error is None
    assert [chunk for chunk in chunks if isinstance(chunk, ModelUsage)] == [counted]
