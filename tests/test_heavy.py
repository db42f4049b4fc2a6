"""Heavy mode: research rollouts, then ParallelMuse's reports and integration.

`Pipe.pipe()` is driven as Open WebUI drives it, against a real local SSE
server whose script tells the rollouts apart by the page each one reads
first; the tools are the pipe tests' fakes (tests/test_pipe.py). The fake
server returns no token log-probabilities, so the rollouts after the first
start from the question once its first reply shows that (the branching
itself: tests/test_lab_parallelmuse.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import threading
from typing import Any

import pytest

from tests.fakes.chat import drive, make_pipe
from tests.fakes.client_watch import ClientWatch
from tests.fakes.openai_server import FakeOpenAI, Reply, answer, tool_call
from tests.fakes.scripted_model import ScriptedModel
from tongyi_deepresearch_openwebui_pipeline.core.budget import estimate_text_tokens
from tongyi_deepresearch_openwebui_pipeline.core.events import RunFinished
from tongyi_deepresearch_openwebui_pipeline.core.parallelmuse import (
    CONVERGE_SYSTEM_PROMPT,
    TOOL_RESPONSE_RECORD,
    Record,
    fit_reports,
    fit_trajectory,
    integrate_request,
)
from tongyi_deepresearch_openwebui_pipeline.core.sources import SourceLedger
from tongyi_deepresearch_openwebui_pipeline.engine import runs

HEAVY = "tongyi_deepresearch.tongyi-deepresearch-heavy"
QUESTION = [{"role": "user", "content": "Who wrote it?"}]
SYNTHESIS = (
    "Ada wrote it ([first](https://example.org/r1)), as the second run found "
    "([second](https://example.org/r2))."
)
NO_LOGPROBS_STATUS = "Rollout 1/3 · ⚠️ " + runs.NO_LOGPROBS_NOTICE


def report_of(rollout: int) -> str:
    """The report the script writes for rollout ``rollout``."""
    return f"Run {rollout} read https://example.org/r{rollout}: Ada wrote it."


class HeavyScript:
    """The model server's side of a heavy run.

    A rollout's first request gets a visit of its own page (r1, r2, r3 in the
    order the requests arrive). The first rollout's second request and the
    other rollouts' first requests must be in flight together (a barrier,
    not a clock): the later rollouts start once the first reply came without
    log-probabilities, and all three then run at once. Later requests belong
    to the rollout whose page is in their history; report calls are told
    apart by their system message and answer with `report_of`, the integrate
    call with `SYNTHESIS`.
    """

    def __init__(self, rollouts: int = 3, failing: frozenset[int] = frozenset()):
        self.barrier = threading.Barrier(rollouts, timeout=30)
        self.failing = failing
        self.reports: list[dict[str, Any]] = []
        self.integrate: list[dict[str, Any]] = []
        self._started = 0
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        if not body.get("stream"):
            return Reply(content="{}")
        messages = body["messages"]
        if messages[0]["content"] == CONVERGE_SYSTEM_PROMPT:
            return self._aggregation(body)
        earlier = [m for m in messages if m["role"] == "assistant"]
        if not earlier:
            with self._lock:
                self._started += 1
                rollout = self._started
            if rollout > 1:
                self.barrier.wait()  # with rollout 1's second request
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
        if rollout == 1 and len(earlier) == 1:
            self.barrier.wait()  # the other rollouts' first requests
        if rollout in self.failing:
            return Reply(status=400, error="invalid request for this test")
        return Reply(
            reasoning=f"Run {rollout} knows.",
            content=answer(
                f"Run {rollout} says Ada ([page](https://example.org/r{rollout}))."
            ),
        )

    def _aggregation(self, body: dict[str, Any]) -> Reply:
        request = str(body["messages"][-1]["content"])
        if request.startswith("Given the following problem-solving trajectory:"):
            self.reports.append(body)
            found = re.search(r"Run (\d) says Ada", request)
            assert found is not None
            rollout = int(found.group(1))
            return Reply(
                reasoning="Distilling.",
                content=f"<report>\n{report_of(rollout)}\n</report>",
            )
        self.integrate.append(body)
        return Reply(reasoning="Both runs agree.", content=answer(SYNTHESIS))


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


async def test_three_rollouts_run_at_once_and_one_integration_cites_them() -> None:
    script = HeavyScript()
    with FakeOpenAI() as fake:
        fake.respond_with(script)
        # The citation check after the answer has its own tests.
        pipe = make_pipe(fake, CITATION_CHECK=False)
        text, _, events = await drive(pipe, QUESTION, body_model=HEAVY)

    # Rollout 1's second request and the others' first were in flight at once.
    assert not script.barrier.broken
    # Each rollout read its own page: one numbering over the whole run.
    numbers = source_numbers(events)
    assert sorted(numbers) == [f"https://example.org/r{k}" for k in (1, 2, 3)]
    # One report call per rollout, then one integrate call over the reports,
    # in the order of the rollouts, exactly as the lab's prompt has them.
    assert len(script.reports) == 3
    (integrate,) = script.integrate
    page = pages_by_rollout(text)
    assert page[1] == 1 and sorted(page.values()) == [1, 2, 3]
    assert integrate["messages"] == integrate_request(
        "Who wrote it?", [report_of(page[k]) for k in (1, 2, 3)]
    )
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
    # What each rollout is doing is said in the status line, and that the
    # server's replies carry no log-probabilities to branch on.
    shown = statuses(events)
    assert "Starting heavy research: 3 rollouts…" in shown
    assert shown.count(NO_LOGPROBS_STATUS) == 1
    assert any(s.startswith("Rollout 3/3 · Round 1/100 · thinking") for s in shown)
    assert any(
        s.startswith("Rollout 1/3 · Round 1/100 · Reading: https://example.org/r")
        for s in shown
    )
    assert any(s.startswith("Synthesis · integrating the answers of 3") for s in shown)
    assert shown[-1].startswith(
        "Done: the model gave its answer · 7 rounds · 3 sources"
    )


def pages_by_rollout(text: str) -> dict[int, int]:
    """The page each rollout that answered read (its block says ``Run k says``)."""
    pages = {}
    for block in text.split("<summary>Rollout ")[1:]:
        rollout = int(block.split(" ", 1)[0])
        found = re.search(r"Run (\d) says Ada", block)
        if found:
            pages[rollout] = int(found.group(1))
    return pages


async def test_a_failing_rollout_does_not_sink_the_run() -> None:
    script = HeavyScript(failing=frozenset({2}))
    with FakeOpenAI() as fake:
        fake.respond_with(script)
        text, _, _ = await drive(make_pipe(fake), QUESTION, body_model=HEAVY)

    # The rollout that failed gets no report; the others are integrated.
    assert len(script.reports) == 2
    (integrate,) = script.integrate
    page = pages_by_rollout(text)
    assert sorted(page.values()) == [1, 3]
    assert integrate["messages"] == integrate_request(
        "Who wrote it?", [report_of(page[k]) for k in sorted(page)]
    )
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
    assert script.reports == [] and script.integrate == []
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
        first = threading.Event()

        def hold(body: dict[str, Any]) -> Reply:
            if not first.is_set():  # rollout 1's first reply lets the others start
                first.set()
                url = "https://example.org/r1"
                return Reply(content=tool_call("visit", {"url": [url], "goal": "g"}))
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


# -- the engine's requests fit the context ----------------------------------------


def test_a_trajectory_too_long_for_the_context_gives_way_oldest_first() -> None:
    given = Record("**system:**\ns\n\n", "given")
    step = Record("**assistant:**\n*Thinking:* t\n*Tool Call:* c\n\n", "turn")
    page = Record(TOOL_RESPONSE_RECORD.format(tool_response="page " * 400), "response")
    last = Record("**assistant:**\n*Thinking:* t\n*Answer:* 42\n\n", "turn")
    left_out = TOOL_RESPONSE_RECORD.format(
        tool_response="(This tool response was left out to fit the context.)"
    )
    records = [given, step, page, step, page, last]
    whole = "".join(r.text for r in records).strip()
    assert fit_trajectory(records, 10_000) == whole
    # Room for one page: the older one gives way to a note.
    assert (
        fit_trajectory(records, 600)
        == (
            given.text + step.text + left_out + step.text + page.text + last.text
        ).strip()
    )
    # Room for no page: both give way; then the oldest steps, the answer kept.
    assert (
        fit_trajectory(records, 150)
        == (
            given.text + step.text + left_out + step.text + left_out + last.text
        ).strip()
    )
    steps_left_out = "(… {} steps of the trajectory left out to fit the context …)\n\n"
    assert (
        fit_trajectory(records, 60)
        == (given.text + steps_left_out.format(3) + left_out + last.text).strip()
    )
    assert (
        fit_trajectory(records, 45)
        == (given.text + steps_left_out.format(4) + last.text).strip()
    )
    # Still too long: the start and the end of what is left, around a cut.
    cut = fit_trajectory(records, 20)
    assert cut.startswith("**system:**\ns") and cut.endswith("*Answer:* 42")
    assert "\n…\n" in cut and estimate_text_tokens(cut) <= 20


def test_the_reports_share_what_the_context_leaves_them() -> None:
    short, long = "Short report.", "word " * 4000
    assert fit_reports([short, long], 100_000) == [short, long]
    fitted = fit_reports([short, long, long], 1000)
    assert fitted[0] == short  # short ones stay whole
    assert fitted[1] == fitted[2] and fitted[1].endswith(" …")
    assert long.startswith(fitted[1].removesuffix(" …"))
    assert 400 <= len(fitted[1]) // 5 <= 500  # about half the rest each


# -- the engine alone, as a headless front end would use it -------------------------


class PageTools:
    """A tool port whose visit returns the page it read as a source."""

    def available(self) -> list[str]:
        return ["visit"]

    async def run(self, call: Any) -> Any:
        from tongyi_deepresearch_openwebui_pipeline.core.events import ToolOutcome
        from tongyi_deepresearch_openwebui_pipeline.core.sources import PageRead

        url = call.arguments["url"][0]
        return ToolOutcome("It is 42.", pages=(PageRead(url, "Page", "It is 42."),))


async def test_the_engine_runs_a_plan_without_any_front_end() -> None:
    from tongyi_deepresearch_openwebui_pipeline.core.events import SourcesAdded

    url = "https://example.org/answer"
    plan = runs.RunPlan(
        messages=[{"role": "system", "content": "s"}, *QUESTION],
        limits=runs.Limits(max_rounds=5),
        today=dt.date(2026, 11, 24),
    )
    model = ScriptedModel(
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


async def test_an_api_caller_asking_for_one_reply_gets_the_answer_only() -> None:
    script = HeavyScript()
    with FakeOpenAI() as fake:
        fake.respond_with(script)
        pipe = make_pipe(fake)
        body = {"model": HEAVY, "messages": QUESTION, "stream": False}
        reply = "".join(
            [piece async for piece in pipe.pipe(body, __user__={"id": "u"})]
        )
    assert len(script.integrate) == 1
    assert reply.startswith("Ada wrote it ([first](https://example.org/r1) [")
    assert "<details" not in reply and "Rollout" not in reply
    assert "**Sources read**" in reply
