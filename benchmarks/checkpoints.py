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

Each length runs with (a) no checkpointer, (b) `DirectoryStore` (the
runner's: one file written, fsynced and renamed per save) and (c)
`DatabaseStore` on a SQLite file (Open WebUI's default database), the three
alternating, after one warm-up run each. Per round it prints the save's time
(encoding + the store's write) and bytes next to the round's own wall time on
the fake, the run's time with the store against without it (the same cost,
seen end to end), and the checkpoint's size after the last research round.
A real model round takes 10-60 s (the model writes 1-2 kB and waits for the
tools), so each save is also put against 10 s, the short end.

Goal (the issue's): a save under 1% of a round's wall time on this fake,
which is the hard comparison: the fake's round costs only the engine's own
work. Checks (fail a quick run too): every run ends with the answer after its
rounds, every round's state was saved and its last checkpoint reads back with
its rounds and sources, no save failed, and the finished run's checkpoint was
removed. ``--quick`` runs 10 and 30 rounds once per store (after the warm-up).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
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
from tongyi_deepresearch_openwebui_pipeline.engine.runs import RunPlan, research

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
        self.turns += 1
        turn = self.turns
        thought = self.texts.thoughts[turn % len(self.texts.thoughts)]
        if turn > self.rounds or messages[-1].get("content") == WRAP_UP_MESSAGE:
            cited = f"The articles agree, as [page 1]({page_url(1)}) shows."
            return f"<think>\n{thought}\n</think>\n\n{answer(cited)}"
        if turn % 2:
            call = tool_call("search", {"query": [f"agreement of results {turn}"]})
        else:
            arguments = {"url": [page_url(turn // 2)], "goal": f"results {turn}"}
            call = tool_call("visit", arguments)
        return f"<think>\n{thought}\n</think>\n\n{call}"

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


# -- measuring the saves ------------------------------------------------------


@dataclass(frozen=True)
class Save:
    """One checkpoint: its size, the whole save's time and the store's part."""

    size: int
    seconds: float
    store_seconds: float

    @property
    def encode_seconds(self) -> float:
        """The save's time outside the store: taking and encoding the state."""
        return self.seconds - self.store_seconds


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

    async def remove(self, owner: str, chat: str) -> None:
        """As the wrapped store."""
        await self.store.remove(owner, chat)

    async def expire(self, older_than: float) -> int:
        """As the wrapped store."""
        return await self.store.expire(older_than)


class TimedCheckpointer(Checkpointer):
    """The run engine's `Checkpointer`, each whole save timed."""

    def __init__(self, store: MeasuredStore, key: RunKey) -> None:
        """Save under ``key`` in ``store``."""
        super().__init__(store, key)
        self.measured = store
        self.seconds: list[float] = []

    async def save(self, state: RunState, ledger: SourceLedger) -> None:
        """Save as the engine does (encode, then the store's write), timed."""
        started = time.perf_counter()
        await super().save(state, ledger)
        self.seconds.append(time.perf_counter() - started)

    def saves(self) -> list[Save]:
        """Every save, with the store's share (a failed one has no write)."""
        writes = self.measured.writes
        if len(writes) != len(self.seconds):
            raise RuntimeError(f"{len(self.seconds) - len(writes)} saves failed")
        return [
            Save(size, seconds, store_seconds)
            for seconds, (size, store_seconds) in zip(self.seconds, writes, strict=True)
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

    @property
    def save_seconds(self) -> float:
        """Every save's time together."""
        return sum(save.seconds for save in self.saves)


def _plan(rounds: int) -> RunPlan:
    messages = [
        {"role": "system", "content": build_system_prompt(["search", "visit"], TODAY)},
        {"role": "user", "content": QUESTION},
    ]
    limits = Limits(
        max_rounds=rounds + 1,
        model_context_tokens=SERVED_CONTEXT,
        at_limit="consolidate",
    )
    return RunPlan(messages=messages, limits=limits, today=TODAY)


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


# -- the figures --------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    """One length with one store: medians over the repeats, against no store."""

    store: str
    rounds: int
    model_rounds: int
    round_seconds: float  # a round's wall time without checkpoints
    save_seconds: float  # checkpointing's time per round
    encode_seconds: float
    write_seconds: float
    end_to_end: float  # (run with the store - run without) per round
    mean_bytes: float
    last_bytes: int
    largest_seconds: float  # the last, largest save's time
    saves: int
    consolidations: int
    checks: tuple[str, ...]  # what went wrong; empty when all held

    @property
    def share(self) -> float:
        """A round's checkpointing over the round's own wall time (fake)."""
        return self.save_seconds / self.round_seconds

    @property
    def real_share(self) -> float:
        """The same over a real model round's short end."""
        return self.save_seconds / REAL_ROUND_SECONDS

    @property
    def write_per_save(self) -> float:
        """The store's time for one save (the mean)."""
        return self.write_seconds * self.model_rounds / self.saves

    @property
    def encode_per_megabyte(self) -> float:
        """Encoding's time (on the event loop) per MB of checkpoint."""
        per_save = self.encode_seconds * self.model_rounds / self.saves
        return per_save / self.mean_bytes * 1_000_000


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
        save_seconds=median([r.save_seconds for r in runs]) / per_round,
        encode_seconds=median([sum(s.encode_seconds for s in r.saves) for r in runs])
        / per_round,
        write_seconds=median([sum(s.store_seconds for s in r.saves) for r in runs])
        / per_round,
        end_to_end=(with_store - base) / per_round,
        mean_bytes=sum(sizes) / len(sizes),
        last_bytes=sizes[-1],
        largest_seconds=median([r.saves[-1].seconds for r in runs]),
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


def side_by_side(results: list[Figures]) -> str:
    """The printed table: one column per length and store."""
    lines: list[tuple[str, ...]] = [
        ("", *(f"{f.rounds} rounds, {f.store}" for f in results)),
        (
            "saves (rounds + consolidations)",
            *(f"{f.saves} ({f.rounds} + {f.consolidations})" for f in results),
        ),
        ("round's wall time, no checkpoint", *(ms(f.round_seconds) for f in results)),
        (
            "save per round: encode + write",
            *(
                f"{ms(f.save_seconds)} ({ms(f.encode_seconds)} + {ms(f.write_seconds)})"
                for f in results
            ),
        ),
        ("run with store - without, per round", *(ms(f.end_to_end) for f in results)),
        ("save / round on the fake", *(percent(f.share) for f in results)),
        (
            f"save / real round ({REAL_ROUND_SECONDS:.0f} s)",
            *(percent(f.real_share) for f in results),
        ),
        ("bytes per save (mean)", *(kilobytes(f.mean_bytes) for f in results)),
        (
            "checkpoint after the last round",
            *(kilobytes(f.last_bytes) for f in results),
        ),
        ("its save (the largest)", *(ms(f.largest_seconds) for f in results)),
        ("checks", *("PASS" if not f.checks else "FAIL" for f in results)),
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]

    def row(cells: tuple[str, ...]) -> str:
        padded = (c.ljust(w) for c, w in zip(cells, widths, strict=True))
        return "  | " + " | ".join(padded) + " |"

    rule = "  |" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([row(lines[0]), rule, *(row(line) for line in lines[1:])])


def where_the_time_goes(results: list[Figures]) -> str:
    """The line under the table: encoding grows with the state, writing does not."""
    parts = [
        f"{f.rounds} rounds, {f.store}: a write of {kilobytes(f.mean_bytes)} takes "
        f"{ms(f.write_per_save)}, encoding {ms(f.encode_per_megabyte)} per MB"
        for f in results
    ]
    return (
        "  Where the time goes: each write is made durable (fsync, or SQLite's "
        "journal and commit), so it costs milliseconds whatever its size; "
        "encoding runs on the event loop and grows with the state "
        f"({'; '.join(parts)})."
    )


def rows(results: list[Figures]) -> list[Row]:
    """The suite's rows: per length and store, the cost; per length, the size."""
    table = []
    for f in results:
        name = f"checkpoint save, {f.rounds} rounds, {f.store}"
        table += [
            Row(
                f"{name}: per round",
                f"{ms(f.save_seconds)}/round ({percent(f.share)})",
                f"{ms(f.round_seconds)}/round (round on the fake)",
                f.share,
                f"< {GOAL_SHARE:.0%} of a round (fake)",
                f.share < GOAL_SHARE,
            ),
            Row(
                f"{name}: vs a real round",
                f"{ms(f.save_seconds)}/round ({percent(f.real_share)})",
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
        finally:
            engine.dispose()
    print(f"  {texts.describe()}")
    runs = f"{REPEATS[quick]} run{'s' if REPEATS[quick] > 1 else ''}"
    print(
        f"  odd rounds search, even rounds visit a new page; consolidation at "
        f"0.9 x 110K tokens; {runs} per store, alternating after a warm-up; "
        "directory = DirectoryStore (fsync + rename), database = DatabaseStore "
        "on a SQLite file"
    )
    print(side_by_side(results))
    print(where_the_time_goes(results))
    print(
        f"  A real model round takes 10-60 s: against {REAL_ROUND_SECONDS:.0f} s "
        "a save is the 'real round' share above, six times less against 60 s."
    )
    return rows(results)
