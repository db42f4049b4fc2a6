"""A heavy run (ParallelMuse) saved as it goes, and taken back where it stopped.

The run engine is driven as a front end drives it (`engine.runs.research` with
a `HeavySettings` plan and a `Checkpointer` whose key says "heavy"), on an
in-process model that returns log-probabilities: rollout 1 is scored, and the
two later rollouts branch before its two most uncertain steps. Rollouts run
one at a time (``concurrency=1``), so every request comes in one order. The
model tells the requests apart by what they hold, and each is named for the
rollout (or report) it belongs to; the tools count the pages each rollout
reads.

An interruption is a front end closing the run's events at a chosen event (as
Stop, or a process that dies, leaves it); the run asked again with the same
store goes on from the checkpoint. An uninterrupted run of the same script
is the measure: together the two runs ask exactly what it asks, but the round
that was in flight, and read each page once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import answer, tool_call
from tongyi_deepresearch_openwebui_pipeline.adapters.checkpoint_store import (
    DirectoryStore,
)
from tongyi_deepresearch_openwebui_pipeline.core.checkpoint import (
    CheckpointError,
    decode,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    ContextWarning,
    ModelChunk,
    ModelDelta,
    ModelError,
    ModelFinish,
    RolloutEvent,
    RoundStarted,
    RunEvent,
    RunFinished,
    RunResumed,
    SynthesisStarted,
    ToolOutcome,
)
from tongyi_deepresearch_openwebui_pipeline.core.loop import Limits
from tongyi_deepresearch_openwebui_pipeline.core.parallelmuse import (
    CONVERGE_SYSTEM_PROMPT,
    Sampling,
    ScoredChunk,
    TokenLogprob,
    TokenLogprobs,
)
from tongyi_deepresearch_openwebui_pipeline.core.sources import PageRead, SourceLedger
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import ToolCall
from tongyi_deepresearch_openwebui_pipeline.engine.checkpoints import (
    Checkpointer,
    RunKey,
)
from tongyi_deepresearch_openwebui_pipeline.engine.runs import (
    HeavySettings,
    RunPlan,
    research,
)

QUESTION = "Who wrote the first program?"
MESSAGES = [
    {"role": "system", "content": "You are a deep research assistant."},
    {"role": "user", "content": QUESTION},
]
HEAVY = RunPlan(
    messages=MESSAGES,
    limits=Limits(max_rounds=10),
    today=dt.date(2026, 11, 26),
    heavy=HeavySettings(rollouts=3, concurrency=1),
)
SINGLE = RunPlan(messages=MESSAGES, limits=Limits(max_rounds=10), today=HEAVY.today)
#: The integrate call's answer: the run's.
SYNTHESIS = "Ada Lovelace, as the three reports agree."
#: Rollout 1's tool-call steps: the log-probability of each call's tokens
#: (its uncertainty is exp(-logprob)): round 2 is the most uncertain, then 3.
LOGPROBS = {1: -0.1, 2: -2.0, 3: -1.0}
#: Where the later rollouts branch: before rollout 1's round 2 and round 3.
BRANCH_AT = {2: 2, 3: 3}
#: Pages a rollout visits before it answers (its own rounds).
VISITS = {1: 3, 2: 2, 3: 2}


def page(rollout: int, round_: int) -> str:
    return f"https://pages.example/r{rollout}-{round_}"


def said_by(rollout: int) -> str:
    return f"Ada Lovelace, says rollout {rollout}."


_READER = re.compile(r"\(read by rollout (\d)\)")
_SAID = re.compile(r"says rollout (\d)\.")


class Script:
    """The model: a `TunableModelPort` whose replies follow from each request.

    A research request belongs to the rollout that read the last tool result
    in it (rollout 1 before any; a single run's tools read as rollout 0); a
    request that does not ask for log-probabilities but whose last result
    rollout 1 read is a branch's first, and which branch follows from its
    round (``branches``). Rollout k visits `page(k, round)` for its first
    `VISITS[k]` rounds of its own, then answers `said_by(k)`. A report
    request names the rollout whose answer is in it; the integrate call
    answers `SYNTHESIS`.

    Each request is recorded by name (``rollout 2 round 3``, ``single round
    2``, ``report 1``, ``integrate``) with its messages. A request ``hold``
    names waits until it is closed (``holding`` is set when it comes); one
    ``fail`` names fails.
    """

    def __init__(
        self,
        hold: str = "",
        fail: Callable[[str], bool] | None = None,
        branches: dict[int, int] | None = None,
    ):
        self.hold = hold
        self.fail = fail or (lambda _name: False)
        self.branches = BRANCH_AT if branches is None else branches
        #: The round each branch starts at.
        self.starts = {rollout: round_ for round_, rollout in self.branches.items()}
        self.asked: list[str] = []
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.holding = asyncio.Event()

    def tuned(self, sampling: Sampling) -> Script:
        """The report and integrate calls' sampling: the same script."""
        return self

    def stream(
        self, messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> AsyncIterator[ModelChunk]:
        return self._reply(messages, scored=False)  # type: ignore[return-value]

    def stream_scored(
        self,
        messages: list[dict[str, Any]],
        max_tokens: int | None = None,
        *,
        top_logprobs: int,
    ) -> AsyncIterator[ScoredChunk]:
        return self._reply(messages, scored=True)

    async def _reply(
        self, messages: list[dict[str, Any]], *, scored: bool
    ) -> AsyncIterator[ScoredChunk]:
        name, text, logprob = self._answer(messages, scored=scored)
        self.asked.append(name)
        self.messages[name] = [dict(m) for m in messages]
        if name == self.hold:
            self.holding.set()
            await asyncio.Event().wait()  # until the run is closed
        if self.fail(name):
            raise ModelError(f"{name} failed")
        yield ModelDelta(content=text)
        if scored and logprob is not None:
            # The call's one token inside <tool_call>: its uncertainty.
            yield TokenLogprobs(
                tuple(
                    TokenLogprob(token, logprob, (logprob,))
                    for token in ("<tool_call>", "call", "</tool_call>")
                )
            )
        yield ModelFinish("stop")

    def _answer(
        self, messages: list[dict[str, Any]], *, scored: bool
    ) -> tuple[str, str, float | None]:
        """The request's name, the reply, and its call's log-probability."""
        if messages[0]["content"] == CONVERGE_SYSTEM_PROMPT:
            request = str(messages[-1]["content"])
            if request.startswith("Given the following problem-solving trajectory"):
                found = _SAID.search(request)
                assert found is not None, request
                rollout = int(found.group(1))
                report = f"<report>\nRollout {rollout} found Ada.\n</report>"
                return f"report {rollout}", report, None
            return "integrate", answer(SYNTHESIS), None
        done = sum(1 for m in messages if m["role"] == "assistant")
        round_ = done + 1
        readers = _READER.findall(" ".join(str(m["content"]) for m in messages))
        rollout = int(readers[-1]) if readers else 1
        if rollout == 1 and not scored and round_ in self.branches:
            rollout = self.branches[round_]  # a branch's first request
        name = (
            f"rollout {rollout} round {round_}" if rollout else f"single round {round_}"
        )
        rollout = rollout or 1  # a single run reads as rollout 1 does
        own = round_ - self.starts.get(rollout, 1) + 1
        if own > VISITS[rollout]:
            return name, answer(said_by(rollout)), None
        url = page(rollout, round_)
        call = tool_call("visit", {"url": [url], "goal": "who"})
        return name, f"<think>\nRead {url}.\n</think>\n\n{call}", LOGPROBS.get(round_)


class Pages:
    """Rollout k's visit tool: any page, each read counted as (k, url)."""

    def __init__(self, rollout: int, reads: list[tuple[int, str]]) -> None:
        self.rollout = rollout
        self.reads = reads

    def available(self) -> list[str]:
        return ["visit"]

    async def run(self, call: ToolCall) -> ToolOutcome:
        url = call.arguments["url"][0]
        self.reads.append((self.rollout, url))
        read = PageRead(url, f"Page {url[-4:]}", f"evidence of {url}")
        text = f"content of {url} (read by rollout {self.rollout})"
        return ToolOutcome(text, pages=(read,))


def heavy_key(store: DirectoryStore, mode: str = "heavy") -> Checkpointer:
    return Checkpointer(store, RunKey("user-1", "chat-1", QUESTION, mode=mode))


def run(
    plan: RunPlan,
    model: Script,
    reads: list[tuple[int, str]],
    keeper: Checkpointer | None,
) -> Any:
    return research(
        plan,
        model,
        lambda k: Pages(k, reads),
        SourceLedger(),
        checkpointer=keeper,
    )


async def whole(events: Any) -> list[RunEvent]:
    async with asyncio.timeout(30):
        return [event async for event in events]


async def until(events: Any, stop: Callable[[RunEvent], bool], model: Script) -> None:
    """Read ``events`` until ``stop``; once ``model`` holds a request, close them."""
    async with asyncio.timeout(30):
        async for event in events:
            if stop(event):
                break
        await model.holding.wait()
        await events.aclose()


def sources(finished: RunEvent) -> list[tuple[int, str]]:
    assert isinstance(finished, RunFinished | RunResumed)
    return [(s.number, s.url) for s in finished.sources]


#: An uninterrupted run of the script: what it asks, in order.
WHOLE_RUN = [
    "rollout 1 round 1",
    "rollout 1 round 2",
    "rollout 1 round 3",
    "rollout 1 round 4",
    "rollout 2 round 2",
    "rollout 2 round 3",
    "rollout 2 round 4",
    "rollout 3 round 3",
    "rollout 3 round 4",
    "rollout 3 round 5",
    "report 1",
    "report 2",
    "report 3",
    "integrate",
]
WHOLE_READS = [
    (1, page(1, 1)),
    (1, page(1, 2)),
    (1, page(1, 3)),
    (2, page(2, 2)),
    (2, page(2, 3)),
    (3, page(3, 3)),
    (3, page(3, 4)),
]


async def test_the_script_is_what_an_uninterrupted_run_asks(tmp_path: Path):
    model, reads = Script(), []
    events = await whole(run(HEAVY, model, reads, heavy_key(DirectoryStore(tmp_path))))
    assert model.asked == WHOLE_RUN
    assert reads == WHOLE_READS
    end = events[-1]
    assert isinstance(end, RunFinished) and end.answer == SYNTHESIS
    assert sources(end) == [(n, url) for n, (_, url) in enumerate(WHOLE_READS, 1)]
    # Branches continue rollout 1's conversation before its uncertain steps.
    assert model.messages["rollout 2 round 2"] == model.messages["rollout 1 round 2"]
    assert model.messages["rollout 3 round 3"] == model.messages["rollout 1 round 3"]
    # The finished run's checkpoint is removed.
    assert await DirectoryStore(tmp_path).load("user-1", "chat-1") is None


async def test_a_heavy_run_goes_on_from_its_last_saved_rounds(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    whole_model = Script()
    whole_events = await whole(run(HEAVY, whole_model, [], None))

    # Stopped while rollout 2's round 3 is asked (rollout 3 waits its turn).
    first, reads = Script(hold="rollout 2 round 3"), []
    await until(
        run(HEAVY, first, reads, heavy_key(store)),
        lambda e: (
            isinstance(e, RolloutEvent)
            and e.rollout == 2
            and e.event == RoundStarted(3, 10)
        ),
        first,
    )
    assert first.asked == WHOLE_RUN[:6]
    assert reads == WHOLE_READS[:4]

    second = Script()
    events = await whole(run(HEAVY, second, reads, heavy_key(store)))

    # Only the round in flight is asked again; rollout 1 is not run again,
    # rollout 3 starts where it branches; every page is read once.
    assert second.asked == WHOLE_RUN[5:]
    assert reads == WHOLE_READS
    for name in WHOLE_RUN[5:]:
        assert second.messages[name] == whole_model.messages[name], name
    # It says it resumed: rollout 1 ran 4 rounds, rollout 2 one of its own;
    # rollout 1's ending is said again.
    resumed = events[0]
    assert isinstance(resumed, RunResumed) and resumed.rounds == 5
    assert sources(resumed) == [(n, url) for n, (_, url) in enumerate(reads[:4], 1)]
    said_again = events[1]
    assert isinstance(said_again, RolloutEvent) and said_again.rollout == 1
    assert isinstance(said_again.event, RunFinished)
    assert (said_again.event.answer, said_again.event.stats.rounds) == (
        said_by(1),
        4,
    )
    end, whole_end = events[-1], whole_events[-1]
    assert isinstance(end, RunFinished) and isinstance(whole_end, RunFinished)
    assert end.answer == SYNTHESIS
    assert sources(end) == sources(whole_end)
    assert [(r.rollout, r.stats.rounds, r.answered) for r in end.rollouts] == [
        (1, 4, True),
        (2, 3, True),
        (3, 3, True),
    ]
    assert end.stats.rounds == whole_end.stats.rounds == 4 + 3 + 3 + 1
    assert await store.load("user-1", "chat-1") is None


async def test_reports_written_before_a_stop_are_not_asked_again(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    first = Script(hold="report 2")
    task = asyncio.create_task(whole(run(HEAVY, first, [], heavy_key(store))))
    async with asyncio.timeout(30):
        await first.holding.wait()
    task.cancel()  # Stop, while report 2 is asked
    with pytest.raises(asyncio.CancelledError):
        await task
    assert first.asked == [*WHOLE_RUN[:-2]]
    # Stop leaves the checkpoint: the front end decides whether to forget it.
    assert await store.load("user-1", "chat-1") is not None

    second, reads = Script(), []
    events = await whole(run(HEAVY, second, reads, heavy_key(store)))
    assert second.asked == ["report 2", "report 3", "integrate"]
    assert reads == []
    said_again = [
        (e.rollout, e.event.answer)
        for e in events
        if isinstance(e, RolloutEvent) and isinstance(e.event, RunFinished)
    ]
    assert said_again == [(1, said_by(1)), (2, said_by(2)), (3, said_by(3))]
    assert SynthesisStarted(3, 3) in events
    end = events[-1]
    assert isinstance(end, RunFinished) and end.answer == SYNTHESIS
    # The integrate call reads the report kept and the two written now.
    assert "Rollout 1 found Ada." in second.messages["integrate"][-1]["content"]
    assert await store.load("user-1", "chat-1") is None


async def stopped_in_the_reports(store: DirectoryStore) -> None:
    """A heavy run stopped while report 2 is asked (report 1 is kept)."""
    first = Script(hold="report 2")
    task = asyncio.create_task(whole(run(HEAVY, first, [], heavy_key(store))))
    async with asyncio.timeout(30):
        await first.holding.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def damage(record: dict[str, Any], change: str) -> None:
    if change == "a report on a rollout that does not exist":
        record["reports"][0]["rollout"] = 5
    elif change == "a rollout out of range":
        record["started"][0]["number"] = 9
    elif change == "another version":
        record["version"] = 3
    elif change == "a count past its list":
        record["started"][0]["state"]["trajectory_shared"] = 10**9


@pytest.mark.parametrize(
    ("change", "note"),
    [
        (
            "a report on a rollout that does not exist",
            "it is damaged: it holds a report on rollout 5, which did not answer",
        ),
        ("a rollout out of range", "it is damaged: it holds rollout 9 of 3"),
        ("another version", "it is version 3; this version reads 1 and 2"),
        ("a count past its list", "it is damaged (ValueError)"),
    ],
)
async def test_a_damaged_or_foreign_heavy_checkpoint_starts_afresh_with_a_note(
    tmp_path: Path, change: str, note: str
):
    store = DirectoryStore(tmp_path)
    await stopped_in_the_reports(store)
    kept = await store.load("user-1", "chat-1")
    assert kept is not None
    record = json.loads(kept)
    damage(record, change)
    await store.save("user-1", "chat-1", json.dumps(record).encode())

    model = Script()
    events = await whole(run(HEAVY, model, [], heavy_key(store)))
    assert events[0] == ContextWarning(f"Saved progress was not used: {note}.")
    assert not any(isinstance(e, RunResumed) for e in events)
    assert model.asked == WHOLE_RUN
    end = events[-1]
    assert isinstance(end, RunFinished) and end.answer == SYNTHESIS


async def test_a_heavy_checkpoint_never_resumes_a_single_run_nor_the_reverse(
    tmp_path: Path,
):
    heavy_store = DirectoryStore(tmp_path / "heavy")
    await stopped_in_the_reports(heavy_store)
    heavy_record = await heavy_store.load("user-1", "chat-1")
    assert heavy_record is not None
    # An earlier reader of single runs refuses it by its version.
    with pytest.raises(CheckpointError) as refused:
        decode(heavy_record, owner="user-1", chat="chat-1", now=0.0)
    assert str(refused.value) == "it is version 2; this version reads 1"
    # A single run of the same question in the chat starts from round 1.
    single_keeper = heavy_key(heavy_store, mode="single")
    single = Script()
    events = await whole(run(SINGLE, single, [], single_keeper))
    assert events[0] == RoundStarted(1, 10)
    assert single_keeper.notes == []
    assert single.asked == [
        "rollout 1 round 1",
        "single round 2",
        "single round 3",
        "single round 4",
    ]
    assert single.messages["rollout 1 round 1"] == MESSAGES

    # A heavy run finds a single run's checkpoint: it starts afresh too.
    single_store = DirectoryStore(tmp_path / "single")
    single_run = run(SINGLE, Script(), [], heavy_key(single_store, mode="single"))
    async with asyncio.timeout(30):
        async for event in single_run:
            if event == RoundStarted(2, 10):  # saved before round 2
                break
        await single_run.aclose()
    assert await single_store.load("user-1", "chat-1") is not None
    heavy_keeper = heavy_key(single_store)
    model = Script()
    heavy_events = await whole(run(HEAVY, model, [], heavy_keeper))
    assert heavy_keeper.notes == []
    assert not any(isinstance(e, RunResumed) for e in heavy_events)
    assert model.asked == WHOLE_RUN


async def test_a_heavy_run_an_error_ended_stays_resumable(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    # Every rollout's second round fails: none answers, the run ends in error.
    failing = Script(fail=lambda name: name.endswith(" round 2"), branches={})
    plan = RunPlan(
        messages=MESSAGES,
        limits=HEAVY.limits,
        today=HEAVY.today,
        heavy=HeavySettings(rollouts=2, concurrency=1, partial_rollouts=False),
    )
    reads: list[tuple[int, str]] = []
    events = await whole(run(plan, failing, reads, heavy_key(store)))
    end = events[-1]
    assert isinstance(end, RunFinished) and end.reason == "error"
    assert failing.asked == [
        "rollout 1 round 1",
        "rollout 1 round 2",
        "rollout 1 round 1",  # rollout 2's first request reads as rollout 1's
        "rollout 2 round 2",
    ]
    assert reads == [(1, page(1, 1)), (2, page(1, 1))]
    assert await store.load("user-1", "chat-1") is not None

    # Asked again: each rollout goes on from its first round, not before it.
    again = Script(branches={})
    resumed = await whole(run(plan, again, reads, heavy_key(store)))
    said = resumed[0]
    assert isinstance(said, RunResumed) and said.rounds == 2
    assert again.asked[:5] == [
        "rollout 1 round 2",
        "rollout 1 round 3",
        "rollout 1 round 4",
        "rollout 2 round 2",
        "rollout 2 round 3",
    ]
    # The reports are asked at once (the shorter trajectory's first).
    assert sorted(again.asked[5:7]) == ["report 1", "report 2"]
    assert again.asked[7:] == ["integrate"]
    assert reads[2:] == [(1, page(1, 2)), (1, page(1, 3)), (2, page(2, 2))]
    last = resumed[-1]
    assert isinstance(last, RunFinished) and last.answer == SYNTHESIS
    assert await store.load("user-1", "chat-1") is None
