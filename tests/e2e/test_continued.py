"""A research goes on by itself after Open WebUI was killed, in a real Open WebUI.

A dedicated ``open-webui serve`` (its own data directory, SQLite, its own
model server; `durable_deployment`) runs the scripted research of
`durable_research`: rounds 1 to 6 each read one page through the real visit
tool, round 7 answers citing every page the conversation holds. The pipe's
runs hold a lease of 5 seconds (RUN_LEASE_SECONDS), renewed while they live.
User A asks in a saved chat, the way the browser does. When the fake model
receives the request for round 4, Open WebUI's whole process group is killed
with SIGKILL (no shutdown of any kind): the checkpoint of rounds 1 to 3 and
the run's lease are then in the database. Open WebUI starts again on the same
data directory, and A's browser only opens Open WebUI: a socket session and
the model list (``GET /api/models``, which loads the pipe). Nobody asks,
nobody regenerates, and:

- the research goes on by itself from round 4 in the original message: the
  model is asked for round 4 again (the round in flight at the kill) with
  the very conversation it was sent before the kill, never for rounds 1 to 3;
  pages 1 to 3 are neither fetched nor read again; A's open session sees the
  answer end; the stored message is done, says it resumed from round 4,
  keeps the sources numbered as they were read (pages 1 to 6) and cites
  pages read before and after the kill;
- once it answered, no checkpoint and no lease is left;
- user B then asks the same question in a chat of their own: B's research
  starts from round 1 (the system prompt and the question) and reads every
  page itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.pages import PageSite

from .conftest import pipe_valves
from .durable_deployment import (
    TIMEOUT,
    Deployment,
    add_user,
    answered,
    deployed,
    ui_session,
)
from .durable_research import (
    PAGES,
    QUESTION,
    DurableResearch,
    ask_in_new_chat,
    assert_resumed_research,
    difference,
)
from .owui import PIPE_MODEL_ID, saved_chat

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

#: Rounds 1-3 finish; the request for this one finds Open WebUI killed.
KILLED_IN_ROUND = 4
#: The runs' lease (the valve's least): lapsed well before Open WebUI is back.
LEASE_SECONDS = 5
ADMIN = ("Continued Admin", "continued-admin@example.com", "e2e-Passw0rd!")
SECOND_USER = ("Continued Second", "continued-second@example.com", "e2e-Passw0rd-2!")

# The phases of the test, as the fake model records them.
KILLED = "A, until the kill"
CONTINUED = "A's research, going on by itself after the restart"
OTHER_USER = "B, once A's research answered"


def _valves(model: FakeOpenAI) -> dict[str, Any]:
    """The pipe's valves: runs go on by themselves, on a short lease."""
    return {
        **pipe_valves(model),
        "CONTINUE_AFTER_RESTART": True,
        "RUN_LEASE_SECONDS": LEASE_SECONDS,
    }


@pytest.fixture
def deployment(owui_venv_path: Path, tmp_path: Path) -> Iterator[Deployment]:
    """A running Open WebUI of its own: admin, pipe and visit tool set up."""
    with deployed(owui_venv_path, tmp_path, "continued", _valves, ADMIN) as it:
        yield it


async def test_a_research_killed_in_round_4_goes_on_by_itself_after_the_restart(
    deployment: Deployment, page_site: PageSite
) -> None:
    research = DurableResearch(page_site, "continued", KILLED_IN_ROUND, TIMEOUT)
    deployment.model.respond_with(research)
    admin = deployment.admin
    owner = str(admin.get("/api/v1/auths/")["id"])
    fetches = [research.fetches()]

    # A asks; Open WebUI is killed once round 4's request reaches the model.
    research.phase = KILLED
    async with ui_session(admin) as session:
        killed = await ask_in_new_chat(admin, session.sid, QUESTION, TIMEOUT)
        reached = await asyncio.to_thread(research.held.wait, TIMEOUT)
        assert reached, deployment.server.log_tail()
        deployment.kill()
    research.release.set()
    fetches.append(research.fetches())
    assert deployment.checkpoints() == [(owner, killed.chat_id)]
    assert deployment.leases() == [(owner, killed.chat_id)]

    deployment.server.start(TIMEOUT)
    # A's browser opens Open WebUI: its socket session, then the model list
    # (which loads the pipe). No chat request, no regenerate.
    research.phase = CONTINUED
    async with ui_session(admin) as session:
        listed = await asyncio.to_thread(admin.models)
        assert PIPE_MODEL_ID in [str(model["id"]) for model in listed]
        await asyncio.wait_for(session.finished(killed.message_id).wait(), TIMEOUT)
        shown = session.final[killed.message_id]
    fetches.append(research.fetches())
    chat = await saved_chat(admin, killed.chat_id, killed.message_id, timeout=30)
    message = chat["chat"]["history"]["messages"][killed.message_id]
    content = str(message["content"])

    # Rounds 1-4 before, 4 (the one in flight) to 7 after; each page read once;
    # the original message says it resumed and cites pages read before and
    # after the kill.
    assert_resumed_research(
        research,
        message,
        killed=KILLED,
        resumed=CONTINUED,
        fetched_until_kill=difference(fetches[1], fetches[0]),
        fetched_after=difference(fetches[2], fetches[1]),
    )
    # It is finished, and the open session was told its final text.
    assert message["done"] is True
    assert shown == content
    assert "\n- Citations: 1 of 1 statement supported by the pages it cites\n" in (
        content
    )
    # It answered: nothing is kept, nobody holds it.
    assert deployment.checkpoints() == []
    assert deployment.leases() == []

    # B asks the same question: a research of their own, from round 1.
    research.phase = OTHER_USER
    second = add_user(admin, *SECOND_USER)
    async with ui_session(second) as session:
        other = await ask_in_new_chat(second, session.sid, QUESTION, TIMEOUT)
        other_answer = await answered(second, session, other)
    fetches.append(research.fetches())

    first = research.conversations(OTHER_USER)[0]
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[1]["content"] == QUESTION
    assert research.turns(OTHER_USER) == list(range(PAGES + 1))
    assert difference(fetches[3], fetches[2]) == [1] * PAGES
    assert research.pages_read(OTHER_USER) == list(range(1, PAGES + 1))
    other_content = str(other_answer["content"])
    assert "Resuming the research" not in other_content
    assert research.answer_shown() in other_content.splitlines(), other_content
    assert deployment.checkpoints() == []
    assert deployment.leases() == []
