"""The model server adapter: streaming chat completions with retries.

Speaks the OpenAI chat-completions protocol to any compatible server (vLLM,
SGLang, llama.cpp, Ollama, hosted providers) directly over ``httpx``, on a
client the caller owns: that client is the test seam and what lets a cancelled
chat close its connections. (The ``openai`` SDK is not used for this stream:
``benchmarks/openai_sdk.py`` measured it at a small fraction of this client's
throughput; see AGENTS.md.)

It normalises the three ways reasoning arrives (``reasoning_content``,
``reasoning``, inline ``<think>``) into `ModelDelta(reasoning=…, content=…)` and
classifies failures:

- transient (connection errors, timeouts, 408/409/429/5xx, a stream cut short,
  a malformed stream, an empty reply) → retried with exponential backoff,
  honouring ``Retry-After``, within ``max_attempts``;
- the user's configuration (400/401/403/404/422) → not retried; a clear
  `ModelError` naming the valve to fix.

``timeout_seconds`` bounds a whole attempt by the wall clock (httpx's own
timeouts are per read, and keep-alive comments would stretch them forever).

Secrets (the API key, credentials written into ``base_url``) go only into the
request's Authorization header: requests and messages use the URL without its
``user:password@``, and every message leaves through one `Redactor`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..core.events import (
    ContextOverflowError,
    ModelChunk,
    ModelDelta,
    ModelError,
    ModelFinish,
    ModelRetry,
    ModelUsage,
)
from . import secrets

log = logging.getLogger(__name__)

#: The reference agent's stop sequences (the model must not write tool output).
STOP_SEQUENCES = ("\n<tool_response>", "<tool_response>")
_TRANSIENT_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529}
_MAX_RETRY_AFTER = 60.0
_MAX_ERROR_BODY = 4096
#: Longest server text shown in a message (after redaction).
_MAX_DETAIL = 300
#: Longest SSE line accepted. A chunk carries a few tokens; even a server that
#: sends a whole 131072-token reply in one escaped chunk stays well under it.
MAX_SSE_LINE_CHARS = 4 * 1024 * 1024


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
    def public_base_url(self) -> str:
        """``base_url`` without credentials: what requests, logs and messages use."""
        return secrets.split_userinfo(self.base_url)[0].rstrip("/")

    @property
    def completions_url(self) -> str:
        """``{base_url}/chat/completions`` (without credentials)."""
        return self.public_base_url + "/chat/completions"

    @property
    def models_url(self) -> str:
        """``{base_url}/models`` (without credentials)."""
        return self.public_base_url + "/models"

    def auth_headers(self) -> dict[str, str]:
        """Bearer for an API key, else Basic for credentials in the URL, else none.

        Keyless local servers get no Authorization header at all.
        """
        key = self.api_key.strip()
        if key:
            return {"Authorization": f"Bearer {key}"}
        _, user, password = secrets.split_userinfo(self.base_url)
        if user or password:
            return {"Authorization": f"Basic {secrets.basic_token(user, password)}"}
        return {}

    def redactor(self) -> secrets.Redactor:
        """The redaction point for everything this endpoint's client says."""
        return secrets.Redactor([self.api_key, *secrets.url_secrets(self.base_url)])


