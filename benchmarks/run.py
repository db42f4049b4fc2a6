"""The benchmark suite: ``python -m benchmarks.run [--quick] [--only NAME …]``.

Runs every benchmark, prints each one's figures as it goes, then a table of
``name | measured | baseline | ratio | target | result``. The full run exits
with status 1 when a target is missed; ``--quick`` (small sizes, for CI)
never fails on timing, only on broken checks (e.g. cross-talk between chats,
or a benchmark that could not run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
import traceback
from collections.abc import Awaitable, Callable

from . import (
    checkpoints,
    citation_check,
    concurrency,
    context,
    fanout,
    heavy,
    hostile,
    hostile_round2,
    loop_lag,
    openai_sdk,
    page_reading,
    rounds,
    runner_throughput,
    streaming,
    token_estimate,
)
from .report import Row, table

Benchmark = Callable[[bool], Awaitable[list[Row]]]

BENCHMARKS: dict[str, tuple[str, Benchmark]] = {
    "fanout": ("1. Fan-out: 5 queries / 5 URLs in one call", fanout.run),
    "streaming": ("2. Streaming: pipe vs raw httpx", streaming.run),
    "rounds": ("3. Per-round overhead of the pipe", rounds.run),
    "concurrency": ("4. Concurrent chats through one Pipe", concurrency.run),
    "loop-lag": ("5. Event-loop lag while converting big pages", loop_lag.run),
    "openai-sdk": ("6. Research stream: SSE client vs openai SDK", openai_sdk.run),
    "hostile": ("7. Worst event-loop stall over hostile pages", hostile.run),
    "token-estimate": ("8. Token estimate vs Qwen's tokenizer", token_estimate.run),
    "page-reading": ("9. Page reading: main content vs whole page", page_reading.run),
    "heavy": ("10. Heavy run vs one rollout", heavy.run),
    "context": ("11. Research beyond the context window", context.run),
    "runner": (
        "12. Headless runner: batch throughput at concurrency 1, 4, 16",
        runner_throughput.run,
    ),
    "hostile-2": (
        "13. Worst event-loop stall over round-2 hostile inputs",
        hostile_round2.run,
    ),
    "checkpoints": (
        "14. Checkpointing a research: cost per round and size",
        checkpoints.run,
    ),
    "citation-check": (
        "15. Citation check: verdicts on labelled cases from real pages",
        citation_check.run,
    ),
}
#: Upper bound per benchmark, so a hang ends the run instead of CI's job.
TIME_LIMIT_SECONDS = {False: 600.0, True: 120.0}


async def _bounded(bench: Benchmark, quick: bool) -> list[Row]:
    async with asyncio.timeout(TIME_LIMIT_SECONDS[quick]):
        return await bench(quick)


def _run_one(key: str, quick: bool) -> list[Row]:
    title, bench = BENCHMARKS[key]
    print(f"\n## {title}", flush=True)
    started = time.perf_counter()
    try:
        rows = asyncio.run(_bounded(bench, quick))
    except Exception as error:  # one broken benchmark must not hide the others
        traceback.print_exc()
        rows = [
            Row(
                f"{key}: could not run",
                f"{type(error).__name__}: {error}"[:60],
                "—",
                None,
                "runs",
                False,
                timing=False,
            )
        ]
    print(f"  ({time.perf_counter() - started:.1f} s)", flush=True)
    return rows


def _machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"Python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} cores, load average {load}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; the exit status says whether every target was met."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes; timing targets are reported but never fail the run",
    )
    parser.add_argument(
        "--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these"
    )
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "full"
    print(f"# Benchmarks ({mode} run)\n{_machine()}", flush=True)
    started = time.perf_counter()
    rows: list[Row] = []
    for key in args.only or BENCHMARKS:
        rows += _run_one(key, args.quick)
    print(f"\n{table(rows, args.quick)}")
    failed = [row.name for row in rows if row.fails(args.quick)]
    summary = f"{len(rows)} figures in {time.perf_counter() - started:.0f} s"
    print(f"\n{summary}; load average now {os.getloadavg()[0]:.2f}")
    if failed:
        print(f"FAILED: {'; '.join(failed)}")
        return 1
    print("all checks passed" if args.quick else "all targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
