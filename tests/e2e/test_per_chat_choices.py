"""Per-chat choices in a real Open WebUI: the chat's tools and each user's valves.

The tools: a chat as the web UI sends it (saved, a socket.io session) with
tools selected in the chat input (the request's ``tool_ids``), and an API
request with ``tool_ids``. Only the scholar tool selected: the model's system
prompt is the reference prompt with the ``google_scholar`` line alone, the
scholar call runs against a local OpenAlex, and the search and visit calls
the model makes anyway are refused in the lab's words without reaching
SearXNG or the web site. Another tool the user selected (one the model was not
trained on) is said once in the status line and is not offered. Nothing
selected: the admin's tools, today's prompt. Whatever Open WebUI does with
the selection itself (0.6 and 0.8 first ask the chat's model, the pipe, for
tool calls in a ``function_calling`` task, which it answers with none; 0.11+
hand the tools' specs to the pipe for native calling), no tool runs but the
research's and the model gets no ``tools``.

Each user's valves: a dedicated Open WebUI (any user may use the pipe's
model there), an admin and two users. One user lowers their round limit, or
their time limit, in the function's user valves; their research ends at
their limit, and the other user's same research goes on under the admin's.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.client_watch import ClientWatch
from tests.fakes.openai_server import FakeOpenAI, Reply, StreamGate, answer, tool_call
from tests.fakes.pages import PageSite
from tests.fakes.scholarly import FakeScholarly, openalex_work
from tests.fakes.searxng import FakeSearXNG
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.catalog import (
    prompt_lines,
)
from tongyi_deepresearch_openwebui_pipeline.core.prompts import (
    WRAP_UP_MESSAGE,
    system_prompt_with,
)

from .conftest import OwuiSession, pipe_valves
from .owui import (
    FUNCTION_ID,
    PIPE_FILE,
    Api,
    OpenWebUIServer,
    ScriptedModel,
    installer,
    stream_chat,
    tool_response,
    tool_responses,
    ui_chat,
    web_search_env,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

#: The user's date, as the web UI sends it (the prompt's "Current date").
TODAY = dt.date(2026, 11, 22)
DATE_VARIABLES = {"{{CURRENT_DATE}}": TODAY.isoformat()}
VARIABLES = {"variables": DATE_VARIABLES}
SCHOLAR = "deepresearch_scholar"
#: How long any one wait may take (a start, a chat, a held request).
TIMEOUT = 240.0
NOT_OFFERED = "Not offered to the research model (it was not trained on them): "

# -- the chat's tools (the session's Open WebUI) --------------------------------

PAPER_QUERY = "graphene lattice strain"
PAPER = openalex_work(
    "Graphene lattice strain",
    year=2021,
    authors=("Ada Kim",),
    venue="Carbon",
    cited=12,
    abstract="Strain changes the graphene lattice.",
)
#: What the scholar tool makes of PAPER (tests/test_scholar_tool.py's format).
PAPER_RESULT = (
    f"A Google scholar for '{PAPER_QUERY}' found 1 results:\n\n## Scholar Results\n"
    "1. [Graphene lattice strain](no available link)\n"
    "publicationInfo: Ada Kim - Carbon, 2021\nDate published: 2021\ncitedBy: 12\n"
    "\nStrain changes the graphene lattice."
)
#: A tool of the user's own, which the research model was not trained on.
CALCULATOR_ID = "e2e_calculator"
CALCULATOR = '''"""
title: E2E Calculator
description: Adds two numbers.
"""


class Tools:
    def add(self, a: int, b: int) -> str:
        """Add two numbers.

        :param a: The first number.
        :param b: The second number.
        """
        return str(a + b)
'''


@pytest.fixture
def scholarly(scholar_apis: FakeScholarly) -> FakeScholarly:
    """The fake OpenAlex the scholar tool searches, knowing PAPER."""
    scholar_apis.openalex[PAPER_QUERY] = [PAPER]
    return scholar_apis


@pytest.fixture
def calculator(owui: OwuiSession) -> Iterator[str]:
    """Another tool in Open WebUI's registry (removed after the test)."""
    owui.api.post(
        "/api/v1/tools/create",
        {
            "id": CALCULATOR_ID,
            "name": "E2E Calculator",
            "content": CALCULATOR,
            "meta": {"description": "Adds two numbers."},
        },
    )
    try:
        yield CALCULATOR_ID
    finally:
        owui.api.call("DELETE", f"/api/v1/tools/id/{CALCULATOR_ID}/delete")


def _system(*tools: str) -> dict[str, str]:
    """The system message of a research offering ``tools`` (the reference's)."""
    return {"role": "system", "content": system_prompt_with(prompt_lines(tools), TODAY)}


