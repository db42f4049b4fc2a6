"""A chat's research goes on by itself when the process running it went away.

Two pipes stand for two Open WebUI processes (or one, before and after a
restart): they share a checkpoint store (a directory, the pipe's seam), a
lease table on a real SQLite database, the model server (a local fake
streaming real SSE) and the host the chat's message is written through (a
recorder, the pipe's ``host`` seam). Process A's run is cut off in round 3;
process B lists its models (which is how Open WebUI loads a pipe) and takes
the run up without any chat request: the model is asked only for the round
in flight, and the original message gets the answer, marked done.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from tests.fakes.chat import drive, fake_tools, make_pipe
from tests.fakes.events import Events
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.test_pipe_durable import PAGE_1, PAGE_2, QUESTION, research
from tongyi_deepresearch_openwebui_pipeline.adapters import secrets
from tongyi_deepresearch_openwebui_pipeline.adapters.checkpoint_store import (
    DirectoryStore,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.continuation import (
    Continuer,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.emitter import Emitter
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.host import KnownSources
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.render import (
    stored_form,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.run_leases import (
    TABLE_NAME,
    LeaseTable,
)
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import TAKEN_OVER_STATUS, Pipe

#: Generous bound of every wait (never reached by a passing test).
PATIENCE = 60.0
RESUMING = (
    "*Resuming the research from round 3: 2 rounds and 2 pages read before "
    "the interruption are kept.*"
)
ANSWER_SHOWN = f"The Pharos [1]({PAGE_1}) [1], then the Tower [2]({PAGE_2}) [2]."


class Host:
    """The chat store and the browser, as a continued research sees them."""

    def __init__(self) -> None:
        """Every message exists; nothing written yet."""
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.done: list[tuple[str, str]] = []
        self.deleted: set[str] = set()
        self.tasks: list[asyncio.Task[None]] = []
        self.finished = asyncio.Event()
        #: Called with each event (a test's trigger).
        self.on_event: Any = None

    async def message_exists(self, user_id: str, chat_id: str, message_id: str) -> bool:
        """False for a message the test deleted, or in another user's chat."""
        return message_id not in self.deleted and user_id in self.owners

    #: The users whose chats these are.
    owners = frozenset({"u1"})

    async def emitter(self, user_id: str, chat_id: str, message_id: str) -> Emitter:
        """A recorder of the events that message receives."""
        received = self.events.setdefault(message_id, [])

        async def emit(event: dict[str, Any]) -> None:
            received.append(event)
            if self.on_event is not None:
                self.on_event(event)

        return emit

    async def mark_done(self, chat_id: str, message_id: str) -> None:
        """Note it; the test waits on `finished`."""
        self.done.append((chat_id, message_id))
        self.finished.set()

    async def start(
        self, work: Coroutine[Any, Any, None], chat_id: str
    ) -> asyncio.Task[None]:
        """A plain task, kept for the test to cancel."""
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.append(task)
        return task

    def contents(self, message_id: str) -> list[str]:
        """What each "replace" of the message wrote, in order."""
        return [
            e["data"]["content"]
            for e in self.events.get(message_id, [])
            if e["type"] == "replace"
        ]


class Deployment:
    """What the processes share: checkpoints, leases, the model, the host."""

    def __init__(self, tmp_path: Path, fake: FakeOpenAI) -> None:
        """Stores under ``tmp_path``; the model is ``fake``."""
        self.store = DirectoryStore(tmp_path / "checkpoints")
        engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'webui.db'}")
        self.engine = engine
        self.leases = LeaseTable(engine)
        self.fake = fake
        self.host = Host()

    def process(self, *, restarting: bool = False) -> Pipe:
        """One Open WebUI process's pipe (``restarting``: being stopped)."""
        pipe = Pipe(
            tool_resolver=fake_tools(),
            checkpoints=lambda: self.store,
            shutting_down=lambda: restarting,
            leases=lambda: self.leases,
            host=self.host,
        )
        # The shortest lease: a takeover is noticed within 5/3 s.
        return make_pipe(self.fake, pipe, CITATION_CHECK=False, RUN_LEASE_SECONDS=5.0)

    def lease_rows(self) -> list[tuple[str, str]]:
        if not sqlalchemy.inspect(self.engine).has_table(TABLE_NAME):
            return []  # never written
        query = f"SELECT owner, chat FROM {TABLE_NAME}"  # noqa: S608
        with self.engine.connect() as connection:
            return [(str(o), str(c)) for o, c in connection.exec_driver_sql(query)]

    def research_requests(self) -> list[int]:
        """How many messages each research request carried, in order."""
        bodies = self.fake.bodies
        return [len(body["messages"]) for body in bodies if body.get("stream")]


