"""Stopping a chat at every stage leaves nothing behind.

Open WebUI stops a chat by cancelling the task that consumes the pipe's
generator. These tests do the same while the run waits on each outside party
(the model streaming or not yet answering, a retry wait, the search engine, a
web page, the extractor), then check that:

- no task of the run is left (``asyncio.all_tasks()`` before and after);
- every fake server sees its client leave: each holding route is released by
  the client hanging up, not by the server stopping, and ``open_connections``
  drops to 0 while the servers still run;
- no handler thread outlives its server;
- the same `Pipe` instance answers the next chat normally.

The servers' holds end only when the client closes its socket
(tests/fakes/client_watch.py), so a connection left open fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

import pytest

from tests.fakes.client_watch import ClientWatch
from tests.fakes.events import Events
from tests.fakes.http import LocalServer
from tests.fakes.openai_server import FakeOpenAI, Reply, StreamGate, answer, tool_call
from tests.fakes.pages import PageSite
from tests.fakes.searxng import FakeSearXNG
from tests.fakes.waits import Waits
from tests.test_faults import (
    QUESTION,
    Router,
    assert_ended,
    chat,
    real_tools_pipe,
    search_tools,
    visit_tools,
    visit_turns,
)
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe
from tongyi_deepresearch_openwebui_pipeline.tools import visit_tool

#: Longest a stage may take to be reached, and a cancelled run to clean up.
WAIT_SECONDS = 10.0
NEXT_ANSWER = "The next chat works."


@pytest.fixture(autouse=True)
def _no_cached_pages() -> Iterator[None]:
    visit_tool._PAGE_CACHE.clear()
    yield
    visit_tool._PAGE_CACHE.clear()


def handler_threads() -> set[threading.Thread]:
    """Threads currently running a LocalServer request handler."""
    return {
        thread
        for thread in threading.enumerate()
        if thread.name.endswith("(process_request_thread)") and thread.is_alive()
    }


@contextlib.contextmanager
def no_handler_thread_survives() -> Iterator[None]:
    """On exit (after the servers stopped), every new handler thread is gone."""
    before = handler_threads()
    yield
    for _ in range(100):
        if not handler_threads() - before:
            break
        threading.Event().wait(0.02)
    assert handler_threads() - before == set()


async def eventually(condition: Callable[[], bool], what: str) -> None:
    """Wait (briefly, polling) until ``condition()`` holds."""
    async with asyncio.timeout(WAIT_SECONDS):
        while not condition():
            await asyncio.sleep(0.01)
    assert condition(), what


class Run:
    """One chat consumed in a task, as Open WebUI runs it, that can be stopped."""

    def __init__(self, pipe: Pipe) -> None:
        self.pipe = pipe
        self.chunks: list[str] = []
        self.events = Events()
        self.before = asyncio.all_tasks()
        self.task = asyncio.create_task(self._consume())

    async def _consume(self) -> None:
        body = {"messages": QUESTION, "stream": True}
        async for chunk in self.pipe.pipe(
            body,
            __user__={"id": "u1"},
            __event_emitter__=self.events,
            __chat_id__="c1",
        ):
            self.chunks.append(chunk)

    async def stop_when(self, condition: Callable[[], bool], stage: str) -> None:
        """Cancel the chat once ``condition()`` holds (the stage is reached)."""
        await eventually(lambda: condition() or self.task.done(), stage)
        assert not self.task.done(), f"the run ended before {stage}"
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task

        def leftover() -> set[asyncio.Task[Any]]:
            return asyncio.all_tasks() - self.before - {asyncio.current_task()}

        with contextlib.suppress(TimeoutError):
            await eventually(lambda: not leftover(), "tasks to finish")
        assert leftover() == set()


async def assert_clients_left(
    servers: list[LocalServer], watches: list[ClientWatch]
) -> None:
    """Every server is idle and every hold was ended by its client, not by stop."""
    with contextlib.suppress(TimeoutError):
        await eventually(
            lambda: all(s.open_connections == 0 for s in servers), "connections"
        )
    assert [s.open_connections for s in servers] == [0] * len(servers)
    for watch in watches:
        assert watch.released_by, "the stage under test was never reached"
        assert set(watch.released_by) == {"client left"}


async def assert_next_chat_works(pipe: Pipe, fake: FakeOpenAI) -> None:
    fake.respond_with(lambda _body: Reply(content=answer(NEXT_ANSWER)))
    text, _, events = await chat(pipe)
    assert NEXT_ANSWER in text
    assert_ended(events)


async def test_stop_while_the_model_streams_its_reply() -> None:
    with no_handler_thread_survives(), FakeOpenAI() as fake:
        # The server holds the rest of the reply until the client leaves: the
        # chat is stopped mid-stream however fast or slow the machine is.
        gate = StreamGate(
            after="word word word",
            client_gone=ClientWatch(fake.server).connection_closed,
        )
        long_answer = answer("word " * 2000)
        fake.script(Reply(content=long_answer, chunk_size=2, gates=(gate,)))
        pipe = real_tools_pipe(fake, {})
        run = Run(pipe)
        await run.stop_when(
            lambda: gate.reached.is_set() and "word word" in "".join(run.chunks),
            "streaming",
        )
        await assert_clients_left([fake.server], [])
        assert gate.released_by == "client left"
        streamed = "".join(run.chunks).count("word")
        assert 0 < streamed < 2000  # stopped in the middle
        # The last status line says so and is done (it no longer spins).
        assert run.events.ending == "Stopped"
        await assert_next_chat_works(pipe, fake)


async def test_stop_while_the_model_has_not_answered_yet() -> None:
    with no_handler_thread_survives(), FakeOpenAI() as fake:
        watch = ClientWatch(fake.server)

        def hold(_body: dict[str, Any]) -> Reply:
            watch.hold()
            return Reply(status=503)

        fake.respond_with(hold)
        pipe = real_tools_pipe(fake, {})
        run = Run(pipe)
        await run.stop_when(watch.arrived.is_set, "the model request")
        await assert_clients_left([fake.server], [watch])
        await assert_next_chat_works(pipe, fake)


async def test_stop_while_waiting_to_retry_the_model() -> None:
    with no_handler_thread_survives(), FakeOpenAI() as fake:
        # The run's back-off holds until the run is stopped.
        fake.respond_with(lambda _b: Reply(status=429, headers={"Retry-After": "30"}))
        waits = Waits(hold=True)
        pipe = real_tools_pipe(fake, {}, waits, MAX_RETRIES=3)
        run = Run(pipe)

        def retrying() -> bool:
            return waits == [30.0] and any(
                "retrying 2/3 in 30 s" in status.get("description", "")
                for status in run.events.statuses()
            )

        await run.stop_when(retrying, "the retry wait")
        await assert_clients_left([fake.server], [])
        assert len(fake.bodies) == 1
        waits.hold = False
        await assert_next_chat_works(pipe, fake)


async def test_stop_while_the_search_engine_holds_the_query() -> None:
    with no_handler_thread_survives(), FakeSearXNG() as engine, FakeOpenAI() as fake:
        watch = ClientWatch(engine)
        engine.routes["/search"] = watch.holding_route()
        fake.respond_with(
            Router([Reply(content=tool_call("search", {"query": ["plants"]}))])
        )
        pipe = real_tools_pipe(fake, search_tools(engine))
        run = Run(pipe)
        await run.stop_when(watch.arrived.is_set, "the search")
        await assert_clients_left([engine, fake.server], [watch])
        await assert_next_chat_works(pipe, fake)


async def test_stop_while_a_page_is_being_read() -> None:
    with no_handler_thread_survives(), PageSite() as site, FakeOpenAI() as fake:
        watch = ClientWatch(site.server)
        site.server.routes["/held"] = watch.holding_route()
        router = Router(visit_turns(site.url("/held")))
        fake.respond_with(router)
        pipe = real_tools_pipe(fake, visit_tools(PAGE_TIMEOUT_SECONDS=60))
        run = Run(pipe)
        await run.stop_when(watch.arrived.is_set, "the page read")
        await assert_clients_left([site.server, fake.server], [watch])
        assert router.extractor_bodies == []
        await assert_next_chat_works(pipe, fake)


async def test_stop_while_the_extractor_holds_the_page() -> None:
    with no_handler_thread_survives(), PageSite() as site, FakeOpenAI() as fake:
        watch = ClientWatch(fake.server)

        def held_extractor(_body: dict[str, Any]) -> Reply:
            watch.hold()
            return Reply(status=503)

        router = Router(visit_turns(site.url("/article")), extractor=held_extractor)
        fake.respond_with(router)
        pipe = real_tools_pipe(fake, visit_tools())
        run = Run(pipe)
        await run.stop_when(watch.arrived.is_set, "the extraction")
        await assert_clients_left([site.server, fake.server], [watch])
        assert len(router.extractor_bodies) == 1
        await assert_next_chat_works(pipe, fake)


async def test_stop_while_several_pages_and_searches_are_in_flight() -> None:
    servers = (FakeSearXNG(), PageSite(), FakeOpenAI())
    engine, site, fake = servers
    with no_handler_thread_survives(), engine, site, fake:
        engine_watch, site_watch = ClientWatch(engine), ClientWatch(site.server)
        engine.routes["/search"] = engine_watch.holding_route()
        site.server.routes["/held"] = site_watch.holding_route()
        pages = [site.url(f"/held/{n}") for n in range(3)]
        fake.respond_with(
            Router(
                [
                    Reply(
                        content=tool_call("search", {"query": ["a", "b"]})
                        + "\n"
                        + tool_call("visit", {"url": pages, "goal": "g"})
                    )
                ]
            )
        )
        classes = {
            "search": search_tools(engine)["search"],
            "visit": visit_tools(PAGE_TIMEOUT_SECONDS=60)["visit"],
        }
        pipe = real_tools_pipe(fake, classes)
        run = Run(pipe)
        await run.stop_when(
            lambda: engine_watch.holding == 2 and site_watch.holding == 3,
            "two searches and three pages",
        )
        await assert_clients_left(
            [engine, site.server, fake.server], [engine_watch, site_watch]
        )
        assert len(engine_watch.released_by) == 2
        assert len(site_watch.released_by) == 3
        await assert_next_chat_works(pipe, fake)


# -- closing the outermost generator only ---------------------------------------------
#
# Open WebUI's middleware may end a response by calling ``aclose()`` on its own
# wrapper around the pipe's generator, so only the outermost generator is told.
# The generators under it (Pipe._turn -> _research -> research() -> the run ->
# ResearchLoop.run -> the model stream) must be closed by that call, before it
# returns, not later by garbage collection. The proof: right after ``aclose()``
# returns, the test blocks the event loop (so nothing else can run on it) and
# the fake model server must see the client leave all the same; without
# `contextlib.aclosing` the inner generators would only be closed by the event
# loop's async-generator finalizer, in tasks that run after aclose() returned.

HEAVY = "tongyi_deepresearch.tongyi-deepresearch-heavy"


def blocking_wait(condition: Callable[[], bool]) -> bool:
    """Wait for ``condition()`` WITHOUT running the event loop (upper bound only)."""
    for _ in range(int(WAIT_SECONDS / 0.02)):
        if condition():
            return True
        threading.Event().wait(0.02)
    return condition()


def open_chat(
    pipe: Pipe, model: str | None = None
) -> tuple[AsyncGenerator[str, None], list[str]]:
    """The pipe's generator for one chat, as Open WebUI holds it, and its output."""
    body: dict[str, Any] = {"messages": QUESTION, "stream": True}
    if model is not None:
        body["model"] = model

    chat = pipe.pipe(
        body, __user__={"id": "u1"}, __event_emitter__=Events(), __chat_id__="c1"
    )
    return chat, []


