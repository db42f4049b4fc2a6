"""Benchmark 14: what checkpointing a research costs per round, in time and bytes.

A scripted research of 10 and of 100 rounds runs through the run engine
(`engine.runs.research`) on in-process fakes: a model port that streams each
turn (1-2 kB of thinking and a tool call, in 7-character deltas as a server
streams tokens) and a tool port that answers at once, a search with its
results (5-10 kB) or a visit with a page's evidence (3-8 kB) and the page as a
new source. The texts are real where ``../shared/fixtures`` is present (the
lab's WebDancer trajectories for the thinking and the search results, the
article pages' bodies for the evidence), else synthetic of the same sizes.
The conversation grows as a real one does: past 0.9 × 110K tokens it is
consolidated (ReSum, the pipe's default) and goes on.

Each length runs with no checkpointer, with `DirectoryStore` (the runner's:
one file written, fsynced and renamed per save) and with `DatabaseStore` on a
SQLite file (Open WebUI's default database), the three alternating, after one
warm-up run each. Side by side, per save:

- **(a) the event loop blocked**: the loop thread's CPU time during the save
  (``time.thread_time``; nothing else runs on the loop here), the time every
  other chat of the server waits; beside it, a bare thread hand-off's;
- **(b) the round waits**: the save's wall time, from the engine's call to
  its return (the guarantee: the state before round n is durable before
  round n's request is sent), and the store's write within it;
- **(c) the round's own time** on the fake (a run without a checkpointer,
  per round), and (a) and (b) against it; and the run's time with the store
  against without it (the same cost, seen end to end), the bytes written,
  and the checkpoint's size after the last research round.

A heavy run of 3 rollouts × 30 rounds (ParallelMuse, the rollouts from the
question: the fake returns no log-probabilities) gives the size of its
checkpoint after every rollout's last round: 1.1 MB. A real model round takes
10-60 s (the model writes 1-2 kB and waits for the tools), so each save is
also put against 10 s, the short end.

Goal (the issue's): a save under 1% of a round's wall time on this fake,
which is the hard comparison: the fake's round costs only the engine's own
work (6-8 ms here). Measured on 2 cores (full run, ``python -m
benchmarks.run --only checkpoints``), before and after the record was taken
as pieces and written in one worker thread:

- (a) the event loop: 0.7 ms a save at 10 rounds and 3.7 ms at 100 before
  (the whole state encoded on the loop), about 0.5 ms at any length now, 7-9%
  of a fake round. Not 1%: a durable write blocks on a disk or a database,
  so it must leave the loop, and a bare hand-off to a thread and back costs
  the loop 0.07 ms idle (1% of a fake round on its own), more between the
  wake-ups of a real save; the rest is taking the record, which no longer
  grows with the run.
- (b) the round's wait: 3-5 ms at 10 rounds and 4-10 ms at 100 (4.6-12 ms
  before), 50-160% of a fake round, under 0.1% of a real one. Most of it is
  the store making the save durable, whatever its size: the file's and its
  directory's fsync (2-3 ms), SQLite's journal and commit (4-9 ms). It
  cannot be 1% with the guarantee kept: saving after the request is sent
  would let a SIGKILL repeat a finished round, so it is not done.

Checks (fail a quick run too): every run ends with the answer after its
rounds, every round's state was saved and its last checkpoint reads back with
its rounds and sources, no save failed, and the finished run's checkpoint was
removed; the heavy run answers and its checkpoint is within `MAX_BYTES`.
``--quick`` runs 10 and 30 rounds once per store (after the warm-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import json
import os
import re
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from tests.fakes.long_research import is_summary_request
from tests.fakes.openai_server import answer, tool_call

from tongyi_deepresearch_openwebui_pipeline.adapters.checkpoint_store import (
    DatabaseStore,
    DirectoryStore,
)
from tongyi_deepresearch_openwebui_pipeline.core.checkpoint import (
    MAX_BYTES,
    BlockingSave,
    CheckpointError,
    CheckpointStore,
    decode,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    ModelChunk,
    ModelDelta,
    ModelFinish,
    ModelUsage,
    RunEvent,
    RunFinished,
    ToolOutcome,
)
from tongyi_deepresearch_openwebui_pipeline.core.loop import Limits, RunState
from tongyi_deepresearch_openwebui_pipeline.core.parallelmuse import (
    CONVERGE_SYSTEM_PROMPT,
)
from tongyi_deepresearch_openwebui_pipeline.core.prompts import (
    WRAP_UP_MESSAGE,
    build_system_prompt,
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

from .report import Row, median, ms

FIXTURES = Path(
    os.environ.get(
        "TDR_FIXTURES", Path(__file__).resolve().parents[2] / "shared" / "fixtures"
    )
)
#: Research rounds of each scripted run (the answer comes one round later),
#: and how many times each store runs them (after a warm-up).
LENGTHS = {False: (10, 100), True: (10, 30)}
REPEATS = {False: 5, True: 1}
#: Goal: a save costs under this share of a round's wall time on the fake.
GOAL_SHARE = 0.01
#: The short end of a real model round (10-60 s).
REAL_ROUND_SECONDS = 10.0
#: Tongyi DeepResearch's served context (128K) and the pipe's budgets.
SERVED_CONTEXT = 131072
TODAY = dt.date(2026, 1, 15)
OWNER = "bench-user"
QUESTION = "Which results do the articles and searches agree on?"
#: Deltas of this many characters, as a server streams a token or two each.
DELTA_CHARS = 7
#: Sizes of the synthetic texts (and the bounds the real ones are cut to).
THOUGHT_CHARS = (1000, 2000)
EVIDENCE_CHARS = (3000, 8000)
STORES = ("none", "directory", "database")
#: The heavy run whose checkpoint is sized: its rollouts (of 30 rounds each).
HEAVY_ROLLOUTS = 3


# -- the texts of a round -----------------------------------------------------


@dataclass(frozen=True)
class Texts:
    """What the fakes write: thoughts, search results and page evidence."""

    thoughts: tuple[str, ...]
    searches: tuple[str, ...]
    evidence: tuple[str, ...]
    origin: str

    def describe(self) -> str:
        """Their origin and mean sizes, for the printed header."""

        def kb(texts: Sequence[str]) -> str:
            return f"{sum(len(t) for t in texts) / len(texts) / 1000:.1f} kB"

        return (
            f"{self.origin}; mean thought {kb(self.thoughts)}, search result "
            f"{kb(self.searches)}, page evidence {kb(self.evidence)}"
        )


_THINK = re.compile(r"<think>\s*(.*?)\s*</think>", re.DOTALL)
_RESPONSE = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.DOTALL)


def load_texts(fixtures: Path = FIXTURES) -> Texts:
    """The fixtures' real texts when they are there, else synthetic ones."""
    trajectories = fixtures / "webdancer" / "sample_traj.jsonl"
    articles = fixtures / "article_pages" / "ground-truth.json"
    if not (trajectories.is_file() and articles.is_file()):
        return synthetic_texts()
    lines = trajectories.read_text(encoding="utf-8").splitlines()
    messages = [
        m for line in lines if line.strip() for m in json.loads(line)["messages"]
    ]
    truth = json.loads(articles.read_text(encoding="utf-8"))
    return Texts(
        thoughts=tuple(_thoughts(messages)),
        searches=tuple(_search_results(messages)),
        evidence=tuple(
            str(page["articleBody"])[: EVIDENCE_CHARS[1]]
            for page in truth.values()
            if len(str(page["articleBody"])) >= EVIDENCE_CHARS[0]
        ),
        origin="real texts (../shared/fixtures: WebDancer trajectories, articles)",
    )


