"""The model server adapter: streaming chat completions with retries.

Speaks the OpenAI chat-completions protocol to any compatible server (vLLM,
SGLang, llama.cpp, Ollama, hosted providers) directly over ``httpx``, on a
client the caller owns: that client is the test seam and what lets a cancelled
chat close its connections. (The ``openai`` SDK is not used here: its
authentication rules differ between the versions Open WebUI pins, and 3.x
refuses to send a request without an API key, which keyless local servers need.)

It normalises the three ways reasoning arrives (``reasoning_content``,
``reasoning``, inline ``<think>``) into `ModelDelta(reasoning=…, content=…)` and
classifies failures:

- transient (connection errors, timeouts, 408/409/429/5xx, a stream cut short,
  a malformed stream, an empty reply) → retried with exponential backoff,
  honouring ``Retry-After``, within ``max_attempts``;
- the user's configuration (400/401/403/404/422) → not retried; a clear
  `ModelError` naming the valve to fix.

The API key is never put into a message, log line or event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..core.events import (
    ModelChunk,
    ModelDelta,
    ModelError,
    ModelFinish,
    ModelRetry,
    ModelUsage,
)

log = logging.getLogger(__name__)

#: The reference agent's stop sequences (the model must not write tool output).
STOP_SEQUENCES = ("\n<tool_response>", "<tool_response>")
_TRANSIENT_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529}
_MAX_RETRY_AFTER = 60.0
_MAX_ERROR_BODY = 4096


@dataclass(frozen=True)
class ModelSettings:
    """How to reach the model and how to sample it (all from valves)."""

    base_url: str
    model: str
    api_key: str = ""
    temperature: float = 0.6
    top_p: float = 0.95
    presence_penalty: float = 1.1
    max_tokens: int = 10000
    timeout_seconds: float = 600.0
    connect_timeout_seconds: float = 30.0
    max_attempts: int = 5
    backoff_seconds: float = 1.0
    backoff_max_seconds: float = 30.0
    request_usage: bool = True
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def completions_url(self) -> str:
        """``{base_url}/chat/completions``."""
        return self.base_url.rstrip("/") + "/chat/completions"


class _Transient(Exception):  # noqa: N818 - internal signal, not an API error
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


def redact(text: str, secret: str) -> str:
    """Remove ``secret`` from ``text`` (errors may echo request details)."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "***")
    return text


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return min(max(float(value), 0.0), _MAX_RETRY_AFTER)
    except ValueError:
        return None


def _error_detail(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:300]
    inner = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(inner, dict):
        inner = inner.get("message") or inner.get("detail") or ""
    return str(inner)[:300]


def _config_error(settings: ModelSettings, status: int, detail: str) -> ModelError:
    where = f"{settings.base_url} (model '{settings.model}')"
    if status in (401, 403):
        text = (
            f"The model server at {where} refused the request (HTTP {status}). "
            "Check the API_KEY valve (leave it empty for a local server that "
            "needs no key)."
        )
    elif status == 404:
        text = (
            f"The model server at {where} answered HTTP 404: the model id or the "
            "URL is wrong. Check the MODEL_ID and API_BASE_URL valves (the URL "
            "usually ends in /v1)."
        )
    else:
        text = (
            f"The model server at {where} rejected the request (HTTP {status}). "
            "Check the MODEL_ID, MAX_TOKENS and sampling valves."
        )
    if detail:
        text += f" Server said: {detail}"
    return ModelError(redact(text, settings.api_key))


def _count(value: Any) -> int:
    valid = isinstance(value, int | float) and math.isfinite(value) and value >= 0
    return int(value) if valid else 0


def _usage(usage: Mapping[str, Any]) -> ModelUsage:
    cost = usage.get("cost")
    return ModelUsage(
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        cost=float(cost) if isinstance(cost, int | float) else None,
    )


_SSL_CONTEXTS: dict[str, ssl.SSLContext] = {}


async def shared_ssl_context() -> ssl.SSLContext:
    """One TLS context per process, built off the event loop.

    Building a context loads the CA bundle: tens of milliseconds idle and far
    more under load, during which the event loop would stall. Every chat's
    HTTP client reuses this one instead.
    """
    context = _SSL_CONTEXTS.get("default")
    if context is None:
        context = await asyncio.to_thread(httpx.create_ssl_context)
        _SSL_CONTEXTS["default"] = context
    return context


_CONTEXT_FIELDS = ("max_model_len", "context_length", "context_window", "n_ctx")
# (base URL, model) -> (monotonic time, tokens): a hosted provider's model list
# can be megabytes, and it rarely changes, so it is read at most every 10 min.
_CONTEXT_CACHE: dict[tuple[str, str], tuple[float, int]] = {}
_CONTEXT_CACHE_SECONDS = 600.0


