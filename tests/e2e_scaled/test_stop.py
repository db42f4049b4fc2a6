"""Stop pressed on the replica that is not running the research ends it there."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest

from tests.e2e.owui import ScriptedModel
from tests.fakes.client_watch import ClientWatch
from tests.fakes.openai_server import FakeOpenAI, Reply, StreamGate, answer

from .cluster import Cluster, Replica, SocketWatch, saved_message, start_chat

pytestmark = pytest.mark.scaled

SHOWN = "The bearings wear out because"
#: Never reached by a passing test; bounds a failing one.
PATIENCE = 180.0


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition()`` holds (checked often, bounded by PATIENCE)."""
    deadline = time.monotonic() + PATIENCE
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {PATIENCE:.0f} s")
        await asyncio.sleep(0.1)


def task_ids(replica: Replica, chat_id: str) -> list[str]:
    """``GET /api/tasks/chat/{chat_id}`` on ``replica``."""
    return list(replica.api.get(f"/api/tasks/chat/{chat_id}")["task_ids"])


def _cancel_outputs(watch: SocketWatch, chat_id: str) -> list[object]:
    """The ``output`` of each ``chat:tasks:cancel`` event of the chat.

    Only the replica whose task was cancelled sends one with the output; the
    stop endpoint sends a bare one when it found no task to stop.
    """
    return [
        data["output"]
        for event in watch.of_chat(chat_id)
        if (payload := event.get("data") or {}).get("type") == "chat:tasks:cancel"
        and isinstance(data := payload.get("data"), dict)
        and "output" in data
    ]


@pytest.mark.parametrize("runner_name", ["A", "B"])
async def test_stop_on_the_other_replica_ends_the_research_and_its_model_stream(
    cluster: Cluster,
    model: ScriptedModel,
    fake_model: FakeOpenAI,
    model_watch: ClientWatch,
    runner_name: str,
) -> None:
    runner = cluster.a if runner_name == "A" else cluster.b
    other = cluster.other(runner)
    key = f"bearing-{runner_name}"
    # The model streams the answer's start, then holds the rest until its
    # client leaves: only a research that really ends releases it.
    gate = StreamGate(
        after=SHOWN, timeout=PATIENCE, client_gone=model_watch.connection_closed
    )
    model.conversation(
        key,
        Reply(
            reasoning="The bearing studies should say.",
            content=answer(SHOWN + " long" * 3000),
            chunk_size=8,
            gates=(gate,),
        ),
    )
    marks = cluster.log_marks()

    # The browser: a session on the runner (where its chat request went) and,
    # after a reload behind the load balancer, one on the other replica.
    async with (
        SocketWatch(runner, cluster.token) as session,
        SocketWatch(other, cluster.token) as watch,
    ):
        chat_id, message_id = await start_chat(
            runner, cluster.token, session.sid, f"Why do {key} fail?"
        )
        # The research is live: its answer streams to the other replica's
        # session, the model server holds the rest, both replicas list the task.
        try:
            await watch.wait_for(
                lambda w: w.shows(SHOWN), PATIENCE, "the answer's start"
            )
        except AssertionError as error:
            # Tells a socket that missed the chat's events from a research
            # that never streamed the answer's start (model side or pipe).
            raise AssertionError(
                f"{error}\nrunner's session: {session.diagnosis()}\n"
                f"model gate reached: {gate.reached.is_set()}, released by "
                f"{gate.released_by!r}, requests: {len(model.bodies(key))}\n"
                f"event types on {other.name}: {watch.types(chat_id)}\n"
                f"on {runner.name}: {session.types(chat_id)}\n"
                f"events on {other.name}: "
                f"{json.dumps(watch.of_chat(chat_id), ensure_ascii=False)[:4000]}"
            ) from None
        assert await asyncio.to_thread(gate.reached.wait, PATIENCE)
        assert await asyncio.to_thread(task_ids, runner, chat_id)
        assert await asyncio.to_thread(task_ids, other, chat_id)
        assert gate.released_by == ""

        # Stop, pressed in the session on the replica not running the research.
        stopped = await asyncio.to_thread(
            other.api.post, f"/api/tasks/chat/{chat_id}/stop"
        )
        assert stopped["status"] is True, stopped

        # The runner cancelled the research: the pipe dropped the model's
        # stream (the server saw its client leave; not the gate's deadline,
        # not the server stopping) ...
        await until(lambda: bool(gate.released_by), "the model stream to end")
        assert gate.released_by == "client left"
        # ... and Open WebUI on the runner reported the cancelled task, with
        # the answer as far as it came, to the user's sessions on both replicas.
        for seen in (session, watch):
            await seen.wait_for(
                lambda w: bool(_cancel_outputs(w, chat_id)),
                PATIENCE,
                "the runner's chat:tasks:cancel event",
            )
            assert SHOWN in str(_cancel_outputs(seen, chat_id))

    # Nothing keeps running: no task on either replica, no open model stream,
    # the message is saved as done with the answer as far as it came.
    for replica in cluster.replicas:
        assert await asyncio.to_thread(task_ids, replica, chat_id) == [], replica.name
    await until(
        lambda: fake_model.server.open_connections == 0, "the model connection to close"
    )
    message = await saved_message(other.api, chat_id, message_id)
    assert message.get("done") is True
    assert SHOWN in str(message.get("output"))
    assert len(model.bodies(key)) == 1  # the research asked nothing more
    assert cluster.errors_since(marks) == {"A": [], "B": []}
