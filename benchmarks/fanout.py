"""Benchmark 1: one tool call with 5 queries / 5 URLs runs them at once.

Search: a fake SearXNG that takes L per query. One call with 5 queries should
take about L (target ≤ 1.3·L); the reference agent searched one query after
another, so the baseline measured next to it is 5 one-query calls in a row.

Visit: pages that take L to serve plus a fake extractor. One call with 5 URLs
should take about as long as a call with one URL (target ≤ 1.3×).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from tongyi_deepresearch_openwebui_pipeline.tools import search_tool, visit_tool

from .harness import with_valves
from .report import Row, median, secs
from .services import Services

FANOUT = 5


async def _timed(call: Callable[[], Awaitable[str]]) -> tuple[float, str]:
    started = time.perf_counter()
    text = await call()
    return time.perf_counter() - started, text


def _check_search(text: str, queries: list[str]) -> None:
    for query in queries:
        if f"A Google search for '{query}' found 3 results" not in text:
            raise RuntimeError(f"search output lacks the results of {query!r}")


def _check_visit(text: str, names: list[str]) -> None:
    for name in names:
        if f"Facts on {name}" not in text:
            raise RuntimeError(f"visit output lacks the page {name!r}: {text[:300]}")


async def search_fanout(services: Services, latency: float, repeats: int) -> Row:
    """5 queries in one call vs 5 one-query calls in a row."""
    tools = with_valves(search_tool.Tools, SEARXNG_URL=services.search_url)

    async def search(queries: list[str]) -> str:
        return await tools().search(query=queries)

    await search(["warm up"])
    fanned, sequential = [], []
    for repeat in range(repeats):
        queries = [f"fan {repeat} query {i}" for i in range(FANOUT)]
        seconds, text = await _timed(lambda q=queries: search(q))
        _check_search(text, queries)
        fanned.append(seconds)
        started = time.perf_counter()
        for query in queries:
            _check_search(await search([query]), [query])
        sequential.append(time.perf_counter() - started)
    wall, baseline = median(fanned), median(sequential)
    print(f"  search L = {secs(latency)} per query (server-side sleep)")
    print(f"  one call, {FANOUT} queries: {secs(wall)} (runs: {_list(fanned)})")
    print(f"  {FANOUT} one-query calls in a row: {secs(baseline)}")
    print(f"  fan-out wall / L = {wall / latency:.2f}")
    return Row(
        f"search: {FANOUT} queries in 1 call",
        secs(wall),
        f"{secs(baseline)} ({FANOUT} calls in a row)",
        wall / baseline,
        f"≤ 1.3·L = {secs(1.3 * latency)}",
        wall <= 1.3 * latency,
    )


async def visit_fanout(services: Services, repeats: int) -> Row:
    """5 URLs in one call vs one URL in one call."""
    tools = with_valves(
        visit_tool.Tools,
        ALLOW_PRIVATE_URLS=True,
        PAGE_LOADER="builtin",
        EXTRACTOR_BASE_URL=services.model_url,
        EXTRACTOR_MODEL="extractor",
    )

    async def visit(names: list[str]) -> str:
        urls = [f"{services.pages_url}/page/{name}" for name in names]
        return await tools().visit(url=urls, goal="the figure")

    await visit(["warmup"])
    fanned, single = [], []
    for repeat in range(repeats):
        one = [f"one{repeat}"]
        seconds, text = await _timed(lambda n=one: visit(n))
        _check_visit(text, one)
        single.append(seconds)
        names = [f"fan{repeat}x{i}" for i in range(FANOUT)]
        seconds, text = await _timed(lambda n=names: visit(n))
        _check_visit(text, names)
        fanned.append(seconds)
    wall, baseline = median(fanned), median(single)
    print(f"  visit, one call with 1 URL: {secs(baseline)} (runs: {_list(single)})")
    print(f"  visit, one call with {FANOUT} URLs: {secs(wall)} (runs: {_list(fanned)})")
    return Row(
        f"visit: {FANOUT} URLs in 1 call",
        secs(wall),
        f"{secs(baseline)} (1 URL)",
        wall / baseline,
        "≤ 1.3× 1 URL",
        wall <= 1.3 * baseline,
    )


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values)


async def run(quick: bool) -> list[Row]:
    """Both fan-out benchmarks against one set of fake services."""
    latency = 0.1 if quick else 0.3
    repeats = 2 if quick else 3
    config: dict[str, Any] = {
        "search_latency": latency,
        "page_latency": latency,
        "extract_latency": latency / 3,
    }
    with Services(**config) as services:
        return [
            await search_fanout(services, latency, repeats),
            await visit_fanout(services, repeats),
        ]
