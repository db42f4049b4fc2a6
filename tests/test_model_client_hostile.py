"""The model client against hostile streams, slow servers and echoed secrets.

Every server here is real HTTP on 127.0.0.1 (`LocalServer`): a stream that
sends one enormous line, keep-alive comments forever, a nested line, an error
event or an error body quoting the key, and a base URL with credentials in it.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakes.http import LocalServer, Request, Response
from tongyi_deepresearch_openwebui_pipeline.adapters import secrets
from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    MAX_SSE_LINE_CHARS,
    ModelSettings,
    OpenAIModelClient,
    SSEDecoder,
    _Transient,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    ModelDelta,
    ModelError,
    ModelRetry,
)

MESSAGES = [{"role": "user", "content": "question"}]
KEY = "sk-proj-HOSTILE-7f3a9c2e5b1d8f40aa"
PASSWORD = "pw-Zq8Lm3Xv9Kt2Rj"


def chunk(content: str = "", finish: str | None = None) -> bytes:
    payload = {"choices": [{"delta": {"content": content}, "finish_reason": finish}]}
    return f"data: {json.dumps(payload)}\n\n".encode()


GOOD = [chunk("<answer>ok</answer>"), chunk(finish="stop"), b"data: [DONE]\n\n"]


class Script:
    """A chat-completions route answering each request with the next responder."""

    def __init__(self, *responders: Callable[[Request], Response]) -> None:
        self.responders = list(responders)
        self.server = LocalServer({"/v1/chat/completions": self._chat})

    def _chat(self, request: Request) -> Response:
        return self.responders.pop(0)(request)

    @property
    def base_url(self) -> str:
        return self.server.url("/v1")

    def __enter__(self) -> Script:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


def sse(parts: Iterator[bytes] | list[bytes]) -> Callable[[Request], Response]:
    return lambda _request: Response(200, {"Content-Type": "text/event-stream"}, parts)


def good(_request: Request) -> Response:
    return Response(200, {"Content-Type": "text/event-stream"}, list(GOOD))


async def collect(base_url: str, **options):
    sleeps: list[float] = []

    async def no_sleep(delay: float) -> None:
        sleeps.append(delay)

    fields = {"base_url": base_url, "model": "m", "backoff_seconds": 0.0, **options}
    async with httpx.AsyncClient() as http:
        client = OpenAIModelClient(ModelSettings(**fields), http, sleep=no_sleep)
        chunks = []
        try:
            async with asyncio.timeout(20):  # the old code would hang here
                async for piece in client.stream(MESSAGES):
                    chunks.append(piece)
        except ModelError as error:
            return chunks, error
    return chunks, None


def content(chunks) -> str:
    return "".join(c.content for c in chunks if isinstance(c, ModelDelta))


# -- SSE decoding: linear, capped, never crashing ------------------------------------


def feed_all(decoder: SSEDecoder, pieces: list[str]) -> list[dict]:
    payloads: list[dict] = []
    for piece in pieces:
        payloads += decoder.feed(piece)
    return payloads + decoder.flush()


class CountedRead(str):
    """A network read that counts the characters copied by concatenating it."""

    copied = 0

    def __add__(self, other: str) -> str:
        CountedRead.copied += len(self) + len(other)
        return str.__add__(self, other)

    def __radd__(self, other: str) -> str:
        CountedRead.copied += len(other) + len(self)
        return str.__add__(other, self)


def test_a_long_line_in_tiny_reads_is_copied_a_bounded_number_of_times():
    """1 MB in 32-character reads: re-joining on every read copies ~16 GB."""
    text = "x" * 1_000_000
    line = f"data: {json.dumps({'c': text})}\n\n"
    decoder = SSEDecoder()
    CountedRead.copied = 0
    payloads: list[dict] = []
    for start in range(0, len(line), 32):
        payloads += decoder.feed(CountedRead(line[start : start + 32]))
    assert payloads == [{"c": text}]
    assert CountedRead.copied <= 2 * len(line)


def test_line_longer_than_the_cap_is_a_clear_transient_error():
    decoder = SSEDecoder(max_line_chars=1000)
    decoder.feed("data: " + "x" * 600)
    with pytest.raises(_Transient, match="stream line too long"):
        decoder.feed("x" * 600)


def test_cap_holds_for_a_long_line_inside_one_read():
    decoder = SSEDecoder(max_line_chars=1000)
    with pytest.raises(_Transient, match="stream line too long"):
        decoder.feed('data: {"a": "' + "x" * 2000 + '"}\n\n')


@pytest.mark.parametrize(
    "line",
    [
        "data: " + "[" * 100_000 + "]" * 100_000,
        'data: {"a": ' * 50_000 + "1" + "}" * 50_000,
        'data: {"error": ' + "[" * 990 + "]" * 990 + "}",
    ],
    ids=["nested-lists", "nested-objects", "error-nested-near-limit"],
)
def test_deeply_nested_line_is_a_malformed_stream_not_a_crash(line):
    with pytest.raises(_Transient):
        SSEDecoder().feed(line + "\n\n")


def test_only_cr_lf_and_crlf_end_a_line():
    """U+2028 and friends are text inside JSON strings, not line breaks."""
    text = "a\u2028b\u2029c\x85d\x0be\x1cf"
    raw = f"data: {json.dumps({'c': text}, ensure_ascii=False)}\n\n"
    assert SSEDecoder().feed(raw) == [{"c": text}]


SAMPLE = (
    ": keep-alive\r\n\r\n"
    'data: {"c": "first \u2028 é"}\r\n\r\n'
    'event: ping\rdata: {"c": "second"}\r\r'
    'data: {"c": "third"}\n\n'
    "data: [DONE]\n\n"
    'data: {"c": "after"}\n\n'
)


@settings(max_examples=300, deadline=None)
@given(cuts=st.lists(st.integers(0, len(SAMPLE)), max_size=12))
def test_any_split_gives_the_same_payloads(cuts):
    bounds = sorted({0, len(SAMPLE), *cuts})
    pieces = [SAMPLE[a:b] for a, b in itertools.pairwise(bounds)]
    assert feed_all(SSEDecoder(), pieces) == [
        {"c": "first \u2028 é"},
        {"c": "second"},
        {"c": "third"},
    ]


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 9), text=st.text(max_size=40))
def test_a_last_line_without_break_is_flushed_at_any_split(size, text):
    raw = f"data: {json.dumps({'t': text})}"
    pieces = [raw[i : i + size] for i in range(0, len(raw), size)]
    assert feed_all(SSEDecoder(), pieces) == [{"t": text}]


async def test_hostile_line_through_the_client_is_retried_then_reported():
    huge = b"data: " + b"x" * (MAX_SSE_LINE_CHARS + 10)
    nested = b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n"
    with Script(sse([huge]), sse([nested])) as script:
        chunks, error = await collect(script.base_url, max_attempts=2)
    reasons = [c.reason for c in chunks if isinstance(c, ModelRetry)]
    assert reasons == ["stream line too long"]
    assert error is not None and "malformed stream data" in error.message


# -- wall-clock request timeout ----------------------------------------------------


def keep_alive_forever(server: LocalServer) -> Callable[[Request], Response]:
    def parts() -> Iterator[bytes]:
        yield chunk("")  # the role chunk, then only comments
        while not server.stopping.wait(0.05):
            yield b": keep-alive\n\n"

    return lambda _request: Response(
        200, {"Content-Type": "text/event-stream"}, parts()
    )


async def test_keep_alive_comments_do_not_stretch_the_request_timeout():
    with Script() as script:
        script.responders = [keep_alive_forever(script.server), good]
        started = time.monotonic()
        chunks, error = await collect(
            script.base_url, timeout_seconds=0.5, max_attempts=2
        )
        elapsed = time.monotonic() - started
    retries = [c for c in chunks if isinstance(c, ModelRetry)]
    assert [r.reason for r in retries] == ["timed out"]
    assert error is None and content(chunks) == "<answer>ok</answer>"
    assert elapsed < 15  # bounded; the old per-read timeout never fired


async def test_trickling_tokens_do_not_stretch_it_either():
    def trickle(server: LocalServer) -> Callable[[Request], Response]:
        def parts() -> Iterator[bytes]:
            while not server.stopping.wait(0.05):
                yield chunk("a")

        return lambda _r: Response(200, {"Content-Type": "text/event-stream"}, parts())

    with Script() as script:
        script.responders = [trickle(script.server)]
        _, error = await collect(script.base_url, timeout_seconds=0.5, max_attempts=1)
    assert error is not None and "timed out" in error.message


# -- redaction on every path -------------------------------------------------------


def error_event(message: str) -> Callable[[Request], Response]:
    body = json.dumps({"error": {"message": message}})
    return sse([f"data: {body}\n\n".encode()])


def error_body(status: int, text: str) -> Callable[[Request], Response]:
    return lambda _r: Response(status, {"Content-Type": "text/plain"}, text.encode())


@pytest.mark.parametrize(
    "responder",
    [
        error_event(f"Invalid key {KEY} for this project"),
        error_event(f"Invalid key {KEY[:12]}… (truncated)"),
        error_event(f"key suffix ...{KEY[-10:]}"),
        error_body(500, "x" * (4096 - 15) + KEY),  # cut inside the key
        error_body(502, json.dumps({"error": {"message": "k=" + KEY * 3}})),
    ],
    ids=["event-full", "event-prefix", "event-suffix", "body-cut", "body-json"],
)
async def test_key_never_reaches_retry_reasons_errors_or_logs(responder, caplog):
    caplog.set_level(logging.DEBUG)
    with Script(responder, responder) as script:
        chunks, error = await collect(script.base_url, api_key=KEY, max_attempts=2)
    reasons = " ".join(c.reason for c in chunks if isinstance(c, ModelRetry))
    assert error is not None
    for text in (reasons, error.message, caplog.text):
        assert not leaks(text, KEY)


@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_config_errors_cut_before_redaction_never_show_a_key_prefix(status):
    body = json.dumps({"error": {"message": "y" * 290 + " " + KEY}})
    with Script(error_body(status, body)) as script:
        _, error = await collect(script.base_url, api_key=KEY)
    assert error is not None and not leaks(error.message, KEY)
    assert "Server said" in error.message


async def test_a_short_key_withholds_the_server_message():
    short = "Ab3$x"
    with Script(error_body(401, f"bad key {short[:4]}")) as script:
        _, error = await collect(script.base_url, api_key=short)
    assert error is not None and short[:4] not in error.message
    assert "API_KEY" in error.message and secrets.WITHHELD in error.message


async def test_a_key_with_surrounding_whitespace_is_sent_trimmed_and_masked():
    with Script(error_event(f"no {KEY}"), good) as script:
        chunks, error = await collect(script.base_url, api_key=f" {KEY}\n")
        sent = script.server.requests[0].headers["authorization"]
    assert sent == f"Bearer {KEY}" and error is None
    reasons = [c.reason for c in chunks if isinstance(c, ModelRetry)]
    assert reasons and not leaks(reasons[0], KEY)


def leaks(text: str, secret: str) -> bool:
    """Whether ``text`` holds any run of 8 characters of ``secret``."""
    return any(secret[i : i + 8] in text for i in range(len(secret) - 7))


@settings(max_examples=200, deadline=None)
@given(
    secret=st.text(min_size=8, max_size=60).filter(lambda s: s.strip() == s),
    before=st.text(max_size=30),
    after=st.text(max_size=30),
    start=st.integers(0, 59),
    length=st.integers(8, 60),
)
def test_any_run_of_a_long_secret_is_masked(secret, before, after, start, length):
    piece = secret[start : start + length]
    if len(piece) < 8:
        return
    text = secrets.Redactor([secret])(before + piece + after)
    assert not leaks(text, secret)


@settings(max_examples=200, deadline=None)
@given(
    secret=st.text(min_size=8, max_size=40).filter(lambda s: s.strip() == s),
    noise=st.text(max_size=400),
    limit=st.integers(10, 300),
)
def test_server_text_cut_anywhere_never_holds_a_run(secret, noise, limit):
    text = secrets.Redactor([secret]).server_text(noise + secret + noise, limit)
    assert not leaks(text, secret) and len(text) <= max(limit, len(secrets.WITHHELD))


# -- credentials written into the URL ----------------------------------------------


def with_credentials(url: str, user: str = "alice", password: str = PASSWORD) -> str:
    return url.replace("http://", f"http://{user}:{password}@")


async def test_url_credentials_become_basic_auth_and_never_show(caplog):
    caplog.set_level(logging.DEBUG)
    with Script(error_body(503, "busy"), error_body(404, "no such model")) as script:
        url = with_credentials(script.base_url)
        chunks, error = await collect(url, max_attempts=2)
        request = script.server.requests[0]
    token = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert request.headers["authorization"] == f"Basic {token}"
    assert error is not None and script.base_url in error.message
    shown = " ".join(
        [
            error.message,
            caplog.text,
            *[c.reason for c in chunks if hasattr(c, "reason")],
        ]
    )
    assert PASSWORD not in shown and "alice:" not in shown
    assert "HTTP Request: POST " + script.base_url in caplog.text


async def test_api_key_wins_over_url_credentials():
    with Script(good) as script:
        await collect(with_credentials(script.base_url), api_key=KEY)
        assert script.server.requests[0].headers["authorization"] == f"Bearer {KEY}"


async def test_echoed_basic_token_is_masked():
    token = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    with Script(error_body(401, f"bad credentials: Basic {token}")) as script:
        _, error = await collect(with_credentials(script.base_url))
    assert error is not None and token not in error.message
    assert PASSWORD not in error.message


def test_userinfo_is_split_from_any_url_spelling():
    cases = {
        "http://u:p%40ss@h:8/v1": ("http://h:8/v1", "u", "p@ss"),
        "https://TOKEN@[::1]/v1": ("https://[::1]/v1", "TOKEN", ""),
        "http://a:b@c@host/v1?x=y@z": ("http://host/v1?x=y@z", "a", "b@c"),
        "http://host/v1/@notuser": ("http://host/v1/@notuser", "", ""),
        "http://[::1": ("http://[::1", "", ""),
    }
    for url, expected in cases.items():
        assert secrets.split_userinfo(url) == expected
