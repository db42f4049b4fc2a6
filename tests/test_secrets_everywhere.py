"""A research turn whose servers echo the key everywhere leaks it nowhere.

The model server here repeats the Authorization header it received in a
response header, in error events inside 200 streams, in error bodies (cut
inside the key by the client's 4 kB limit) and in its model list. The pipe runs
a whole turn against it, with an API key or with credentials written into
``API_BASE_URL``, and the key, the password and the Basic token must appear
nowhere: not in any log record at DEBUG (httpx and httpcore included), not in
any emitted event, not in the chat.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from tests.fakes.chat import QUESTION, drive, fake_tools, make_pipe
from tests.fakes.http import LocalServer, Request, Response
from tests.fakes.openai_server import answer, tool_call
from tests.fakes.waits import Waits
from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import ModelSettings
from tongyi_deepresearch_openwebui_pipeline.adapters.secrets import MASK
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe

KEY = "sk-live-ECHOED-4b9e1f7a2c8d3e60f1"
USER = "svc-research"
PASSWORD = "Pw-Echo-9Hk2Lx7Qm4"
BASIC = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
MODEL = "Alibaba-NLP/Tongyi-DeepResearch-30B-A3B"


def delta(text: str = "", finish: str | None = None) -> bytes:
    payload = {"choices": [{"delta": {"content": text}, "finish_reason": finish}]}
    return f"data: {json.dumps(payload)}\n\n".encode()


def turn(text: str) -> list[bytes]:
    return [delta(text), delta(finish="stop"), b"data: [DONE]\n\n"]


Step = Callable[[str], Response]


def sse(parts: list[bytes], auth: str) -> Response:
    headers = {"Content-Type": "text/event-stream", "X-Echo": auth}
    return Response(200, headers, parts)


def error_event(auth: str) -> Response:
    event = {"error": {"message": f"Invalid credentials: {auth}"}}
    return sse([delta("<think>"), f"data: {json.dumps(event)}\n\n".encode()], auth)


def cut_error_body(auth: str) -> Response:
    # The key straddles the client's 4096-byte read limit.
    text = "e" * (4096 - len(auth) // 2) + auth
    return Response(500, {"Content-Type": "text/plain", "X-Echo": auth}, text.encode())


def search_turn(auth: str) -> Response:
    return sse(turn(tool_call("search", {"query": ["echo"]})), auth)


def answer_turn(auth: str) -> Response:
    return sse(turn(answer("Done.")), auth)


def refused(auth: str) -> Response:
    body = json.dumps({"error": {"message": f"Incorrect API key provided: {auth}"}})
    return Response(
        401, {"Content-Type": "application/json", "X-Echo": auth}, body.encode()
    )


class EchoingModel:
    """A model server that repeats the credentials it receives."""

    def __init__(self, steps: list[Step]) -> None:
        self.model = MODEL
        self.steps = list(steps)
        self.server = LocalServer(
            {"/v1/chat/completions": self._chat, "/v1/models": self._models}
        )

    def _chat(self, request: Request) -> Response:
        auth = request.headers.get("authorization", "")
        if not self.steps:
            return refused(auth)
        return self.steps.pop(0)(auth)

    def _models(self, request: Request) -> Response:
        auth = request.headers.get("authorization", "")
        data = {"data": [{"id": MODEL, "max_model_len": 65536, "owner": auth}]}
        return Response.json(data, 200, **{"X-Echo": auth})

    @property
    def base_url(self) -> str:
        return self.server.url("/v1")

    def __enter__(self) -> EchoingModel:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


SCRIPTS = {
    "retries-then-answer": [error_event, cut_error_body, search_turn, answer_turn],
    "refused": [error_event, refused],
    "gives-up": [error_event, cut_error_body, error_event],
}


def leaked(text: str, secret: str) -> list[str]:
    """Every run of 8 characters of ``secret`` found in ``text``."""
    return [
        secret[i : i + 8] for i in range(len(secret) - 7) if secret[i : i + 8] in text
    ]


def make(server: EchoingModel, credentials: str, pipe: Pipe | None = None) -> Pipe:
    """A pipe on ``server`` with the key or URL credentials (retries wait no time)."""
    pipe = pipe or Pipe(tool_resolver=fake_tools(), sleep=Waits())
    pipe = make_pipe(server, pipe, MAX_RETRIES=3)  # type: ignore[arg-type]
    if credentials == "api-key":
        pipe.valves = pipe.Valves(
            API_BASE_URL=server.base_url, MODEL_ID=MODEL, API_KEY=KEY, MAX_RETRIES=3
        )
    else:
        url = server.base_url.replace("http://", f"http://{USER}:{PASSWORD}@")
        pipe.valves = pipe.Valves(API_BASE_URL=url, MODEL_ID=MODEL, MAX_RETRIES=3)
    return pipe


@pytest.mark.parametrize("credentials", ["api-key", "url"])
@pytest.mark.parametrize("script", sorted(SCRIPTS))
async def test_no_secret_in_logs_events_or_chat(
    script, credentials, caplog, monkeypatch
):
    monkeypatch.delenv("WEBUI_SECRET_KEY", raising=False)
    caplog.set_level(logging.DEBUG)
    with EchoingModel(SCRIPTS[script]) as server:
        text, _, events = await drive(make(server, credentials), QUESTION)
        sent = {r.headers.get("authorization") for r in server.server.requests}
    expected = f"Bearer {KEY}" if credentials == "api-key" else f"Basic {BASIC}"
    assert sent == {expected}  # the credentials did reach the server
    # httpcore logged the echoing header, the credentials in it masked.
    scheme = expected.split(" ", 1)[0]
    assert f"(b'X-Echo', b'{scheme} {MASK}')" in caplog.text
    emitted = json.dumps(events)
    for secret in (KEY, PASSWORD, BASIC):
        for where, content in (
            ("logs", caplog.text),
            ("events", emitted),
            ("chat", text),
        ):
            assert not leaked(content, secret), f"{secret[:4]}… leaked into {where}"
    assert f"{USER}:" not in caplog.text + emitted + text


async def test_an_unexpected_error_is_redacted_in_chat_and_log(caplog, monkeypatch):
    """Whatever exception escapes the run, its text passes the same redactor."""
    monkeypatch.delenv("WEBUI_SECRET_KEY", raising=False)
    caplog.set_level(logging.DEBUG)

    def broken_client(settings: ModelSettings, http: Any, sleep: Any) -> Any:
        raise RuntimeError(f"boom near {KEY[:20]} and {PASSWORD}")

    with EchoingModel([]) as server:
        pipe = make(server, "url", Pipe(model_client=broken_client))
        pipe.valves = pipe.Valves(
            API_BASE_URL=pipe.valves.API_BASE_URL, MODEL_ID=MODEL, API_KEY=KEY
        )
        turn = await drive(pipe, QUESTION)
    message = f"RuntimeError: boom near {MASK} and {MASK}"
    assert turn.text == f"\n\n> ⚠️ **Unexpected error:** {message}\n"
    assert turn.ending == f"Error: {message}"
    for secret in (KEY, PASSWORD):
        assert not leaked(turn.text + json.dumps(turn.events) + caplog.text, secret)
    assert "RuntimeError" in caplog.text  # the failure is still logged


def test_valve_validation_errors_do_not_repeat_the_input():
    with pytest.raises(ValueError, match="http") as caught:
        Pipe.Valves(API_BASE_URL=f"ftp://{USER}:{PASSWORD}@host/v1")
    assert PASSWORD not in str(caught.value)
