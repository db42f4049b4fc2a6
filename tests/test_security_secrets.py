"""API keys never leak, and are encrypted at rest when WEBUI_SECRET_KEY is set."""

from __future__ import annotations

import json
import logging

import pytest

from tests.fakes.chat import QUESTION, drive, make_pipe
from tests.fakes.openai_server import FakeOpenAI, Reply, answer, tool_call
from tongyi_deepresearch_openwebui_pipeline.adapters import secrets
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe

KEY = "sk-or-v1-THIS-IS-A-SECRET-abcdef0123456789"


def test_round_trip_with_the_server_secret():
    stored = secrets.encrypt(KEY, "server-secret")
    assert stored.startswith(secrets.PREFIX) and KEY not in stored
    assert secrets.decrypt(stored, "server-secret") == KEY


def test_no_secret_means_plain_storage():
    assert secrets.encrypt(KEY, "") == KEY
    assert secrets.decrypt(KEY, "") == KEY


def test_wrong_secret_gives_a_clear_error():
    stored = secrets.encrypt(KEY, "one")
    with pytest.raises(secrets.SecretError, match="enter the key in the valves again"):
        secrets.decrypt(stored, "two")


def test_valves_store_the_key_encrypted(monkeypatch):
    monkeypatch.setenv("WEBUI_SECRET_KEY", "s3cr3t")
    valves = Pipe.Valves(API_KEY=KEY)
    dumped = valves.model_dump()
    assert dumped["API_KEY"].startswith(secrets.PREFIX)
    assert KEY not in json.dumps(dumped)
    # Open WebUI re-creates the valves from what it stored before every call.
    reloaded = Pipe.Valves(**dumped).model_dump()
    assert reloaded["API_KEY"] == dumped["API_KEY"]


async def test_encrypted_key_is_sent_decrypted(monkeypatch):
    monkeypatch.setenv("WEBUI_SECRET_KEY", "s3cr3t")
    with FakeOpenAI() as fake:
        fake.script(Reply(content=answer("ok")))
        await drive(make_pipe(fake, API_KEY=KEY), QUESTION)
        assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"


async def test_changed_server_secret_is_reported_not_crashing(monkeypatch):
    monkeypatch.setenv("WEBUI_SECRET_KEY", "first")
    with FakeOpenAI() as fake:
        pipe = make_pipe(fake, API_KEY=KEY)
        monkeypatch.setenv("WEBUI_SECRET_KEY", "second")
        text, _, events = await drive(pipe, QUESTION)
        assert fake.bodies == []
    assert "cannot be decrypted" in text
    assert events[-1]["data"]["done"] is True


SCENARIOS = [
    [
        Reply(reasoning="r", content=tool_call("search", {"query": ["q"]})),
        Reply(content=answer(f"done, not {KEY[:6]}")),
    ],
    [Reply(status=401, error=f"Incorrect API key provided: {KEY}")],
    [Reply(status=500, error=f"upstream said {KEY}") for _ in range(2)],
    [
        Reply(content=tool_call("visit", {"url": ["https://a.org"], "goal": "g"})),
        Reply(status=400, error=f"bad request for key {KEY}"),
    ],
]


@pytest.mark.parametrize("script", SCENARIOS)
async def test_key_never_appears_anywhere(script, caplog, monkeypatch):
    monkeypatch.delenv("WEBUI_SECRET_KEY", raising=False)
    caplog.set_level(logging.DEBUG)
    with FakeOpenAI() as fake:
        fake.script(*script)
        pipe = make_pipe(fake, API_KEY=KEY, MAX_RETRIES=2)
        text, _, events = await drive(pipe, QUESTION)
        bodies = json.dumps(fake.bodies)
        assert all(
            r.headers.get("authorization") == f"Bearer {KEY}" for r in fake.requests
        )
    assert KEY not in text
    assert KEY not in json.dumps(events)
    assert KEY not in caplog.text
    assert KEY not in bodies  # never sent to the model as content