def _thoughts(messages: list[dict[str, Any]]) -> Iterator[str]:
    """Each assistant turn's thinking of at least 1 kB, cut at 2 kB."""
    for message in messages:
        found = _THINK.search(str(message["content"]))
        if message["role"] == "assistant" and found:
            thought = found.group(1)
            if len(thought) >= THOUGHT_CHARS[0]:
                yield thought[: THOUGHT_CHARS[1]]


def _search_results(messages: list[dict[str, Any]]) -> Iterator[str]:
    """The tool responses that answered a search call, without their tags."""
    for before, message in itertools.pairwise(messages):
        called_search = '"name": "search"' in str(before["content"])
        found = _RESPONSE.search(str(message["content"]))
        if before["role"] == "assistant" and called_search and found:
            yield found.group(1)


def synthetic_texts() -> Texts:
    """Texts of the sizes the real ones have (no fixtures)."""
    sentence = "The study reports a measured value of {k} units under condition {k}. "
    thoughts = tuple(
        "".join(sentence.format(k=k * 100 + i) for i in range(20 + k % 10))
        for k in range(10)
    )
    searches = tuple(
        f"A Google search for 'topic {k}' found 10 results:\n\n## Web Results\n"
        + "\n\n".join(
            f"{i}. [Result {i} on topic {k}](https://example.org/{k}/{i})\n\n"
            + sentence.format(k=i) * 6
            for i in range(1, 11)
        )
        for k in range(10)
    )
    evidence = tuple(
        "".join(sentence.format(k=k * 1000 + i) for i in range(45 + 10 * k))
        for k in range(10)
    )
    return Texts(thoughts, searches, evidence, "synthetic texts (no fixtures)")


