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
import random
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


def _delta_parts(delta: Mapping[str, Any]) -> tuple[str, str]:
    """(reasoning, content) from one streamed delta, whatever the server style."""
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    content = delta.get("content") or ""
    return (
        reasoning if isinstance(reasoning, str) else "",
        content if isinstance(content, str) else "",
    )


def _usage(usage: Mapping[str, Any]) -> ModelUsage:
    cost = usage.get("cost")
    return ModelUsage(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        cost=float(cost) if isinstance(cost, int | float) else None,
    )


async def _sse_payloads(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """JSON payloads of an SSE stream, up to ``data: [DONE]``.

    Comment lines and lines without a ``data:`` field are skipped, as the SSE
    format says; a ``data:`` line that is not JSON means the stream is broken.
    """
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        if not data:
            continue
        try:
            payload = json.loads(data)
        except ValueError:
            raise _Transient("malformed stream data") from None
        if isinstance(payload, dict):
            if payload.get("error"):
                detail = payload["error"]
                if isinstance(detail, dict):
                    detail = detail.get("message", "")
                raise _Transient(f"server error in stream: {str(detail)[:200]}")
            yield payload


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
                async for payload in _sse_payloads(response):
                    usage = payload.get("usage")
                    if isinstance(usage, dict):
                        yield _usage(usage)
                    for choice in (payload.get("choices") or [])[:1]:
                        reasoning, content = _delta_parts(choice.get("delta") or {})
                        if reasoning or content:
                            received = True
                            yield ModelDelta(reasoning, content)
                        if choice.get("finish_reason"):
                            finished = True
                            yield ModelFinish(choice["finish_reason"])
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
