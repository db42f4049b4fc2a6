"""A research goes on on the other replica when the one running it is killed.

The two replicas share PostgreSQL, where the pipe keeps each run's progress.
The scripted research of `tests.e2e.durable_research` (six rounds reading one
page each, then the answer) is asked in a saved chat through replica A; when
the fake model receives the request for round 4, A's whole process group is
killed with SIGKILL. The checkpoint of rounds 1 to 3 is then in PostgreSQL.
The user regenerates the answer through replica B: the research goes on from
round 4 there. The model is asked for round 4 again (the round in flight)
with the conversation it was sent before the kill, never for rounds 1 to 3;
pages 1 to 3 are neither fetched nor read again; the saved answer says it
resumed from round 4, keeps the sources' numbers and cites pages read on
both replicas; no checkpoint is left.

Named to run after the tests that read the replicas' setup logs (A is
started again afterwards, with a fresh log) and before test_zz_update_once.
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
    regenerate,
)
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.pages import PageSite
from tongyi_deepresearch_openwebui_pipeline.adapters.checkpoint_store import (
    TABLE_NAME,
)

from .cluster import Cluster, Replica, SocketWatch, saved_message

pytestmark = [pytest.mark.scaled, pytest.mark.timeout(900)]

#: Rounds 1-3 finish on A; the request for this one finds A killed.
KILLED_IN_ROUND = 4
#: Never reached by a passing test; bounds a failing one.
PATIENCE = 180.0
KILLED = "on replica A, until it is killed"
RESUMED = "regenerated on replica B"


def _kill(replica: Replica) -> None:
    """SIGKILL the replica's whole process group, as the OOM killer would."""
    process = replica.server.process
    assert process is not None
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)
    replica.server.keep_log(f"open-webui-scaled-{replica.name}-killed.log")


def _checkpoints(cluster: Cluster) -> list[list[str]]:
    """The (user id, chat id) of every checkpoint in the shared PostgreSQL."""
    (exists,) = cluster.postgres.sql(f"SELECT to_regclass('{TABLE_NAME}') IS NULL")
    if exists == ["t"]:
        return []  # the pipe never saved anything
    return cluster.postgres.sql(f"SELECT owner, chat FROM {TABLE_NAME}")  # noqa: S608


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


async def test_the_other_replica_goes_on_from_the_last_finished_round(
    cluster: Cluster, fake_model: FakeOpenAI, page_site: PageSite
) -> None:
    a, b = cluster.a, cluster.b
    research = DurableResearch(page_site, "replicas", KILLED_IN_ROUND, PATIENCE)
    fake_model.respond_with(research)
    owner = str(b.api.get("/api/v1/auths/")["id"])
    fetches = [research.fetches()]
    try:
        # The browser's session is on B; the chat's request goes to A.
        async with SocketWatch(b, cluster.token) as watch:
            research.phase = KILLED
            killed = await ask_in_new_chat(a.api, watch.sid, QUESTION, PATIENCE)
            reached = await asyncio.to_thread(research.held.wait, PATIENCE)
            assert reached, a.server.log_tail()
            _kill(a)
            research.release.set()
            fetches.append(research.fetches())
            assert _checkpoints(cluster) == [[owner, killed.chat_id]]

            research.phase = RESUMED
            resumed = await regenerate(b.api, watch.sid, killed, PATIENCE)
            await watch.wait_for(
                _finished(resumed.message_id), PATIENCE, "the resumed answer's end"
            )
        message = await saved_message(b.api, resumed.chat_id, resumed.message_id)
        fetches.append(research.fetches())
    finally:
        fake_model.responder = None
        research.release.set()
        if not a.server.running():
            a.server.start()

    # The regenerated run, on replica B, read only what A had not (its
    # citation check quoting the evidence A read).
    assert_resumed_research(
        research,
        message,
        killed=KILLED,
        resumed=RESUMED,
        fetched_until_kill=difference(fetches[1], fetches[0]),
        fetched_after=difference(fetches[2], fetches[1]),
    )
    assert _checkpoints(cluster) == []