def _no_tools_in_requests(model: ScriptedModel) -> None:
    """The model got the research's requests alone: no ``tools``, no task."""
    bodies = list(model.fake.bodies)
    assert all(body.get("stream") for body in bodies)
    assert [body for body in bodies if "tools" in body] == []


def _statuses(message: dict[str, Any]) -> list[str]:
    return [str(s.get("description")) for s in message.get("statusHistory") or []]


async def test_a_chat_with_only_the_scholar_tool_researches_with_it_alone(
    owui: OwuiSession,
    model: ScriptedModel,
    search: FakeSearXNG,
    scholarly: FakeScholarly,
    page_site: PageSite,
) -> None:
    page = page_site.url("/article")
    visits_before = page_site.hits("/article")
    model.conversation(
        "graphene",
        Reply(
            reasoning="Papers first.",
            content=tool_call("google_scholar", {"query": [PAPER_QUERY]}),
        ),
        # The model strays to the tools the chat did not select.
        Reply(content=tool_call("search", {"query": ["graphene strain news"]})),
        Reply(content=tool_call("visit", {"url": [page], "goal": "strain facts"})),
        Reply(content=answer("Strain changes the graphene lattice (Kim, 2021).")),
    )

    chat = await ui_chat(
        owui.api,
        "How does strain change graphene?",
        extra={"tool_ids": [SCHOLAR], **VARIABLES},
    )

    first, *_, last = model.bodies("graphene")
    assert len(model.bodies("graphene")) == 4
    assert first["messages"] == [
        _system("google_scholar"),
        {"role": "user", "content": "How does strain change graphene?"},
    ]
    # The scholar call ran; search and visit were refused (the lab's words)
    # and reached neither SearXNG nor the site.
    assert tool_responses(last) == [
        tool_response(PAPER_RESULT),
        tool_response("Error: Tool search not found"),
        tool_response("Error: Tool visit not found"),
    ]
    (request,) = scholarly.requests_to("/works")
    assert request.query["search"] == [PAPER_QUERY]
    assert search.queries() == []
    assert page_site.hits("/article") == visits_before, owui.visit_setup_problem
    _no_tools_in_requests(model)
    message = chat.message
    assert "Strain changes the graphene lattice (Kim, 2021)." in message["content"]
    assert 'name="google_scholar"' in message["content"]
    assert not [s for s in _statuses(message) if s.startswith(NOT_OFFERED)]


async def test_a_chat_with_nothing_selected_offers_the_admin_s_tools(
    owui: OwuiSession, model: ScriptedModel
) -> None:
    model.conversation("tidal", Reply(content=answer("Tides rise twice a day.")))

    chat = await ui_chat(owui.api, "How often do tidal waters rise?", extra=VARIABLES)

    (first,) = model.bodies("tidal")
    # Today's prompt: the admin's tools (no code execution is set up, no
    # file is attached: PythonInterpreter and parse_file are not offered).
    assert first["messages"][0] == _system("search", "visit", "google_scholar")
    _no_tools_in_requests(model)
    assert "Tides rise twice a day." in chat.message["content"]


async def test_a_chat_s_other_tool_is_said_once_and_not_offered(
    owui: OwuiSession,
    model: ScriptedModel,
    scholarly: FakeScholarly,
    calculator: str,
) -> None:
    model.conversation(
        "graphene sheets",
        Reply(content=tool_call("google_scholar", {"query": [PAPER_QUERY]})),
        Reply(content=answer("Graphene sheets stretch under strain.")),
    )

    chat = await ui_chat(
        owui.api,
        "Do graphene sheets stretch?",
        extra={"tool_ids": [calculator, SCHOLAR], **VARIABLES},
    )

    first, second = model.bodies("graphene sheets")
    assert first["messages"][0] == _system("google_scholar")
    assert tool_responses(second) == [tool_response(PAPER_RESULT)]
    _no_tools_in_requests(model)
    statuses = _statuses(chat.message)
    assert [s for s in statuses if s.startswith(NOT_OFFERED)] == [
        NOT_OFFERED + calculator
    ]
    assert "Graphene sheets stretch under strain." in chat.message["content"]


async def test_an_api_request_s_tool_ids_are_honoured(
    owui: OwuiSession,
    model: ScriptedModel,
    search: FakeSearXNG,
    scholarly: FakeScholarly,
) -> None:
    model.conversation(
        "carbon nanotubes",
        Reply(content=tool_call("google_scholar", {"query": [PAPER_QUERY]})),
        Reply(content=answer("Nanotubes are rolled graphene.")),
    )

    stream = await stream_chat(
        owui.base_url,
        owui.token,
        "What are carbon nanotubes made of?",
        tool_ids=[SCHOLAR],
        variables=DATE_VARIABLES,
    )

    assert stream.status == 200
    assert stream.done and not stream.errors
    assert "Nanotubes are rolled graphene." in stream.content
    first, second = model.bodies("carbon nanotubes")
    assert first["messages"][0] == _system("google_scholar")
    assert tool_responses(second) == [tool_response(PAPER_RESULT)]
    assert search.queries() == []
    _no_tools_in_requests(model)