async def read_until(
    chat: AsyncGenerator[str, None], chunks: list[str], condition: Callable[[], bool]
) -> None:
    """Read the chat's chunks until ``condition()`` holds (it then rests at a yield)."""
    async with asyncio.timeout(WAIT_SECONDS):
        while not condition():
            chunks.append(await anext(chat))


async def test_closing_the_outermost_generator_closes_the_whole_chain() -> None:
    with no_handler_thread_survives(), FakeOpenAI() as fake:
        gate = StreamGate(
            after="word word word",
            client_gone=ClientWatch(fake.server).connection_closed,
        )
        fake.script(Reply(content=answer("word " * 2000), chunk_size=2, gates=(gate,)))
        pipe = real_tools_pipe(fake, {})
        before = asyncio.all_tasks()
        chat, chunks = open_chat(pipe)
        await read_until(chat, chunks, lambda: "word word" in "".join(chunks))
        # The chat rests at a yield; the server holds the rest of the reply.
        assert await asyncio.to_thread(gate.reached.wait, WAIT_SECONDS)
        async with asyncio.timeout(WAIT_SECONDS):
            await chat.aclose()  # the outermost generator only
        # Nothing runs on the loop while this waits: the connection was closed
        # inside aclose(), or the server never sees the client leave.
        assert blocking_wait(lambda: bool(gate.released_by)), "the model stream is open"
        assert gate.released_by == "client left"

        def leftover() -> set[asyncio.Task[Any]]:
            return asyncio.all_tasks() - before - {asyncio.current_task()}

        with contextlib.suppress(TimeoutError):
            await eventually(lambda: not leftover(), "tasks to finish")
        assert leftover() == set()
        await assert_clients_left([fake.server], [])
        assert 0 < "".join(chunks).count("word") < 2000
        await assert_next_chat_works(pipe, fake)