@pytest.fixture
def deployment(tmp_path: Path) -> Any:
    with FakeOpenAI() as fake:
        fake.respond_with(research)
        yield Deployment(tmp_path, fake)


async def cut_off_in_round(pipe: Pipe, number: int, message_id: str = "m-1") -> None:
    """Ask in a saved chat as Open WebUI does; close it as round ``number`` starts."""
    events = Events()
    chat = pipe.pipe(
        {"model": "tongyi.tongyi-deepresearch", "messages": QUESTION, "stream": True},
        __user__={"id": "u1", "role": "user", "name": "U"},
        __event_emitter__=events,
        __chat_id__="chat-1",
        __metadata__={"chat_id": "chat-1", "message_id": message_id},
    )
    async for _ in chat:
        if any(d.startswith(f"Round {number}/") for d in events.descriptions()):
            break
    await chat.aclose()


async def continued(pipe: Pipe, host: Host) -> Continuer:
    """``pipe``'s process lists its models; wait until its continuer ends a run."""
    assert pipe.pipes()  # Open WebUI loads the pipe to list its models
    continuer = pipe.start_continuing()
    assert continuer is not None
    await asyncio.wait_for(host.finished.wait(), PATIENCE)
    return continuer


async def test_a_run_cut_off_by_a_restart_goes_on_by_itself_in_its_message(
    deployment: Deployment,
):
    await cut_off_in_round(deployment.process(restarting=True), 3)
    before = deployment.research_requests()
    assert deployment.lease_rows() == [("u1", "chat-1")]  # lapsed, kept

    continuer = await continued(deployment.process(), deployment.host)
    continuer.cancel()
    await asyncio.gather(*deployment.host.tasks)
    after = deployment.research_requests()[len(before) :]

    # Rounds 1-2 were done, round 3 was in flight: only round 3 is asked again.
    assert before == [2, 4, 6]
    assert after == [6]
    # The original message holds the resumed research, is done, and the
    # open browser is told so with the same text.
    host = deployment.host
    final = host.contents("m-1")[-1]
    assert final.splitlines()[0] == RESUMING
    assert ANSWER_SHOWN in final.splitlines()
    assert host.done == [("chat-1", "m-1")]
    assert host.events["m-1"][-1] == {
        "type": "chat:completion",
        "data": {"done": True, "content": final},
    }
    # Answered: neither progress nor lease is kept.
    assert await deployment.store.load("u1", "chat-1") is None
    assert deployment.lease_rows() == []


async def test_a_continued_run_the_user_stops_stays_stopped(deployment: Deployment):
    await cut_off_in_round(deployment.process(restarting=True), 3)
    before = len(deployment.research_requests())
    host = deployment.host

    def stop_in_round_3(event: dict[str, Any]) -> None:
        description = (event.get("data") or {}).get("description") or ""
        if event["type"] == "status" and description.startswith("Round 3/"):
            for task in host.tasks:
                task.cancel()  # the chat's Stop button cancels the chat's task

    host.on_event = stop_in_round_3
    continuer = await continued(deployment.process(), deployment.host)
    continuer.cancel()
    results = await asyncio.gather(*host.tasks, return_exceptions=True)

    assert [type(result) for result in results] == [asyncio.CancelledError]
    # Stopped: the message is done with what it had, nothing more is asked,
    # and the run's progress and lease are gone (a restart will not revive it).
    assert host.done == [("chat-1", "m-1")]
    assert deployment.research_requests()[before:] in ([], [6])
    assert await deployment.store.load("u1", "chat-1") is None
    assert deployment.lease_rows() == []


