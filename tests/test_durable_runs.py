"""A single run saved between rounds goes on from its last finished round.

The run engine saves the state before each round after the first; a process
that dies (here: the run is abandoned at the start of round 3, as a SIGKILL
would leave it) leaves the state after round 2. A new run of the same
question in the same chat takes it back: the model is asked for round 3 only,
sources keep their numbers, and the answer cites pages read before and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.scripted_model import ScriptedModel
from tongyi_deepresearch_openwebui_pipeline.adapters.checkpoint_store import (
    DirectoryStore,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    ContextWarning,
    ModelError,
    RoundStarted,
    RunEvent,
    RunFinished,
    RunResumed,
    ToolOutcome,
)
from tongyi_deepresearch_openwebui_pipeline.core.loop import Limits
from tongyi_deepresearch_openwebui_pipeline.core.sources import PageRead, SourceLedger
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import ToolCall
from tongyi_deepresearch_openwebui_pipeline.engine.checkpoints import (
    Checkpointer,
    RunKey,
)
from tongyi_deepresearch_openwebui_pipeline.engine.runs import RunPlan, research

QUESTION = "Which lighthouse was first?"
PLAN = RunPlan(
    messages=[
        {"role": "system", "content": "You are a deep research assistant."},
        {"role": "user", "content": QUESTION},
    ],
    limits=Limits(max_rounds=10),
    today=dt.date(2026, 11, 26),
)


def visit(url: str) -> str:
    call = {"name": "visit", "arguments": {"url": [url], "goal": "history"}}
    thought = f"<think>\nRead {url}.\n</think>\n\n"
    return f"{thought}<tool_call>\n{json.dumps(call)}\n</tool_call>"


def page(n: int) -> str:
    return f"https://pages.example/{n}"


class Pages:
    """A visit tool that reads any page, and counts each read."""

    def __init__(self) -> None:
        self.read: list[str] = []

    def available(self) -> list[str]:
        return ["visit"]

    async def run(self, call: ToolCall) -> ToolOutcome:
        url = call.arguments["url"][0]
        self.read.append(url)
        read = PageRead(url, f"Page {url[-1]}", f"evidence of {url}")
        return ToolOutcome(f"content of {url}", pages=(read,))


def checkpointer(store: DirectoryStore, owner: str = "user-1") -> Checkpointer:
    return Checkpointer(store, RunKey(owner, "chat-1", QUESTION))


async def until_round(events: Any, number: int) -> list[RunEvent]:
    """The run's events until round ``number`` starts; then it is abandoned."""
    seen: list[RunEvent] = []
    async for event in events:
        seen.append(event)
        if isinstance(event, RoundStarted) and event.round == number:
            break
    await events.aclose()
    return seen