# -- each user's valves (a dedicated Open WebUI) ---------------------------------

ADMIN = ("Choices Admin", "choices-admin@example.com", "e2e-Passw0rd!")
USERS = (
    ("Choices Limited", "choices-limited@example.com", "e2e-Passw0rd-1!"),
    ("Choices Other", "choices-other@example.com", "e2e-Passw0rd-2!"),
)
USER_VALVES = f"/api/v1/functions/id/{FUNCTION_ID}/valves/user"
QUESTION = "How much power do tidal turbines give?"


@dataclass
class TwoUsers:
    """A dedicated Open WebUI, its model server, and two users of the pipe."""

    server: OpenWebUIServer
    model: FakeOpenAI
    admin: Api
    #: The user who sets their own limits.
    limited: Api
    #: The user who leaves theirs at the admin's.
    other: Api

    def set_valves(self, values: dict[str, Any]) -> dict[str, Any]:
        """The limited user's valves of the pipe, as their settings save them."""
        saved = self.limited.post(f"{USER_VALVES}/update", values)
        assert self.limited.get(USER_VALVES) == values
        assert self.other.get(USER_VALVES) in (None, {})
        return saved


def _add_user(admin: Api, name: str, email: str, password: str) -> Api:
    """A new user (role user) made through the admin API, signed in."""
    admin.post(
        "/api/v1/auths/add",
        {"name": name, "email": email, "password": password, "role": "user"},
    )
    return Api(admin.base_url, installer.sign_in(admin.base_url, email, password))


@pytest.fixture(scope="module")
def two_users(
    owui_venv_path: Path,
    fake_search: FakeSearXNG,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TwoUsers]:
    """Open WebUI where any user may use the pipe's model, and two users.

    The model server is the test's own; a held request waits as long as the
    test needs (the pipe's request timeout is long).
    """
    name = f"Tongyi-DeepResearch-choices-{uuid.uuid4().hex[:8]}"
    with FakeOpenAI(name) as model:
        server = OpenWebUIServer(
            owui_venv_path,
            tmp_path_factory.mktemp("owui-choices"),
            {
                **web_search_env(fake_search.search_url),
                "BYPASS_MODEL_ACCESS_CONTROL": "true",
            },
        )
        try:
            server.start(TIMEOUT)
            admin = Api(server.base_url, installer.sign_up(server.base_url, *ADMIN))
            client = admin.rest_client()
            valves = {**pipe_valves(model), "REQUEST_TIMEOUT_SECONDS": 3600}
            installer.install_pipe(
                client, PIPE_FILE.read_text(encoding="utf-8"), valves
            )
            installer.wait_for_model(client)
            tools = admin.wait_for_tools(timeout=60)
            if "deepresearch_search" not in tools:
                pytest.fail(
                    f"the search tool was not installed (tools: {sorted(tools)})"
                )
            limited, other = (_add_user(admin, *user) for user in USERS)
            yield TwoUsers(server, model, admin, limited, other)
        finally:
            server.stop()
            server.keep_log("open-webui-choices.log")


@pytest.fixture
def users(two_users: TwoUsers, fake_search: FakeSearXNG) -> Iterator[TwoUsers]:
    """The dedicated Open WebUI with nothing recorded yet."""
    fake_search.reset()
    two_users.model.bodies.clear()
    try:
        yield two_users
    finally:
        two_users.model.responder = None


def _ending(message: dict[str, Any]) -> str:
    """The research's last status line ("Done: …")."""
    (done,) = [s for s in _statuses(message) if s.startswith("Done: ")]
    return done


def _researching(body: dict[str, Any]) -> Reply:
    """A search a round; the answer after three, or when asked for it."""
    if body["messages"][-1]["content"] == WRAP_UP_MESSAGE:
        return Reply(content=answer("Tidal turbines give up to 2 MW (asked)."))
    done = len(tool_responses(body))
    if done < 3:
        return Reply(
            content=tool_call("search", {"query": [f"tidal round {done + 1}"]})
        )
    return Reply(content=answer("Tidal turbines give up to 2 MW."))