async def test_a_run_whose_message_was_deleted_is_let_go(deployment: Deployment):
    await cut_off_in_round(deployment.process(restarting=True), 3)
    before = len(deployment.research_requests())
    deployment.host.deleted.add("m-1")
    pipe = deployment.process()

    assert pipe.pipes()
    continuer = pipe.start_continuing()
    assert continuer is not None
    continuer.cancel()
    claimed = await continuer.scan_once()
    await asyncio.gather(*continuer.running)

    assert [run.chat for run in claimed] == ["chat-1"]
    assert len(deployment.research_requests()) == before  # no model call
    assert deployment.lease_rows() == []
    assert deployment.host.done == []


async def test_a_stopped_run_is_not_taken_up(deployment: Deployment):
    await cut_off_in_round(deployment.process(restarting=False), 3)  # Stop

    pipe = deployment.process()
    continuer = pipe.start_continuing()
    assert continuer is not None
    continuer.cancel()

    assert await continuer.scan_once() == []
    assert deployment.lease_rows() == []


async def test_no_lease_without_a_message_to_write_into(deployment: Deployment):
    pipe = deployment.process(restarting=True)
    events = Events()
    chat = pipe.pipe(
        {"model": "tongyi.tongyi-deepresearch", "messages": QUESTION, "stream": True},
        __user__={"id": "u1", "role": "user"},
        __event_emitter__=events,
        __chat_id__="chat-1",
        __metadata__={"chat_id": "chat-1"},  # an API call: no message id
    )
    async for _ in chat:
        if any(d.startswith("Round 2/") for d in events.descriptions()):
            break
    with contextlib.suppress(StopAsyncIteration):
        await chat.aclose()

    assert await deployment.store.load("u1", "chat-1") is not None  # resumable
    assert deployment.lease_rows() == []  # but not by itself


async def test_a_regenerate_takes_a_continued_run_over(deployment: Deployment):
    await cut_off_in_round(deployment.process(restarting=True), 3)
    reached, release = threading.Event(), threading.Event()
    held: list[int] = []

    def hold_the_first_round_3(body: dict[str, Any]) -> Reply:
        # The continuation's request for round 3 waits; the regenerated one not.
        if body.get("stream") and len(body["messages"]) == 6 and not held:
            held.append(1)
            reached.set()
            release.wait(PATIENCE)
        return research(body)

    deployment.fake.respond_with(hold_the_first_round_3)
    host = deployment.host
    process_b = deployment.process()
    assert process_b.pipes()
    continuer = process_b.start_continuing()
    assert continuer is not None
    try:
        assert await asyncio.to_thread(reached.wait, PATIENCE)
        # The user regenerates (on another replica): a new message, same chat.
        regenerated = await drive(
            deployment.process(),
            QUESTION,
            body_model="tongyi.tongyi-deepresearch",
            __metadata__={"chat_id": "chat-1", "message_id": "m-2"},
        )
        await asyncio.wait_for(host.finished.wait(), PATIENCE)
    finally:
        release.set()
        continuer.cancel()
    await asyncio.gather(*host.tasks)

    # The regenerated reply resumed from round 3 and answered ...
    assert regenerated.answer.splitlines()[0] == RESUMING
    assert ANSWER_SHOWN in regenerated.answer.splitlines()
    # ... and the continued one ended, saying where the research went on.
    assert host.contents("m-1")[-1].endswith(f"\n\n> {TAKEN_OVER_STATUS}\n")
    assert host.done == [("chat-1", "m-1")]
    assert await deployment.store.load("u1", "chat-1") is None
    assert deployment.lease_rows() == []


