"""A chat's research outlives a killed Open WebUI, in a real Open WebUI.

A dedicated ``open-webui serve`` (its own data directory, SQLite, its own
model server; the session's server is never touched; `durable_deployment`),
whose pipe leaves the research to the user (CONTINUE_AFTER_RESTART off: the
research going on by itself is tests/e2e/test_continued.py's), runs the scripted
research of `durable_research`: rounds 1 to 6 each read one page through the
real visit tool, round 7 answers citing every page the conversation holds.
User A asks in a saved chat, the way the browser does. When the fake model
receives the request for round 4, Open WebUI's whole process group is killed
with SIGKILL (no shutdown of any kind); the checkpoint of rounds 1 to 3 is
then in the database. Open WebUI starts again on the same data directory, and:

- user B, created through the admin API, asks the same question in a chat of
  their own while A's progress is stored: B's research starts from round 1
  (its first request is the system prompt and the question) and runs every
  round, reading every page itself;
- A regenerates the answer, as the browser does: the research goes on from
  round 4. The model is asked for round 4 again (the round in flight at the
  kill) with the very conversation it was sent before the kill, and never for
  rounds 1 to 3; pages 1 to 3 are neither fetched nor read again; the stored
  answer says it resumed from round 4, keeps the sources numbered as they
  were read and cites page 1 (read before the kill) and page 6 (after);
- once both runs answered, no checkpoint is left.
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
    regenerate,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

#: Rounds 1-3 finish; the request for this one finds Open WebUI killed.
KILLED_IN_ROUND = 4
ADMIN = ("Durable Admin", "durable-admin@example.com", "e2e-Passw0rd!")
SECOND_USER = ("Durable Second", "durable-second@example.com", "e2e-Passw0rd-2!")

# The phases of the test, as the fake model records them.
KILLED = "A, until the kill"
OTHER_USER = "B, after the restart"
RESUMED = "A, regenerated after the restart"


def _valves(model: FakeOpenAI) -> dict[str, Any]:
    """The pipe's valves: a research goes on only when the user asks again.

    By itself (tests/e2e/test_continued.py) it would go on once its lease
    lapsed, at a moment that depends on the machine's speed.
    """
    return {**pipe_valves(model), "CONTINUE_AFTER_RESTART": False}


@pytest.fixture
def deployment(owui_venv_path: Path, tmp_path: Path) -> Iterator[Deployment]:
    """A running Open WebUI of its own: admin, pipe and visit tool set up."""
    with deployed(owui_venv_path, tmp_path, "durable", _valves, ADMIN) as it:
        yield it


# -- the test ----------------------------------------------------------------------


async def test_a_research_killed_in_round_4_goes_on_after_the_restart(
    deployment: Deployment, page_site: PageSite
) -> None:
    research = DurableResearch(page_site, "durable", KILLED_IN_ROUND, TIMEOUT)
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

    deployment.server.start(TIMEOUT)
    # B asks the same question while A's progress is stored.
    research.phase = OTHER_USER
    second = add_user(admin, *SECOND_USER)
    async with ui_session(second) as session:
        other = await ask_in_new_chat(second, session.sid, QUESTION, TIMEOUT)
        other_answer = await answered(second, session, other)
    fetches.append(research.fetches())
    assert deployment.checkpoints() == [(owner, killed.chat_id)]

    # A regenerates the answer in the same chat: the research goes on.
    research.phase = RESUMED
    async with ui_session(admin) as session:
        resumed = await regenerate(admin, session.sid, killed, TIMEOUT)
        message = await answered(admin, session, resumed)
    fetches.append(research.fetches())
    content = str(message["content"])

    # Rounds 1-4 before, 4 (the one in flight) to 7 after; each page read once
    # in A's research; the chat says it resumed and cites pages read before
    # and after the kill.
    assert_resumed_research(
        research,
        message,
        killed=KILLED,
        resumed=RESUMED,
        fetched_until_kill=difference(fetches[1], fetches[0]),
        fetched_after=difference(fetches[3], fetches[2]),
    )
    assert "\n- Citations: 1 of 1 statement supported by the pages it cites\n" in (
        content
    )
    # Both runs answered: nothing is kept.
    assert deployment.checkpoints() == []

    # B's research started from round 1 (system prompt and question only)
    # and did every round and read every page itself.
    first = research.conversations(OTHER_USER)[0]
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[1]["content"] == QUESTION
    assert research.turns(OTHER_USER) == list(range(PAGES + 1))
    assert difference(fetches[2], fetches[1]) == [1] * PAGES
    assert research.pages_read(OTHER_USER) == list(range(1, PAGES + 1))
    other_content = str(other_answer["content"])
    assert "Resuming the research" not in other_content
    assert research.answer_shown() in other_content.splitlines(), other_content
