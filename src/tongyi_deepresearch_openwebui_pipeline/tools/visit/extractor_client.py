"""The extractor's client: an OpenAI-compatible endpoint through the `openai` SDK.

One request at a time with the tool's own retry policy (backoff, Retry-After,
the reference's give-up rules); thinking switched off where the server allows
it, and fields a server refuses never sent to it again; the key and URL
credentials sent in the Authorization header only and redacted from every
text that leaves. The reply is split into answer and thinking in every
server's style. Only the visit tool has an extractor.
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import asyncio
import base64
import contextlib
import email.utils
import importlib
import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import httpx

from ..shared.safe_http import _SSL_CONTEXTS, _ssl_context, _TlsContexts

if TYPE_CHECKING:
    from ..visit_tool import Tools

log = logging.getLogger(__name__)

# --- snippet ---

_BACKOFF_BASE_SECONDS = 1.0
_MAX_RETRY_AFTER_SECONDS = 60.0


class _ExtractorError(Exception):
    """The extractor endpoint cannot be used; the message is user-facing."""


# Waits between extractor retries.
Sleep = Callable[[float], Awaitable[None]]


async def _sleep(seconds: float) -> None:
    """Wait between extractor retries (a visit call's sleep by default)."""
    await asyncio.sleep(seconds)


# The extractor's credentials: the key valve and any user:password written into
# EXTRACTOR_BASE_URL. They go to that endpoint in the Authorization header only;
# every text that leaves the extractor's code is redacted against all the forms
# they could take there (as written, trimmed, JSON-escaped, URL-quoted, base64).
_REDACTED = "***"
# The reference agent's placeholder for servers that need no key.
_NO_KEY = "EMPTY"
# An error body is searched and quoted from its beginning only.
_ERROR_SCAN_CHARS = 4_000
_INVALID_EXTRACTOR_URL = (
    "the extractor URL is invalid; check the EXTRACTOR_BASE_URL valve"
)

# By default the extractor is the research model: a reasoning model that would
# otherwise think through its whole reply budget before writing the JSON. These
# fields ask the server to skip thinking (EXTRACTOR_DISABLE_THINKING):
# - chat_template_kwargs: vLLM, SGLang and llama.cpp's server hand it to the
#   chat template. Qwen3-style templates, Tongyi-DeepResearch's included, then
#   write an empty `<think>\n\n</think>` themselves, so the model answers at once
#   (it may still think a little: the reply is read after the last `</think>`).
# - reasoning_effort "none": Ollama's /v1 endpoint maps it to think=false (it
#   ignores chat_template_kwargs); recent vLLM releases accept it too.
# Servers ignore fields they do not know, but some validate them: older vLLM
# and SGLang allow only low/medium/high efforts, strict APIs refuse unknown
# fields. A 400/422 naming a field is answered by sending the request again
# without it, and that endpoint does not get the field again in this process.
_THINKING_OFF: dict[str, Any] = {
    "chat_template_kwargs": {"enable_thinking": False},
    "reasoning_effort": "none",
}
# How a refusal names each field (Ollama says "invalid reasoning value").
_FIELD_NAMED = {
    "chat_template_kwargs": re.compile(r"chat_template|enable_thinking", re.I),
    "reasoning_effort": re.compile(r"reasoning", re.I),
}
# Endpoint base URL (no credentials) -> fields it refused. Bounded: the oldest
# endpoint is forgotten first.
_REFUSED_FIELDS: dict[str, set[str]] = {}
_MAX_REMEMBERED_ENDPOINTS = 64
_TOO_LONG = re.compile(
    r"context.{0,20}(length|window|size)|too long|maximum.{0,40}tokens", re.I
)


@dataclass(frozen=True)
class _Endpoint:
    """The extractor endpoint: a base URL without credentials, and how to sign in."""

    base_url: str
    api_key: str
    headers: dict[str, str]
    secrets: tuple[str, ...]


def _api_base(base_url: str) -> str:
    """The OpenAI base URL (the SDK appends /chat/completions itself)."""
    base = base_url.strip().rstrip("/")
    return base.removesuffix("/chat/completions").rstrip("/")


def _secret_forms(values: list[str]) -> tuple[str, ...]:
    """Every spelling of each secret that could appear in a reply, longest first."""
    forms: set[str] = set()
    for value in values:
        for variant in (value, value.strip()):
            if variant.strip():
                forms.update(
                    (variant, json.dumps(variant)[1:-1], quote(variant, safe=""))
                )
    return tuple(sorted(forms, key=len, reverse=True))


def _redact(text: str, secrets: tuple[str, ...]) -> str:
    """The text with every secret form replaced (run it before any cut)."""
    for secret in secrets:
        text = text.replace(secret, _REDACTED)
    return text


def _endpoint(valves: "Tools.Valves") -> _Endpoint:
    """Split EXTRACTOR_BASE_URL into a clean URL and credentials; check its form."""
    key = valves.EXTRACTOR_API_KEY
    secrets = [key]
    try:
        parts = urlsplit(_api_base(valves.EXTRACTOR_BASE_URL))
        valid = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
    except ValueError:
        parts, valid = urlsplit(""), False
    userinfo, _, hostport = parts.netloc.rpartition("@")
    headers: dict[str, str] = {}
    if userinfo:
        user, _, password = userinfo.partition(":")
        pair = f"{unquote(user)}:{unquote(password)}"
        basic = base64.b64encode(pair.encode()).decode("ascii")
        secrets += [userinfo, password, unquote(password), pair, basic]
        if not key.strip():  # the key valve, when set, wins the one header
            headers["Authorization"] = f"Basic {basic}"
    if not valid:
        raise _ExtractorError(_INVALID_EXTRACTOR_URL)
    base = urlunsplit((parts.scheme, hostport, parts.path, parts.query, ""))
    return _Endpoint(base, key.strip() or _NO_KEY, headers, _secret_forms(secrets))


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (number or HTTP date)."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


@dataclass(frozen=True)
class _Reply:
    """One extractor reply, its thinking set apart.

    `answer` is the content after the last `</think>` (a thought may mention
    the tag; an answer quoting it is rarer, and a thought's draft must never
    pass for the answer). `thought` is the thinking, wherever the server put it.
    """

    answer: str = ""
    thought: str = ""
    cut: bool = False  # finish_reason "length": the reply budget ran out


def _text(value: Any) -> str:
    """A message field as text (content parts joined; anything else is empty)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, dict))
    return ""


def _reply_parts(completion: Any) -> _Reply:
    """Split a chat completion into answer and thinking, in every server's style.

    The thinking arrives as `reasoning_content` (vLLM/SGLang with a reasoning
    parser, llama.cpp), as `reasoning` (OpenRouter, Ollama), inline as
    `<think>…</think>` (raw servers), or opened by the chat template so that the
    content starts mid-thought and only `</think>` appears.
    """
    try:
        choice = completion.choices[0]
        message = choice.message
    except (AttributeError, IndexError, KeyError, TypeError):
        return _Reply()
    content = _text(getattr(message, "content", None))
    thought = _text(getattr(message, "reasoning_content", None)) or _text(
        getattr(message, "reasoning", None)
    )
    cut = getattr(choice, "finish_reason", None) == "length"
    head, closed, tail = content.rpartition("</think>")
    if closed:
        inline = head.partition("<think>")[2] if "<think>" in head else head
        return _Reply(tail, "\n".join(filter(None, (thought, inline))), cut)
    if content.lstrip().startswith("<think>"):  # thinking that never closed
        inline = content.lstrip().removeprefix("<think>")
        return _Reply("", "\n".join(filter(None, (thought, inline))), cut)
    return _Reply(content, thought, cut)


def _config_error(status: int, detail: str, valves: "Tools.Valves") -> _ExtractorError:
    """A clear error naming the valve to fix; no credential is ever included."""
    if status in (401, 403):
        names = "EXTRACTOR_API_KEY"
    elif status == 404:
        names = "EXTRACTOR_BASE_URL / EXTRACTOR_MODEL"
    elif status in (400, 422):
        names = "EXTRACTOR_MODEL / EXTRACTOR_MAX_TOKENS"
    else:
        names = "EXTRACTOR_BASE_URL"
    secrets = _endpoint_secrets(valves)
    detail = _redact(detail, secrets)  # the whole body, before anything is cut
    with contextlib.suppress(ValueError, AttributeError, TypeError, RecursionError):
        detail = _redact(str(json.loads(detail)["error"]["message"]), secrets)
    detail = " ".join(detail[:_ERROR_SCAN_CHARS].split())[:160]
    return _ExtractorError(
        f"the extractor endpoint answered HTTP {status} ({detail}); "
        f"check the {names} valve of the DeepResearch Visit tool"
    )


def _endpoint_secrets(valves: "Tools.Valves") -> tuple[str, ...]:
    """The secret forms of the valves, even when the URL itself is unusable."""
    try:
        return _endpoint(valves).secrets
    except _ExtractorError:
        return _secret_forms([valves.EXTRACTOR_API_KEY, valves.EXTRACTOR_BASE_URL])


def _extractor_options(
    prompt: str, valves: "Tools.Valves", not_given: Any, extra: dict[str, Any]
) -> dict:
    """Keyword arguments of one chat.completions.create call."""
    options: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "model": valves.EXTRACTOR_MODEL.strip() or not_given,
        "temperature": valves.EXTRACTOR_TEMPERATURE,
        "stream": False,
    }
    if valves.EXTRACTOR_MAX_TOKENS > 0:
        options["max_tokens"] = valves.EXTRACTOR_MAX_TOKENS
    if extra:  # sent as they are: the SDK checks no server-specific field
        options["extra_body"] = extra
    return options


def _thinking_fields(valves: "Tools.Valves", endpoint: str) -> dict[str, Any]:
    """The thinking controls for this endpoint, less those it has refused."""
    if not valves.EXTRACTOR_DISABLE_THINKING:
        return {}
    refused = _REFUSED_FIELDS.get(endpoint, set())
    return {name: v for name, v in _THINKING_OFF.items() if name not in refused}


def _refused_fields(response: httpx.Response, sent: dict[str, Any]) -> set[str]:
    """The sent thinking fields a 400/422 names (none for a too-long prompt)."""
    detail = response.text[:_ERROR_SCAN_CHARS]
    if response.status_code not in (400, 422) or _TOO_LONG.search(detail):
        return set()
    return {name for name in sent if _FIELD_NAMED[name].search(detail)}


def _remember_refused(endpoint: str, fields: set[str]) -> None:
    """Never send these fields to this endpoint again (in this process)."""
    if endpoint not in _REFUSED_FIELDS and len(_REFUSED_FIELDS) >= (
        _MAX_REMEMBERED_ENDPOINTS
    ):
        _REFUSED_FIELDS.pop(next(iter(_REFUSED_FIELDS)))
    _REFUSED_FIELDS.setdefault(endpoint, set()).update(fields)
    log.info("extractor endpoint refused %s; not sent again", sorted(fields))


def _retry_delay(
    response: httpx.Response, backoff: float, valves: "Tools.Valves"
) -> float | None:
    """Seconds to wait before retrying a failed reply; None if the prompt is too long.

    Raises `_ExtractorError` for errors that retrying cannot fix (auth, config).
    """
    status, detail = response.status_code, response.text
    if status in (400, 413, 422) and _TOO_LONG.search(detail[:_ERROR_SCAN_CHARS]):
        return None
    if status not in (408, 409, 425, 429) and status < 500:
        raise _config_error(status, detail, valves)
    waited = _retry_after(response.headers.get("retry-after"))
    return backoff if waited is None else waited


# Modules imported whole by `_import_whole`. Not `sys.modules`: while one
# thread runs a package's first import, sys.modules already holds the partly
# initialised module, and a second visit reading it there would find no
# `AsyncOpenAI` yet (two pages read at once did exactly that).
_WHOLE_MODULES: dict[str, Any] = {}
_IMPORT_LOCK = threading.Lock()


def _import_whole(name: str) -> Any:
    """Import `name` once, returning it only when its import has finished."""
    with _IMPORT_LOCK:
        module = _WHOLE_MODULES.get(name)
        if module is None:
            module = _WHOLE_MODULES[name] = importlib.import_module(name)
        return module


async def _openai_sdk(name: str = "openai") -> Any:
    """The `openai` package; the first import runs in a thread (it takes ~0.5 s)."""
    module = _WHOLE_MODULES.get(name)
    if module is not None:
        return module
    try:
        return await asyncio.to_thread(_import_whole, name)
    except ImportError as exc:
        raise _ExtractorError(
            "the extractor needs the 'openai' Python package (pip install openai)"
        ) from exc


@contextlib.asynccontextmanager
async def _extractor_client(
    openai: Any, valves: "Tools.Valves", tls: _TlsContexts = _SSL_CONTEXTS
) -> AsyncIterator[Any]:
    """An `openai.AsyncOpenAI` on our own httpx client, for one URL's extraction.

    Our client: the shared TLS context, the valve's timeouts, no environment
    proxies. The SDK's own retries are off: `_call_extractor` is the one retry
    policy (backoff, Retry-After, the reference's give-up rules).

    Args:
        openai: The `openai` package (`_openai_sdk`).
        valves: The call's settings.
        tls: The TLS contexts to connect with (the process's).

    Yields:
        The SDK's client, closed when the block ends.
    """
    endpoint = _endpoint(valves)
    timeout = httpx.Timeout(
        valves.EXTRACTOR_TIMEOUT_SECONDS,
        connect=min(10.0, valves.EXTRACTOR_TIMEOUT_SECONDS),
    )
    verify = await _ssl_context(True, tls)  # the extractor is always verified
    async with httpx.AsyncClient(
        timeout=timeout, verify=verify, trust_env=False
    ) as http:
        client = openai.AsyncOpenAI(
            api_key=endpoint.api_key,
            base_url=endpoint.base_url,
            timeout=timeout,
            max_retries=0,
            default_headers=endpoint.headers or None,
            http_client=http,
        )
        # The SDK fills these from OPENAI_ORG_ID / OPENAI_PROJECT_ID and sends
        # them as headers: the server's own environment must not reach an
        # extractor endpoint the admin configured.
        client.organization = None
        client.project = None
        yield client


async def _call_extractor(
    openai: Any,
    client: Any,
    prompt: str,
    valves: "Tools.Valves",
    *,
    sleep: Sleep = _sleep,
) -> _Reply:
    """One extractor request, retrying transient errors with backoff.

    A thinking field the server refuses is dropped and the request sent again
    at once (at most once per field).

    Args:
        openai: The `openai` package (its error classes).
        client: The SDK's client (`_extractor_client`).
        prompt: The extractor prompt.
        valves: The call's settings.
        sleep: Waits between retries (`_sleep`).

    Returns:
        The reply; empty when the endpoint says the prompt is too long, or the
        reply cannot be read, so the caller shrinks it.

    Raises:
        _ExtractorError: A configuration error, or an outage retries did not end.
    """
    endpoint = _endpoint(valves).base_url
    problem = ""
    attempt = 0
    while True:
        extra = _thinking_fields(valves, endpoint)
        options = _extractor_options(prompt, valves, openai.NOT_GIVEN, extra)
        delay = min(_BACKOFF_BASE_SECONDS * 2**attempt, 30.0)
        try:
            completion = await client.chat.completions.create(**options)
        except openai.APIStatusError as exc:
            refused = _refused_fields(exc.response, extra)
            if refused:
                _remember_refused(endpoint, refused)
                continue  # without them; each field can go only once
            waited = _retry_delay(exc.response, delay, valves)
            if waited is None:
                return _Reply()
            problem = f"the extractor endpoint answered HTTP {exc.status_code}"
            if waited > _MAX_RETRY_AFTER_SECONDS:
                break
            delay = waited
        except openai.APIConnectionError as exc:  # timeouts included
            cause = exc.__cause__
            if isinstance(cause, httpx.UnsupportedProtocol | httpx.InvalidURL):
                raise _ExtractorError(_INVALID_EXTRACTOR_URL) from exc
            problem = f"{type(cause or exc).__name__} talking to the extractor endpoint"
        except (openai.OpenAIError, ValueError, TypeError):
            log.info("extractor reply could not be read")  # e.g. a 200 that is no JSON
            return _Reply()
        else:
            return _reply_parts(completion)
        if attempt >= valves.EXTRACTOR_MAX_RETRIES:
            break
        attempt += 1
        await sleep(delay)
    raise _ExtractorError(f"{problem}; gave up after retries")
