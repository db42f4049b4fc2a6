"""Benchmark 12: the headless runner's batch throughput at concurrency 1, 4, 16.

The same batch of questions (each a chat of the services' ``bench:chat``
scenario: search, read a page, answer; search, page and extractor take L
each, the model writes at a steady pace) runs through the runner's batch
code in process (`runner.batch.run_batch` with a `Researcher`, records
written to memory) at concurrency 1, 4 and 16, side by side. The fake
servers run in a child process (`Services`), so they do not compete with
the runner for its interpreter. Every record must hold its own question's
answer (no cross-talk between concurrent runs).
"""

from __future__ import annotations

import io
import json
import time

from tongyi_deepresearch_openwebui_pipeline.runner.batch import (
    BatchState,
    Job,
    Question,
    RecordWriter,
    run_batch,
)
from tongyi_deepresearch_openwebui_pipeline.runner.research import open_researcher
from tongyi_deepresearch_openwebui_pipeline.runner.results import Outcome
from tongyi_deepresearch_openwebui_pipeline.runner.settings import load_settings

from .report import Row, secs
from .services import Services

LEVELS = (1, 4, 16)


def _q(level: int, n: int) -> str:
    # Tokens are "tok" + 3 digits + "q" (the services' pattern); unique per run.
    return f"bench:chat token=tok{(level * 100 + n) % 1000:03d}q"


def _problems(output: str) -> int:
    problems = 0
    for line in output.splitlines():
        record = json.loads(line)
        token = record["question"].split("token=")[1]
        if record["prediction"] != f"The answer for {token} is ready.":
            problems += 1
    return problems


async def _batch(
    services: Services, jobs: list[Job], concurrency: int
) -> tuple[float, int]:
    settings = load_settings(
        {
            "API_BASE_URL": services.model_url,
            "SEARXNG_URL": services.search_url,
            "ALLOW_PRIVATE_URLS": True,
            "SCHOLAR_ENABLED": False,
        },
        env={},
    )
    output = io.StringIO()
    async with open_researcher(settings) as researcher:

        async def research(job: Job) -> Outcome:
            return await researcher.run(job.question.question)

        state = BatchState(total=len(jobs))
        started = time.perf_counter()
        await run_batch(
            jobs, research, RecordWriter(output), state, concurrency=concurrency
        )
        elapsed = time.perf_counter() - started
    problems = _problems(output.getvalue()) + (len(jobs) - state.done)
    return elapsed, problems


async def run(quick: bool) -> list[Row]:
    """The same batch at each concurrency level; questions per minute."""
    count = 16 if quick else 32
    latency = 0.05 if quick else 0.3
    config = {
        "search_latency": latency,
        "page_latency": latency,
        "extract_latency": latency,
        "chunk_delay": 0.002 if quick else 0.01,
    }
    rates: dict[int, float] = {}
    problems = 0
    with Services(**config) as services:
        await _batch(services, [Job(Question(0, _q(9, 99)), 1)], 1)  # warm-up
        for level in LEVELS:
            jobs = [Job(Question(n, _q(level, n)), 1) for n in range(count)]
            elapsed, wrong = await _batch(services, jobs, level)
            rates[level] = count / elapsed * 60
            problems += wrong
            print(
                f"  concurrency {level:>2}: {count} questions in {secs(elapsed)} "
                f"({rates[level]:.0f} per min)"
            )
    print(
        f"  each question: search, visit, answer (L = {latency} s); "
        + " · ".join(f"c={k}: {v:.0f}/min" for k, v in rates.items())
    )
    one = rates[1]
    rows = [
        Row(
            f"runner batch: questions/min at concurrency {level}",
            f"{rates[level]:.0f}/min",
            f"{one:.0f}/min (concurrency 1)",
            rates[level] / one,
            target,
            rates[level] >= factor * one,
        )
        for level, factor, target in ((4, 3.0, "≥ 3× c=1"), (16, 8.0, "≥ 8× c=1"))
    ]
    rows.append(
        Row(
            "runner batch: wrong or missing records",
            f"{problems}",
            "—",
            None,
            "0",
            problems == 0,
            timing=False,
        )
    )
    return rows
