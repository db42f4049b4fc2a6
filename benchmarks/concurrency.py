"""Benchmark 4: many chats at once through ONE pipe.

Each chat is a real research run with the real search and visit tools: the
fake model (which takes a little time per chunk, like a real one) searches
for the chat's own token, reads a page about it (the page takes L to serve,
the extractor L to answer) and answers with the token. All chats start
together on one `Pipe`, as Open WebUI runs them.

Measured next to each other: one chat alone, then N chats at once (target:
total wall ≤ 1.5× one chat). Checks: every chat's answer, yielded text and
emitted events carry its own token and no other (no cross-talk). Memory: the
RSS high-water mark during the timed run, and tracemalloc's peak in a
separate, untimed run (tracing slows everything down).
"""

from __future__ import annotations

import asyncio
import json
import re
import resource
import time
import tracemalloc

from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe
from tongyi_deepresearch_openwebui_pipeline.tools import search_tool, visit_tool

from .harness import Transcript, drive, make_pipe, with_valves
from .report import Row, secs
from .services import Services

_TOKEN = re.compile(r"tok\d{3}q")


def _token(number: int) -> str:
    return f"tok{number:03d}q"


def _crosstalk(token: str, transcript: Transcript) -> list[str]:
    """What is wrong with one chat's transcript (empty when it is clean)."""
    problems = []
    text = transcript.text
    if f"The answer for {token} is ready." not in text:
        stopped = re.search(r"The research stopped:\*\* (.*)", text)
        why = stopped.group(1) if stopped else text[-200:]
        problems.append(f"{token}: its answer is missing ({why})")
    if "CROSSTALK" in text:
        problems.append(f"{token}: the model saw another chat's tool result")
    if set(_TOKEN.findall(text)) != {token}:
        problems.append(f"{token}: text mentions {set(_TOKEN.findall(text))}")
    events = json.dumps([event for _, event in transcript.events])
    if set(_TOKEN.findall(events)) != {token}:
        problems.append(f"{token}: events mention {set(_TOKEN.findall(events))}")
    if "Facts on" not in text:
        problems.append(f"{token}: the page was not read")
    return problems


async def _chats(pipe: Pipe, numbers: range) -> tuple[float, list[str]]:
    """Run the chats at once; (wall seconds, problems found)."""
    started = time.perf_counter()
    transcripts = await asyncio.gather(
        *(drive(pipe, f"bench:chat token={_token(n)}", f"chat-{n}") for n in numbers)
    )
    wall = time.perf_counter() - started
    problems = [
        problem
        for n, transcript in zip(numbers, transcripts, strict=True)
        for problem in _crosstalk(_token(n), transcript)
    ]
    return wall, problems


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _traced_peak_mb() -> float:
    return tracemalloc.get_traced_memory()[1] / 1e6


async def run(quick: bool) -> list[Row]:
    """One chat, then N at once; cross-talk checks; memory."""
    chats = 10 if quick else 50
    latency = 0.1 if quick else 0.3
    config = {
        "search_latency": latency,
        "page_latency": latency,
        "extract_latency": latency,
        "chunk_delay": 0.002 if quick else 0.01,
    }
    with Services(**config) as services:
        search = with_valves(search_tool.Tools, SEARXNG_URL=services.search_url)
        visit = with_valves(
            visit_tool.Tools, ALLOW_PRIVATE_URLS=True, PAGE_LOADER="builtin"
        )
        pipe = make_pipe(services.model_url, {"search": search, "visit": visit})
        await _chats(pipe, range(900, 901))  # warm-up
        one, problems = await _chats(pipe, range(0, 1))
        rss_before = _rss_mb()
        wall, more = await _chats(pipe, range(1, chats + 1))
        rss_growth = _rss_mb() - rss_before
        problems += more
        tracemalloc.start()
        try:
            await _chats(pipe, range(901, 902))
            one_peak = _traced_peak_mb()
            tracemalloc.reset_peak()
            _, more = await _chats(pipe, range(100, 100 + chats))
            all_peak = _traced_peak_mb()
        finally:
            tracemalloc.stop()
        problems += more
    print(
        f"  each chat: search, visit, answer; search, page and extractor take "
        f"{latency} s each, the model {config['chunk_delay']} s per 4-character chunk"
    )
    print(f"  one chat: {secs(one)}; {chats} chats at once: {secs(wall)}")
    print(
        f"  memory: tracemalloc peak {one_peak:.1f} MB (1 chat), {all_peak:.1f} MB "
        f"({chats} chats); RSS high-water mark +{rss_growth:.1f} MB"
    )
    for problem in problems[:10]:
        print(f"  PROBLEM: {problem}")
    return [
        Row(
            f"{chats} chats at once, one Pipe",
            secs(wall),
            f"{secs(one)} (1 chat)",
            wall / one,
            "≤ 1.5× 1 chat",
            wall <= 1.5 * one,
        ),
        Row(
            "cross-talk between chats",
            f"{len(problems)} problems",
            "—",
            None,
            "0 (answers, text, events)",
            not problems,
            timing=False,
        ),
        Row(
            f"peak memory, {chats} chats",
            f"{all_peak:.1f} MB traced",
            f"{one_peak:.1f} MB (1 chat)",
            all_peak / one_peak,
            f"reported (RSS +{rss_growth:.0f} MB)",
            None,
        ),
    ]