async def test_closing_the_outermost_generator_stops_every_rollout() -> None:
    """Heavy: one rollout has answered, the other's request is held; aclose()."""
    with no_handler_thread_survives(), FakeOpenAI() as fake:
        watch = ClientWatch(fake.server)
        answered = threading.Lock()
        first = [True]

        def respond(_body: dict[str, Any]) -> Reply:
            with answered:
                mine, first[0] = first[0], False
            if mine:
                return Reply(content=answer("Rollout one says Ada."))
            watch.hold()  # the other rollout: until its client leaves
            return Reply(content=answer("too late"))

        fake.respond_with(respond)
        pipe = real_tools_pipe(fake, {}, HEAVY_ENABLED=True, HEAVY_ROLLOUTS=2)
        before = asyncio.all_tasks()
        chat, chunks = open_chat(pipe, HEAVY)
        # The finished rollout's block comes out while the other one is held.
        await read_until(
            chat, chunks, lambda: "Rollout one says Ada." in "".join(chunks)
        )
        assert await asyncio.to_thread(watch.arrived.wait, WAIT_SECONDS)
        async with asyncio.timeout(WAIT_SECONDS):
            await chat.aclose()
        # Right after aclose(), before the loop runs anything else: the rollout
        # tasks were cancelled and awaited inside it.
        assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()
        assert blocking_wait(lambda: bool(watch.released_by)), "a rollout's request"
        await assert_clients_left([fake.server], [watch])
        await assert_next_chat_works(pipe, fake)
