"""Chats across replicas: streamed to the other one, stored whole, no cross-talk."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.e2e.owui import ScriptedModel, UiChat, output_texts, ui_chat
from tests.fakes.openai_server import Reply, StreamGate, answer, tool_call
from tests.fakes.pages import PageSite

from .cluster import Cluster, Replica, SocketWatch

pytestmark = pytest.mark.scaled

CONCURRENT_CHATS = 20


def _statuses(watch: SocketWatch, chat_id: str) -> list[str]:
    return [
        str(((e.get("data") or {}).get("data") or {}).get("description", ""))
        for e in watch.of_chat(chat_id)
        if (e.get("data") or {}).get("type") == "status"
    ]


async def _open_when_seen(watch: SocketWatch, gate: StreamGate) -> None:
    """Open ``gate`` once its text streamed to ``watch``'s session."""
    await watch.wait_for(
        lambda w: w.shows(gate.until_seen),
        timeout=180,
        what=f"the answer's first part ({gate.until_seen!r})",
    )
    gate.open()


@pytest.mark.parametrize("runner_name", ["A", "B"])
async def test_a_chat_on_one_replica_streams_to_the_other_and_is_stored_whole(
    cluster: Cluster, model: ScriptedModel, page_site: PageSite, runner_name: str
) -> None:
    runner = cluster.a if runner_name == "A" else cluster.b
    other = cluster.other(runner)
    key = f"tidal-{runner_name}"
    page = page_site.url("/article")
    model.extractor = lambda _prompt: Reply(
        content=json.dumps(
            {"rational": "r", "evidence": f"Evidence for {key}.", "summary": "s"}
        )
    )
    # The model holds the rest of its answer until the other replica's socket
    # session has shown the first part: the answer streams live across replicas.
    gate = StreamGate(after="First half of the", until_seen="First half", timeout=120)
    model.conversation(
        key,
        Reply(
            reasoning=f"I should read the page about {key}.",
            content=tool_call("visit", {"url": [page], "goal": f"facts on {key}"}),
        ),
        Reply(
            reasoning="The page answers it.",
            content=answer(f"First half of the {key} answer; second half ({page})."),
            gates=(gate,),
        ),
    )
    marks = cluster.log_marks()

    async with SocketWatch(other, cluster.token) as watch:
        opener = asyncio.create_task(_open_when_seen(watch, gate))
        try:
            # The browser's session is on the other replica, the request on the
            # runner (a load balancer without sticky sessions does that).
            chat: UiChat = await ui_chat(
                runner.api,
                f"What does the page say about {key}?",
                timeout=180,
                socket_url=other.base_url,
            )
        finally:
            if not opener.done():
                opener.cancel()
        await asyncio.gather(opener, return_exceptions=True)

    assert gate.opened_by_consumer, gate.released_by
    assert chat.finished
    # The runner's status and source events reached the other replica's socket.
    types = watch.types(chat.chat_id)
    assert "status" in types and "source" in types, types
    sources_seen = [
        e["data"]["data"]
        for e in watch.of_chat(chat.chat_id)
        if e["data"].get("type") == "source"
    ]
    assert [s["source"]["url"] for s in sources_seen] == [page]
    assert any(page in status for status in _statuses(watch, chat.chat_id))
    # Stored whole in the shared database: read back through the OTHER replica.
    message = (await asyncio.to_thread(other.api.get_chat, chat.chat_id))["chat"][
        "history"
    ]["messages"][chat.message_id]
    assert message["done"] is True
    content = message["content"]
    assert f"First half of the {key} answer; second half" in content
    assert '<details type="tool_calls"' in content and 'name="visit"' in content
    reasoning = " ".join(output_texts(message, "reasoning"))
    assert f"I should read the page about {key}." in reasoning
    assert "The page answers it." in reasoning
    assert [s["metadata"][0]["source"] for s in message["sources"]] == [page]
    assert message["sources"][0]["document"][0].startswith(f"Evidence for {key}.")
    assert message["statusHistory"][-1]["done"] is True
    assert cluster.errors_since(marks) == {"A": [], "B": []}


async def test_twenty_concurrent_chats_over_both_replicas_keep_their_own_answers(
    cluster: Cluster, model: ScriptedModel
) -> None:
    keys = [f"walrus{n:02d}" for n in range(CONCURRENT_CHATS)]
    for key in keys:
        model.conversation(
            key,
            Reply(
                reasoning=f"Thinking only about {key}.",
                content=answer(f"The answer for {key} is {key.upper()}."),
            ),
        )
    # No first turn is answered before all twenty are waiting: the chats run
    # at the same time, whatever the machine's speed (a generous bound).
    model.hold_first_turns(CONCURRENT_CHATS, timeout=240)
    marks = cluster.log_marks()

    def placement(n: int) -> tuple[Replica, Replica]:
        runner = cluster.replicas[n % 2]
        # Half of the sessions sit on the other replica.
        session = cluster.other(runner) if n % 4 >= 2 else runner
        return runner, session

    chats = await asyncio.gather(
        *(
            ui_chat(
                placement(n)[0].api,
                f"Tell me about {key}.",
                timeout=300,
                socket_url=placement(n)[1].base_url,
            )
            for n, key in enumerate(keys)
        )
    )

    assert len({chat.chat_id for chat in chats}) == CONCURRENT_CHATS
    messages = []
    for n, chat in enumerate(chats):
        reader = cluster.other(placement(n)[0])
        stored = await asyncio.to_thread(reader.api.get_chat, chat.chat_id)
        messages.append(stored["chat"]["history"]["messages"][chat.message_id])
    # Which first turns reached the model, per chat (when one chat's never
    # does, the other nineteen wait for it until the hold's bound).
    reached = {model.key_of(body) for body in model.bodies()}
    report = "\n".join(
        f"{key} on {placement(n)[0].name} (session on {placement(n)[1].name}): "
        f"reached the model {key in reached}, finished {chat.finished}, "
        f"{len(chat.events)} events, content {str(message.get('content'))[:300]!r}"
        for n, (key, chat, message) in enumerate(
            zip(keys, chats, messages, strict=True)
        )
    )
    for key, chat, message in zip(keys, chats, messages, strict=True):
        assert chat.finished and message["done"] is True, f"{key}\n{report}"
        assert f"The answer for {key} is {key.upper()}." in message["content"], (
            f"{key}\n{report}"
        )
        assert f"Thinking only about {key}." in " ".join(
            output_texts(message, "reasoning")
        ), key
        others = [k for k in keys if k != key]
        seen = json.dumps(message) + json.dumps(
            [e for e in chat.events if e.get("chat_id") == chat.chat_id]
        )
        assert [k for k in others if k in seen] == [], key
    # Each conversation reached the model once, with its own question.
    assert sorted(model.key_of(body) or "" for body in model.bodies()) == keys
    assert cluster.errors_since(marks) == {"A": [], "B": []}