async def served_context_tokens(
    http: httpx.AsyncClient, settings: ModelSettings
) -> int:
    """The context length the server says it serves for the model (0 = unknown).

    vLLM lists ``max_model_len`` under ``GET /models``, OpenRouter
    ``context_length``, llama.cpp ``n_ctx`` in its metadata. A deployment may
    serve far less than the model's 128K, and the research budget must fit
    what is actually served. Any failure means "unknown": never an error.
    """
    key = (settings.base_url, settings.model)
    cached = _CONTEXT_CACHE.get(key)
    if cached and time.monotonic() - cached[0] < _CONTEXT_CACHE_SECONDS:
        return cached[1]
    tokens = await _read_served_context(http, settings)
    _CONTEXT_CACHE[key] = (time.monotonic(), tokens)
    return tokens


async def _read_served_context(http: httpx.AsyncClient, settings: ModelSettings) -> int:
    headers = (
        {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    )
    try:
        response = await http.get(
            settings.base_url.rstrip("/") + "/models",
            headers=headers,
            timeout=httpx.Timeout(5.0),
        )
        entries = response.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return 0
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("id") != settings.model:
            continue
        places = [entry, entry.get("meta") or {}, entry.get("top_provider") or {}]
        for place in places:
            for name in _CONTEXT_FIELDS:
                value = place.get(name) if isinstance(place, dict) else None
                if isinstance(value, int) and value > 0:
                    return value
    return 0


class SSEDecoder:
    """Incremental decoder of ``data:`` payloads (httpx-style ``feed``/``flush``).

    Network reads split lines anywhere, so ``feed`` keeps the unfinished last
    line for the next call. Comment lines and lines without a ``data:`` field are
    skipped, as the SSE format says; a ``data:`` line that is not JSON means the
    stream is broken; ``data: [DONE]`` ends it.
    """

    def __init__(self) -> None:
        """Start empty."""
        self._partial = ""
        self.done = False

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Payloads completed by ``text``."""
        if self.done:
            return []
        text = self._partial + text
        cut = max(text.rfind("\n"), text.rfind("\r"))
        self._partial, complete = text[cut + 1 :], text[: cut + 1]
        return self._payloads(complete.splitlines())

    def flush(self) -> list[dict[str, Any]]:
        """Payloads of a last line that had no line break."""
        rest, self._partial = self._partial, ""
        return self._payloads([rest]) if rest and not self.done else []

    def _payloads(self, lines: list[str]) -> list[dict[str, Any]]:
        payloads: list[dict[str, Any]] = []
        decode = _JSON.raw_decode  # json.loads adds two frames per line
        for line in lines:
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                self.done = True
                break
            if not data:
                continue
            try:
                payload, end = decode(data)
            except ValueError:
                raise _Transient("malformed stream data") from None
            if end != len(data):
                raise _Transient("malformed stream data")
            if type(payload) is not dict:
                continue
            if payload.get("error"):
                detail = payload["error"]
                if isinstance(detail, dict):
                    detail = detail.get("message", "")
                raise _Transient(f"server error in stream: {str(detail)[:200]}")
            payloads.append(payload)
        return payloads


_JSON = json.JSONDecoder()


def chunks_of(payloads: list[dict[str, Any]]) -> list[ModelChunk]:
    """Model chunks for the payloads of one network read.

    All deltas of one read become ONE `ModelDelta`: a fast server sends many
    tiny events per TCP segment, and handling them one by one would cost the
    UI more time than the network took to deliver them.
    """
    chunks: list[ModelChunk] = []
    tail: list[ModelChunk] = []
    # A ModelDelta means "its reasoning, then its content"; a run is cut where
    # reasoning follows content so the order of the two channels is kept.
    reasoning, content = "", ""
    for payload in payloads:
        usage = payload.get("usage")
        if usage and type(usage) is dict:
            tail.append(_usage(usage))
        choices = payload.get("choices")
        if type(choices) is not list or not choices or type(choices[0]) is not dict:
            continue
        choice = choices[0]
        delta = choice.get("delta")
        if type(delta) is not dict:
            delta = {}
        # Kept inline: this runs once per streamed token.
        thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
        text = delta.get("content") or ""
        if type(thought) is not str:
            thought = ""
        if type(text) is not str:
            text = ""
        if thought and content:
            chunks.append(ModelDelta(reasoning, content))
            reasoning, content = "", ""
        reasoning += thought
        content += text
        if choice.get("finish_reason"):
            tail.append(ModelFinish(choice["finish_reason"]))
    if reasoning or content:
        chunks.append(ModelDelta(reasoning, content))
    return chunks + tail


class OpenAIModelClient:
    """`ModelPort` for OpenAI-compatible servers."""

    def __init__(
        self,
        settings: ModelSettings,
        http_client: httpx.AsyncClient,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Use ``http_client`` for every request (the caller closes it)."""
        self.settings = settings
        self._http = http_client
        self._sleep = sleep
        self._send_usage_option = settings.request_usage

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream", **self.settings.headers}
        if self.settings.api_key:
            # Keyless local servers get no Authorization header at all.
            headers["Authorization"] = f"Bearer {self.settings.api_key}"
        return headers

    def _payload(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        s = self.settings
        payload: dict[str, Any] = {
            **s.extra_body,
            "model": s.model,
            "messages": messages,
            "stream": True,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "presence_penalty": s.presence_penalty,
            "max_tokens": s.max_tokens,
            "stop": list(STOP_SEQUENCES),
        }
        if self._send_usage_option:
            payload["stream_options"] = {"include_usage": True}
        return payload

    async def stream(self, messages: list[dict[str, Any]]) -> AsyncIterator[ModelChunk]:
        """Stream one reply, retrying transient failures from the start."""
        attempts = max(1, self.settings.max_attempts)
        for attempt in range(1, attempts + 1):
            try:
                async for chunk in self._attempt(messages):
                    yield chunk
                return
            except _Transient as failure:
                if attempt >= attempts:
                    raise ModelError(self._gave_up(failure.reason, attempts)) from None
                delay = self._backoff(attempt, failure.retry_after)
                log.warning(
                    "model call failed (%s); retry %d/%d in %.1fs",
                    failure.reason,
                    attempt + 1,
                    attempts,
                    delay,
                )
                yield ModelRetry(attempt + 1, attempts, failure.reason, delay)
                await self._sleep(delay)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        s = self.settings
        if retry_after is not None:
            return retry_after
        jitter = random.uniform(0, s.backoff_seconds)  # noqa: S311 - not crypto
        delay = s.backoff_seconds * 2 ** (attempt - 1) + jitter
        return min(delay, s.backoff_max_seconds)

    def _gave_up(self, reason: str, attempts: int) -> str:
        s = self.settings
        return redact(
            f"The model server at {s.base_url} did not give a usable reply after "
            f"{attempts} attempts ({reason}). Check that it is running and that "
            "API_BASE_URL is right, or try again later.",
            s.api_key,
        )

    async def _attempt(
        self, messages: list[dict[str, Any]]
    ) -> AsyncIterator[ModelChunk]:
        s = self.settings
        timeout = httpx.Timeout(s.timeout_seconds, connect=s.connect_timeout_seconds)
        received = finished = False
        decoder = SSEDecoder()
        try:
            async with self._http.stream(
                "POST",
                s.completions_url,
                json=self._payload(messages),
                headers=self._headers(),
                timeout=timeout,
            ) as response:
                if response.status_code != 200:
                    await self._raise_for_status(response)
                async for text in response.aiter_text():
                    for chunk in chunks_of(decoder.feed(text)):
                        received = received or isinstance(chunk, ModelDelta)
                        finished = finished or isinstance(chunk, ModelFinish)
                        yield chunk
                    if decoder.done:
                        break
                for chunk in chunks_of(decoder.flush()):
                    received = received or isinstance(chunk, ModelDelta)
                    finished = finished or isinstance(chunk, ModelFinish)
                    yield chunk
        except httpx.TimeoutException:
            raise _Transient("timed out") from None
        except httpx.TransportError as error:
            raise _Transient(f"connection failed: {type(error).__name__}") from None
        if not received:
            raise _Transient("empty reply")
        if not finished:
            raise _Transient("the stream ended before the reply was complete")

    async def _raise_for_status(self, response: httpx.Response) -> None:
        raw = b""
        async for part in response.aiter_bytes():
            raw += part
            if len(raw) > _MAX_ERROR_BODY:
                break
        status = response.status_code
        detail = redact(_error_detail(raw), self.settings.api_key)
        if status == 400 and self._send_usage_option and "stream_options" in detail:
            # Some older servers reject stream_options; ask once without it.
            self._send_usage_option = False
            raise _Transient("server does not accept stream_options", 0.0)
        if status in _TRANSIENT_STATUS:
            raise _Transient(f"HTTP {status}", _retry_after(response))
        raise _config_error(self.settings, status, detail)
