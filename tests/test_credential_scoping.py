"""The pipe's key reaches only the pipe's server, whatever the extractor valves say.

The real visit tool runs through the `Toolbox` (and through the pipe) against
two real extractor servers on 127.0.0.1, the pipe's own model server and
another one, which record the Authorization header of every request.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Literal

import pytest
from pydantic import create_model

from tests.fakes.chat import drive
from tests.fakes.openai_server import FakeOpenAI, Reply, answer, tool_call
from tests.fakes.pages import PageSite
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.toolbox import (
    SharedEndpoint,
    Toolbox,
    ToolContext,
    ToolResolver,
)
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import ToolCall
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe
from tongyi_deepresearch_openwebui_pipeline.tools import visit_tool

KEY = "sk-pipe-SCOPED-0d1e2f3a4b5c6d7e"
PASSWORD = "url-Pw-5Tg8Yh1Uj"
EVIDENCE = {"rational": "r", "evidence": "The page says hello.", "summary": "Hello."}


def local_visit(**defaults: str) -> type:
    """The real visit tool reading 127.0.0.1, with these valve defaults."""

    class LocalValves(visit_tool.Tools.Valves):
        ALLOW_PRIVATE_URLS: bool = True
        PAGE_LOADER: Literal["auto", "openwebui", "builtin"] = "builtin"
        CACHE_TTL_SECONDS: int = 0

    fields: dict[str, Any] = {name: (str, value) for name, value in defaults.items()}
    valves = create_model("Valves", __base__=LocalValves, **fields)
    return type("LocalVisit", (visit_tool.Tools,), {"Valves": valves})


def extractor() -> FakeOpenAI:
    fake = FakeOpenAI()
    fake.respond_with(lambda _body: Reply(content=json.dumps(EVIDENCE)))
    return fake


def authorizations(fake: FakeOpenAI) -> list[str | None]:
    return [
        r.headers.get("authorization")
        for r in fake.requests
        if r.path.endswith("/chat/completions")
    ]


# What a keyless extractor receives: the reference agent's placeholder key, which
# the openai SDK sends as a bearer token (no credential of the pipe's).
KEYLESS = "Bearer EMPTY"


def with_credentials(url: str) -> str:
    return url.replace("http://", f"http://svc:{PASSWORD}@")


async def visit_with(admin: dict[str, Any], pipe_url: str, pipe_key: str, page: str):
    endpoint = SharedEndpoint(
        url_valve="EXTRACTOR_BASE_URL",
        key_valve="EXTRACTOR_API_KEY",
        model_valve="EXTRACTOR_MODEL",
        base_url=pipe_url,
        api_key=pipe_key,
        model="pipe-model",
    )
    toolbox = Toolbox(
        {"visit": local_visit()},
        ToolContext(shared_endpoints={"visit": endpoint}),
        admin_valves={"visit": admin},
    )
    return await toolbox.run(ToolCall("visit", {"url": [page], "goal": "greeting"}))


# (admin valves, which server should be asked, the Authorization it should get)
CASES = {
    "empty-url-gets-the-pipe-endpoint": ({}, "pipe", f"Bearer {KEY}"),
    "other-url-empty-key-gets-no-key": (
        {"EXTRACTOR_BASE_URL": "{other}"},
        "other",
        KEYLESS,
    ),
    "other-url-own-key": (
        {"EXTRACTOR_BASE_URL": "{other}", "EXTRACTOR_API_KEY": "other-key-123"},
        "other",
        "Bearer other-key-123",
    ),
    "same-url-spelled-differently-gets-the-key": (
        {"EXTRACTOR_BASE_URL": "{pipe_upper}/"},
        "pipe",
        f"Bearer {KEY}",
    ),
    "same-url-own-key-kept": (
        {"EXTRACTOR_BASE_URL": "{pipe}", "EXTRACTOR_API_KEY": "mine-456789"},
        "pipe",
        "Bearer mine-456789",
    ),
    "other-url-whitespace-key-gets-no-key": (
        {"EXTRACTOR_BASE_URL": " {other} ", "EXTRACTOR_API_KEY": "  "},
        "other",
        KEYLESS,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_extractor_credentials_follow_its_url(case):
    admin, target, expected = CASES[case]
    with PageSite() as site, extractor() as pipe_server, extractor() as other:
        urls = {
            "other": other.base_url,
            "pipe": pipe_server.base_url,
            "pipe_upper": pipe_server.base_url.replace("http://", "HTTP://"),
        }
        valves = {k: v.format(**urls) for k, v in admin.items()}
        outcome = await visit_with(
            valves, pipe_server.base_url, KEY, site.url("/article")
        )
        seen = {"pipe": authorizations(pipe_server), "other": authorizations(other)}
    assert outcome.ok, outcome.text
    assert seen[target] == [expected]
    assert seen["other" if target == "pipe" else "pipe"] == []
    for headers in seen.values():
        assert all(KEY not in (h or "") for h in headers) or target == "pipe"


async def test_url_credentials_go_only_to_the_pipes_server():
    with PageSite() as site, extractor() as pipe_server, extractor() as other:
        pipe_url = with_credentials(pipe_server.base_url)
        page = site.url("/article")
        shared = await visit_with({}, pipe_url, "", page)
        elsewhere = await visit_with(
            {"EXTRACTOR_BASE_URL": other.base_url}, pipe_url, "", page
        )
        seen_pipe, seen_other = authorizations(pipe_server), authorizations(other)
    assert shared.ok and elsewhere.ok
    token = base64.b64encode(f"svc:{PASSWORD}".encode()).decode()
    assert seen_pipe == [f"Basic {token}"]
    assert seen_other == [KEYLESS]


async def test_through_the_pipe_an_extractor_elsewhere_never_gets_the_key():
    with PageSite() as site, FakeOpenAI() as model, extractor() as other:
        page = site.url("/article")
        turns = [
            Reply(content=tool_call("visit", {"url": [page], "goal": "greeting"})),
            Reply(content=answer("Hello.")),
        ]
        model.script(*turns)
        visit = local_visit(EXTRACTOR_BASE_URL=other.base_url)
        pipe = Pipe(
            tool_resolver=ToolResolver(
                classes={"visit": visit, "search": None, "google_scholar": None}
            )
        )
        pipe.valves = pipe.Valves(
            API_BASE_URL=model.base_url, MODEL_ID=model.model, API_KEY=KEY
        )
        text, _, _ = await drive(pipe, [{"role": "user", "content": "Read it."}])
        seen_other = authorizations(other)
        seen_model = authorizations(model)
    assert "Hello." in text
    assert seen_other == [KEYLESS]
    assert seen_model and set(seen_model) == {f"Bearer {KEY}"}
