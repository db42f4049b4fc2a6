"""Benchmark 6: the worst event-loop stall while the visit tool reads hostile pages.

Each hostile input of tests/fakes/hostile.py is visited alone (pages that cost
CPython's HTMLParser seconds to hours, each at the size that costs seconds and,
in the full run, at the 10 MB download cap; one gzip member followed by 37 MB
of junk; a charset that is not a text encoding; a resolver that never
answers), while the `LagMonitor` of benchmark 5 records how late a 10 ms
ticker wakes up. The figure is the worst stall over all inputs (target
< 50 ms), next to the same ticker on an idle loop.

The pages are served by a child process (``python -m benchmarks.hostile``), so
serving them takes no time from the measured interpreter.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
import time
from typing import Any

from tests.fakes.hostile import HOSTILE_UNITS, gzip_then_junk, hostile_page, scaled
from tests.fakes.http import LocalServer, Response

from tongyi_deepresearch_openwebui_pipeline.tools import visit_tool

from .harness import with_valves
from .loop_lag import TARGET_SECONDS, LagMonitor, _idle_lag
from .report import Row, ms, secs

CAP = 10_000_000
JUNK_BYTES = 37_000_000
PAGE_TIMEOUT = 3.0


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def _routes() -> dict[str, Any]:
    html = {"Content-Type": "text/html; charset=utf-8"}
    article = b"<html><body><h1>Fine</h1><p>" + b"An ordinary page. " * 200 + b"</p>"
    routes: dict[str, Any] = {"/fine": lambda r: Response(200, html, article)}
    for name in HOSTILE_UNITS:
        page, big = hostile_page(name), scaled(name, CAP)
        routes[f"/small/{_slug(name)}"] = lambda r, p=page: Response(200, html, p)
        routes[f"/big/{_slug(name)}"] = lambda r, p=big: Response(200, html, p)
    routes["/gzip-then-junk"] = lambda r: Response(
        200,
        {**html, "Content-Encoding": "gzip"},
        iter(gzip_then_junk(article, JUNK_BYTES)),
    )
    routes["/rot13"] = lambda r: Response(
        200, {"Content-Type": "text/html; charset=rot13"}, article
    )
    routes["/gzip-members"] = lambda r: Response(
        200,
        {**html, "Content-Encoding": "gzip"},
        b"".join(gzip.compress(article) for _ in range(100)),
    )
    return routes


def serve() -> None:
    """Serve the hostile site until stdin closes (run in a child process)."""
    with LocalServer(_routes()) as server:
        print(json.dumps({"url": server.base_url}), flush=True)
        sys.stdin.read()


async def _never_resolves(host: str) -> list[str]:
    await asyncio.sleep(3600)
    return []


async def _stall(tools: type, url: str) -> tuple[float, float]:
    """(max loop lag, wall time) of one visit."""
    async with LagMonitor() as monitor:
        started = time.perf_counter()
        await tools().visit(url=[url], goal="g")
        wall = time.perf_counter() - started
    return monitor.max_lag, wall


def _start_site() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.hostile"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def run(quick: bool) -> list[Row]:
    """The worst loop stall over every hostile input, vs an idle loop."""
    child = _start_site()
    try:
        assert child.stdout is not None
        site = json.loads(child.stdout.readline())["url"]
        return await _measure(site, quick)
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(timeout=30)


async def _measure(site: str, quick: bool) -> list[Row]:
    tools = with_valves(
        visit_tool.Tools,
        ALLOW_PRIVATE_URLS=True,
        PAGE_LOADER="builtin",
        PAGE_TIMEOUT_SECONDS=PAGE_TIMEOUT,
        MAX_DOWNLOAD_BYTES=CAP,
    )
    await tools().visit(url=[f"{site}/fine"], goal="warm up")  # worker, TLS, imports
    inputs = {
        f"{name} ({len(hostile_page(name)) // 1000} kB)": f"{site}/small/{_slug(name)}"
        for name in HOSTILE_UNITS
    }
    if not quick:
        inputs |= {
            f"{name} (10 MB)": f"{site}/big/{_slug(name)}" for name in HOSTILE_UNITS
        }
    inputs |= {
        "gzip member + 37 MB junk": f"{site}/gzip-then-junk",
        "100 gzip members": f"{site}/gzip-members",
        "charset=rot13": f"{site}/rot13",
        "resolver that never answers": "http://never-resolves.example/",
    }
    original_resolve = visit_tool._resolve
    visit_tool._resolve = _never_resolves
    try:
        stalls = {}
        wall_total = 0.0
        for label, url in inputs.items():
            lag, wall = await _stall(tools, url)
            stalls[label] = lag
            wall_total += wall
            print(f"  {label}: answered in {secs(wall)}; max loop lag {ms(lag)}")
    finally:
        visit_tool._resolve = original_resolve
    idle = await _idle_lag(min(wall_total, 10.0))
    worst_label = max(stalls, key=lambda k: stalls[k])
    worst = stalls[worst_label]
    print(f"  worst: {worst_label}; idle loop: max lag {ms(idle)}")
    return [
        Row(
            f"worst event-loop stall, {len(inputs)} hostile inputs",
            ms(worst),
            f"{ms(idle)} (idle loop)",
            worst / idle if idle > 0 else None,
            "< 50 ms",
            worst < TARGET_SECONDS,
        )
    ]


if __name__ == "__main__":
    serve()
