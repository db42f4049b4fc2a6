"""A long research interrupted mid-way, for the durable-research tests.

Both profiles (tests/e2e/test_durable.py: one process on SQLite;
tests/e2e_scaled/test_zy_durable.py: two replicas on PostgreSQL) run the
same script and ask the same way:

- `DurableResearch` is the fake model's side: rounds 1 to `PAGES` each read
  one page of the local site through the real visit tool, the next round
  answers citing every page whose URL is in the conversation it was sent (a
  resumed run that lost earlier rounds would cite fewer). The first request
  for round `hold_round` is held until the test has killed Open WebUI. Every
  request is recorded with the phase of the test it came in. The citation
  check's verdict calls about the answer (told apart by their system
  message) are no research requests: each is recorded apart with the page
  whose evidence it quotes, and finds the statement supported.
- `ask_in_new_chat` and `regenerate` send what the browser sends for a new
  saved chat and for Regenerate, on each Open WebUI version.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from tests.fakes.openai_server import Reply, answer, tool_call
from tests.fakes.pages import PageSite
from tongyi_deepresearch_openwebui_pipeline.core.phrasing import resumed_text

from .owui import (
    PIPE_MODEL_ID,
    Api,
    create_chat,
    is_verdict_request,
    post_ui_chat,
    server_creates_chats,
    turn_of,
    ui_chat_request,
)

QUESTION = "Which property does each of the durable items have?"
#: Pages read, one a round; the round after them answers.
PAGES = 6
_PAGE = re.compile(r"/count/[a-z]+-(\d+)")
#: The extractor's evidence for a page (`DurableResearch._extraction`).
_EVIDENCE = re.compile(r"<evidence>\nItem (\d+) has property P\1\.")


@dataclass(frozen=True)
class ResearchRequest:
    """One research request the fake model received."""

    phase: str
    turn: int
    messages: list[dict[str, Any]]


class DurableResearch:
    """The fake model's research, the same for every user (thread-safe)."""

    def __init__(
        self, site: PageSite, name: str, hold_round: int, patience: float
    ) -> None:
        """Read ``site``'s pages ``/count/<name>-<k>``; hold round ``hold_round``.

        The held request waits for `release` (at most ``patience`` seconds),
        then fails: Open WebUI was killed meanwhile, nobody reads it.
        """
        self.site = site
        self.name = name
        self.hold_round = hold_round
        self.patience = patience
        #: What the test is doing now (recorded with each request).
        self.phase = ""
        self.research: list[ResearchRequest] = []
        #: (phase, page) of each extractor call of the visit tool.
        self.extractions: list[tuple[str, int]] = []
        #: (phase, page whose evidence it quotes) of each verdict call.
        self.verdicts: list[tuple[str, int]] = []
        #: Set when the request for round `hold_round` arrived.
        self.held = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def url(self, page: int) -> str:
        """Where page ``page`` is."""
        return self.site.url(f"/count/{self.name}-{page}")

    def fetches(self) -> list[int]:
        """How often each page (1 to `PAGES`) has been fetched so far."""
        return [
            self.site.hits(f"/count/{self.name}-{page}") for page in range(1, PAGES + 1)
        ]

    def answer_shown(self) -> str:
        """The answer citing every page, as the chat shows it (numbered)."""
        cited = ", ".join(
            f"[page {k}]({self.url(k)}) [{k}]" for k in range(1, PAGES + 1)
        )
        return f"The properties are on {cited}."

    def __call__(self, body: dict[str, Any]) -> Reply:
        """The reply to one request (runs in the fake server's threads)."""
        messages = body["messages"]
        if not body.get("stream"):
            return self._extraction(str(messages[-1]["content"]))
        if is_verdict_request(body):
            found = _EVIDENCE.search(str(messages[-1]["content"]))
            with self._lock:
                self.verdicts.append((self.phase, int(found[1]) if found else 0))
            return Reply("SUPPORTED\nThe notes give the item's property.")
        turn = turn_of(body)
        with self._lock:
            self.research.append(ResearchRequest(self.phase, turn, messages))
            hold = turn + 1 == self.hold_round and not self.held.is_set()
            if hold:
                self.held.set()
        if hold:
            self.release.wait(self.patience)
            return Reply(status=503, error="nobody reads this reply")
        if turn < PAGES:
            page = turn + 1
            return Reply(
                reasoning=f"Round {page}: read page {page}.",
                content=tool_call(
                    "visit",
                    {"url": [self.url(page)], "goal": f"item {page}'s property"},
                ),
            )
        return Reply(reasoning="Every page is read.", content=answer(self._cited(body)))

    def _cited(self, body: dict[str, Any]) -> str:
        sent = json.dumps(body["messages"])
        links = [
            f"[page {k}]({self.url(k)})"
            for k in range(1, PAGES + 1)
            if self.url(k) in sent
        ]
        return "The properties are on " + ", ".join(links) + "."

    def _extraction(self, prompt: str) -> Reply:
        found = _PAGE.search(prompt)
        page = int(found.group(1)) if found else 0
        with self._lock:
            self.extractions.append((self.phase, page))
        evidence = {
            "rational": "r",
            "evidence": f"Item {page} has property P{page}.",
            "summary": f"Item {page}: P{page}.",
        }
        return Reply(content=json.dumps(evidence))

    def turns(self, phase: str) -> list[int]:
        """The turns the model was asked for in ``phase`` (0: round 1), in order."""
        return [r.turn for r in self.research if r.phase == phase]

    def conversations(self, phase: str) -> list[list[dict[str, Any]]]:
        """The messages of each research request of ``phase``."""
        return [r.messages for r in self.research if r.phase == phase]

    def pages_read(self, phase: str) -> list[int]:
        """The pages the extractor read in ``phase``, in order."""
        return [page for p, page in self.extractions if p == phase]

    def pages_checked(self, phase: str) -> list[int]:
        """The pages whose evidence the verdict calls of ``phase`` quoted, sorted."""
        return sorted(page for p, page in self.verdicts if p == phase)


