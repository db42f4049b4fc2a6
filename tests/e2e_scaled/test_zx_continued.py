"""A research goes on by itself on the other replica when the one running it dies.

The two replicas share PostgreSQL, where the pipe keeps each run's progress
and its lease. For this test the pipe's runs hold a lease of 5 seconds
(RUN_LEASE_SECONDS, set through the valves API, put back afterwards), and
replica B lists its models once they are set (which is how Open WebUI loads
the pipe, whose first listing starts taking up the runs left behind). The
scripted research of `tests.e2e.durable_research` (six rounds reading one
page each, then the answer) is asked in a saved chat through replica A, the
browser's socket session being on B; when the fake model receives the
request for round 4, A's whole process group is killed with SIGKILL. Nobody
asks again and nobody regenerates: B takes the run up once A's lease has
lapsed. The model is asked for round 4 again (the round in flight) with the
conversation it was sent before the kill, never for rounds 1 to 3; pages 1
to 3 are neither fetched nor read again; B's session sees the answer end;
the original message is stored done, says it resumed from round 4, keeps the
sources' numbers and cites pages read on both replicas; no checkpoint and no
lease is left.

Named to run after the tests that read the replicas' setup logs (A is
started again afterwards, with a fresh log) and before test_zy_durable and
test_zz_update_once.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import pytest

from tests.e2e.durable_research import (
    QUESTION,
    DurableResearch,
    ask_in_new_chat,
    assert_resumed_research,
    difference,
)
from tests.e2e.owui import FUNCTION_ID, PIPE_MODEL_ID
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.pages import PageSite
from tongyi_deepresearch_openwebui_pipeline.adapters import (
    checkpoint_store,
    run_leases,
)

from .cluster import Cluster, Replica, SocketWatch, saved_message
from .conftest import pipe_valves

pytestmark = [pytest.mark.scaled, pytest.mark.timeout(900)]

#: Rounds 1-3 finish on A; the request for this one finds A killed.
KILLED_IN_ROUND = 4
#: The runs' lease (the valve's least): A's lapses seconds after its death.
LEASE_SECONDS = 5
#: Never reached by a passing test; bounds a failing one.
PATIENCE = 180.0
KILLED = "on replica A, until it is killed"
CONTINUED = "going on by itself on replica B"
VALVES = f"/api/v1/functions/id/{FUNCTION_ID}/valves/update"


def _kill(replica: Replica) -> None:
    """SIGKILL the replica's whole process group, as the OOM killer would."""
    process = replica.server.process
    assert process is not None
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)
    replica.server.keep_log(f"open-webui-scaled-{replica.name}-killed.log")


def _rows(cluster: Cluster, table: str) -> list[list[str]]:
    """The (user id, chat id) of every row of ``table`` in the shared PostgreSQL."""
    (absent,) = cluster.postgres.sql(f"SELECT to_regclass('{table}') IS NULL")
    if absent == ["t"]:
        return []  # the pipe never wrote one
    return cluster.postgres.sql(f"SELECT owner, chat FROM {table}")  # noqa: S608


def _finished(message_id: str) -> Callable[[SocketWatch], bool]:
    """Whether a session saw the answer ``message_id`` end."""

    def seen(watch: SocketWatch) -> bool:
        return any(
            event.get("message_id") == message_id
            and (payload := event.get("data") or {}).get("type") == "chat:completion"
            and (payload.get("data") or {}).get("done")
            for event in watch.events
        )

    return seen


def _final_content(watch: SocketWatch, message_id: str) -> list[str]:
    """The ``content`` of each end of the answer ``message_id`` the session saw."""
    return [
        str(update.get("content"))
        for event in watch.events
        if event.get("message_id") == message_id
        and (payload := event.get("data") or {}).get("type") == "chat:completion"
        and isinstance(update := payload.get("data"), dict)
        and update.get("done")
    ]


async def test_the_other_replica_goes_on_by_itself_from_the_last_finished_round(
    cluster: Cluster, fake_model: FakeOpenAI, page_site: PageSite
) -> None:
    a, b = cluster.a, cluster.b
    research = DurableResearch(page_site, "continued", KILLED_IN_ROUND, PATIENCE)
    fake_model.respond_with(research)
    fetches = [research.fetches()]
    short_lease = {
        **pipe_valves(fake_model),
        "CONTINUE_AFTER_RESTART": True,
        "RUN_LEASE_SECONDS": LEASE_SECONDS,
    }
    try:
        await asyncio.to_thread(a.api.post, VALVES, short_lease)
        # B lists its models: its pipe is loaded, with the valves just set.
        listed = await asyncio.to_thread(b.api.models)
        assert PIPE_MODEL_ID in [str(model["id"]) for model in listed]
        # The browser's session is on B; the chat's request goes to A.
        async with SocketWatch(b, cluster.token) as watch:
            research.phase = KILLED
            killed = await ask_in_new_chat(a.api, watch.sid, QUESTION, PATIENCE)
            reached = await asyncio.to_thread(research.held.wait, PATIENCE)
            assert reached, a.server.log_tail()
            # A waits for round 4's reply: every later request is B's.
            research.phase = CONTINUED
            _kill(a)
            research.release.set()
            fetches.append(research.fetches())
            await watch.wait_for(
                _finished(killed.message_id), PATIENCE, "the continued answer's end"
            )
        message = await saved_message(b.api, killed.chat_id, killed.message_id)
        fetches.append(research.fetches())
    finally:
        fake_model.responder = None
        research.release.set()
        await asyncio.to_thread(b.api.post, VALVES, pipe_valves(fake_model))
        if not a.server.running():
            a.server.start()
    content = str(message["content"])

    # The continued run, on replica B, read only what A had not (its citation
    # check quoting the evidence A read).
    assert_resumed_research(
        research,
        message,
        killed=KILLED,
        resumed=CONTINUED,
        fetched_until_kill=difference(fetches[1], fetches[0]),
        fetched_after=difference(fetches[2], fetches[1]),
    )
    # The original message holds the whole answer, finished; B's session was
    # told its final text once.
    assert message["done"] is True
    assert _final_content(watch, killed.message_id) == [content]
    assert _rows(cluster, checkpoint_store.TABLE_NAME) == []
    assert _rows(cluster, run_leases.TABLE_NAME) == []
