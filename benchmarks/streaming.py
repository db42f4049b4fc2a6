"""Benchmark 2: the pipe streams as fast as a raw client reads the stream.

The fake model sends one answer (no tools) in many small SSE chunks, written
in large blocks so the client side is the bottleneck. Next to each other, on
the same server and the same reply:

- raw: an ``httpx.AsyncClient`` (created before the clock starts) POSTs the
  request, reads the lines, parses each ``data:`` JSON and takes the content;
- pipe: ``Pipe.pipe()`` with no tools, consumed like Open WebUI consumes it.

Throughput = answer characters after the first visible piece / (last visible
piece − first visible piece): the streaming phase alone, for both. Time to
first token = first visible piece − start of the call.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx

from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe

from .harness import MODEL_ID, drive, make_pipe
from .report import Row, median, ms
from .services import STREAM_CHUNK_CHARS, Services, stream_text


@dataclass
class Stream:
    """Timings of one stream (seconds since the call started)."""

    first: float
    last: float
    chars_after_first: int

    @property
    def throughput(self) -> float:
        """Characters per second after the first visible piece."""
        return self.chars_after_first / (self.last - self.first)


async def raw_stream(
    client: httpx.AsyncClient, model_url: str, question: str
) -> Stream:
    """Read the reply with nothing but httpx and json."""
    payload = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": question}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    times: list[float] = []
    parts: list[str] = []
    async with client.stream(
        "POST", f"{model_url}/chat/completions", json=payload
    ) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            for choice in json.loads(data).get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    times.append(time.perf_counter() - started)
                    parts.append(content)
    text = "".join(parts)
    if not text.startswith("<answer>"):
        raise RuntimeError("the raw client got no answer")
    return Stream(times[0], times[-1], len(text) - len(parts[0]))


async def pipe_stream(pipe: Pipe, question: str, expected: str) -> Stream:
    """The same reply through the pipe."""
    transcript = await drive(pipe, question, chat_id="stream")
    if expected not in transcript.text:
        raise RuntimeError("the pipe's output lacks the streamed answer")
    visible = [(t, text) for t, text in transcript.chunks if text.strip()]
    answer_end = transcript.text.index(expected) + len(expected)
    # The last piece that still carries answer text (the sources and the
    # research summary come after the stream).
    shown = 0
    last = visible[0][0]
    for when, text in transcript.chunks:
        if shown >= answer_end:
            break
        shown += len(text)
        last = when
    first_time, first_text = visible[0]
    return Stream(first_time, last, len(expected) - len(first_text.strip()))


async def run(quick: bool) -> list[Row]:
    """Throughput and time to first token, raw vs pipe, alternating runs."""
    chunks = 2_000 if quick else 20_000
    repeats = 2 if quick else 5
    question = f"bench:stream chunks={chunks}"
    expected = stream_text(chunks)
    raws: list[Stream] = []
    pipes: list[Stream] = []
    with Services() as services:
        url = services.model_url
        pipe = make_pipe(url, {})
        async with httpx.AsyncClient(timeout=120) as client:
            await raw_stream(client, url, question)  # warm-up (server renders once)
            await pipe_stream(pipe, question, expected)
            for _ in range(repeats):
                raws.append(await raw_stream(client, url, question))
                pipes.append(await pipe_stream(pipe, question, expected))
    raw_rate = median([s.throughput for s in raws])
    pipe_rate = median([s.throughput for s in pipes])
    raw_first = median([s.first for s in raws])
    pipe_first = median([s.first for s in pipes])
    print(f"  {chunks} SSE chunks of {STREAM_CHUNK_CHARS} characters, {repeats} runs")
    print(f"  raw:  {raw_rate:,.0f} chars/s, first token {ms(raw_first)}")
    print(f"  pipe: {pipe_rate:,.0f} chars/s, first token {ms(pipe_first)}")
    print(f"  pipe first tokens: {', '.join(ms(s.first) for s in pipes)}")
    return [
        Row(
            "streaming throughput (pipe)",
            f"{pipe_rate:,.0f} chars/s",
            f"{raw_rate:,.0f} chars/s (raw httpx)",
            pipe_rate / raw_rate,
            "≥ 0.9× raw",
            pipe_rate >= 0.9 * raw_rate,
        ),
        Row(
            "time to first token (pipe)",
            ms(pipe_first),
            f"{ms(raw_first)} (raw httpx)",
            pipe_first / raw_first,
            "≤ raw + 20 ms",
            pipe_first <= raw_first + 0.020,
        ),
    ]
