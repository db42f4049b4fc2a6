"""Benchmark 6: the research stream through our SSE client vs the ``openai`` SDK.

Issue 11 asks whether the research model's stream should go through the
``openai`` SDK (one client, its retries and ``Retry-After``) unless that costs
more than 10 % of streaming throughput or time to first token. Both read the
same long reply from the same fake model (a child process, so the server never
competes with the client for the GIL), alternately, with equivalent work per
event:

- ours: `OpenAIModelClient.stream` (SSE decoder + `chunks_of`, one
  `ModelDelta` per network read);
- sdk: ``openai.AsyncOpenAI(...).chat.completions.create(stream=True)``, taking
  each chunk's content, reasoning (``reasoning_content`` / ``reasoning``),
  finish reason and usage, one `ModelDelta` per event. The SDK gets the same
  kind of ``httpx.AsyncClient`` and a placeholder key (it refuses to send a
  request without one), as a keyless server needs.

Throughput = content characters after the first one / (last − first content
piece); time to first token = first content piece − start of the call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    STOP_SEQUENCES,
    ModelSettings,
    OpenAIModelClient,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import ModelDelta

from .harness import MODEL_ID
from .report import Row, median, ms
from .services import STREAM_CHUNK_CHARS, Services, stream_text

#: What the issue allows the SDK to cost before the SSE decoder stays.
ALLOWED_COST = 0.10


@dataclass
class Stream:
    """Timings of one stream (seconds since the call started)."""

    first: float
    last: float
    chars_after_first: int

    @property
    def throughput(self) -> float:
        """Characters per second after the first content piece."""
        return self.chars_after_first / max(self.last - self.first, 1e-9)


def _timed(started: float, pieces: list[tuple[float, str]], expected: str) -> Stream:
    text = "".join(piece for _, piece in pieces)
    if expected not in text:
        raise RuntimeError("the stream lacks the expected answer")
    first_time, first_text = pieces[0]
    return Stream(
        first_time - started, pieces[-1][0] - started, len(text) - len(first_text)
    )


def _messages(question: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": question}]


async def ours(
    http: httpx.AsyncClient, url: str, question: str, expected: str
) -> Stream:
    """The reply through `OpenAIModelClient` (what the pipe uses)."""
    settings = ModelSettings(base_url=url, model=MODEL_ID, max_attempts=1)
    client = OpenAIModelClient(settings, http)
    pieces: list[tuple[float, str]] = []
    started = time.perf_counter()
    async for chunk in client.stream(_messages(question)):
        if isinstance(chunk, ModelDelta) and chunk.content:
            pieces.append((time.perf_counter(), chunk.content))
    return _timed(started, pieces, expected)


def _sdk_delta(chunk: Any) -> tuple[ModelDelta | None, str | None]:
    """The same normalisation `chunks_of` does, for one SDK chunk."""
    if not chunk.choices:
        return None, None
    choice = chunk.choices[0]
    delta = choice.delta
    extra = delta.model_extra or {}
    thought = extra.get("reasoning_content") or extra.get("reasoning") or ""
    text = delta.content or ""
    if not isinstance(thought, str):
        thought = ""
    made = ModelDelta(thought, text) if thought or text else None
    return made, choice.finish_reason


async def sdk(sdk_client: Any, question: str, expected: str) -> Stream:
    """The reply through ``openai.AsyncOpenAI`` with equivalent handling."""
    pieces: list[tuple[float, str]] = []
    started = time.perf_counter()
    stream = await sdk_client.chat.completions.create(
        model=MODEL_ID,
        messages=_messages(question),
        stream=True,
        stream_options={"include_usage": True},
        temperature=0.6,
        top_p=0.95,
        presence_penalty=1.1,
        max_tokens=10000,
        stop=list(STOP_SEQUENCES),
    )
    usage = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        delta, _finish = _sdk_delta(chunk)
        if delta is not None and delta.content:
            pieces.append((time.perf_counter(), delta.content))
    if usage is None:
        raise RuntimeError("the SDK stream reported no usage")
    return _timed(started, pieces, expected)


async def run(quick: bool) -> list[Row]:
    """Throughput and time to first token, ours vs the SDK, alternating runs."""
    import openai

    chunks = 2_000 if quick else 20_000
    repeats = 3 if quick else 7
    question = f"bench:stream chunks={chunks}"
    expected = stream_text(chunks)
    mine: list[Stream] = []
    theirs: list[Stream] = []
    with Services() as services:
        url = services.model_url
        async with (
            httpx.AsyncClient(timeout=120) as http,
            httpx.AsyncClient(timeout=120) as sdk_http,
        ):
            # openai 3.x types http_client as httpx2's client; it accepts httpx's.
            sdk_http_client: Any = sdk_http
            sdk_client = openai.AsyncOpenAI(
                base_url=url,
                api_key="no-key",
                http_client=sdk_http_client,
                max_retries=0,
            )
            await ours(http, url, question, expected)  # warm-up both paths
            await sdk(sdk_client, question, expected)
            for _ in range(repeats):
                mine.append(await ours(http, url, question, expected))
                theirs.append(await sdk(sdk_client, question, expected))
    our_rate = median([s.throughput for s in mine])
    sdk_rate = median([s.throughput for s in theirs])
    our_first = median([s.first for s in mine])
    sdk_first = median([s.first for s in theirs])
    print(
        f"  openai {openai.__version__}; {chunks} SSE chunks of "
        f"{STREAM_CHUNK_CHARS} characters, {repeats} runs each, alternating"
    )
    print(f"  ours: {our_rate:,.0f} chars/s, first token {ms(our_first)}")
    print(f"  sdk:  {sdk_rate:,.0f} chars/s, first token {ms(sdk_first)}")
    print(
        f"  sdk/ours: throughput {sdk_rate / our_rate:.2f}×, "
        f"first token {sdk_first / our_first:.2f}×"
    )
    return [
        Row(
            "SDK stream throughput",
            f"{sdk_rate:,.0f} chars/s",
            f"{our_rate:,.0f} chars/s (SSE client)",
            sdk_rate / our_rate,
            "INFO: SDK used if ≥ 0.9×",
            None,
        ),
        Row(
            "SDK time to first token",
            ms(sdk_first),
            f"{ms(our_first)} (SSE client)",
            sdk_first / our_first,
            "INFO: SDK used if ≤ 1.1×",
            None,
        ),
    ]
