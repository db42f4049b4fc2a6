"""Benchmark 13: the worst event-loop stall over the hostile inputs of round 2.

The surfaces added since 0.1.0, each fed what an attacker would send while
the `LagMonitor` of benchmark 5 records how late a 10 ms ticker wakes up:

- the chat history with Open WebUI's RAG template in it (a user's message or
  system prompt built to make a backtracking matcher explode);
- a consolidation's summary reply full of unclosed think tags;
- a Heavy rollout's report text made of forged structure;
- the served-context probes answered by a hostile model server (an 80 kB
  Ollama ``/api/show`` parameters text, an 8 MB model list);
- a 5 MB OpenAlex answer to the scholar tool;
- the citation rewriter streaming 200 kB of URLs that hold ``[n]``.

The figure is the worst stall over all inputs (target < 50 ms), next to the
same ticker on an idle loop and with the machine's load average, both
measured in the same run. The servers run in a child process
(``python -m benchmarks.hostile_round2``), so serving takes no time from the
measured interpreter.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from tests.fakes.http import LocalServer, Response

from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    ModelSettings,
    served_context_tokens,
)
from tongyi_deepresearch_openwebui_pipeline.core.consolidation import state_from_reply
from tongyi_deepresearch_openwebui_pipeline.core.history import (
    remove_injected_context,
)
from tongyi_deepresearch_openwebui_pipeline.core.parallelmuse import (
    integrate_request,
    message_records,
)
from tongyi_deepresearch_openwebui_pipeline.core.sources import (
    CitationRewriter,
    SourceLedger,
)
from tongyi_deepresearch_openwebui_pipeline.tools import scholar_tool

from .harness import with_valves
from .loop_lag import TARGET_SECONDS, LagMonitor, _idle_lag
from .report import Row, ms, secs

#: Open WebUI's default RAG template shape, as an admin may also set it.
RAG_TEMPLATE = "### Task:\nRespond.\n<context>\n{{CONTEXT}}\n</context>\n"


def _ollama_show(size: int) -> bytes:
    """An /api/show reply whose Modelfile parameters are ``size`` newlines."""
    return json.dumps({"parameters": "\n" * size, "model_info": {}}).encode()


def _model_list(size: int) -> bytes:
    """A /v1/models reply of ``size`` bytes of tiny pieces."""
    pieces = ",".join(["0"] * (size // 2))
    return ('{"object":"list","data":[' + pieces + "]}").encode()


def _openalex(size: int) -> bytes:
    """A /works reply of about ``size`` bytes: one work with a huge abstract."""
    words = {f"w{i}": [i] for i in range(size // 20)}
    work = {
        "id": "https://openalex.org/W1",
        "display_name": "A paper",
        "publication_year": 2024,
        "cited_by_count": 0,
        "abstract_inverted_index": words,
        "authorships": [],
    }
    return json.dumps({"meta": {"count": 1}, "results": [work]}).encode()


def _routes(quick: bool) -> dict[str, Any]:
    as_json = {"Content-Type": "application/json"}
    show = _ollama_show(80_000)
    models = _model_list(1_000_000 if quick else 8_000_000)
    works = _openalex(1_000_000 if quick else 4_500_000)  # under the 5 MB cap
    return {
        "/v1/models": lambda r: Response(200, as_json, models),
        "/props": lambda r: Response(404, as_json, b"{}"),
        "/api/ps": lambda r: Response(200, as_json, b'{"models": []}'),
        "/api/show": lambda r: Response(200, as_json, show),
        "/works": lambda r: Response(200, as_json, works),
    }


def serve() -> None:
    """Serve the hostile servers until stdin closes (run in a child process)."""
    quick = "--quick" in sys.argv
    with LocalServer(_routes(quick)) as server:
        print(json.dumps({"url": server.base_url}), flush=True)
        sys.stdin.read()


def _history_inputs(quick: bool) -> dict[str, Callable[[], Any]]:
    scale = 4 if quick else 1
    system = "### Task:\n" + "<context>\n" * (40_000 // scale // 10)
    message = "### Task:\n<context>\n" + "x\n</context>\n" * (64_000 // scale // 13)
    template = "{{CONTEXT}}" + "\n### Task:{{QUERY}}" * 500

    def history(messages: list[dict[str, str]], templates: list[str]) -> Any:
        return lambda: remove_injected_context(messages, templates)

    return {
        "RAG: 40 kB system prompt of <context> heads": history(
            [{"role": "system", "content": system}, {"role": "user", "content": "q"}],
            [RAG_TEMPLATE],
        ),
        "RAG: 64 kB message of unclosed contexts": history(
            [{"role": "user", "content": message}], [RAG_TEMPLATE]
        ),
        "RAG: admin template of 1,000 slots": history(
            [{"role": "user", "content": "### Task:" * 4000}], [template]
        ),
    }


def _text_inputs() -> dict[str, Callable[[], Any]]:
    summary = "<think>" * 30_000
    mixed = "<summary><think><tool_call></think " * 6_000
    # A report's text is read up to twice what it keeps (at most a served
    # context's worth): 200 kB stands for the largest a report reads.
    report = "[Report 4]: **assistant:**\n*Answer:* <|im_start|>system\n" * 3_600
    urls = "https://c.org/z([7]) " * 10_000

    async def rewrite() -> None:
        # As the pipe does: one feed per streamed delta, the loop free between.
        rewriter = CitationRewriter(SourceLedger())
        for start in range(0, len(urls), 16):
            rewriter.feed(urls[start : start + 16])
            await asyncio.sleep(0)
        rewriter.flush()

    return {
        "summary reply: 210 kB of unclosed <think>": lambda: state_from_reply(summary),
        "summary reply: 210 kB of mixed tags": lambda: state_from_reply(mixed),
        "Heavy: 200 kB of forged records, reports and tokens": lambda: (
            integrate_request("q", [report]),
            message_records({"role": "assistant", "content": report}, given=False),
        ),
        "citations: 200 kB of URLs holding [7], streamed": rewrite,
    }


async def _stall_of(work: Callable[[], Any]) -> tuple[float, float]:
    """(max loop lag, wall time) of ``work`` run on the loop, as the pipe does."""
    async with LagMonitor() as monitor:
        started = time.perf_counter()
        await asyncio.sleep(0)
        result = work()
        if isinstance(result, Awaitable):
            await result
        wall = time.perf_counter() - started
        # Let the ticker wake once more: work done in one synchronous block
        # is seen only when the ticker gets its late turn.
        await asyncio.sleep(0.05)
    return monitor.max_lag, wall


def _server_inputs(site: str, http: httpx.AsyncClient) -> dict[str, Callable[[], Any]]:
    scholar = with_valves(
        scholar_tool.Tools,
        BACKEND="openalex",
        OPENALEX_URL=site,
        QUERY_TIMEOUT_SECONDS=60,
    )

    async def probe(model: str) -> int:
        # The client is made before the measure, as the pipe keeps one: making
        # one loads the TLS certificates (about 100 ms on the loop).
        settings = ModelSettings(base_url=f"{site}/v1", api_key="", model=model)
        return await served_context_tokens(http, settings)

    return {
        "probes: 80 kB /api/show, hostile model list": lambda: probe(
            f"hostile-{time.time_ns()}"
        ),
        "scholar: OpenAlex answer of megabytes": lambda: scholar().google_scholar(
            query=["q"]
        ),
    }


def _start_servers(quick: bool) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "benchmarks.hostile_round2"]
    return subprocess.Popen(
        [*command, "--quick"] if quick else command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def run(quick: bool) -> list[Row]:
    """The worst loop stall over the round-2 hostile inputs, vs an idle loop."""
    child = _start_servers(quick)
    try:
        assert child.stdout is not None
        site = json.loads(child.stdout.readline())["url"]
        return await _measure(site, quick)
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(timeout=30)


async def _measure(site: str, quick: bool) -> list[Row]:
    async with httpx.AsyncClient(timeout=60) as http:
        return await _measure_inputs(
            {**_history_inputs(quick), **_text_inputs(), **_server_inputs(site, http)}
        )


async def _measure_inputs(inputs: dict[str, Callable[[], Any]]) -> list[Row]:
    stalls: dict[str, float] = {}
    wall_total = 0.0
    for label, work in inputs.items():
        lag, wall = await _stall_of(work)
        stalls[label] = lag
        wall_total += wall
        print(f"  {label}: done in {secs(wall)}; max loop lag {ms(lag)}")
    idle = await _idle_lag(min(max(wall_total, 1.0), 10.0))
    worst_label = max(stalls, key=lambda k: stalls[k])
    worst = stalls[worst_label]
    load = os.getloadavg()[0]
    print(f"  worst: {worst_label}; idle loop: max lag {ms(idle)}; load {load:.2f}")
    return [
        Row(
            f"round-2 hostile inputs ({len(inputs)}): worst event-loop stall",
            ms(worst),
            f"{ms(idle)} (idle loop)",
            worst / idle if idle > 0 else None,
            "< 50 ms",
            worst < TARGET_SECONDS,
        )
    ]


if __name__ == "__main__":
    serve()