async def test_a_user_s_round_limit_ends_their_research_and_not_another_s(
    users: TwoUsers, fake_search: FakeSearXNG
) -> None:
    users.model.respond_with(_researching)
    assert users.set_valves({"MAX_TOOL_ROUNDS": 2}) == {"MAX_TOOL_ROUNDS": 2}

    limited = await ui_chat(users.limited, QUESTION, timeout=TIMEOUT)
    theirs = list(users.model.bodies)
    queries = fake_search.queries()
    users.model.bodies.clear()
    other = await ui_chat(users.other, QUESTION, timeout=TIMEOUT)
    others = list(users.model.bodies)

    # Their two rounds, then the model was asked for the answer.
    assert [len(tool_responses(body)) for body in theirs] == [0, 1, 2]
    assert theirs[-1]["messages"][-1]["content"] == WRAP_UP_MESSAGE
    assert queries == ["tidal round 1", "tidal round 2"]
    assert _ending(limited.message).startswith(
        "Done: the round limit was reached · 3 rounds · "
    )
    assert "Tidal turbines give up to 2 MW (asked)." in limited.message["content"]
    # The other user's same research searched three times and answered,
    # under the admin's limit (8 rounds).
    assert [len(tool_responses(body)) for body in others] == [0, 1, 2, 3]
    assert WRAP_UP_MESSAGE not in str(others[-1]["messages"])
    assert fake_search.queries() == [*queries, *(f"tidal round {k}" for k in (1, 2, 3))]
    assert _ending(other.message).startswith(
        "Done: the model gave its answer · 4 rounds · "
    )
    assert "Tidal turbines give up to 2 MW." in other.message["content"]


async def test_a_user_s_time_limit_ends_their_research_and_not_another_s(
    users: TwoUsers,
) -> None:
    """The other user's research outlives the limited user's whole research.

    Both ask the same question; the model answers the other user's first
    request only once the limited user's research has ended, and never ends
    the limited user's first turn (it is held until the pipe drops it). No
    clock is read: the other user's run is older than the limited one's.
    """
    watch = ClientWatch(users.model.server)
    held_for_other = StreamGate(after="Reading the tide tables.", timeout=TIMEOUT)
    never_ends = StreamGate(
        after="Still thinking", timeout=TIMEOUT, client_gone=watch.connection_closed
    )
    first_turns = [
        Reply(
            reasoning="Reading the tide tables.",
            content=answer("Tidal turbines give up to 2 MW (unhurried)."),
            gates=(held_for_other,),
        ),
        Reply(reasoning="Still thinking" + " and thinking" * 50, gates=(never_ends,)),
    ]
    lock = threading.Lock()

    def respond(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["content"] == WRAP_UP_MESSAGE:
            return Reply(content=answer("Tidal turbines give up to 2 MW (in time)."))
        with lock:
            if first_turns:
                return first_turns.pop(0)
        return Reply(status=500, error="no more first turns scripted")

    users.model.respond_with(respond)
    assert users.set_valves({"MAX_RESEARCH_MINUTES": 0.01}) == {
        "MAX_RESEARCH_MINUTES": 0.01
    }

    other_chat = asyncio.create_task(ui_chat(users.other, QUESTION, timeout=TIMEOUT))
    try:
        reached = await asyncio.to_thread(held_for_other.reached.wait, TIMEOUT)
        assert reached, users.server.log_tail()
        limited = await ui_chat(users.limited, QUESTION, timeout=TIMEOUT)
        # The limited user's research has ended; the other's is still waiting.
        assert not other_chat.done()
        assert held_for_other.released_by == ""
        held_for_other.open()
        other = await other_chat
    finally:
        held_for_other.open()
        if not other_chat.done():
            other_chat.cancel()

    other_first, limited_first, wrap_up = users.model.bodies
    assert other_first["messages"] == limited_first["messages"]
    # The pipe dropped the turn at the limit and asked for the answer.
    await _until(lambda: bool(never_ends.released_by))
    assert never_ends.released_by == "client left"
    assert wrap_up["messages"] == [*limited_first["messages"], _wrap_up_message()]
    assert _ending(limited.message).startswith("Done: the time limit was reached · ")
    assert "Tidal turbines give up to 2 MW (in time)." in limited.message["content"]
    # The other user's research went on past that and ended with its answer.
    assert held_for_other.released_by == "opened"
    assert _ending(other.message).startswith(
        "Done: the model gave its answer · 1 rounds · "
    )
    assert "Tidal turbines give up to 2 MW (unhurried)." in other.message["content"]


def _wrap_up_message() -> dict[str, str]:
    return {"role": "user", "content": WRAP_UP_MESSAGE}


async def _until(check: Callable[[], bool]) -> None:
    """Wait until ``check()`` holds (bounded; the assertion after says what)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(TIMEOUT):
            while not check():
                await asyncio.sleep(0.05)
