"""Valves changed through one replica take effect for chats served by the other."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.owui import FUNCTION_ID, ScriptedModel, ui_chat
from tests.fakes.openai_server import FakeOpenAI, Reply, answer

from .cluster import Cluster
from .conftest import pipe_valves

pytestmark = pytest.mark.scaled


@pytest.mark.parametrize("changed_on", ["A", "B"])
async def test_pipe_valves_set_on_one_replica_reach_chats_on_the_other(
    cluster: Cluster, model: ScriptedModel, fake_model: FakeOpenAI, changed_on: str
) -> None:
    changer = cluster.a if changed_on == "A" else cluster.b
    server = cluster.other(changer)
    key = f"preamble-{changed_on}"
    preamble = f"House rule {key}: answer in one sentence."
    model.conversation(key, Reply(content=answer(f"One sentence about {key}.")))
    marks = cluster.log_marks()
    path = f"/api/v1/functions/id/{FUNCTION_ID}/valves/update"
    try:
        await asyncio.to_thread(
            changer.api.post,
            path,
            {**pipe_valves(fake_model), "SYSTEM_PROMPT_PREAMBLE": preamble},
        )

        chat = await ui_chat(server.api, f"Tell me about {key}.", timeout=180)
    finally:
        await asyncio.to_thread(changer.api.post, path, pipe_valves(fake_model))

    assert f"One sentence about {key}." in chat.message["content"]
    (body,) = model.bodies(key)
    system = body["messages"][0]
    assert system["role"] == "system"
    assert system["content"].startswith(preamble), system["content"][:200]
    assert cluster.errors_since(marks) == {"A": [], "B": []}
