"""Benchmark 3: what one research round costs the pipe itself.

Every round the fake model thinks (a few hundred characters, streamed in
7-character chunks) and calls ``search``; an instant in-process search tool
answers in the reference format; after N rounds the model answers. Measured
two ways, side by side:

- over HTTP: the pipe's time from its "Round 1" status to the end of the run,
  minus the time a raw httpx client needs to send the same N conversations
  (same messages, same sizes) and stream the same N replies from the same
  server; divided by N. What remains is parsing, building the next request,
  events, tool dispatch and rendering, as far as it is not hidden behind
  waiting for the server;
- in process: the same replies from an instant model port through the real
  `single_run`, `Toolbox` and `ChatRenderer` (no HTTP at all), divided by
  N: the pipe's CPU cost per round, nothing hidden.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from tests.fakes.openai_server import Reply

from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.emitter import (
    EventRelay,
    SafeEmitter,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.render import (
    ChatRenderer,
    Display,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.toolbox import (
    Toolbox,
    ToolContext,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    ModelChunk,
    ModelDelta,
    ModelFinish,
    ModelUsage,
)
from tongyi_deepresearch_openwebui_pipeline.core.loop import (
    Limits,
    RunState,
)
from tongyi_deepresearch_openwebui_pipeline.core.prompts import build_system_prompt
from tongyi_deepresearch_openwebui_pipeline.core.sources import SourceLedger
from tongyi_deepresearch_openwebui_pipeline.engine.runs import single_run

from .harness import MODEL_ID, drive, make_pipe
from .report import Row, median, ms, secs
from .services import Services, rounds_reply

TARGET_SECONDS = 0.005
ANSWER = "Efficiency is 22.8 %."
TODAY = dt.date(2026, 1, 15)


def search_text(query: str) -> str:
    """Five results for `query` in the reference format."""
    hits = "\n\n".join(
        f"{i}. [Result {i} for {query}]({link})\n\n"
        f"A snippet of about thirty words on {query}, as a search engine shows."
        for i, link in enumerate(_links(query), start=1)
    )
    return f"A Google search for '{query}' found 5 results:\n\n## Web Results\n{hits}"


def _links(query: str) -> list[str]:
    return [f"https://example.org/{i}/{'-'.join(query.split())}" for i in range(5)]


class InstantSearch:
    """A search tool that answers at once, in the reference format."""

    async def search(
        self, query: list[str], __event_emitter__: Any = None, **_: Any
    ) -> str:
        """Five results per query, with the status event the real tool sends."""
        for q in query:
            if __event_emitter__ is not None:
                await __event_emitter__(
                    {
                        "type": "status",
                        "data": {
                            "action": "web_search",
                            "description": "Searched {{count}} sites",
                            "query": q,
                            "urls": _links(q),
                            "done": True,
                        },
                    }
                )
        return "\n=======\n".join(search_text(q) for q in query)


def _pieces(reply: Reply) -> list[str]:
    text = reply.full_inline()
    return [
        text[i : i + reply.chunk_size] for i in range(0, len(text), reply.chunk_size)
    ]


def _history(question: str, done: int, rounds: int) -> list[dict[str, Any]]:
    """The conversation the pipe sends before round ``done + 1``.

    Same messages, same sizes: encoding and decoding a long history is part
    of the protocol, so the raw client pays for it too.
    """
    system = build_system_prompt(["search"], TODAY)
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
    ]
    for number in range(done):
        query = f"solar cell efficiency {number}"
        response = f"<tool_response>\n{search_text(query)}\n</tool_response>"
        messages += [
            {
                "role": "assistant",
                "content": rounds_reply(number, rounds).full_inline(),
            },
            {"role": "user", "content": response},
        ]
    return messages


async def _raw_replies(model_url: str, question: str, rounds: int) -> float:
    """Stream the same N replies with a bare client; seconds for all of them."""
    histories = [_history(question, done, rounds) for done in range(rounds)]
    async with httpx.AsyncClient(timeout=120) as client:
        started = time.perf_counter()
        for done, messages in enumerate(histories):
            payload = {
                "model": MODEL_ID,
                "messages": messages,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            content = []
            async with client.stream(
                "POST", f"{model_url}/chat/completions", json=payload
            ) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    for choice in json.loads(line[5:]).get("choices") or []:
                        content.append((choice.get("delta") or {}).get("content") or "")
            if "<tool_call>" not in "".join(content) and done < rounds - 1:
                raise RuntimeError("the raw client did not get the scripted reply")
        return time.perf_counter() - started


async def _pipe_rounds(model_url: str, question: str, rounds: int) -> float:
    """Seconds from the pipe's "Round 1" status to the end of its run."""
    pipe = make_pipe(model_url, {"search": InstantSearch}, MAX_TOOL_ROUNDS=rounds + 5)
    transcript = await drive(pipe, question, chat_id="rounds")
    text = transcript.text
    if ANSWER not in text or f"- Rounds: {rounds}\n" not in text:
        raise RuntimeError(f"the pipe did not run {rounds} rounds: {text[-400:]}")
    return transcript.finished - transcript.event_time("Round 1/")


