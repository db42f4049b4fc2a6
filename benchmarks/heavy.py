"""Benchmark 10: a heavy run (3 rollouts and a synthesis) next to one rollout.

The same chat as the concurrency benchmark's (the fake model searches, reads
a page, answers; search, page and extractor take L each, the model writes at
a steady pace), run once as a single research run and once on the heavy
model, side by side. The rollouts run at once and the model server batches
them, so the heavy run should take about one rollout plus its synthesis
(target ≤ 1.3× one rollout). The page the three rollouts read is fetched
once (counted by the page server). The per-round overhead of the pipe is
benchmark 3's figure, measured on the same loop.
"""

from __future__ import annotations

import time

import httpx

from tongyi_deepresearch_openwebui_pipeline.tools import search_tool, visit_tool

from .harness import Transcript, drive, make_pipe, with_valves
from .report import Row, median, secs
from .services import Services

ROLLOUTS = 3


def _check(transcript: Transcript, token: str, heavy: bool) -> None:
    text = transcript.text
    if f"The answer for {token} is ready." not in text:
        raise RuntimeError(f"no answer for {token}: {text[-300:]}")
    if heavy and text.count("<summary>Rollout ") != ROLLOUTS:
        raise RuntimeError(f"the heavy run did not show {ROLLOUTS} rollouts")


async def _page_hits(pages_url: str, token: str) -> int:
    async with httpx.AsyncClient() as client:
        counts = (await client.get(f"{pages_url}/hits")).json()
    return int(counts.get(f"/page/{token}", 0))


async def run(quick: bool) -> list[Row]:
    """One rollout, then a heavy run, alternating; page fetches counted."""
    repeats = 2 if quick else 5
    latency = 0.1 if quick else 0.3
    config = {
        "search_latency": latency,
        "page_latency": latency,
        "extract_latency": latency,
        "chunk_delay": 0.002 if quick else 0.01,
    }
    singles, heavies, fetches = [], [], []
    with Services(**config) as services:
        search = with_valves(search_tool.Tools, SEARXNG_URL=services.search_url)
        visit = with_valves(
            visit_tool.Tools, ALLOW_PRIVATE_URLS=True, PAGE_LOADER="builtin"
        )
        pipe = make_pipe(
            services.model_url,
            {"search": search, "visit": visit},
            HEAVY_ROLLOUTS=ROLLOUTS,
        )
        await drive(pipe, "bench:chat token=tok990q", "warm-up")
        for repeat in range(repeats):
            for heavy in (False, True):
                token = f"tok{repeat * 2 + heavy:03d}q"
                model = "tongyi-deepresearch-heavy" if heavy else "tongyi-deepresearch"
                started = time.perf_counter()
                transcript = await drive(
                    pipe, f"bench:chat token={token}", f"chat-{token}", model
                )
                (heavies if heavy else singles).append(time.perf_counter() - started)
                _check(transcript, token, heavy)
                if heavy:
                    fetches.append(await _page_hits(services.pages_url, token))
    one, many = median(singles), median(heavies)
    print(
        f"  each rollout: search, visit, answer (L = {latency} s); "
        f"one rollout {secs(one)}, heavy run of {ROLLOUTS} {secs(many)}; "
        f"page fetches per heavy run: {fetches}"
    )
    return [
        Row(
            f"heavy run, {ROLLOUTS} rollouts + synthesis",
            secs(many),
            f"{secs(one)} (1 rollout)",
            many / one,
            "≤ 1.3× 1 rollout",
            many <= 1.3 * one,
        ),
        Row(
            f"page fetches when {ROLLOUTS} rollouts read it",
            f"{max(fetches)}",
            "—",
            None,
            "1",
            set(fetches) == {1},
            timing=False,
        ),
    ]
