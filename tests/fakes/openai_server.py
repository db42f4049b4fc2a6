"""A fake OpenAI-compatible chat server that plays scripted Tongyi turns.

It streams real SSE over real HTTP in each style a real server uses:

- ``inline``: the model's ``<think>…</think>`` arrives inside ``content``
  (a raw vLLM/SGLang server without a reasoning parser, llama.cpp, Ollama);
- ``reasoning_content``: vLLM/SGLang with ``--reasoning-parser``;
- ``reasoning``: OpenRouter and newer servers.

Faults on demand: HTTP errors (with ``Retry-After``), a stream cut mid-token,
garbage SSE lines, an empty ``choices`` list, an empty reply and a server that
never answers. Requests are recorded so tests can check what the model saw.

A served context on demand (``enforce_context=True``): like vLLM, a request
whose prompt plus ``max_tokens`` exceeds ``max_model_len`` is refused with
HTTP 400 and vLLM's message, and usage reports the prompt as counted. The
fake counts with the package's own estimate, the most the estimate allows
(Qwen's tokenizer counts about 10% fewer, benchmark 8), so a request that
passes here passes a real server.

Token log-probabilities on demand: a `Reply` with ``logprobs`` answers a
request that asks for them (``"logprobs": true``, ``"top_logprobs": k``) as
vLLM, SGLang and llama.cpp do, each streamed piece one token carrying
``choices[0].logprobs.content``; a reply without them returns none, as a
server that does not serve them ignores the fields.

Streaming without timing: a `StreamGate` holds the rest of a reply back until
the test has seen its first part come out of the code under test, so "it
streams" is proven by a handshake, not by counting network reads (which a busy
machine coalesces).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from tongyi_deepresearch_openwebui_pipeline.core.budget import (
    estimate_text_tokens,
    messages_tokens,
)

from .http import LocalServer, Request, Response

Style = Literal["inline", "reasoning_content", "reasoning"]
Fault = Literal["drop", "garbage", "empty_choices", "hang", "hang_mid", "empty"]


@dataclass
class StreamGate:
    """A point in a streamed reply where the server waits for the test.

    The server sends the reply up to and including the delta that completes
    `after` (matched in the reply's text as sent, reasoning and content), then
    holds the rest until the test calls `open()`, typically through
    `observe(output)` once the consumer's output contains `until_seen`
    (default: `after`). Code that buffers the reply instead of streaming it
    never shows that text while the server waits: after `timeout` seconds the
    server sends the rest anyway and records `timed_out`, so the test fails on
    `opened_by_consumer` instead of hanging. The wait also ends when the server
    stops or, given `client_gone` (e.g. `ClientWatch.client_gone`, called on
    the handler thread), when the client leaves; `released_by` says which.
    """

    after: str
    until_seen: str = ""
    timeout: float = 30.0
    client_gone: Callable[[], bool] | None = None
    reached: threading.Event = field(default_factory=threading.Event)
    released_by: str = ""
    _opened: threading.Event = field(default_factory=threading.Event)

    def open(self) -> None:
        """Let the server send the rest of the reply."""
        self._opened.set()

    def observe(self, output: str) -> None:
        """Open the gate if the consumer's `output` so far shows the text."""
        if (self.until_seen or self.after) in output:
            self.open()

    @property
    def opened_by_consumer(self) -> bool:
        """The server reached the gate and the test opened it in time."""
        return self.released_by == "opened"

    @property
    def timed_out(self) -> bool:
        """Nobody opened the gate: the server sent on after `timeout`."""
        return self.released_by == "timed out"

    def hold(self, stopping: threading.Event) -> None:
        """Server side: wait for `open()`, the client leaving or the deadline."""
        self.reached.set()
        deadline = time.monotonic() + self.timeout
        while not self._opened.wait(0.02):
            if stopping.is_set():
                self.released_by = "server stopped"
                return
            if self.client_gone is not None and self.client_gone():
                self.released_by = "client left"
                return
            if time.monotonic() >= deadline:
                self.released_by = "timed out"
                return
        self.released_by = "opened"


@dataclass
class Reply:
    """One scripted model reply."""

    content: str = ""
    reasoning: str = ""
    style: Style = "inline"
    chunk_size: int = 7
    usage: bool = True
    prompt_tokens: int | None = None
    cost: float | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    error: str = ""
    fault: Fault | None = None
    delay: float = 0.0
    finish_reason: str = "stop"
    gates: tuple[StreamGate, ...] = ()
    # A recorded non-streamed completion, served as it is (opt-in): for replies
    # no style above produces, e.g. `"content": null` next to the reasoning.
    body: dict[str, Any] | None = None
    # The top log-probabilities of every token (streamed piece) of the reply,
    # the token's own first, served when the request asks for them (the
    # first ``top_logprobs`` of them); None: no log-probabilities at all.
    logprobs: tuple[float, ...] | None = None

    def full_inline(self) -> str:
        """The whole text as a raw model would write it."""
        if self.reasoning:
            return f"<think>\n{self.reasoning}\n</think>\n\n{self.content}"
        return self.content


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A `<tool_call>` block as the model writes it."""
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def answer(text: str) -> str:
    """An `<answer>` block as the model writes it."""
    return f"<answer>\n{text}\n</answer>"


def _pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), max(1, size)):
        yield text[start : start + size]


class FakeOpenAI:
    """The fake server; use as a context manager, then `.script(...)`."""

    def __init__(
        self,
        model: str = "Alibaba-NLP/Tongyi-DeepResearch-30B-A3B",
        max_model_len: int = 131072,
        *,
        enforce_context: bool = False,
    ) -> None:
        """Create the server (not started)."""
        self.model = model
        self.max_model_len = max_model_len
        self.enforce_context = enforce_context
        #: Each chat request's (prompt tokens, max_tokens) as this server counts.
        self.sizes: list[tuple[int, int]] = []
        #: Requests refused for their length.
        self.refused = 0
        self.replies: list[Reply] = []
        self.responder: Callable[[dict[str, Any]], Reply] | None = None
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.server = LocalServer(
            {
                "/v1/chat/completions": self._chat,
                "/v1/models": self._models,
            }
        )

    # -- scripting --
    def script(self, *replies: Reply) -> FakeOpenAI:
        """Queue replies, served in order, one per chat request."""
        with self._lock:
            self.replies.extend(replies)
        return self

    def respond_with(self, responder: Callable[[dict[str, Any]], Reply]) -> None:
        """Answer every request with `responder(request_body)` instead of a queue."""
        self.responder = responder

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (ends in /v1)."""
        return self.server.url("/v1")

    @property
    def requests(self) -> list[Request]:
        """Raw requests seen by the server."""
        return self.server.requests

    # -- routes --
    def _models(self, _request: Request) -> Response:
        return Response.json(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "max_model_len": self.max_model_len,
                    }
                ],
            }
        )

    def _next_reply(self, body: dict[str, Any]) -> Reply | None:
        if self.responder is not None:
            return self.responder(body)
        with self._lock:
            return self.replies.pop(0) if self.replies else None

    def _chat(self, request: Request) -> Response:
        body = request.json()
        with self._lock:
            self.bodies.append(body)
        if self.enforce_context:
            refusal = self._refusal(body)
            if refusal is not None:
                return refusal
        reply = self._next_reply(body)
        if reply is None:
            return Response.json({"error": {"message": "script exhausted"}}, 500)
        if reply.fault == "hang":
            self.server.wait_forever()
            return Response.json({}, 504)
        if reply.status != 200:
            return Response.json(
                {"error": {"message": reply.error or f"HTTP {reply.status}"}},
                reply.status,
                **reply.headers,
            )
        if not body.get("stream"):
            return Response.json(self._completion(reply, body))
        return Response(
            200,
            {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
            self._stream(reply, body),
        )

    def _refusal(self, body: dict[str, Any]) -> Response | None:
        """vLLM's answer to a request longer than the served context, if it is."""
        prompt = messages_tokens(body["messages"])
        wanted = int(body.get("max_tokens") or 0)
        with self._lock:
            self.sizes.append((prompt, wanted))
        if prompt + wanted <= self.max_model_len:
            return None
        with self._lock:
            self.refused += 1
        message = (
            f"This model's maximum context length is {self.max_model_len} tokens. "
            f"However, you requested {prompt + wanted} tokens ({prompt} in the "
            f"messages, {wanted} in the completion). Please reduce the length of "
            "the messages or completion."
        )
        return Response.json(
            {"object": "error", "message": message, "type": "BadRequestError"}, 400
        )

    def _usage(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        prompt_chars = sum(len(str(m.get("content", ""))) for m in body["messages"])
        completion = len(reply.full_inline())
        usage: dict[str, Any] = {
            "prompt_tokens": reply.prompt_tokens or prompt_chars // 4,
            "completion_tokens": completion // 4,
        }
        if self.enforce_context:
            usage["prompt_tokens"] = messages_tokens(body["messages"])
            usage["completion_tokens"] = estimate_text_tokens(reply.full_inline())
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if reply.cost is not None:
            usage["cost"] = reply.cost
        return usage

    def _completion(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        if reply.body is not None:
            return reply.body
        message: dict[str, Any] = {"role": "assistant"}
        if reply.style == "inline":
            message["content"] = reply.full_inline()
        else:
            message["content"] = reply.content
            message[reply.style] = reply.reasoning
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": self.model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": reply.finish_reason}
            ],
            "usage": self._usage(reply, body),
        }

    def _chunk(
        self,
        delta: dict[str, Any],
        finish: str | None = None,
        logprobs: dict[str, Any] | None = None,
    ) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        if logprobs is not None:
            choice["logprobs"] = logprobs
        payload = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": self.model,
            "choices": [choice],
        }
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    @staticmethod
    def _logprobs(
        reply: Reply, body: dict[str, Any], piece: str
    ) -> dict[str, Any] | None:
        """One token's log-probabilities as vLLM streams them (when asked)."""
        if reply.logprobs is None or not body.get("logprobs"):
            return None
        top = reply.logprobs[: int(body.get("top_logprobs") or 0)]
        alternatives = [
            {"token": piece if rank == 0 else f"alt{rank}", "logprob": value}
            for rank, value in enumerate(top)
        ]
        entry = {
            "token": piece,
            "logprob": reply.logprobs[0],
            "bytes": list(piece.encode()),
            "top_logprobs": alternatives,
        }
        return {"content": [entry]}

    def _deltas(self, reply: Reply) -> Iterator[dict[str, Any]]:
        if reply.fault == "empty":
            return
        if reply.style == "inline":
            for piece in _pieces(reply.full_inline(), reply.chunk_size):
                yield {"content": piece}
            return
        for piece in _pieces(reply.reasoning, reply.chunk_size):
            yield {reply.style: piece, "content": None}
        for piece in _pieces(reply.content, reply.chunk_size):
            yield {"content": piece}

    def _stream(self, reply: Reply, body: dict[str, Any]) -> Iterator[bytes]:
        yield self._chunk({"role": "assistant", "content": ""})
        if reply.fault == "empty_choices":
            payload = {"id": "x", "object": "chat.completion.chunk", "choices": []}
            yield f"data: {json.dumps(payload)}\n\n".encode()
            yield b"data: [DONE]\n\n"
            return
        deltas = list(self._deltas(reply))
        gates = list(reply.gates)
        sent = ""
        for index, delta in enumerate(deltas):
            if reply.fault == "garbage" and index == 1:
                yield b": keep-alive\n\nnot an sse line\n\ndata: {broken json\n\n"
            if reply.fault in ("drop", "hang_mid") and index == len(deltas) // 2:
                if reply.fault == "hang_mid":
                    self.server.wait_forever()
                return
            if reply.delay:
                time.sleep(reply.delay)
            piece = "".join(str(v) for v in delta.values() if v)
            logprobs = self._logprobs(reply, body, piece)
            # Subclasses that shape chunks know no log-probabilities.
            yield (
                self._chunk(delta)
                if logprobs is None
                else self._chunk(delta, logprobs=logprobs)
            )
            # Resumed only once the server has written and flushed that chunk.
            sent += piece
            while gates and gates[0].after in sent:
                gates.pop(0).hold(self.server.stopping)
        yield self._chunk({}, reply.finish_reason)
        include_usage = (body.get("stream_options") or {}).get("include_usage")
        if reply.usage and include_usage:
            payload = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": self._usage(reply, body),
            }
            yield f"data: {json.dumps(payload)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    # -- lifecycle --
    def __enter__(self) -> FakeOpenAI:
        """Start on entry."""
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop on exit."""
        self.server.stop()
