"""The model server adapter: streaming chat completions with retries.

Speaks the OpenAI chat-completions protocol to any compatible server (vLLM,
SGLang, llama.cpp, Ollama, hosted providers) directly over ``httpx``, on a
client the caller owns: that client is the test seam and what lets a cancelled
chat close its connections. (The ``openai`` SDK is not used for this stream:
``benchmarks/openai_sdk.py`` measured it at a small fraction of this client's
throughput; see docs/protocol.md.)

It normalises the three ways reasoning arrives (``reasoning_content``,
``reasoning``, inline ``<think>``) into `ModelDelta(reasoning=…, content=…)` and
classifies failures:

- transient (connection errors, timeouts, 408/409/429/5xx, a stream cut short,
  a malformed stream, an empty reply) → retried with exponential backoff,
  honouring ``Retry-After``, within ``max_attempts``;
- the user's configuration (400/401/403/404/422) → not retried; a clear
  `ModelError` naming the valve to fix.

An error event inside a 200 stream is read the same way: after the reply's
finish it ends nothing (OpenRouter reports a ``max_tokens`` cut so, after
``finish_reason: "length"``); before it, a 4xx code the HTTP path would not
retry is a refusal, anything else transient (see `SSEDecoder`).

Replies are read raw and never inflated: the request asks for an
uncompressed reply, and a compressed one (one 64 KiB read of gzip inflates
to 64 MB before any cap could apply) is refused unread. An event stream is
UTF-8 whatever charset it declares, as the SSE format defines it.

``timeout_seconds`` bounds a whole attempt by the wall clock (httpx's own
timeouts are per read, and keep-alive comments would stretch them forever).

Secrets (the API key, credentials written into ``base_url``) go only into the
request's Authorization header: requests and messages use the URL without its
``user:password@``, and every message leaves through one `Redactor`.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import logging
import math
import random
import re
import ssl
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
)
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

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
from ..core.parallelmuse import Sampling, ScoredChunk, TokenLogprob, TokenLogprobs
from . import secrets

log = logging.getLogger(__name__)

#: The reference agent's stop sequences (the model must not write tool output).
STOP_SEQUENCES = ("\n<tool_response>", "<tool_response>")


_JSON_CONTENT = {"Content-Type": "application/json"}


def json_body(value: Any) -> bytes:
    """``value`` as a UTF-8 JSON request body, whatever its strings hold.

    A server may stream a lone surrogate (JSON's escape of half a pair), and
    it comes back in the next request's history: UTF-8 cannot encode it, so
    httpx's own ``json=`` raised and the run ended. Each lone surrogate is
    sent as U+FFFD; everything else is what httpx 0.28 sends.
    """
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Through UTF-16, a lone surrogate cannot pair: it decodes as U+FFFD.
        repaired = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return repaired.encode("utf-8")


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
    #: None leaves the penalty out of the request (the server's default).
    presence_penalty: float | None = 1.1
    max_tokens: int = 10000
    timeout_seconds: float = 600.0
    connect_timeout_seconds: float = 30.0
    max_attempts: int = 5
    backoff_seconds: float = 1.0
    backoff_max_seconds: float = 30.0
    request_usage: bool = True
    #: The stop sequences every request carries (none when empty).
    stop: tuple[str, ...] = STOP_SEQUENCES
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
# SGLang "longer than the model's context length (N tokens)", SGLang's router
# "maximum context length of N tokens".
_OVERFLOW = re.compile(
    r"context[_ ]length|context size|context window|maximum context|"
    r"too many tokens|prompt is too long|input is too long|exceed_context",
    re.IGNORECASE,
)
# Both run on at most _MAX_ERROR_BODY characters, in linear time.
_OVERFLOW_LIMIT = re.compile(
    r"(?:maximum context length (?:is|of)|context length \(|\bn_ctx\W{1,3})"
    r"\s*(\d{3,8})(?!\d)",
    re.IGNORECASE,
)


def _overflow_limit(text: str) -> int:
    """The context size a too-long-request error names (0 when it names none).

    A number that is no plausible context (see `_plausible_context`) names
    none: the loop would cap the conversation at it.
    """
    match = _OVERFLOW_LIMIT.search(text[:_MAX_ERROR_BODY])
    limit = int(match.group(1)) if match else 0
    return limit if _plausible_context(limit) else 0


class _Refused(Exception):  # noqa: N818 - internal signal, not an API error
    """The server refused the request for a reason the admin must fix.

    ``in_stream``: said by an error event inside a 200 stream, ``status``
    being the event's code.
    """

    def __init__(self, status: int, detail: str, in_stream: bool = False) -> None:
        super().__init__(status)
        self.status = status
        self.detail = detail
        self.in_stream = in_stream


def _overflow(status: int, body: str, detail: str) -> _Overflow | None:
    """The refusal of a too-long request, if ``body`` (server text) says so."""
    if status in (400, 413) and _OVERFLOW.search(body[:_MAX_ERROR_BODY]):
        return _Overflow(_overflow_limit(body), detail)
    return None


class _Encoded(Exception):  # noqa: N818 - internal signal, not an API error
    """A 200 reply compressed although asked for an uncompressed one."""

    def __init__(self, encoding: str) -> None:
        super().__init__(encoding)
        self.encoding = encoding


def _content_encoding(response: httpx.Response) -> str:
    """The reply's ``Content-Encoding`` as sent, "" when it is none or identity."""
    codings = response.headers.get_list("content-encoding", split_commas=True)
    if all(coding.strip().lower() in ("", "identity") for coding in codings):
        return ""
    return response.headers.get("content-encoding", "")


async def _utf8_texts(response: httpx.Response) -> AsyncIterator[str]:
    """The reply's network reads as text: raw bytes, decoded as UTF-8.

    Read raw, the reply is never inflated by the HTTP library whatever its
    headers say (`_content_encoding` refuses a compressed one before). The
    SSE format has one encoding, UTF-8, so a declared charset is no codec to
    run: ``charset=zlib`` would inflate, ``hex`` crash, ``latin-1`` garble.
    Pieces are as httpx's ``aiter_text`` gives them for a UTF-8 reply.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    async for raw in response.aiter_raw():
        text = decoder.decode(raw)
        if text:
            yield text
    rest = decoder.decode(b"", final=True)
    if rest:
        yield rest


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


def _config_error_text(
    settings: ModelSettings, status: int, in_stream: bool = False
) -> str:
    where = f"{settings.public_base_url} (model '{settings.model}')"
    said = f"error {status} in its stream" if in_stream else f"HTTP {status}"
    if status in (401, 403):
        text = (
            f"The model server at {where} refused the request ({said}). "
            "Check the API_KEY valve (leave it empty for a local server that "
            "needs no key)."
        )
    elif status == 404:
        text = (
            f"The model server at {where} answered {said}: the model id or the "
            "URL is wrong. Check the MODEL_ID and API_BASE_URL valves (the URL "
            "usually ends in /v1)."
        )
    else:
        text = (
            f"The model server at {where} rejected the request ({said}). "
            "Check the MODEL_ID, MAX_TOKENS and sampling valves."
        )
    return text


def _finite(value: Any) -> float | None:
    """``value`` as a finite float; None for a boolean, NaN, 1e400 or 10**400.

    Python counts a boolean as an int, and JSON may hold ``NaN``,
    ``Infinity`` and integers too long for a float.
    """
    if not isinstance(value, int | float) or type(value) is bool:
        return None
    try:
        number = float(value)
    except OverflowError:  # an int of hundreds of digits
        return None
    return number if math.isfinite(number) else None


def _count(value: Any) -> int:
    """A token count (0 when none): no one call counts more than any context."""
    number = _finite(value)
    if number is None or not 0 <= number <= _MAX_CONTEXT_TOKENS:
        return 0
    return int(number)


def _usage(usage: Mapping[str, Any]) -> ModelUsage:
    return ModelUsage(
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        cost=_finite(usage.get("cost")),
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
# The served contexts believed. Under 256 tokens not even the system prompt
# fits, so no deployment of this agent serves less; over 16 Mi tokens is past
# any model served today (the longest hold 10M). Anything else a server says
# (a boolean, which Python counts as an int, a fraction, "32k", NaN, 10**30)
# is no context: the probe reports "unknown" and the valves' budget holds.
_MIN_CONTEXT_TOKENS = 256
_MAX_CONTEXT_TOKENS = 16 * 1024 * 1024
_CONTEXT_RANGE = (
    f"a whole number of tokens from {_MIN_CONTEXT_TOKENS:,} to {_MAX_CONTEXT_TOKENS:,}"
)
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
    ``/v1``). Each reply is timed, asked for unencoded, capped (8 MiB for the
    model list, 1 MiB for the others) and decoded a bounded piece at a time
    (`_JsonPieces`); a context is believed only as a JSON integer (a decimal
    number in Ollama's parameters text) within the plausible range. Any
    failure means "unknown", never an error; an odd reply or value is logged.
    Known sizes are cached 10 minutes, unknown ones 1 minute (Ollama reports a
    model's context only once it is loaded).
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
#: Largest model list read: a hosted provider's is ~2 MB.
_MAX_MODEL_LIST_BYTES = 8 * 1024 * 1024
#: Largest reply of a native endpoint read: llama.cpp's /props and Ollama's
#: /api/ps are a few kB, /api/show (its tensor list included) under 200 kB.
_MAX_NATIVE_REPLY_BYTES = 1024 * 1024
#: Longest piece of a reply (a member, or an element of a top-level array)
#: decoded in one step. Real pieces are under 40 kB (a model list entry, a
#: licence, a chat template); decoding this much, however dense, takes about
#: 10 ms at worst.
_PIECE_CHARS = 64 * 1024
#: Most pieces read from a reply: each costs a few microseconds of Python, and
#: real replies hold a few thousand at most (a model list's entries, the
#: tensors /api/show lists), where 8 MB of "0," would hold four million.
_MAX_PIECES = 50_000
#: Pieces read between two turns given to the event loop.
_PIECES_PER_TURN = 1000
#: Longest Modelfile parameters text read: Ollama writes a line per setting,
#: a few hundred characters in all.
_MAX_PARAMETERS_CHARS = 16 * 1024
#: Longest server value quoted in a log line.
_SHOWN_CHARS = 40


def _server_root(settings: ModelSettings) -> str:
    base = settings.public_base_url
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _unknown(settings: ModelSettings, why: str, level: int = logging.INFO) -> None:
    """Log why the served context counts as unknown (the valves' budget holds)."""
    log.log(
        level, "%s; the served context counts as unknown.", settings.redactor()(why)
    )


def _shown(value: Any) -> str:
    """A value a server sent, as JSON cut short for a log line."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        value = value[: _SHOWN_CHARS + 1]
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


def _plausible_context(value: Any) -> bool:
    """Whether ``value`` is a context a server can serve (an int, not a bool)."""
    return type(value) is int and _MIN_CONTEXT_TOKENS <= value <= _MAX_CONTEXT_TOKENS


def _context_value(value: Any, settings: ModelSettings, where: str, name: str) -> int:
    """``value`` as a served context; 0 when absent or implausible (logged)."""
    if value is None:
        return 0
    if _plausible_context(value):
        return value
    _ignored(settings, where, name, _shown(value))
    return 0


def _ignored(settings: ModelSettings, where: str, name: str, shown: str) -> None:
    said = settings.redactor().server_text(shown, _SHOWN_CHARS + 1)
    why = (
        f"The model server at {where} reported {name} = {said}, which is no "
        f"context size ({_CONTEXT_RANGE})"
    )
    _unknown(settings, why, logging.WARNING)


async def _probe(
    http: httpx.AsyncClient,
    settings: ModelSettings,
    method: str,
    url: str,
    *,
    cap: int,
    body: Any = None,
) -> str | None:
    """A probe's reply as text, or None (timed, capped; never raises)."""
    try:
        with secrets.guard_http_logs(settings.redactor()):
            async with asyncio.timeout(5.0):
                request = http.build_request(
                    method,
                    url,
                    content=None if body is None else json_body(body),
                    # A compressed reply inflates a thousandfold or more within
                    # one read, before any cap could be checked.
                    headers={
                        **settings.auth_headers(),
                        "Accept-Encoding": "identity",
                        **({} if body is None else _JSON_CONTENT),
                    },
                    timeout=httpx.Timeout(5.0),
                )
                response = await http.send(request, stream=True)
                try:
                    if response.status_code != 200:
                        return None
                    return await _reply_text(response, settings, url, cap)
                finally:
                    await response.aclose()
    except (httpx.HTTPError, TimeoutError):
        return None
    except ValueError:  # UnicodeDecodeError
        _unknown(settings, f"The model server's reply to {url} is not UTF-8 text")
        return None


async def _reply_text(
    response: httpx.Response, settings: ModelSettings, url: str, cap: int
) -> str | None:
    """The reply's text, read raw up to ``cap`` bytes (None past it, or encoded).

    Each network read is decoded as it arrives, so no step works on more than
    one read.
    """
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        said = settings.redactor().server_text(encoding, _SHOWN_CHARS)
        why = f"The model server at {url} sent a reply encoded as {said!r}"
        _unknown(settings, f"{why} though asked for a plain one")
        return None
    decoder = codecs.getincrementaldecoder("utf-8-sig")()  # as json.loads(bytes)
    texts: list[str] = []
    size = 0
    async for part in response.aiter_raw():
        size += len(part)
        if size > cap:
            _unknown(
                settings, f"The model server's reply to {url} is over {cap:,} bytes"
            )
            return None
        texts.append(decoder.decode(part))
    texts.append(decoder.decode(b"", final=True))
    return "".join(texts)


class _Unreadable(Exception):  # noqa: N818 - internal signal, not an API error
    """A reply that is not a JSON object, or that the reader's caps refuse."""


class _Piece(NamedTuple):
    """A member of a JSON object, or one element of a member that is an array."""

    key: str
    value: Any
    element: bool = False


_JSON_SPACE = re.compile(r"[ \t\n\r]*")
# Characters that may continue a number: a number that a window cuts short
# ("12" of "1234", "1.5" of "1.5e3") is read again from a fresh window.
_NUMBER_TAIL = frozenset("0123456789.eE+-")


class _JsonPieces:
    """A JSON object read one piece at a time, no piece longer than a window.

    ``json.loads`` of a whole reply holds the event loop (and, in a worker
    thread, the GIL) for as long as the reply is dense: 8 MB of ``[],`` take
    seconds. Here each piece (a key, a member's value, or each element of a
    member that is an array) is decoded by the standard library's decoder
    from a window of at most ``window`` characters copied from the text. A
    piece the window cuts is read again from a window that starts with it, so
    every character is copied about twice at most (`copied` counts them) and
    no step decodes more than one window; `windows` counts the windows read
    and `read` the pieces, for the caller to give the event loop a turn
    between them. A piece longer than a window, more than ``max_pieces``
    pieces, or malformed JSON raise `_Unreadable`.
    """

    def __init__(
        self, text: str, window: int = _PIECE_CHARS, max_pieces: int = _MAX_PIECES
    ) -> None:
        """Read ``text`` in windows of ``window`` characters."""
        self._text = text
        self._size = max(1, window)
        self._max_pieces = max_pieces
        self._window = ""
        self._start = 0  # where the window begins in the text
        self._at = 0  # the reading position in the window
        self.windows = 0
        self.copied = 0
        self.read = 0
        self._load(0)

    def members(self) -> Iterator[_Piece]:
        """The object's members in order; an array gives one piece per element."""
        self._expect("{")
        if not self._take("}"):
            while True:
                key = self._value()
                if not isinstance(key, str):
                    raise _Unreadable
                self._expect(":")
                if self._take("["):
                    for element in self._elements():
                        yield _Piece(key, element, element=True)
                else:
                    yield _Piece(key, self._value())
                if not self._take(","):
                    self._expect("}")
                    break
        if self._peek():
            raise _Unreadable  # text after the object

    def _elements(self) -> Iterator[Any]:
        if self._take("]"):
            return
        while True:
            yield self._value()
            if not self._take(","):
                self._expect("]")
                return

    def _load(self, start: int) -> None:
        self._window = self._text[start : start + self._size]
        self._start, self._at = start, 0
        self.windows += 1
        self.copied += len(self._window)

    def _cut(self) -> bool:
        """Whether the text goes on past the window."""
        return self._start + len(self._window) < len(self._text)

    def _peek(self) -> str:
        """The next character that is not white space ("" at the end)."""
        while True:
            match = _JSON_SPACE.match(self._window, self._at)
            self._at = match.end() if match else self._at
            if self._at < len(self._window) or not self._cut():
                return self._window[self._at : self._at + 1]
            self._load(self._start + self._at)

    def _take(self, char: str) -> bool:
        """Step over ``char`` if it comes next."""
        if self._peek() != char:
            return False
        self._at += 1
        return True

    def _expect(self, char: str) -> None:
        if not self._take(char):
            raise _Unreadable

    def _value(self) -> Any:
        """The next value, decoded from a window that holds all of it."""
        self.read += 1
        if self.read > self._max_pieces:
            raise _Unreadable
        self._peek()
        while True:
            try:
                value, end = _JSON.raw_decode(self._window, self._at)
            except (ValueError, RecursionError):  # deep nesting: RecursionError
                value, end = None, -1
            if end >= 0 and not self._may_go_on(end):
                self._at = end
                return value
            if self._at == 0 or not self._cut():
                raise _Unreadable  # malformed, or longer than a window
            self._load(self._start + self._at)

    def _may_go_on(self, end: int) -> bool:
        """Whether a value decoded up to ``end`` may be a number cut short."""
        if not self._cut():
            return False
        return end == len(self._window) or self._window[end] in _NUMBER_TAIL


async def _read_pieces(
    pieces: _JsonPieces, keep: Callable[[_Piece], bool]
) -> list[_Piece]:
    """The pieces ``keep`` accepts.

    The event loop gets a turn after every window and every
    `_PIECES_PER_TURN` pieces: no step between two turns decodes more than a
    few windows or runs more than that many pieces.
    """
    kept: list[_Piece] = []
    windows, read = pieces.windows, pieces.read
    for piece in pieces.members():
        if keep(piece):
            kept.append(piece)
        if pieces.windows != windows or pieces.read - read >= _PIECES_PER_TURN:
            await asyncio.sleep(0)
            windows, read = pieces.windows, pieces.read
    return kept


async def _pieces(
    http: httpx.AsyncClient,
    settings: ModelSettings,
    url: str,
    keep: Callable[[_Piece], bool],
    *,
    cap: int = _MAX_NATIVE_REPLY_BYTES,
    post: Any = None,
) -> list[_Piece]:
    """The pieces of a probe's JSON reply that ``keep`` accepts ([] if none)."""
    method = "GET" if post is None else "POST"
    text = await _probe(http, settings, method, url, cap=cap, body=post)
    if text is None:
        return []
    try:
        return await _read_pieces(_JsonPieces(text), keep)
    except _Unreadable:
        why = (
            f"The model server's reply to {url} is not JSON the probe reads "
            f"(malformed, over {_MAX_PIECES:,} pieces, or a piece over "
            f"{_PIECE_CHARS:,} characters)"
        )
        _unknown(settings, why)
        return []


def _entry_named(
    key: str, names: tuple[str, ...], model: str
) -> Callable[[_Piece], bool]:
    """Whether a piece is an element of array ``key`` whose ``names`` hold ``model``."""

    def named(piece: _Piece) -> bool:
        entry = piece.value
        if not (piece.element and piece.key == key and isinstance(entry, dict)):
            return False
        return any(entry.get(name) == model for name in names)

    return named


def _members_named(*keys: str) -> Callable[[_Piece], bool]:
    """Whether a piece is the (non-array) member of one of ``keys``."""
    return lambda piece: piece.key in keys and not piece.element


async def _context_from_models(http: httpx.AsyncClient, settings: ModelSettings) -> int:
    url = settings.models_url
    ours = _entry_named("data", ("id",), settings.model)
    for piece in await _pieces(http, settings, url, ours, cap=_MAX_MODEL_LIST_BYTES):
        entry = piece.value
        places = {
            "": entry,
            "meta.": entry.get("meta"),
            "top_provider.": entry.get("top_provider"),
        }
        for prefix, place in places.items():
            if not isinstance(place, dict):
                continue
            for name in _CONTEXT_FIELDS:
                tokens = _context_value(place.get(name), settings, url, prefix + name)
                if tokens:
                    return tokens
    return 0


async def _context_from_props(http: httpx.AsyncClient, settings: ModelSettings) -> int:
    url = _server_root(settings) + "/props"
    wanted = _members_named("default_generation_settings", "n_ctx")
    props = {
        piece.key: piece.value for piece in await _pieces(http, settings, url, wanted)
    }
    defaults = props.get("default_generation_settings")
    slot = defaults.get("n_ctx") if isinstance(defaults, dict) else None
    name = "default_generation_settings.n_ctx"
    return _context_value(slot, settings, url, name) or _context_value(
        props.get("n_ctx"), settings, url, "n_ctx"
    )


async def _context_from_ollama(http: httpx.AsyncClient, settings: ModelSettings) -> int:
    return await _ollama_loaded_context(http, settings) or await _ollama_set_context(
        http, settings
    )


async def _ollama_loaded_context(
    http: httpx.AsyncClient, settings: ModelSettings
) -> int:
    """``context_length`` of the model as loaded (Ollama ``GET /api/ps``)."""
    url = _server_root(settings) + "/api/ps"
    loaded = _entry_named("models", ("name", "model"), settings.model)
    for piece in await _pieces(http, settings, url, loaded):
        length = piece.value.get("context_length")
        tokens = _context_value(length, settings, url, "context_length")
        if tokens:
            return tokens
    return 0


async def _ollama_set_context(http: httpx.AsyncClient, settings: ModelSettings) -> int:
    """``num_ctx`` of the model's Modelfile parameters (Ollama ``POST /api/show``)."""
    url = _server_root(settings) + "/api/show"
    asked = {"model": settings.model}
    wanted = _members_named("parameters")
    shown = await _pieces(http, settings, url, wanted, post=asked)
    parameters = shown[-1].value if shown else None
    return _num_ctx(parameters, settings, url) if isinstance(parameters, str) else 0


def _num_ctx(parameters: str, settings: ModelSettings, url: str) -> int:
    """The ``num_ctx`` of a Modelfile's parameters text (0: unset or implausible).

    Ollama writes a ``name value`` line per setting, so the text is read with
    one split into lines and one into words per line: linear, where a
    multi-line regex whose leading white space may span lines rescans, from
    every line start, all the blank lines after it. A text over
    `_MAX_PARAMETERS_CHARS` is no Modelfile's and is not read.
    """
    if len(parameters) > _MAX_PARAMETERS_CHARS:
        why = (
            f"The model server at {url} sent Modelfile parameters of "
            f"{len(parameters):,} characters, more than the "
            f"{_MAX_PARAMETERS_CHARS:,} read"
        )
        _unknown(settings, why)
        return 0
    for line in parameters.split("\n"):
        words = line.split(None, 1)
        if not words or words[0] != "num_ctx":
            continue
        value = words[1].strip() if len(words) > 1 else ""
        # ASCII digits only: int() would also read other scripts' digits.
        if value.isascii() and value.isdigit() and len(value) <= 9:
            tokens = int(value)
            if _plausible_context(tokens):
                return tokens
        cut = value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "…"
        _ignored(settings, url, "num_ctx", cut)
        return 0
    return 0


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

    An event with an ``error`` is read by when it comes:

    - once the reply has finished (a ``finish_reason`` other than "error" in
      this event or an earlier one) it ends nothing: the event is kept (its
      finish, its usage) and the server's text is left in `late_error`.
      OpenRouter reports a ``max_tokens`` cut so, after "length";
    - before, an ``error.code`` that is a 4xx the HTTP path does not retry
      (400-499 but 408, 409, 425, 429) refuses the request: `_Overflow` when
      it says the request is too long, else `_Refused`;
    - anything else (5xx, a text code, none) is a transient failure.
    """

    def __init__(self, max_line_chars: int = MAX_SSE_LINE_CHARS) -> None:
        """Start empty."""
        self._pieces: list[str] = []
        self._pending = 0
        self._max_line = max_line_chars
        self.done = False
        self.finished = False
        self.late_error = ""

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
            if not self.finished:
                # Kept inline: this runs once per streamed token until the finish.
                choices = payload.get("choices")
                if type(choices) is list and choices and type(choices[0]) is dict:
                    reason = choices[0].get("finish_reason")
                    self.finished = bool(reason) and reason != "error"
            if payload.get("error"):
                self._error_event(payload)
            payloads.append(payload)
        return payloads

    def _error_event(self, payload: dict[str, Any]) -> None:
        """Keep an error event after the finish; raise one before it."""
        detail = _stream_error(payload)
        if self.finished:
            self.late_error = detail
            return
        code = _refusal_code(payload["error"])
        if code:
            raise _overflow(code, detail, detail) or _Refused(code, detail, True)
        raise _Transient("server error in stream", detail=detail)


def _refusal_code(error: Any) -> int:
    """The 4xx code of an error event that the HTTP path would not retry (or 0)."""
    code = error.get("code") if isinstance(error, dict) else None
    if type(code) is not int or not 400 <= code <= 499:
        return 0
    return 0 if code in _TRANSIENT_STATUS else code


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


def _token_logprob(entry: Any, top: int) -> TokenLogprob | None:
    """One ``logprobs.content`` entry: token, log-probability, top alternatives.

    An entry without a text token or a number is skipped; at most ``top``
    alternatives are kept, whatever the server sent.
    """
    if type(entry) is not dict:
        return None
    token, logprob = entry.get("token"), _finite(entry.get("logprob"))
    if type(token) is not str or logprob is None:
        return None
    alternatives = entry.get("top_logprobs")
    values: list[float] = []
    if type(alternatives) is list:
        for alternative in alternatives[:top]:
            value = (
                _finite(alternative.get("logprob"))
                if type(alternative) is dict
                else None
            )
            if value is not None:
                values.append(value)
    return TokenLogprob(token, logprob, tuple(values))


def logprobs_of(payloads: list[dict[str, Any]], top: int) -> TokenLogprobs | None:
    """The token log-probabilities the payloads of one read carry, if any.

    vLLM, SGLang and llama.cpp stream them as OpenAI does:
    ``choices[0].logprobs.content``, a list of ``{token, logprob,
    top_logprobs: [{token, logprob}, …]}`` (reasoning tokens included).
    """
    tokens: list[TokenLogprob] = []
    for payload in payloads:
        choices = payload.get("choices")
        if type(choices) is not list or not choices or type(choices[0]) is not dict:
            continue
        logprobs = choices[0].get("logprobs")
        content = logprobs.get("content") if type(logprobs) is dict else None
        if type(content) is not list:
            continue
        for entry in content:
            token = _token_logprob(entry, top)
            if token is not None:
                tokens.append(token)
    return TokenLogprobs(tuple(tokens)) if tokens else None


class OpenAIModelClient:
    """`ModelPort` for OpenAI-compatible servers.

    It is also a `parallelmuse.TunableModelPort`: `tuned` gives the same
    endpoint with other sampling, and `stream_scored` asks for token
    log-probabilities (a server that refuses the fields is asked again
    without them, and not asked again).
    """

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
        self._send_logprobs = True
        self._redact = settings.redactor()

    def tuned(self, sampling: Sampling) -> OpenAIModelClient:
        """A client of the same endpoint that samples with ``sampling``.

        Its requests carry ``sampling``'s temperature, top_p, presence
        penalty and stop sequences (none when it has none).
        """
        settings = replace(
            self.settings,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            presence_penalty=sampling.presence_penalty,
            stop=sampling.stop,
        )
        client = OpenAIModelClient(settings, self._http, self._sleep)
        client._send_usage_option = self._send_usage_option
        return client

    def _headers(self) -> dict[str, str]:
        # An uncompressed reply, whatever the admin's headers ask: a compressed
        # one is refused unread (`_content_encoding`).
        extra = {
            name: value
            for name, value in self.settings.headers.items()
            if name.strip().lower() != "accept-encoding"
        }
        return {
            "Accept": "text/event-stream",
            **extra,
            **self.settings.auth_headers(),
            "Accept-Encoding": "identity",
        }

    def _payload(
        self,
        messages: list[dict[str, Any]],
        max_tokens: int | None = None,
        top_logprobs: int = 0,
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
        }
        if s.presence_penalty is None:
            del payload["presence_penalty"]
        if s.stop:
            payload["stop"] = list(s.stop)
        if top_logprobs and self._send_logprobs:
            payload["logprobs"] = True
            payload["top_logprobs"] = top_logprobs
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
        async with contextlib.aclosing(self._stream(messages, max_tokens, 0)) as chunks:
            async for chunk in chunks:
                if not isinstance(chunk, TokenLogprobs):
                    yield chunk

    async def stream_scored(
        self,
        messages: list[dict[str, Any]],
        max_tokens: int | None = None,
        *,
        top_logprobs: int,
    ) -> AsyncIterator[ScoredChunk]:
        """Stream one reply asking for ``top_logprobs`` alternatives per token.

        Besides `stream`'s chunks it yields `TokenLogprobs` for every read
        that carries them (none from a server that does not return them).
        """
        scored = self._stream(messages, max_tokens, max(top_logprobs, 0))
        async with contextlib.aclosing(scored) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _stream(
        self, messages: list[dict[str, Any]], max_tokens: int | None, top_logprobs: int
    ) -> AsyncGenerator[ScoredChunk, None]:
        attempts = max(1, self.settings.max_attempts)
        with secrets.guard_http_logs(self._redact):
            for attempt in range(1, attempts + 1):
                try:
                    reply = self._attempt(messages, max_tokens, top_logprobs)
                    async with contextlib.aclosing(reply) as chunks:
                        async for chunk in chunks:
                            yield chunk
                    return
                except _Overflow as overflow:
                    raise ContextOverflowError(
                        self._overflowed(overflow), overflow.limit
                    ) from None
                except _Refused as refused:
                    raise ModelError(self._refused(refused)) from None
                except _Encoded as encoded:
                    raise ModelError(self._encoded(encoded.encoding)) from None
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
        text = _config_error_text(self.settings, refused.status, refused.in_stream)
        if refused.detail.strip():
            return self._public(f"{text} Server said", refused.detail)
        return self._public(text)

    def _compressed(self, encoding: str) -> str:
        """``encoding`` (server text) as shown: redacted, cut, quoted."""
        return repr(self._redact.server_text(encoding, _SHOWN_CHARS))

    def _encoded(self, encoding: str) -> str:
        return self._public(
            f"The model server at {self.settings.public_base_url} sent its reply "
            f"compressed ({self._compressed(encoding)}) although the request "
            "asked for an uncompressed one; a compressed reply is not read, as "
            "one read of it can inflate a thousandfold. Turn off compression "
            "for this endpoint in the proxy in front of the server, or point "
            "API_BASE_URL at the server itself."
        )

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
        self,
        messages: list[dict[str, Any]],
        max_tokens: int | None = None,
        top_logprobs: int = 0,
    ) -> AsyncGenerator[ScoredChunk, None]:
        """One request, bounded as a whole by ``timeout_seconds`` of wall clock.

        Only the waits for the server are under the deadline, never the
        consumer's handling of a yielded chunk: a deadline that fired while
        the caller held the chunk would cancel the caller, not this request.
        """
        s = self.settings
        deadline = asyncio.get_running_loop().time() + s.timeout_seconds
        payload = self._payload(messages, max_tokens, top_logprobs)
        request = self._http.build_request(
            "POST",
            s.completions_url,
            content=json_body(payload),
            headers={**self._headers(), **_JSON_CONTENT},
            timeout=httpx.Timeout(s.timeout_seconds, connect=s.connect_timeout_seconds),
        )
        received = finished = False
        # One call's usage: the last a stream reports. OpenAI sends it once;
        # vLLM's continuous usage stats (and Cloudflare's Workers AI) send the
        # running total in every chunk, which counted a call a hundred times.
        usage: ModelUsage | None = None
        decoder = SSEDecoder()
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._http.send(request, stream=True)
            try:
                async with asyncio.timeout_at(deadline):
                    await self._check_reply(response, "logprobs" in payload)
                reads = _utf8_texts(response)
                while not decoder.done:
                    async with asyncio.timeout_at(deadline):
                        text = await anext(reads, None)
                    if text is None:
                        break
                    for chunk in _read(decoder.feed(text), top_logprobs):
                        if isinstance(chunk, ModelUsage):
                            usage = chunk
                            continue
                        received = received or isinstance(chunk, ModelDelta)
                        finished = finished or isinstance(chunk, ModelFinish)
                        yield chunk
                for chunk in _read(decoder.flush(), top_logprobs):
                    if isinstance(chunk, ModelUsage):
                        usage = chunk
                        continue
                    received = received or isinstance(chunk, ModelDelta)
                    finished = finished or isinstance(chunk, ModelFinish)
                    yield chunk
                self._note_late_error(decoder.late_error)
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
        if usage is not None:
            yield usage

    async def _check_reply(
        self, response: httpx.Response, asked_logprobs: bool = False
    ) -> None:
        """Raise unless the reply is an uncompressed 200 stream to read."""
        encoding = _content_encoding(response)
        if response.status_code != 200:
            await self._raise_for_status(response, encoding, asked_logprobs)
        if encoding:
            raise _Encoded(encoding)

    def _note_late_error(self, detail: str) -> None:
        """Log an error event that came after the reply's finish (if any)."""
        if detail:
            log.info(
                self._public(
                    "The model server reported an error after its reply had "
                    "finished; the reply is kept",
                    detail,
                )
            )

    def _note_unread_body(self, status: int, encoding: str) -> None:
        """Log why an error reply has no server text: it came compressed."""
        log.warning(
            self._public(
                f"The model server at {self.settings.public_base_url} answered "
                f"HTTP {status} with a body compressed "
                f"({self._compressed(encoding)}) although the request asked "
                "for an uncompressed one; the body is not read."
            )
        )

    async def _raise_for_status(
        self, response: httpx.Response, encoding: str, asked_logprobs: bool = False
    ) -> None:
        """Raise what a non-200 reply means; a compressed body is not read."""
        status = response.status_code
        if encoding:
            self._note_unread_body(status, encoding)
        raw = b"" if encoding else await _error_body(response)
        body = raw.decode("utf-8", "replace")
        detail = _error_detail(raw)
        overflow = _overflow(status, body, detail)
        if overflow:
            raise overflow
        if status == 400 and self._send_usage_option and "stream_options" in detail:
            # Some older servers reject stream_options; ask once without it.
            self._send_usage_option = False
            raise _Transient("server does not accept stream_options", 0.0)
        if status in (400, 422) and asked_logprobs and "logprobs" in detail:
            # A server (or a model) without log-probabilities: ask without.
            self._send_logprobs = False
            raise _Transient("server does not accept logprobs", 0.0)
        if status in _TRANSIENT_STATUS:
            raise _Transient(f"HTTP {status}", _retry_after(response))
        raise _Refused(status, detail)


def _read(payloads: list[dict[str, Any]], top_logprobs: int) -> list[ScoredChunk]:
    """The chunks of one read; its log-probabilities first, when asked for."""
    chunks: list[ScoredChunk] = list(chunks_of(payloads))
    if top_logprobs:
        logprobs = logprobs_of(payloads, top_logprobs)
        if logprobs is not None:
            chunks.insert(0, logprobs)
    return chunks


async def _error_body(response: httpx.Response) -> bytes:
    """The first `_MAX_ERROR_BODY` bytes of an error reply, read raw."""
    raw = bytearray()
    async for part in response.aiter_raw():
        raw += part[: _MAX_ERROR_BODY - len(raw)]
        if len(raw) >= _MAX_ERROR_BODY:
            break
    return bytes(raw)