class _Transient(Exception):  # noqa: N818 - internal signal, not an API error
    """A failure worth retrying. ``detail`` is the server's own text, unredacted."""

    def __init__(
        self, reason: str, retry_after: float | None = None, detail: str = ""
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.detail = detail


class _Overflow(Exception):  # noqa: N818 - internal signal, not an API error
    """The server refused the request for its length; ``limit`` if it said."""

    def __init__(self, limit: int, detail: str) -> None:
        super().__init__(limit)
        self.limit = limit
        self.detail = detail


# How servers say a request is too long (HTTP 400/413): vLLM and OpenAI
# "maximum context length is N tokens", OpenAI's code context_length_exceeded,
# llama.cpp "exceeds the available context size" (type exceed_context_size_error),
# SGLang "longer than the model's context length (N tokens)".
_OVERFLOW = re.compile(
    r"context[_ ]length|context size|context window|maximum context|"
    r"too many tokens|prompt is too long|input is too long|exceed_context",
    re.IGNORECASE,
)
_OVERFLOW_LIMIT = re.compile(
    r"(?:maximum context length is|context length \(|\bn_ctx\W{1,3})\s*(\d{3,8})",
    re.IGNORECASE,
)


def _overflow_limit(text: str) -> int:
    """The context size a too-long-request error names (0 when it names none)."""
    match = _OVERFLOW_LIMIT.search(text[:_MAX_ERROR_BODY])
    return int(match.group(1)) if match else 0


class _Refused(Exception):  # noqa: N818 - internal signal, not an API error
    """The server refused the request for a reason the admin must fix."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(status)
        self.status = status
        self.detail = detail


def redact(text: str, secret: str) -> str:
    """Mask ``secret`` (and runs of it) in ``text``; see `secrets.Redactor`."""
    return secrets.Redactor([secret])(text)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return min(max(float(value), 0.0), _MAX_RETRY_AFTER)
    except ValueError:
        return None


def _error_detail(raw: bytes) -> str:
    """The server's message in an error body (unredacted, uncut)."""
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return text.strip()
    inner = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(inner, dict):
        inner = inner.get("message") or inner.get("detail") or ""
    return str(inner)


def _config_error_text(settings: ModelSettings, status: int) -> str:
    where = f"{settings.public_base_url} (model '{settings.model}')"
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
    return text


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
# (base URL, model) -> (monotonic expiry, tokens): a hosted provider's model
# list can be megabytes, and it rarely changes, so it is read at most every
# 10 min.
_CONTEXT_CACHE: dict[tuple[str, str], tuple[float, int]] = {}
_CONTEXT_CACHE_SECONDS = 600.0


async def served_context_tokens(
    http: httpx.AsyncClient, settings: ModelSettings
) -> int:
    """The context length the server says it serves for the model (0 = unknown).

    A deployment may serve far less than the model's 128K, and the research
    budget must fit what is actually served. Asked in turn, until one answers:

    - ``GET /models``: vLLM ``max_model_len``, OpenRouter ``context_length``;
    - llama.cpp ``GET /props``: ``default_generation_settings.n_ctx``, the
      context of one slot (``-c`` divided among ``--parallel`` slots);
    - Ollama ``GET /api/ps``: ``context_length`` of the loaded model, else
      ``POST /api/show``: a ``num_ctx`` set in its Modelfile parameters. The
      trained maximum (``model_info``) is not what Ollama serves, so it is
      never used.

    The native endpoints live at the server root (``base_url`` without
    ``/v1``). Each reply is capped and timed; any failure means "unknown",
    never an error. Known sizes are cached 10 minutes, unknown ones 1 minute
    (Ollama reports a model's context only once it is loaded).
    """
    key = (settings.base_url, settings.model)
    cached = _CONTEXT_CACHE.get(key)
    if cached and time.monotonic() < cached[0]:
        return cached[1]
    tokens = 0
    for read in (_context_from_models, _context_from_props, _context_from_ollama):
        tokens = await read(http, settings)
        if tokens > 0:
            break
    ttl = _CONTEXT_CACHE_SECONDS if tokens else _UNKNOWN_CACHE_SECONDS
    _CONTEXT_CACHE[key] = (time.monotonic() + ttl, tokens)
    return tokens


_UNKNOWN_CACHE_SECONDS = 60.0
#: Largest context-info reply read (a hosted provider's model list is ~2 MB).
_MAX_INFO_BYTES = 8 * 1024 * 1024


def _server_root(settings: ModelSettings) -> str:
    base = settings.public_base_url
    return base[: -len("/v1")] if base.endswith("/v1") else base


async def _json_from(
    http: httpx.AsyncClient,
    settings: ModelSettings,
    method: str,
    url: str,
    body: Any = None,
) -> Any:
    """A small JSON reply from the model server, or None (bounded; never raises)."""
    try:
        with secrets.guard_http_logs(settings.redactor()):
            async with asyncio.timeout(5.0):
                request = http.build_request(
                    method,
                    url,
                    json=body,
                    headers=settings.auth_headers(),
                    timeout=httpx.Timeout(5.0),
                )
                response = await http.send(request, stream=True)
                try:
                    if response.status_code != 200:
                        return None
                    raw = b""
                    async for part in response.aiter_bytes():
                        raw += part
                        if len(raw) > _MAX_INFO_BYTES:
                            return None
                finally:
                    await response.aclose()
        if len(raw) > 200_000:  # a big model list: parse off the event loop
            return await asyncio.to_thread(json.loads, raw)
        return json.loads(raw)
    except (httpx.HTTPError, ValueError, RecursionError, TimeoutError):
        return None


def _positive_int(value: Any) -> int:
    return value if isinstance(value, int) and value > 0 else 0


async def _context_from_models(http: httpx.AsyncClient, settings: ModelSettings) -> int:
    listing = await _json_from(http, settings, "GET", settings.models_url)
    entries = listing.get("data") if isinstance(listing, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("id") != settings.model:
            continue
        places = [entry, entry.get("meta") or {}, entry.get("top_provider") or {}]
        for place in places:
            for name in _CONTEXT_FIELDS:
                value = place.get(name) if isinstance(place, dict) else None
                tokens = _positive_int(value)
                if tokens:
                    return tokens
    return 0


async def _context_from_props(http: httpx.AsyncClient, settings: ModelSettings) -> int:
    props = await _json_from(http, settings, "GET", _server_root(settings) + "/props")
    if not isinstance(props, dict):
        return 0
    defaults = props.get("default_generation_settings")
    slot = defaults.get("n_ctx") if isinstance(defaults, dict) else None
    return _positive_int(slot) or _positive_int(props.get("n_ctx"))


_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d{2,9})\s*$", re.MULTILINE)


async def _context_from_ollama(http: httpx.AsyncClient, settings: ModelSettings) -> int:
    root = _server_root(settings)
    running = await _json_from(http, settings, "GET", root + "/api/ps")
    models = running.get("models") if isinstance(running, dict) else None
    for entry in models if isinstance(models, list) else []:
        if not isinstance(entry, dict):
            continue
        if settings.model in (entry.get("name"), entry.get("model")):
            loaded = _positive_int(entry.get("context_length"))
            if loaded:
                return loaded
    shown = await _json_from(
        http, settings, "POST", root + "/api/show", {"model": settings.model}
    )
    parameters = shown.get("parameters") if isinstance(shown, dict) else None
    match = _NUM_CTX.search(parameters) if isinstance(parameters, str) else None
    return int(match.group(1)) if match else 0


class SSEDecoder:
    """Incremental decoder of ``data:`` payloads (httpx-style ``feed``/``flush``).

    Network reads split lines anywhere, so ``feed`` keeps the unfinished last
    line for the next call, as a list of pieces joined once when the line
    ends: linear in the stream's size however the reads fall. A line longer
    than ``max_line_chars`` ends the stream. Lines end at CR, LF or CRLF only
    (the SSE format), never at the other breaks ``str.splitlines`` knows.
    Comment lines and lines without a ``data:`` field are skipped; a
    ``data:`` line that is not JSON means the stream is broken; ``data:
    [DONE]`` ends it.
    """

    def __init__(self, max_line_chars: int = MAX_SSE_LINE_CHARS) -> None:
        """Start empty."""
        self._pieces: list[str] = []
        self._pending = 0
        self._max_line = max_line_chars
        self.done = False

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Payloads completed by ``text``."""
        if self.done or not text:
            return []
        cut = max(text.rfind("\n"), text.rfind("\r"))
        if cut < 0:
            self._keep(text)
            return []
        complete = text[: cut + 1]
        if self._pieces:
            self._pieces.append(complete)
            complete = "".join(self._pieces)
        self._pieces, self._pending = [], 0
        self._keep(text[cut + 1 :])
        lines = _LINE_BREAK.split(complete)
        lines.pop()  # the empty text after the last line break
        return self._payloads(lines)

    def flush(self) -> list[dict[str, Any]]:
        """Payloads of a last line that had no line break."""
        rest = "".join(self._pieces)
        self._pieces, self._pending = [], 0
        return self._payloads([rest]) if rest and not self.done else []

    def _keep(self, piece: str) -> None:
        if not piece:
            return
        self._pending += len(piece)
        if self._pending > self._max_line:
            self._pieces, self._pending = [], 0
            raise _Transient("stream line too long")
        self._pieces.append(piece)

    def _payloads(self, lines: list[str]) -> list[dict[str, Any]]:
        payloads: list[dict[str, Any]] = []
        decode = _JSON.raw_decode  # json.loads adds two frames per line
        for line in lines:
            if not line.startswith("data:"):
                continue
            if len(line) > self._max_line:
                raise _Transient("stream line too long")
            data = line[5:].strip()
            if data == "[DONE]":
                self.done = True
                break
            if not data:
                continue
            try:
                payload, end = decode(data)
            except (ValueError, RecursionError):  # deep nesting: RecursionError
                raise _Transient("malformed stream data") from None
            if end != len(data):
                raise _Transient("malformed stream data")
            if type(payload) is not dict:
                continue
            if payload.get("error"):
                raise _Transient(
                    "server error in stream", detail=_stream_error(payload)
                )
            payloads.append(payload)
        return payloads


def _stream_error(payload: dict[str, Any]) -> str:
    detail = payload["error"]
    if isinstance(detail, dict):
        detail = detail.get("message", "")
    try:
        return str(detail)
    except RecursionError:  # nested just short of the parser's limit
        return ""


_LINE_BREAK = re.compile("\r\n|\r|\n")
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
        self._redact = settings.redactor()

    def _headers(self) -> dict[str, str]:
        return {
            "Accept": "text/event-stream",
            **self.settings.headers,
            **self.settings.auth_headers(),
        }

    def _payload(
        self, messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> dict[str, Any]:
        s = self.settings
        payload: dict[str, Any] = {
            **s.extra_body,
            "model": s.model,
            "messages": messages,
            "stream": True,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "presence_penalty": s.presence_penalty,
            "max_tokens": s.max_tokens if max_tokens is None else max_tokens,
            "stop": list(STOP_SEQUENCES),
        }
        if self._send_usage_option:
            payload["stream_options"] = {"include_usage": True}
        return payload

    async def stream(
        self, messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> AsyncIterator[ModelChunk]:
        """Stream one reply, retrying transient failures from the start.

        ``max_tokens`` lowers the settings' reply length for this call (the
        loop keeps prompt and reply within the served context).
        """
        attempts = max(1, self.settings.max_attempts)
        with secrets.guard_http_logs(self._redact):
            for attempt in range(1, attempts + 1):
                try:
                    async for chunk in self._attempt(messages, max_tokens):
                        yield chunk
                    return
                except _Overflow as overflow:
                    raise ContextOverflowError(
                        self._overflowed(overflow), overflow.limit
                    ) from None
                except _Refused as refused:
                    raise ModelError(self._refused(refused)) from None
                except _Transient as failure:
                    reason = self._reason(failure)
                    if attempt >= attempts:
                        raise ModelError(self._gave_up(reason, attempts)) from None
                    delay = self._backoff(attempt, failure.retry_after)
                    log.warning(
                        "model call failed (%s); retry %d/%d in %.1fs",
                        reason,
                        attempt + 1,
                        attempts,
                        delay,
                    )
                    yield ModelRetry(attempt + 1, attempts, reason, delay)
                    await self._sleep(delay)

    # -- the one way out for anything the server or the URL can put in a message --
    def _public(self, text: str, detail: str = "") -> str:
        """``text`` (ours) plus the server's ``detail``, safe to show and log."""
        if detail.strip():
            said = self._redact.server_text(detail.strip(), _MAX_DETAIL)
            text = f"{text}: {said}"
        return self._redact(text)

    def _reason(self, failure: _Transient) -> str:
        return self._public(failure.reason, failure.detail)

    def _refused(self, refused: _Refused) -> str:
        text = _config_error_text(self.settings, refused.status)
        if refused.detail.strip():
            return self._public(f"{text} Server said", refused.detail)
        return self._public(text)

    def _overflowed(self, overflow: _Overflow) -> str:
        held = f" (it holds {overflow.limit:,} tokens)" if overflow.limit else ""
        return self._public(
            f"The model server at {self.settings.public_base_url} refused the "
            f"conversation as too long for its context{held}. Serve a longer "
            "context or lower MAX_CONTEXT_TOKENS. Server said",
            overflow.detail,
        )

    def _gave_up(self, reason: str, attempts: int) -> str:
        s = self.settings
        return self._public(
            f"The model server at {s.public_base_url} did not give a usable reply "
            f"after {attempts} attempts ({reason}). Check that it is running and "
            "that API_BASE_URL is right, or try again later."
        )

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        s = self.settings
        if retry_after is not None:
            return retry_after
        jitter = random.uniform(0, s.backoff_seconds)  # noqa: S311 - not crypto
        delay = s.backoff_seconds * 2 ** (attempt - 1) + jitter
        return min(delay, s.backoff_max_seconds)

    async def _attempt(
        self, messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> AsyncIterator[ModelChunk]:
        """One request, bounded as a whole by ``timeout_seconds`` of wall clock.

        Only the waits for the server are under the deadline, never the
        consumer's handling of a yielded chunk: a deadline that fired while
        the caller held the chunk would cancel the caller, not this request.
        """
        s = self.settings
        deadline = asyncio.get_running_loop().time() + s.timeout_seconds
        request = self._http.build_request(
            "POST",
            s.completions_url,
            json=self._payload(messages, max_tokens),
            headers=self._headers(),
            timeout=httpx.Timeout(s.timeout_seconds, connect=s.connect_timeout_seconds),
        )
        received = finished = False
        decoder = SSEDecoder()
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._http.send(request, stream=True)
            try:
                if response.status_code != 200:
                    async with asyncio.timeout_at(deadline):
                        await self._raise_for_status(response)
                reads = response.aiter_text()
                while not decoder.done:
                    async with asyncio.timeout_at(deadline):
                        text = await anext(reads, None)
                    if text is None:
                        break
                    for chunk in chunks_of(decoder.feed(text)):
                        received = received or isinstance(chunk, ModelDelta)
                        finished = finished or isinstance(chunk, ModelFinish)
                        yield chunk
                for chunk in chunks_of(decoder.flush()):
                    received = received or isinstance(chunk, ModelDelta)
                    finished = finished or isinstance(chunk, ModelFinish)
                    yield chunk
            finally:
                await response.aclose()
        except (httpx.TimeoutException, TimeoutError):
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
        body = raw[:_MAX_ERROR_BODY].decode("utf-8", "replace")
        detail = _error_detail(raw[:_MAX_ERROR_BODY])
        if status in (400, 413) and _OVERFLOW.search(body):
            raise _Overflow(_overflow_limit(body), detail)
        if status == 400 and self._send_usage_option and "stream_options" in detail:
            # Some older servers reject stream_options; ask once without it.
            self._send_usage_option = False
            raise _Transient("server does not accept stream_options", 0.0)
        if status in _TRANSIENT_STATUS:
            raise _Transient(f"HTTP {status}", _retry_after(response))
        raise _Refused(status, detail)
