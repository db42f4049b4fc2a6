"""Benchmark 5: the event loop stays responsive while big pages are converted.

The visit tool reads a 5 MB HTML page and a ~20 MB PDF (real text content
streams on every page) from the fake site: each alone, then both in one call
(the figure in the table). Meanwhile a ticker task sleeps 10 ms at a time
and records how late each wake-up is; the largest delay is the event-loop
lag every other chat on the server would feel (target < 50 ms). The
baseline, measured in the same run, is the same ticker on an idle loop for
as long as the visit took.

When a wake-up is late, a watchdog thread records what the loop thread was
doing (and what the other threads were doing) at that moment, so a blocking
call can be named precisely; garbage-collector pauses are timed as well
(they stop every thread, the loop's included).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from tongyi_deepresearch_openwebui_pipeline.tools import visit_tool

from .documents import HTML_MARKER, PDF_MARKER
from .harness import with_valves
from .report import Row, ms, secs
from .services import Services

TARGET_SECONDS = 0.050
TICK = 0.010
_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Stall:
    """A late wake-up and what the threads were doing during it."""

    since: float
    late: float
    loop_stack: list[str]
    other_threads: list[str]
    gc_pauses: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class LagMonitor:
    """Ticker task + watchdog thread (use with ``async with``)."""

    stall_threshold: float = 0.030
    samples: list[tuple[float, float]] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)
    #: (start, seconds, generation) of every garbage-collector pass.
    gc_pauses: list[tuple[float, float, int]] = field(default_factory=list)
    _gc_started: float = 0.0
    _last_tick: float = 0.0
    _captured: float = -1.0
    _stop: threading.Event = field(default_factory=threading.Event)

    async def __aenter__(self) -> LagMonitor:
        """Start ticking and watching."""
        self._last_tick = time.perf_counter()
        self._loop_thread = threading.get_ident()
        self._ticker = asyncio.create_task(self._tick())
        self._watchdog = threading.Thread(target=self._watch, daemon=True)
        self._watchdog.start()
        gc.callbacks.append(self._gc)
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stop both; attach to each stall the collector passes inside it."""
        gc.callbacks.remove(self._gc)
        self._ticker.cancel()
        await asyncio.gather(self._ticker, return_exceptions=True)
        self._stop.set()
        self._watchdog.join(timeout=5)
        for stall in self.stalls:
            end = stall.since + TICK + stall.late
            stall.gc_pauses = [
                (seconds, generation)
                for start, seconds, generation in self.gc_pauses
                if start < end and start + seconds > stall.since
            ]

    @property
    def max_lag(self) -> float:
        """The latest any wake-up came."""
        return max((late for _, late in self.samples), default=0.0)

    def max_lag_between(self, start: float, end: float) -> float:
        """The latest wake-up among those that ended in [start, end]."""
        return max(
            (late for when, late in self.samples if start <= when <= end),
            default=0.0,
        )

    def longest_gc_pause(self) -> tuple[float, int]:
        """(seconds, generation) of the longest collector pass."""
        longest = max(self.gc_pauses, key=lambda p: p[1], default=(0.0, 0.0, 0))
        return longest[1], longest[2]

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._gc_started = now
        else:
            pause = now - self._gc_started
            self.gc_pauses.append((self._gc_started, pause, info["generation"]))

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(TICK)
            now = time.perf_counter()
            self.samples.append((now, now - before - TICK))
            self._last_tick = now

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            last = self._last_tick
            late = time.perf_counter() - last - TICK
            if late > self.stall_threshold and self._captured != last:
                self._captured = last
                self.stalls.append(self._snapshot(last, late))
            elif self.stalls and self._captured == last:
                self.stalls[-1].late = max(self.stalls[-1].late, late)

    def _snapshot(self, since: float, late: float) -> Stall:
        frames = sys._current_frames()
        loop_frame = frames.get(self._loop_thread)
        others = [
            _innermost_own_frame(frame)
            for ident, frame in frames.items()
            if ident not in (self._loop_thread, threading.get_ident())
        ]
        return Stall(
            since,
            late,
            _stack(loop_frame) if loop_frame else [],
            [text for text in others if text],
        )


def _where(entry: traceback.FrameSummary) -> str:
    path = Path(entry.filename)
    shown = path.relative_to(_ROOT) if path.is_relative_to(_ROOT) else path.name
    return f"{shown}:{entry.lineno} {entry.name}"


def _stack(frame: FrameType, depth: int = 6) -> list[str]:
    """The innermost frames, import machinery folded into one line."""
    entries = traceback.extract_stack(frame)
    shown = [e for e in entries if not e.filename.startswith("<frozen")]
    lines = [_where(entry) for entry in shown[-depth:]]
    if len(shown) < len(entries) and entries[-1].filename.startswith("<frozen"):
        lines.append("(importing a module)")
    return lines


