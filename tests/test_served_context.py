"""What context the model server serves, read where each server says it.

Real HTTP on 127.0.0.1: a fake that answers the OpenAI endpoints plus the
native ones of llama.cpp (``/props``) and Ollama (``/api/ps``, ``/api/show``),
with the shapes those servers return. And the server's "too long" refusals,
classified so the loop can recover.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.http import Request, Response
from tests.fakes.openai_server import FakeOpenAI, Reply
from tongyi_deepresearch_openwebui_pipeline.adapters import model_client
from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    ModelSettings,
    OpenAIModelClient,
    served_context_tokens,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    ContextOverflowError,
    ModelError,
)

OLLAMA_MODEL = "tongyi-deepresearch:30b"


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    model_client._CONTEXT_CACHE.clear()
    # /v1/models lists another id: the model list says nothing of ours.
    with FakeOpenAI(model="listed-elsewhere") as server:
        yield server


def route(fake: FakeOpenAI, path: str, data: Any, status: int = 200) -> None:
    def answer(_request: Request) -> Response:
        return Response.json(data, status)

    fake.server.routes[path] = answer


async def served(fake: FakeOpenAI, model: str = OLLAMA_MODEL, key: str = "") -> int:
    settings = ModelSettings(base_url=fake.base_url, model=model, api_key=key)
    async with httpx.AsyncClient() as http:
        return await served_context_tokens(http, settings)


async def test_llama_cpp_props_give_the_slot_context(fake: FakeOpenAI) -> None:
    route(
        fake,
        "/props",
        {
            "default_generation_settings": {"n_ctx": 65536, "params": {}},
            "total_slots": 1,
            "model_path": "/models/tongyi.gguf",
        },
    )
    assert await served(fake) == 65536


async def test_ollama_loaded_model_context_from_api_ps(fake: FakeOpenAI) -> None:
    route(
        fake,
        "/api/ps",
        {
            "models": [
                {"name": "other:7b", "model": "other:7b", "context_length": 2048},
                {"name": OLLAMA_MODEL, "model": OLLAMA_MODEL, "context_length": 8192},
            ]
        },
    )
    assert await served(fake) == 8192


async def test_ollama_num_ctx_from_api_show(fake: FakeOpenAI) -> None:
    route(fake, "/api/ps", {"models": []})  # not loaded yet
    route(
        fake,
        "/api/show",
        {
            "parameters": 'num_ctx                        40960\nstop "<|im_end|>"',
            "model_info": {"qwen3moe.context_length": 131072},
        },
    )
    assert await served(fake) == 40960
    shows = [r for r in fake.requests if r.path == "/api/show"]
    assert shows[0].method == "POST" and shows[0].json() == {"model": OLLAMA_MODEL}


async def test_ollama_trained_maximum_is_not_what_it_serves(fake: FakeOpenAI) -> None:
    route(fake, "/api/ps", {"models": []})
    route(fake, "/api/show", {"model_info": {"qwen3moe.context_length": 131072}})
    assert await served(fake) == 0  # unknown: Ollama's default applies


async def test_the_key_goes_only_to_the_model_server(fake: FakeOpenAI) -> None:
    route(fake, "/props", {"default_generation_settings": {"n_ctx": 32768}})
    assert await served(fake, key="sk-secret") == 32768
    assert {r.headers.get("authorization") for r in fake.requests} == {
        "Bearer sk-secret"
    }


async def test_a_huge_reply_is_cut_and_counts_as_unknown(fake: FakeOpenAI) -> None:
    huge = b"{" + b'"pad": "' + b"x" * (9 * 1024 * 1024) + b'"}'

    def answer(_request: Request) -> Response:
        return Response(200, {"Content-Type": "application/json"}, huge)

    fake.server.routes["/props"] = answer
    assert await served(fake) == 0


@pytest.mark.parametrize(
    "reply",
    [["not", "a", "dict"], {"default_generation_settings": {"n_ctx": -5}}, {}],
)
async def test_odd_replies_count_as_unknown(fake: FakeOpenAI, reply: Any) -> None:
    route(fake, "/props", reply)
    assert await served(fake) == 0


async def test_an_unknown_context_is_asked_again_sooner(fake: FakeOpenAI) -> None:
    assert await served(fake) == 0
    expiry, _ = model_client._CONTEXT_CACHE[(fake.base_url, OLLAMA_MODEL)]
    route(fake, "/props", {"default_generation_settings": {"n_ctx": 4096}})
    known = await served(fake, model="known")
    assert known == 4096
    known_expiry, _ = model_client._CONTEXT_CACHE[(fake.base_url, "known")]
    assert known_expiry - expiry > 300  # 10 minutes against 1


# -- "too long" refusals ------------------------------------------------------


OVERFLOWS = {
    "vllm": (
        "This model's maximum context length is 32768 tokens. However, you "
        "requested 40960 tokens (30960 in the messages, 10000 in the completion).",
        32768,
    ),
    "openai": (
        "This model's maximum context length is 128000 tokens. However, your "
        "messages resulted in 130000 tokens.",
        128000,
    ),
    "llama.cpp": (
        "the request exceeds the available context size, try increasing it",
        0,
    ),
    "sglang": (
        "The input (40000 tokens) is longer than the model's context length "
        "(32768 tokens).",
        32768,
    ),
}


@pytest.mark.parametrize("server", sorted(OVERFLOWS))
async def test_a_too_long_refusal_is_an_overflow(server: str) -> None:
    message, limit = OVERFLOWS[server]
    with FakeOpenAI() as fake:
        fake.script(Reply(status=400, error=message))
        settings = ModelSettings(
            base_url=fake.base_url, model=fake.model, api_key="sk-secret"
        )
        async with httpx.AsyncClient() as http:
            client = OpenAIModelClient(settings, http)
            with pytest.raises(ContextOverflowError) as raised:
                async for _ in client.stream([{"role": "user", "content": "q"}]):
                    pass
        assert len(fake.bodies) == 1  # not retried as it was
    assert raised.value.limit == limit
    assert "too long" in raised.value.message
    assert "sk-secret" not in raised.value.message


async def test_other_refusals_are_not_overflows() -> None:
    with FakeOpenAI() as fake:
        fake.script(Reply(status=400, error="temperature must be at most 2"))
        settings = ModelSettings(base_url=fake.base_url, model=fake.model)
        async with httpx.AsyncClient() as http:
            client = OpenAIModelClient(settings, http)
            with pytest.raises(ModelError) as raised:
                async for _ in client.stream([{"role": "user", "content": "q"}]):
                    pass
    assert not isinstance(raised.value, ContextOverflowError)