def test_a_continued_message_is_stored_as_open_webui_stores_a_finished_one():
    streamed = (
        "*Resuming*\n\n<think>\nweigh <the> dates\n</think>\n\nRound text"
        "<think>\nstill thinking"
    )

    # The card is the Heavy renderer's (`_reasoning_block`), blank lines around.
    assert stored_form(streamed) == (
        "*Resuming*\n\n\n\n"
        '<details type="reasoning" done="true" duration="0">\n'
        "<summary>Thought</summary>\n> weigh &lt;the&gt; dates\n</details>\n\n"
        "Round text"
    )


async def test_a_continuation_that_fails_before_its_run_starts_lets_go(
    deployment: Deployment,
):
    await cut_off_in_round(deployment.process(restarting=True), 3)
    before = len(deployment.research_requests())
    pipe = deployment.process()
    # A key Open WebUI cannot decrypt: the turn ends before the run holds
    # its own lease, so only the continuer's claim is there to let go.
    pipe.valves = pipe.Valves(
        **{**pipe.valves.model_dump(), "API_KEY": secrets.PREFIX + "not-a-key"}
    )
    continuer = pipe.start_continuing()
    assert continuer is not None
    continuer.cancel()

    claimed = await continuer.scan_once()
    await asyncio.gather(*continuer.running)
    await asyncio.gather(*deployment.host.tasks)

    assert [run.chat for run in claimed] == ["chat-1"]
    assert len(deployment.research_requests()) == before  # no model call
    # Not taken up again every lease: the claim is gone, the progress kept
    # for when the user asks again.
    assert deployment.lease_rows() == []
    assert await deployment.store.load("u1", "chat-1") is not None
    assert deployment.host.done == [("chat-1", "m-1")]


class Sent:
    """What a message's emitter passed on, and the sources it stored."""

    def __init__(self) -> None:
        """Nothing yet."""
        self.events: list[dict[str, Any]] = []
        self.kept: list[list[Any]] = []

    async def emit(self, event: dict[str, Any]) -> None:
        """Record an event sent on."""
        self.events.append(event)

    async def keep(self, sources: list[Any]) -> None:
        """Record the sources stored."""
        self.kept.append(sources)


def source(url: str) -> dict[str, Any]:
    """A source event's data as the pipe emits it (and Open WebUI stores it)."""
    return {"source": {"name": url, "url": url}, "document": ["…"], "metadata": []}


DONE = {"type": "chat:completion", "data": {"done": True, "content": "x"}}


async def test_the_sources_a_message_holds_are_not_stored_twice():
    sent = Sent()
    stored = [source("https://a.example"), source("https://b.example")]
    emit = KnownSources(sent.emit, stored, sent.keep)

    for url in ("https://a.example", "https://b.example", "https://c.example"):
        await emit({"type": "source", "data": source(url)})
    await emit(DONE)

    assert sent.events == [
        {"type": "source", "data": source("https://c.example")},
        DONE,
    ]
    assert sent.kept == []


async def test_a_round_that_went_otherwise_cuts_the_stored_sources_back():
    sent = Sent()
    stored = [source("https://a.example"), source("https://b.example")]
    emit = KnownSources(sent.emit, stored, sent.keep)

    await emit({"type": "source", "data": source("https://a.example")})
    await emit({"type": "source", "data": source("https://d.example")})

    # Page b was read in the round cut off; the round went on to d instead.
    assert sent.kept == [[source("https://a.example")]]
    assert sent.events == [{"type": "source", "data": source("https://d.example")}]


async def test_stored_sources_never_told_again_go_at_the_answer():
    sent = Sent()
    stored = [source("https://a.example"), source("https://b.example")]
    emit = KnownSources(sent.emit, stored, sent.keep)

    await emit({"type": "source", "data": source("https://a.example")})
    await emit(DONE)

    assert sent.kept == [[source("https://a.example")]]
    assert sent.events == [DONE]