async def test_a_resumed_run_asks_only_for_the_rounds_not_finished(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    first_model = ScriptedModel(visit(page(1)), visit(page(2)))
    pages = Pages()
    await until_round(
        research(
            PLAN, first_model, lambda _: pages, SourceLedger(),
            checkpointer=checkpointer(store),
        ),
        3,
    )  # fmt: skip

    saved = await checkpointer(store).resume()
    assert saved is not None and saved.state.round == 2
    answer = f"<answer>\nFirst [a]({page(1)}), then [b]({page(3)}).\n</answer>"
    second_model = ScriptedModel(visit(page(3)), answer)
    events = [
        event
        async for event in research(
            PLAN,
            second_model,
            lambda _: pages,
            SourceLedger(),
            checkpointer=checkpointer(store),
        )
    ]

    resumed = events[0]
    assert isinstance(resumed, RunResumed)
    assert resumed.rounds == 2
    assert [(s.number, s.url) for s in resumed.sources] == [(1, page(1)), (2, page(2))]
    # Round 3 is the first the second model is asked, with rounds 1-2 kept.
    assert [len(m) for m in second_model.seen] == [6, 8]
    assert second_model.seen[0] == first_model.seen[1] + [
        {"role": "assistant", "content": visit(page(2))},
        {
            "role": "user",
            "content": f"<tool_response>\ncontent of {page(2)}\n</tool_response>",
        },
    ]
    assert pages.read == [page(1), page(2), page(3)]  # none read twice
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert end.reason == "answer"
    assert end.answer == f"First [a]({page(1)}), then [b]({page(3)})."
    assert [(s.number, s.url) for s in end.sources] == [
        (1, page(1)),
        (2, page(2)),
        (3, page(3)),
    ]
    assert end.stats.rounds == 4
    # The trajectory spans both processes; the finished run is forgotten.
    assert [m["role"] for m in end.trajectory][:4] == [
        "system",
        "user",
        "assistant",
        "user",
    ]
    assert len(end.trajectory) == 9
    assert await store.load("user-1", "chat-1") is None


async def test_another_user_in_the_same_chat_id_starts_from_round_one(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    await until_round(
        research(
            PLAN, ScriptedModel(visit(page(1))), lambda _: Pages(), SourceLedger(),
            checkpointer=checkpointer(store),
        ),
        2,
    )  # fmt: skip
    assert await checkpointer(store, owner="user-2").resume() is None
    assert await checkpointer(store).resume() is not None


async def test_another_question_in_the_chat_starts_afresh(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    await until_round(
        research(
            PLAN, ScriptedModel(visit(page(1))), lambda _: Pages(), SourceLedger(),
            checkpointer=checkpointer(store),
        ),
        2,
    )  # fmt: skip
    other = Checkpointer(store, RunKey("user-1", "chat-1", "Another question?"))
    assert await other.resume() is None


async def test_a_run_an_error_ended_stays_resumable(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    model = ScriptedModel(visit(page(1)), ModelError("server down"))
    events = [
        event
        async for event in research(
            PLAN, model, lambda _: Pages(), SourceLedger(),
            checkpointer=checkpointer(store),
        )
    ]  # fmt: skip
    end = events[-1]
    assert isinstance(end, RunFinished) and end.reason == "error"
    saved = await checkpointer(store).resume()
    assert saved is not None and saved.state.round == 1


async def test_a_damaged_checkpoint_is_said_and_removed(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    await store.save("user-1", "chat-1", b'{"format": "tongyi-deepresearch-check')
    keeper = checkpointer(store)
    assert await keeper.resume() is None
    assert keeper.notes == ["Saved progress was not used: it is not JSON."]
    assert await store.load("user-1", "chat-1") is None


class FullDisk(DirectoryStore):
    """A store whose every save fails, as on a full disk."""

    async def save(self, owner: str, chat: str, data: bytes) -> None:
        raise OSError(28, "No space left on device")


async def test_a_store_that_cannot_save_is_said_once_and_the_run_goes_on(
    tmp_path: Path,
):
    model = ScriptedModel(visit(page(1)), visit(page(2)), "<answer>\nDone.\n</answer>")
    events = [
        event
        async for event in research(
            PLAN, model, lambda _: Pages(), SourceLedger(),
            checkpointer=checkpointer(FullDisk(tmp_path)),
        )
    ]  # fmt: skip
    warnings = [e.text for e in events if isinstance(e, ContextWarning)]
    assert warnings == [
        "Progress could not be saved (OSError); the research goes on, but "
        "cannot be resumed if interrupted."
    ]
    end = events[-1]
    assert isinstance(end, RunFinished) and (end.reason, end.answer) == (
        "answer",
        "Done.",
    )


class GatedStore:
    """A store in memory whose every save waits in a worker thread for ``gate``.

    Loading and removing run on the event loop, so a run's cancellation
    (and the front end's `finish` after it) needs nothing but the loop.
    ``log`` says what landed, in order.
    """

    def __init__(self) -> None:
        self.kept: dict[tuple[str, str], bytes] = {}
        self.log: list[str] = []
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.landed = threading.Event()

    async def load(self, owner: str, chat: str) -> bytes | None:
        return self.kept.get((owner, chat))

    async def save(self, owner: str, chat: str, data: bytes) -> None:
        await asyncio.to_thread(self._save, owner, chat, data)

    def _save(self, owner: str, chat: str, data: bytes) -> None:
        self.entered.set()
        self.gate.wait(30)
        self.kept[(owner, chat)] = data
        self.log.append("saved")
        self.landed.set()

    async def remove(self, owner: str, chat: str) -> None:
        self.kept.pop((owner, chat), None)
        self.log.append("removed")

    async def expire(self, older_than: float) -> int:
        return 0


class GatedBlockingStore(GatedStore):
    """`GatedStore` that also saves from the engine's worker thread itself."""

    async def save(self, owner: str, chat: str, data: bytes) -> None:
        await asyncio.to_thread(self.save_blocking, owner, chat, data)

    def save_blocking(self, owner: str, chat: str, data: bytes) -> None:
        self._save(owner, chat, data)


@pytest.mark.parametrize("store_kind", [GatedStore, GatedBlockingStore])
async def test_a_run_stopped_while_a_save_is_written_forgets_it_after_it_lands(
    store_kind: type[GatedStore],
):
    store = store_kind()
    keeper = Checkpointer(store, RunKey("user-1", "chat-1", QUESTION))
    model = ScriptedModel(visit(page(1)), visit(page(2)))

    async def stopped_as_the_pipe_stops() -> None:
        events = research(
            PLAN, model, lambda _: Pages(), SourceLedger(), checkpointer=keeper
        )
        try:
            async with contextlib.aclosing(events):
                async for _ in events:
                    pass
        except asyncio.CancelledError:
            await keeper.finish()  # Stop: the run's progress is forgotten
            raise

    task = asyncio.create_task(stopped_as_the_pipe_stops())
    # The save before round 2 is in its thread, held there.
    assert await asyncio.to_thread(store.entered.wait, 30)
    task.cancel()
    # Everything the cancellation does without the write runs on the loop:
    # give it every turn it could take before the write is let through.
    for _ in range(100):
        await asyncio.sleep(0)
    store.gate.set()
    assert await asyncio.to_thread(store.landed.wait, 30)
    with pytest.raises(asyncio.CancelledError):
        await task
    # The write landed before the run ended and its progress was removed.
    assert store.log == ["saved", "removed"]
    assert store.kept == {}
    assert len(model.seen) == 1  # round 2 was never asked
