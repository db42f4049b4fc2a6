"""Heavy mode: several research rollouts at once, then one synthesis.

`Pipe.pipe()` is driven as Open WebUI drives it, against a real local SSE
server whose script tells the rollouts apart by the page each one reads
first; the tools are the pipe tests' fakes (tests/test_pipe.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.fakes.client_watch import ClientWatch
from tests.fakes.openai_server import FakeOpenAI, Reply, answer, tool_call
from tests.test_pipe import drive, make_pipe
from tongyi_deepresearch_openwebui_pipeline.core.events import RunFinished, RunStats
from tongyi_deepresearch_openwebui_pipeline.core.prompts import SYNTHESIS_SYSTEM
from tongyi_deepresearch_openwebui_pipeline.core.sources import SourceLedger
from tongyi_deepresearch_openwebui_pipeline.engine import runs

HEAVY = "tongyi_deepresearch.tongyi-deepresearch-heavy"
QUESTION = [{"role": "user", "content": "Who wrote it?"}]
SYNTHESIS = (
    "Ada wrote it ([first](https://example.org/r1)), as the second run found "
    "([second](https://example.org/r2))."
)


class HeavyScript:
    """The model server's side of a heavy run.

    A rollout's first request gets a visit of its own page (r1, r2, r3 in the
    order the requests arrive); the first requests of all rollouts must be in
    flight together (a barrier, not a clock). Later requests belong to the
    rollout whose page is in their history; the synthesis is told apart by
    its system message.
    """

    def __init__(self, rollouts: int = 3, failing: frozenset[int] = frozenset()):
        self.barrier = threading.Barrier(rollouts, timeout=30)
        self.failing = failing
        self.synthesis: list[dict[str, Any]] = []
        self._started = 0
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        if not body.get("stream"):
            return Reply(content="{}")
        messages = body["messages"]
        if str(messages[0]["content"]).startswith(SYNTHESIS_SYSTEM):
            self.synthesis.append(body)
            return Reply(reasoning="Both runs agree.", content=answer(SYNTHESIS))
        earlier = [m for m in messages if m["role"] == "assistant"]
        if not earlier:
            with self._lock:
                self._started += 1
                rollout = self._started
            self.barrier.wait()  # every rollout's first request has arrived
            return Reply(
                reasoning=f"Plan of run {rollout}.",
                content=tool_call(
                    "visit",
                    {"url": [f"https://example.org/r{rollout}"], "goal": "author"},
                ),
            )
        found = re.search(r"example\.org/r(\d)", str(earlier[0]["content"]))
        assert found is not None
        rollout = int(found.group(1))
        if rollout in self.failing:
            return Reply(status=400, error="invalid request for this test")
        return Reply(
            reasoning=f"Run {rollout} knows.",
            content=answer(
                f"Run {rollout} says Ada ([page](https://example.org/r{rollout}))."
            ),
        )


def source_numbers(events: list[dict[str, Any]]) -> dict[str, int]:
    urls = [e["data"]["source"]["url"] for e in events if e["type"] == "source"]
    return {url: number for number, url in enumerate(urls, start=1)}


def statuses(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["data"].get("description")) for e in events if e["type"] == "status"]


async def test_the_manifold_offers_the_heavy_model() -> None:
    with FakeOpenAI() as fake:
        pipe = make_pipe(fake)
        assert [m["id"] for m in pipe.pipes()] == [
            "tongyi-deepresearch",
            "tongyi-deepresearch-heavy",
        ]
        pipe.valves = pipe.Valves(HEAVY_ENABLED=False)
        assert [m["id"] for m in pipe.pipes()] == ["tongyi-deepresearch"]


async def test_three_rollouts_run_at_once_and_one_synthesis_cites_them() -> None:
    script = HeavyScript()
    with FakeOpenAI() as fake:
        fake.respond_with(script)
        pipe = make_pipe(fake)
        text, _, events = await drive(pipe, QUESTION, body_model=HEAVY)

    assert not script.barrier.broken  # the three first requests were in flight at once
    # Each rollout read its own page: one numbering over the whole run.
    numbers = source_numbers(events)
    assert sorted(numbers) == [f"https://example.org/r{k}" for k in (1, 2, 3)]
    # The synthesis request holds every rollout's report: answer and evidence.
    (synthesis,) = script.synthesis
    request = synthesis["messages"][-1]["content"]
    assert "3 researchers worked on the question below" in request
    assert "# Question\n\nWho wrote it?" in request
    for k in (1, 2, 3):
        url = f"https://example.org/r{k}"
        assert f"Run {k} says Ada ([page]({url}))." in request
        assert (
            f"[{numbers[url]}] Title of {url} ({url})\nEvidence from {url}" in request
        )
    assert "[Read:" not in request
    # The answer cites pages two different rollouts read, with the run's numbers.
    r1, r2 = numbers["https://example.org/r1"], numbers["https://example.org/r2"]
    assert f"([first](https://example.org/r1) [{r1}])" in text
    assert f"([second](https://example.org/r2) [{r2}])" in text
    # Each rollout is one collapsible block, before the answer.
    for k in (1, 2, 3):
        assert f"<summary>Rollout {k} of 3 · 2 rounds · the model gave its answer" in (
            text
        )
    assert text.index("<summary>Rollout") < text.index("Ada wrote it")
    assert '<details type="reasoning" done="true" duration="0">' in text
    assert "<think>" not in text.split("Ada wrote it")[0].split("<summary>Rollout")[1]
    assert "- Rollouts: 3 (3 answered, synthesised into this answer)" in text
    assert "  - Rollout 2: 2 rounds, 0 searches, " in text
    # What each rollout is doing is said in the status line.
    shown = statuses(events)
    assert "Starting heavy research: 3 rollouts…" in shown
    assert any(s.startswith("Rollout 3/3 · Round 1/100 · thinking") for s in shown)
    assert any(
        s.startswith("Rollout 1/3 · Round 1/100 · Reading: https://example.org/r")
        for s in shown
    )
    assert any(s.startswith("Synthesis · integrating the answers of 3") for s in shown)
    assert shown[-1].startswith(
        "Done: the model gave its answer · 7 rounds · 3 sources"
    )


async def test_a_failing_rollout_does_not_sink_the_run() -> None:
    script = HeavyScript(failing=frozenset({2}))
    with FakeOpenAI() as fake:
        fake.respond_with(script)
        text, _, _ = await drive(make_pipe(fake), QUESTION, body_model=HEAVY)

    (synthesis,) = script.synthesis
    request = synthesis["messages"][-1]["content"]
    assert "2 researchers worked on the question below" in request
    assert "Run 2 says" not in request
    assert "Run 1 says" in request and "Run 3 says" in request
    # Which rollout read r2 is the server's arrival order: one of them stopped.
    ended = re.findall(r"<summary>Rollout \d of 3 · 2 rounds · ([^<]*)</summary>", text)
    assert sorted(ended) == ["stopped by an error", *["the model gave its answer"] * 2]
    assert "**This rollout stopped:**" in text
    assert "- Rollouts: 3 (2 answered, synthesised into this answer)" in text
    assert "Ada wrote it" in text


async def test_no_rollout_answering_gives_a_clear_message() -> None:
    script = HeavyScript(failing=frozenset({1, 2, 3}))
    with FakeOpenAI() as fake:
        fake.respond_with(script)
        text, _, _ = await drive(make_pipe(fake), QUESTION, body_model=HEAVY)
    assert script.synthesis == []
    assert (
        "**The research stopped:** None of the 3 research rollouts produced an" in text
    )
    assert "answer (rollout 1: The model server at " in text
    assert "Server said: invalid request for this test; rollout 2: " in text
    assert "; rollout 3: The model server at " in text


async def test_stop_cancels_every_rollout() -> None:
    with FakeOpenAI() as fake:
        watch = ClientWatch(fake.server)
        arrived = threading.Semaphore(0)

        def hold(body: dict[str, Any]) -> Reply:
            arrived.release()
            watch.hold()  # until this rollout's request is dropped
            return Reply(content=answer("too late"))

        fake.respond_with(hold)
        pipe = make_pipe(fake)
        before = asyncio.all_tasks()

        async def consume() -> None:
            body = {"messages": QUESTION, "stream": True, "model": HEAVY}
            async for _ in pipe.pipe(body, __user__={"id": "u"}):
                pass

        task = asyncio.create_task(consume())
        for _ in range(3):  # all three rollouts are waiting on the server
            assert await asyncio.to_thread(arrived.acquire, True, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()
        for _ in range(1500):
            if len(watch.released_by) == 3:
                break
            await asyncio.sleep(0.02)
        # Every rollout's request was dropped by the pipe, not by the server.
        assert watch.released_by == ["client left"] * 3


# -- the engine's reports ---------------------------------------------------------


class FakeModel:
    def stream(
        self, messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> Any:
        raise AssertionError("not called")


def stats() -> RunStats:
    return RunStats(1, 0, 0, 0, 10, 5, None, 1.0)


def test_a_report_fits_its_budget_and_says_what_it_left_out() -> None:
    ledger = SourceLedger()
    for k in range(1, 21):
        url = f"https://example.org/p{k}"
        ledger.record(
            {
                "source": {"name": f"Page {k}", "url": url},
                "document": [
                    "evidence " * 400 + "\n\n[Read: whole page, 9 characters]"
                ],
                "metadata": [{"source": url}],
            },
            reader=1,
        )
    finished = RunFinished("answer", "The answer. " * 50, stats())
    report = runs._report(1, finished, ledger.read_by(1), budget=8000)
    assert len(report) < 8000 + 200
    assert report.startswith("# Report 1 (the model gave its answer)\n\n## Answer\n\n")
    assert "[1] Page 1 (https://example.org/p1)\nevidence evidence" in report
    assert re.search(r"\(\d+ more pages read, not shown\)$", report)
    assert "[Read:" not in report


def test_the_reports_share_the_context_the_server_serves() -> None:
    served, reply = 32768, 10000
    limits = runs.Limits(model_context_tokens=served, max_output_tokens=reply)
    heavy = runs.HeavyRun(
        [],
        FakeModel(),
        lambda _rollout: runs._NoTools(),
        SourceLedger(),
        limits,
        runs.HeavySettings(),
        dt.date(2026, 11, 24),
    )
    per_report = heavy._report_chars(3)
    # Three reports, at ~3 characters a token, and 2,000 tokens of request
    # around them leave the reply its room.
    assert 3 * per_report / 3 + 2000 <= served - reply
    assert per_report > 5000  # and still say something


# -- the engine alone, as a headless front end would use it -------------------------


class ScriptedPort:
    """A model port in process: each call streams the next scripted content."""

    def __init__(self, *contents: str) -> None:
        self.contents = list(contents)

    async def stream(
        self, messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> AsyncIterator[Any]:
        from tongyi_deepresearch_openwebui_pipeline.core.events import ModelDelta

        yield ModelDelta(content=self.contents.pop(0))


class PageTools:
    """A tool port whose visit returns the page it read as a source."""

    def available(self) -> list[str]:
        return ["visit"]

    async def run(self, call: Any) -> Any:
        from tongyi_deepresearch_openwebui_pipeline.core.events import ToolOutcome

        url = call.arguments["url"][0]
        source = {"source": {"name": "Page", "url": url}, "document": ["It is 42."]}
        return ToolOutcome("It is 42.", sources=(source,))


async def test_the_engine_runs_a_plan_without_any_front_end() -> None:
    from tongyi_deepresearch_openwebui_pipeline.core.events import SourcesAdded

    url = "https://example.org/answer"
    plan = runs.RunPlan(
        messages=[{"role": "system", "content": "s"}, *QUESTION],
        limits=runs.Limits(max_rounds=5),
        today=dt.date(2026, 11, 24),
    )
    model = ScriptedPort(
        tool_call("visit", {"url": [url], "goal": "the answer"}),
        answer(f"42 ({url})."),
    )
    ledger = SourceLedger()
    events = [
        e async for e in runs.research(plan, model, lambda _k: PageTools(), ledger)
    ]
    added = [e for e in events if isinstance(e, SourcesAdded)]
    assert [[s.url for s in e.sources] for e in added] == [[url]]
    end = events[-1]
    assert isinstance(end, RunFinished) and end.answer == f"42 ({url})."
    assert [s.number for s in end.sources] == [1]
    assert end.stats.tool_calls == 1


async def test_an_api_caller_asking_for_one_reply_gets_the_synthesis_only() -> None:
    script = HeavyScript()
    with FakeOpenAI() as fake:
        fake.respond_with(script)
        pipe = make_pipe(fake)
        body = {"model": HEAVY, "messages": QUESTION, "stream": False}
        reply = "".join(
            [piece async for piece in pipe.pipe(body, __user__={"id": "u"})]
        )
    assert len(script.synthesis) == 1
    assert reply.startswith("Ada wrote it ([first](https://example.org/r1) [")
    assert "<details" not in reply and "Rollout" not in reply
    assert "**Sources read**" in reply