def _innermost_own_frame(frame: FrameType) -> str:
    """The deepest frame of this project in a thread, plus the very top one."""
    entries = traceback.extract_stack(frame)
    own = [e for e in entries if "tongyi_deepresearch" in e.filename]
    if not own:
        return ""
    return f"{_where(own[-1])} (top: {_where(entries[-1])})"


@contextmanager
def timed_conversions(windows: list[tuple[float, float]]) -> Iterator[None]:
    """Record when the visit tool's page conversion runs (instrumentation only).

    `_convert_page` is the tool's one entry to conversion: a child process for
    PDFs and big HTML, a worker thread for the rest.
    """
    original: Callable[..., Awaitable[Any]] = visit_tool._convert_page

    async def convert(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            windows.append((started, time.perf_counter()))

    visit_tool._convert_page = convert
    try:
        yield
    finally:
        visit_tool._convert_page = original


async def _idle_lag(seconds: float) -> float:
    async with LagMonitor() as monitor:
        await asyncio.sleep(seconds)
    return monitor.max_lag


@dataclass
class Visit:
    """One measured visit call."""

    label: str
    wall: float
    converting: float
    lag: float
    lag_converting: float
    stalls: list[Stall]
    gc_pause: tuple[float, int]


async def _visit(tools: type, label: str, urls: list[str], markers: list[str]) -> Visit:
    windows: list[tuple[float, float]] = []
    with timed_conversions(windows):
        async with LagMonitor() as monitor:
            started = time.perf_counter()
            text = await tools().visit(url=urls, goal="solar capacity")
            wall = time.perf_counter() - started
    for marker in markers:
        if marker not in text:
            raise RuntimeError(f"the visit output lacks {marker}: {text[:600]}")
    during = max((monitor.max_lag_between(a, b) for a, b in windows), default=0.0)
    converting = max(b for _, b in windows) - min(a for a, _ in windows)
    visit = Visit(
        label,
        wall,
        converting,
        monitor.max_lag,
        during,
        monitor.stalls,
        monitor.longest_gc_pause(),
    )
    pause, generation = visit.gc_pause
    print(
        f"  {label}: {secs(wall)} (converting {secs(converting)}); max loop lag "
        f"{ms(visit.lag)} ({ms(during)} while converting); longest GC pause "
        f"{ms(pause)} (generation {generation})"
    )
    return visit


async def run(quick: bool) -> list[Row]:
    """Max loop lag during a visit of the two big documents vs an idle loop."""
    html_bytes = 1_000_000 if quick else 5_000_000
    pdf_bytes = 2_000_000 if quick else 20_000_000
    import pypdf  # noqa: F401  (imported once per process; not what is measured)

    with Services(big_html_bytes=html_bytes, big_pdf_bytes=pdf_bytes) as services:
        sizes = services.info["sizes"]
        tools = with_valves(
            visit_tool.Tools,
            ALLOW_PRIVATE_URLS=True,
            PAGE_LOADER="builtin",
            MAX_DOWNLOAD_BYTES=64_000_000,
            PAGE_TIMEOUT_SECONDS=300.0,
            EXTRACTOR_BASE_URL=services.model_url,
            EXTRACTOR_MODEL="extractor",
        )
        site = services.pages_url
        html, pdf = f"{site}/big.html", f"{site}/big.pdf"
        names = (
            f"HTML {sizes['html'] / 1e6:.1f} MB",
            f"PDF {sizes['pdf'] / 1e6:.1f} MB",
        )
        # First use of the HTTP stack imports modules (h11, …): a warm-up call
        # keeps that one-time cost out of the figures, as on a running server.
        await tools().visit(url=[f"{site}/page/warmup"], goal="warm up")
        alone = [
            await _visit(tools, names[0], [html], [HTML_MARKER]),
            await _visit(tools, names[1], [pdf], [PDF_MARKER]),
        ]
        both = await _visit(
            tools, f"{names[0]} + {names[1]}", [html, pdf], [HTML_MARKER, PDF_MARKER]
        )
        idle = await _idle_lag(both.wall)
    print(f"  idle loop for {secs(both.wall)}: max lag {ms(idle)}")
    _print_stalls([stall for visit in (*alone, both) for stall in visit.stalls])
    return [
        Row(
            f"event-loop lag, visit {names[0]} + {names[1]}",
            ms(both.lag),
            f"{ms(idle)} (idle loop)",
            both.lag / idle if idle > 0 else None,
            "< 50 ms",
            both.lag < TARGET_SECONDS,
        )
    ]


def _print_stalls(stalls: list[Stall]) -> None:
    worst = sorted(stalls, key=lambda s: s.late, reverse=True)[:3]
    for stall in worst:
        print(f"  stall of ≥ {ms(stall.late)}; loop thread was in:")
        for line in stall.loop_stack:
            print(f"      {line}")
        for line in stall.other_threads:
            print(f"    other thread: {line}")
        for seconds, generation in stall.gc_pauses:
            if seconds >= 0.005:
                print(
                    f"    garbage collection (generation {generation}): {ms(seconds)}"
                )