class InstantModel:
    """`ModelPort` replaying the scripted replies with no I/O."""

    def __init__(self, rounds: int) -> None:
        """Play the rounds scenario with `rounds` rounds."""
        self.rounds = rounds

    async def stream(
        self, messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> AsyncIterator[ModelChunk]:
        """The reply for this point of the conversation, in small deltas."""
        done = sum(1 for m in messages if m["role"] == "assistant")
        for piece in _pieces(rounds_reply(done, self.rounds)):
            yield ModelDelta(content=piece)
        yield ModelFinish("stop")
        yield ModelUsage(prompt_tokens=1000 + 500 * done, completion_tokens=120)


async def _in_process_rounds(rounds: int) -> float:
    """Seconds for a whole run through loop, toolbox and renderer, no HTTP."""
    events: list[dict[str, Any]] = []

    async def collect(event: dict[str, Any]) -> None:
        events.append(event)

    started = time.perf_counter()
    emit = SafeEmitter(collect)
    ledger = SourceLedger()
    renderer = ChatRenderer(Display())
    context = ToolContext(emitter=EventRelay(emit), chat_id="rounds")
    toolbox = Toolbox({"search": InstantSearch}, context)
    system = build_system_prompt(toolbox.available(), TODAY)
    state = RunState(
        messages=[
            {"role": "system", "content": system},
            {"role": "user", "content": "bench:rounds"},
        ],
        started=time.monotonic(),
    )
    shown = []
    limits = Limits(max_rounds=rounds + 5)
    async for event in single_run(state, InstantModel(rounds), toolbox, limits, ledger):
        rendered = renderer.render(event)  # what the pipe does with each event
        for payload in rendered.events:
            await emit(payload)
        shown.append(rendered.text)
    seconds = time.perf_counter() - started
    if ANSWER not in "".join(shown) or state.round != rounds:
        raise RuntimeError("the in-process run did not finish as scripted")
    return seconds


async def run(quick: bool) -> list[Row]:
    """Per-round overhead over HTTP (minus raw streaming) and in process."""
    rounds = 10 if quick else 30
    repeats = 2 if quick else 5
    question = f"bench:rounds n={rounds}"
    pipes, raws, local = [], [], []
    with Services() as services:
        url = services.model_url
        await _pipe_rounds(url, question, rounds)  # warm-up
        await _in_process_rounds(rounds)
        for _ in range(repeats):
            raws.append(await _raw_replies(url, question, rounds))
            pipes.append(await _pipe_rounds(url, question, rounds))
            local.append(await _in_process_rounds(rounds))
    pipe, raw, in_process = median(pipes), median(raws), median(local)
    http_overhead = (pipe - raw) / rounds
    per_round = in_process / rounds
    chunks = len(_pieces(rounds_reply(0, rounds)))
    print(f"  {rounds} rounds, {chunks} chunks of 7 characters per reply")
    print(f"  pipe: {secs(pipe)} for {rounds} rounds; raw streams: {secs(raw)}")
    print(f"  pipe overhead per round over HTTP: {ms(http_overhead)}")
    print(f"  in process (loop + toolbox + renderer): {ms(per_round)} per round")
    return [
        Row(
            "per-round overhead (pipe over HTTP)",
            f"{ms(http_overhead)}/round",
            f"{ms(raw / rounds)}/round (raw stream)",
            pipe / raw,
            "< 5 ms/round",
            http_overhead < TARGET_SECONDS,
        ),
        Row(
            "per-round time (in process, no I/O)",
            f"{ms(per_round)}/round",
            "—",
            None,
            "< 5 ms/round",
            per_round < TARGET_SECONDS,
        ),
    ]