def difference(after: list[int], before: list[int]) -> list[int]:
    """Per page, how many more fetches ``after`` counts than ``before``."""
    return [a - b for a, b in zip(after, before, strict=True)]


def source_urls(message: dict[str, Any]) -> list[str]:
    """The URLs of a saved message's sources, in their order (their numbers)."""
    return [str(s["metadata"][0]["source"]) for s in message.get("sources") or []]


def assert_resumed_research(
    research: DurableResearch,
    message: dict[str, Any],
    *,
    killed: str,
    resumed: str,
    fetched_until_kill: list[int],
    fetched_after: list[int],
) -> None:
    """A research killed in its round ``research.hold_round``, then taken up.

    ``killed`` and ``resumed`` are the two phases; ``fetched_until_kill`` and
    ``fetched_after`` each page's fetches in them. The model was asked rounds
    1 to the held one, then that round (the one in flight, with the very
    conversation it had) to the end: no finished round twice. Each page was
    fetched and read once, before or after the kill. The ``message`` says it
    resumed, keeps the sources' numbers and cites pages read before and after
    the kill; its citation check quoted the evidence read before the kill
    (the first three of the six pages cited, one call each).
    """
    finished = research.hold_round - 1
    content = str(message["content"])
    assert research.turns(killed) == list(range(finished + 1))
    assert research.turns(resumed) == list(range(finished, PAGES + 1))
    in_flight = research.conversations(killed)[finished]
    assert research.conversations(resumed)[0] == in_flight
    before, after = list(range(1, finished + 1)), list(range(finished + 1, PAGES + 1))
    assert fetched_until_kill == [int(k in before) for k in range(1, PAGES + 1)]
    assert fetched_after == [int(k in after) for k in range(1, PAGES + 1)]
    assert research.pages_read(killed) == before
    assert research.pages_read(resumed) == after
    note = resumed_text(finished, finished)
    assert content.splitlines()[0] == f"*{note}*", content[:500]
    assert source_urls(message) == [research.url(k) for k in range(1, PAGES + 1)]
    assert research.answer_shown() in content.splitlines(), content
    assert research.pages_checked(resumed) == [1, 2, 3]
    assert research.pages_checked(killed) == []


# -- what the browser sends --------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """An answer asked for in a saved chat."""

    chat_id: str
    message_id: str
    question_id: str


async def ask_in_new_chat(
    api: Api, session_id: str, question: str, timeout: float
) -> Turn:
    """Start a new saved chat as the browser does (the answer runs on).

    No background tasks (title, tags): the model's log holds the research
    alone.
    """
    message_id = str(uuid.uuid4())
    question_message, body = ui_chat_request(
        question,
        model=PIPE_MODEL_ID,
        session_id=session_id,
        message_id=message_id,
        background_tasks=(),
    )
    chat_id = None
    if not server_creates_chats():
        # 0.6 / 0.8: the browser saves the chat first, then asks in it.
        chat_id = await asyncio.to_thread(
            create_chat, api, PIPE_MODEL_ID, question_message, message_id
        )
        body |= {
            "chat_id": chat_id,
            "parent_id": question_message["id"],
            "parent_message": question_message,
        }
    answered = await post_ui_chat(api.base_url, api.token, body, timeout, "new chat")
    return Turn(chat_id or str(answered["chat_id"]), message_id, question_message["id"])


async def regenerate(api: Api, session_id: str, turn: Turn, timeout: float) -> Turn:
    """Ask for a new answer to ``turn``'s question, as Regenerate does."""
    chat = await asyncio.to_thread(api.get_chat, turn.chat_id)
    question_message = chat["chat"]["history"]["messages"][turn.question_id]
    message_id = str(uuid.uuid4())
    _, body = ui_chat_request(
        str(question_message["content"]),
        model=PIPE_MODEL_ID,
        session_id=session_id,
        message_id=message_id,
        background_tasks=(),
    )
    if server_creates_chats():
        # 0.11+: the server adds the new reply beside the old one.
        body |= {
            "chat_id": turn.chat_id,
            "parent_id": question_message.get("parentId"),
            "user_message": question_message,
        }
    else:
        await asyncio.to_thread(
            _add_reply, api, turn.chat_id, question_message, message_id
        )
        body |= {
            "chat_id": turn.chat_id,
            "parent_id": question_message["id"],
            "parent_message": question_message,
        }
    await post_ui_chat(api.base_url, api.token, body, timeout, "regenerate")
    return Turn(turn.chat_id, message_id, turn.question_id)


def _add_reply(
    api: Api, chat_id: str, question: dict[str, Any], message_id: str
) -> None:
    """Save an empty reply beside the question's others (0.6 / 0.8's browser)."""
    chat = api.get_chat(chat_id)["chat"]
    history = chat["history"]
    question = {
        **question,
        "childrenIds": [*question.get("childrenIds", []), message_id],
    }
    reply = {
        "id": message_id,
        "parentId": question["id"],
        "childrenIds": [],
        "role": "assistant",
        "content": "",
        "model": PIPE_MODEL_ID,
        "modelIdx": 0,
        "timestamp": question.get("timestamp", 0),
    }
    history["messages"] |= {question["id"]: question, message_id: reply}
    history["currentId"] = message_id
    chat["messages"] = [question, reply]
    api.post(f"/api/v1/chats/{chat_id}", {"chat": chat})