def page_url(number: int) -> str:
    """The URL of the scripted run's page ``number`` (each read once)."""
    return f"https://pages.example/article/{number}"


# -- the fakes ----------------------------------------------------------------


class ScriptedModel:
    """`ModelPort`: ``rounds`` rounds of thinking and a call, then the answer.

    Odd rounds search, even rounds visit the next page. A summary request
    (a consolidation) gets a summary; the wrap-up gets the answer at once.
    """

    def __init__(self, texts: Texts, rounds: int) -> None:
        """Play ``rounds`` research rounds with ``texts``."""
        self.texts = texts
        self.rounds = rounds
        self.turns = 0

    def reply(self, messages: list[dict[str, Any]]) -> str:
        """The whole reply to ``messages``, as the model writes it."""
        if is_summary_request(messages):
            return "<summary>\n" + self.texts.thoughts[0] + "\n</summary>"
        turn = self.turn(messages)
        thought = self.texts.thoughts[turn % len(self.texts.thoughts)]
        if turn > self.rounds or messages[-1].get("content") == WRAP_UP_MESSAGE:
            cited = f"The articles agree, as [page 1]({page_url(1)}) shows."
            return f"<think>\n{thought}\n</think>\n\n{answer(cited)}"
        if turn % 2:
            call = tool_call("search", {"query": [f"agreement of results {turn}"]})
        else:
            page = self.page(turn, messages)
            arguments = {"url": [page_url(page)], "goal": f"results {turn}"}
            call = tool_call("visit", arguments)
        return f"<think>\n{thought}\n</think>\n\n{call}"

    def turn(self, messages: list[dict[str, Any]]) -> int:
        """The turn ``messages`` asks for (the model's turns so far, plus one)."""
        self.turns += 1
        return self.turns

    def page(self, turn: int, messages: list[dict[str, Any]]) -> int:
        """The page the visit of ``turn`` reads (each once)."""
        return turn // 2

    async def stream(
        self, messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> AsyncIterator[ModelChunk]:
        """The reply in small deltas, then its finish and usage."""
        text = self.reply(messages)
        for start in range(0, len(text), DELTA_CHARS):
            yield ModelDelta(content=text[start : start + DELTA_CHARS])
        yield ModelFinish("stop")
        # About four characters a token, as a server would count them.
        prompt = sum(len(str(m.get("content"))) for m in messages) // 4
        yield ModelUsage(prompt_tokens=prompt, completion_tokens=len(text) // 4)


class ScriptedTools:
    """`ToolPort`: search results, or a page's evidence and the page as a source."""

    def __init__(self, texts: Texts) -> None:
        """Answer with ``texts``."""
        self.texts = texts
        self.searches = 0

    def available(self) -> list[str]:
        """Search and visit."""
        return ["search", "visit"]

    async def run(self, call: ToolCall) -> ToolOutcome:
        """The call's result at once."""
        if call.name == "search":
            self.searches += 1
            results = self.texts.searches[self.searches % len(self.texts.searches)]
            return ToolOutcome(results, counts=(("searches", 1),))
        url = call.arguments["url"][0]
        number = int(url.rsplit("/", 1)[1])
        evidence = self.texts.evidence[number % len(self.texts.evidence)]
        goal = str(call.arguments["goal"])
        text = (
            f"The useful information in {url} for user goal {goal} "
            f"as follows: \n\nEvidence in page: \n{evidence}\n\nSummary: \n"
            f"Article {number} reports its results.\n\n"
        )
        page = PageRead(url, f"Article {number}", evidence, goal=goal)
        return ToolOutcome(text, pages=(page,), counts=(("pages_requested", 1),))


_ROLLOUT = re.compile(r"\[rollout (\d)\]")


class RolloutsModel(ScriptedModel):
    """`ModelPort` of a heavy run: each rollout's turns counted in its conversation.

    A rollout's search results say which rollout it is (`RolloutTools`), and
    its visits read pages of its own. A report call gets a report, the
    integrate call the answer.
    """

    def reply(self, messages: list[dict[str, Any]]) -> str:
        """A report, the answer, or the rollout's turn."""
        if messages[0]["content"] == CONVERGE_SYSTEM_PROMPT:
            if str(messages[-1]["content"]).startswith("Given the following"):
                return "<report>\nThe articles agree on their results.\n</report>"
            return answer("The articles agree.")
        return super().reply(messages)

    def turn(self, messages: list[dict[str, Any]]) -> int:
        """Its rollout's turns so far, plus one (no rollout consolidates)."""
        return 1 + sum(1 for m in messages if m["role"] == "assistant")

    def page(self, turn: int, messages: list[dict[str, Any]]) -> int:
        """Page ``turn // 2`` of the rollout's own thousand."""
        found = _ROLLOUT.findall(" ".join(str(m["content"]) for m in messages[-3:]))
        return int(found[-1]) * 1000 + turn // 2 if found else turn // 2


class RolloutTools(ScriptedTools):
    """`ScriptedTools` of rollout ``rollout``: its searches say which it is."""

    def __init__(self, texts: Texts, rollout: int) -> None:
        """Answer as rollout ``rollout``'s tools."""
        super().__init__(texts)
        self.rollout = rollout

    async def run(self, call: ToolCall) -> ToolOutcome:
        """As `ScriptedTools`, the search results marked with the rollout."""
        outcome = await super().run(call)
        if call.name != "search":
            return outcome
        return replace(outcome, text=f"{outcome.text}\n[rollout {self.rollout}]")


# -- measuring the saves ------------------------------------------------------


@dataclass(frozen=True)
class Save:
    """One checkpoint: its size, the round's wait, the loop's share, the store's."""

    size: int
    #: The save's wall time: what the round waits for it.
    seconds: float
    #: The store's write (in its thread), within ``seconds``.
    store_seconds: float
    #: The event loop's CPU time during the save: what it blocks other chats.
    blocked_seconds: float = 0.0


class MeasuredStore:
    """A `CheckpointStore` that times and sizes each write of the one it wraps."""

    def __init__(self, store: CheckpointStore) -> None:
        """Wrap ``store``."""
        self.store = store
        #: (bytes, seconds) of each write, in order.
        self.writes: list[tuple[int, float]] = []
        self.last: bytes = b""

    async def load(self, owner: str, chat: str) -> bytes | None:
        """As the wrapped store."""
        return await self.store.load(owner, chat)

    async def save(self, owner: str, chat: str, data: bytes) -> None:
        """Write through, timed."""
        started = time.perf_counter()
        await self.store.save(owner, chat, data)
        self.writes.append((len(data), time.perf_counter() - started))
        self.last = data

    def save_blocking(self, owner: str, chat: str, data: bytes) -> None:
        """Write through in the calling (worker) thread, timed, as the engine does.

        The engine encodes a record and saves it in one worker thread when
        the store can (`core.checkpoint.BlockingSave`), as both stores can.
        """
        if not isinstance(self.store, BlockingSave):
            raise TypeError(f"{type(self.store).__name__} saves only on the loop")
        started = time.perf_counter()
        self.store.save_blocking(owner, chat, data)
        self.writes.append((len(data), time.perf_counter() - started))
        self.last = data

    async def remove(self, owner: str, chat: str) -> None:
        """As the wrapped store."""
        await self.store.remove(owner, chat)

    async def expire(self, older_than: float) -> int:
        """As the wrapped store."""
        return await self.store.expire(older_than)


class TimedCheckpointer(Checkpointer):
    """The run engine's `Checkpointer`, each whole save timed on and off the loop."""

    def __init__(self, store: MeasuredStore, key: RunKey) -> None:
        """Save under ``key`` in ``store``."""
        super().__init__(store, key)
        self.measured = store
        self.seconds: list[float] = []
        self.blocked: list[float] = []

    async def save(self, state: RunState, ledger: SourceLedger) -> None:
        """Save as the engine does, timed: wall time, and the loop thread's CPU."""
        cpu, started = time.thread_time(), time.perf_counter()
        await super().save(state, ledger)
        self.seconds.append(time.perf_counter() - started)
        self.blocked.append(time.thread_time() - cpu)

    def saves(self) -> list[Save]:
        """Every save, with the store's share (a failed one has no write)."""
        writes = self.measured.writes
        if len(writes) != len(self.seconds):
            raise RuntimeError(f"{len(self.seconds) - len(writes)} saves failed")
        return [
            Save(size, seconds, store_seconds, blocked)
            for seconds, blocked, (size, store_seconds) in zip(
                self.seconds, self.blocked, writes, strict=True
            )
        ]


# -- one run ------------------------------------------------------------------


@dataclass
class Outcome:
    """One scripted research with one store (or none)."""

    store: str
    rounds: int  # research rounds; the run had one more, the answer's
    seconds: float
    finished: RunFinished
    saves: list[Save] = field(default_factory=list)
    #: The last checkpoint written (the state after the last research round).
    last: bytes = b""
    #: Whether the store still held the run's checkpoint after it finished.
    left_behind: bool = False

    @property
    def model_rounds(self) -> int:
        """The run's rounds as it counted them (the answer's included)."""
        return self.finished.stats.rounds


def _plan(rounds: int, heavy: HeavySettings | None = None) -> RunPlan:
    messages = [
        {"role": "system", "content": build_system_prompt(["search", "visit"], TODAY)},
        {"role": "user", "content": QUESTION},
    ]
    limits = Limits(
        max_rounds=rounds + 1,
        model_context_tokens=SERVED_CONTEXT,
        at_limit="consolidate",
    )
    return RunPlan(messages=messages, limits=limits, today=TODAY, heavy=heavy)


async def _events(
    rounds: int, texts: Texts, checkpointer: Checkpointer | None
) -> tuple[RunEvent, float]:
    """Run the scripted research; its last event and its wall time."""
    run = research(
        _plan(rounds),
        ScriptedModel(texts, rounds),
        lambda _rollout: ScriptedTools(texts),
        SourceLedger(),
        checkpointer=checkpointer,
    )
    return await _last(run)


async def _last(run: AsyncGenerator[RunEvent, None]) -> tuple[RunEvent, float]:
    """The run's last event and its wall time."""
    last: RunEvent | None = None
    started = time.perf_counter()
    async with contextlib.aclosing(run) as events:
        async for event in events:
            last = event
    seconds = time.perf_counter() - started
    if last is None:
        raise RuntimeError("the run yielded nothing")
    return last, seconds


async def one_run(
    rounds: int, texts: Texts, store: CheckpointStore | None, label: str, chat: str
) -> Outcome:
    """The scripted research of ``rounds`` rounds, saving to ``store`` if any."""
    checkpointer = None
    if store is not None:
        checkpointer = TimedCheckpointer(
            MeasuredStore(store), RunKey(OWNER, chat, QUESTION)
        )
    last, seconds = await _events(rounds, texts, checkpointer)
    if not isinstance(last, RunFinished):
        raise RuntimeError(f"the run did not finish: {last!r}")
    outcome = Outcome(label, rounds, seconds, last)
    if checkpointer is not None:
        if checkpointer.notes:
            raise RuntimeError(f"checkpointing failed: {checkpointer.notes}")
        outcome.saves = checkpointer.saves()
        outcome.last = checkpointer.measured.last
        outcome.left_behind = await checkpointer.store.load(OWNER, chat) is not None
    return outcome


@dataclass(frozen=True)
class HeavySize:
    """A heavy run's checkpoint: its largest write, and what went wrong."""

    rollouts: int
    rounds: int
    largest: int
    writes: int
    checks: tuple[str, ...]


async def heavy_size(texts: Texts, store: CheckpointStore, rounds: int) -> HeavySize:
    """A heavy run of 3 rollouts × ``rounds`` rounds, saving to ``store``."""
    measured = MeasuredStore(store)
    keeper = Checkpointer(measured, RunKey(OWNER, "heavy", QUESTION, mode="heavy"))
    run = research(
        _plan(rounds, HeavySettings(rollouts=HEAVY_ROLLOUTS)),
        RolloutsModel(texts, rounds),
        lambda rollout: RolloutTools(texts, rollout),
        SourceLedger(),
        checkpointer=keeper,
    )
    last, _ = await _last(run)
    checks = []
    if not isinstance(last, RunFinished) or last.answer != "The articles agree.":
        checks.append(f"the heavy run ended {last!r:.80}")
    elif [r.stats.rounds for r in last.rollouts] != [rounds + 1] * HEAVY_ROLLOUTS:
        checks.append(f"rollouts of {[r.stats.rounds for r in last.rollouts]} rounds")
    if keeper.notes:
        checks.append(f"checkpointing failed: {keeper.notes}")
    if await store.load(OWNER, "heavy") is not None:
        checks.append("the finished heavy run's checkpoint was left in the store")
    largest = max((size for size, _ in measured.writes), default=0)
    if not 0 < largest <= MAX_BYTES:
        checks.append(f"its largest checkpoint is {largest:,} bytes")
    return HeavySize(
        HEAVY_ROLLOUTS, rounds, largest, len(measured.writes), tuple(checks)
    )


async def handoff_seconds(times: int = 300) -> float:
    """The event loop's CPU time in one bare thread hand-off (the floor of (a)).

    A save that is durable blocks on a disk or a database, so it runs in a
    worker thread: submitting it, and being woken when it ends, is loop work
    no save can do without.
    """
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, int)
    spent = []
    for _ in range(times):
        cpu = time.thread_time()
        await loop.run_in_executor(None, int)
        spent.append(time.thread_time() - cpu)
    return median(spent)


# -- the figures --------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    """One length with one store: medians over the repeats, against no store."""

    store: str
    rounds: int
    model_rounds: int
    round_seconds: float  # (c) a round's wall time without checkpoints
    wait_seconds: float  # (b) the round's wait for one save (mean)
    blocked_seconds: float  # (a) the event loop's time in one save (mean)
    write_seconds: float  # the store's write, within the wait (mean)
    end_to_end: float  # (run with the store - run without) per round
    mean_bytes: float
    last_bytes: int
    largest_wait: float  # the last, largest save: the round's wait
    largest_blocked: float  # ... and the loop's time in it
    saves: int
    consolidations: int
    checks: tuple[str, ...]  # what went wrong; empty when all held

    @property
    def share(self) -> float:
        """(b) / (c): the round's wait for a save over the round's own time."""
        return self.wait_seconds / self.round_seconds

    @property
    def blocked_share(self) -> float:
        """(a) / (c): the loop's time in a save over the round's own time."""
        return self.blocked_seconds / self.round_seconds

    @property
    def real_share(self) -> float:
        """The wait over a real model round's short end."""
        return self.wait_seconds / REAL_ROUND_SECONDS


def problems(outcome: Outcome, chat: str) -> list[str]:
    """What a checkpointed run got wrong (empty: nothing)."""
    found = []
    finished = outcome.finished
    if finished.reason != "answer" or outcome.model_rounds != outcome.rounds + 1:
        found.append(f"ended {finished.reason} after {outcome.model_rounds} rounds")
    consolidations = finished.stats.consolidations
    if len(outcome.saves) != outcome.rounds + consolidations:
        found.append(f"{len(outcome.saves)} saves for {outcome.rounds} rounds")
    if outcome.left_behind:
        found.append("the finished run's checkpoint was left in the store")
    try:
        saved = decode(outcome.last, owner=OWNER, chat=chat, now=time.monotonic())
    except CheckpointError as error:
        return [*found, f"the last checkpoint does not read back: {error}"]
    pages = outcome.rounds // 2
    if saved.state.round != outcome.rounds or len(saved.sources) != pages:
        found.append(
            f"the last checkpoint holds round {saved.state.round} and "
            f"{len(saved.sources)} sources (expected {outcome.rounds}, {pages})"
        )
    return found


def _per_save(runs: list[Outcome], measure: str) -> float:
    """The median over ``runs`` of the mean of one of their saves' figures."""
    return median(
        [sum(getattr(save, measure) for save in r.saves) / len(r.saves) for r in runs]
    )


def figures(runs: list[Outcome], bases: list[Outcome], chat: str) -> Figures:
    """The medians of ``runs`` (one store) against ``bases`` (no store)."""
    first = runs[0]
    per_round = first.model_rounds
    base = median([b.seconds for b in bases])
    with_store = median([r.seconds for r in runs])
    sizes = [save.size for save in first.saves]
    return Figures(
        store=first.store,
        rounds=first.rounds,
        model_rounds=per_round,
        round_seconds=base / per_round,
        wait_seconds=_per_save(runs, "seconds"),
        blocked_seconds=_per_save(runs, "blocked_seconds"),
        write_seconds=_per_save(runs, "store_seconds"),
        end_to_end=(with_store - base) / per_round,
        mean_bytes=sum(sizes) / len(sizes),
        last_bytes=sizes[-1],
        largest_wait=median([r.saves[-1].seconds for r in runs]),
        largest_blocked=median([r.saves[-1].blocked_seconds for r in runs]),
        saves=len(first.saves),
        consolidations=first.finished.stats.consolidations,
        checks=tuple(sorted({p for r in runs for p in problems(r, chat)})),
    )


def kilobytes(size: float) -> str:
    """Bytes as kB or MB (powers of 1000), one decimal."""
    if size >= 1_000_000:
        return f"{size / 1_000_000:,.1f} MB"
    return f"{size / 1000:,.1f} kB"


def percent(share: float) -> str:
    """A share with enough digits for small ones."""
    return f"{share:.2%}" if share >= 0.0001 else f"{share:.4%}"


def micro(seconds: float) -> str:
    """Seconds in milliseconds, with the digits a fraction of one needs."""
    return f"{seconds * 1000:.3f} ms" if seconds < 0.001 else ms(seconds)


def side_by_side(results: list[Figures], handoff: float) -> str:
    """The printed table: one column per length and store."""
    lines: list[tuple[str, ...]] = [
        ("", *(f"{f.rounds} rounds, {f.store}" for f in results)),
        (
            "saves (rounds + consolidations)",
            *(f"{f.saves} ({f.rounds} + {f.consolidations})" for f in results),
        ),
        (
            "(c) round's wall time, no checkpoint",
            *(ms(f.round_seconds) for f in results),
        ),
        (
            "(a) event loop blocked per save",
            *(micro(f.blocked_seconds) for f in results),
        ),
        (
            "    of which a bare thread hand-off",
            *(micro(handoff) for _ in results),
        ),
        (
            "(b) round waits per save (store's write)",
            *(f"{ms(f.wait_seconds)} ({ms(f.write_seconds)})" for f in results),
        ),
        ("(a) / (c)", *(percent(f.blocked_share) for f in results)),
        ("(b) / (c)", *(percent(f.share) for f in results)),
        ("run with store - without, per round", *(ms(f.end_to_end) for f in results)),
        (
            f"(b) / a real round ({REAL_ROUND_SECONDS:.0f} s)",
            *(percent(f.real_share) for f in results),
        ),
        ("bytes per save (mean)", *(kilobytes(f.mean_bytes) for f in results)),
        (
            "checkpoint after the last round",
            *(kilobytes(f.last_bytes) for f in results),
        ),
        (
            "its save (the largest): (a), (b)",
            *(f"{micro(f.largest_blocked)}, {ms(f.largest_wait)}" for f in results),
        ),
        ("checks", *("PASS" if not f.checks else "FAIL" for f in results)),
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]

    def row(cells: tuple[str, ...]) -> str:
        padded = (c.ljust(w) for c, w in zip(cells, widths, strict=True))
        return "  | " + " | ".join(padded) + " |"

    rule = "  |" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([row(lines[0]), rule, *(row(line) for line in lines[1:])])


def where_the_time_goes(results: list[Figures]) -> str:
    """The line under the table: the wait is the store's durability."""
    parts = [
        f"{f.rounds} rounds, {f.store}: {ms(f.wait_seconds)} of which the write "
        f"{ms(f.write_seconds)}"
        for f in results
    ]
    return (
        "  Where the time goes: the event loop only takes the record (each "
        "message encoded once, in a worker thread); the round waits for the "
        "write to be durable (fsync of the file and its directory, or SQLite's "
        "journal and commit), milliseconds whatever the size, and a thread's "
        f"hand-off ({'; '.join(parts)})."
    )


def rows(results: list[Figures], heavy: HeavySize) -> list[Row]:
    """The suite's rows: per length and store, the cost; per length, the size."""
    table = []
    for f in results:
        name = f"checkpoint save, {f.rounds} rounds, {f.store}"
        table += [
            Row(
                f"{name}: per round",
                f"{ms(f.wait_seconds)}/save ({percent(f.share)})",
                f"{ms(f.round_seconds)}/round (round on the fake)",
                f.share,
                f"< {GOAL_SHARE:.0%} of a round (fake)",
                f.share < GOAL_SHARE,
            ),
            Row(
                f"{name}: event loop blocked",
                f"{micro(f.blocked_seconds)}/save ({percent(f.blocked_share)})",
                f"{ms(f.round_seconds)}/round (round on the fake)",
                f.blocked_share,
                f"< {GOAL_SHARE:.0%} of a round (fake)",
                f.blocked_share < GOAL_SHARE,
            ),
            Row(
                f"{name}: vs a real round",
                f"{ms(f.wait_seconds)}/save ({percent(f.real_share)})",
                f"{REAL_ROUND_SECONDS:.0f} s/round (real model, short end)",
                f.real_share,
                f"< {GOAL_SHARE:.0%} of a round (real)",
                f.real_share < GOAL_SHARE,
            ),
            Row(
                f"{name}: checks",
                "; ".join(f.checks) or "0 problems",
                "—",
                None,
                "every round saved, read back, removed at the end",
                not f.checks,
                timing=False,
            ),
        ]
    for rounds in dict.fromkeys(f.rounds for f in results):
        size = max(f.last_bytes for f in results if f.rounds == rounds)
        table.append(
            Row(
                f"checkpoint size after round {rounds}",
                kilobytes(size),
                f"{kilobytes(MAX_BYTES)} (MAX_BYTES)",
                size / MAX_BYTES,
                "≤ MAX_BYTES",
                size <= MAX_BYTES,
                timing=False,
            )
        )
    table.append(
        Row(
            f"heavy checkpoint, {heavy.rollouts} rollouts × {heavy.rounds} rounds",
            "; ".join(heavy.checks) or kilobytes(heavy.largest),
            f"{kilobytes(MAX_BYTES)} (MAX_BYTES)",
            heavy.largest / MAX_BYTES,
            "answers; ≤ MAX_BYTES",
            not heavy.checks,
            timing=False,
        )
    )
    return table


# -- the benchmark ------------------------------------------------------------


def rotated(labels: list[str], by: int) -> list[str]:
    """``labels`` started ``by`` places on: each store runs first in turn."""
    start = by % len(labels)
    return labels[start:] + labels[:start]


async def measure(
    rounds: int, repeats: int, texts: Texts, stores: dict[str, CheckpointStore | None]
) -> list[Figures]:
    """Each store on ``rounds`` rounds, alternating, after a warm-up each."""
    outcomes: dict[str, list[Outcome]] = {label: [] for label in stores}
    chats = itertools.count(1)
    for label, store in stores.items():  # warm-up: imports, the table, caches
        await one_run(rounds, texts, store, label, f"warm-up-{next(chats)}")
    for repeat in range(repeats):
        for label in rotated(list(stores), repeat):
            outcome = await one_run(
                rounds, texts, stores[label], label, f"chat-{rounds}"
            )
            outcomes[label].append(outcome)
    bases = outcomes.pop("none")
    return [figures(runs, bases, f"chat-{rounds}") for runs in outcomes.values()]


async def run(quick: bool) -> list[Row]:
    """10 and 100 rounds (quick: 10 and 30), each store against none."""
    texts = load_texts()
    with tempfile.TemporaryDirectory(prefix="bench-checkpoints-") as directory:
        path = Path(directory)
        engine = sa.create_engine(f"sqlite:///{path / 'webui.db'}")
        try:
            stores: dict[str, CheckpointStore | None] = {
                "none": None,
                "directory": DirectoryStore(path / "checkpoints"),
                "database": DatabaseStore(engine),
            }
            results = []
            for rounds in LENGTHS[quick]:
                results += await measure(rounds, REPEATS[quick], texts, stores)
            heavy = await heavy_size(texts, DirectoryStore(path / "heavy"), 30)
            handoff = await handoff_seconds()
        finally:
            engine.dispose()
    print(f"  {texts.describe()}")
    runs = f"{REPEATS[quick]} run{'s' if REPEATS[quick] > 1 else ''}"
    print(
        f"  odd rounds search, even rounds visit a new page; consolidation at "
        f"0.9 x 110K tokens; {runs} per store, alternating after a warm-up; "
        "directory = DirectoryStore (fsync + rename), database = DatabaseStore "
        "on a SQLite file; (a) the event loop's CPU time in a save, (b) the "
        "save's wall time (what the round waits), (c) a round without saves"
    )
    print(side_by_side(results, handoff))
    print(where_the_time_goes(results))
    print(
        f"  A real model round takes 10-60 s: against {REAL_ROUND_SECONDS:.0f} s "
        "a save is the 'real round' share above, six times less against 60 s."
    )
    print(
        f"  Heavy: {heavy.rollouts} rollouts × {heavy.rounds} rounds, the "
        f"largest checkpoint {kilobytes(heavy.largest)} ({heavy.writes} writes)"
        + (f"; {'; '.join(heavy.checks)}" if heavy.checks else "")
    )
    return rows(results, heavy)
