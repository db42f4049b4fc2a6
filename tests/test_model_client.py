"""The model client against a real local SSE server, per server style and fault."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakes.openai_server import FakeOpenAI, Reply, answer, tool_call
from tongyi_deepresearch_openwebui_pipeline.adapters import model_client
from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    STOP_SEQUENCES,
    ModelSettings,
    OpenAIModelClient,
    SSEDecoder,
    _Transient,
    chunks_of,
    served_context_tokens,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    ModelDelta,
    ModelError,
    ModelFinish,
    ModelRetry,
    ModelUsage,
)
from tongyi_deepresearch_openwebui_pipeline.core.protocol import parse_turn

MESSAGES = [{"role": "user", "content": "question"}]
KEY = "sk-test-SECRET-123456"


async def run(fake: FakeOpenAI, **settings):
    sleeps: list[float] = []

    async def no_sleep(delay: float) -> None:
        sleeps.append(delay)

    options = {"base_url": fake.base_url, "model": fake.model, "backoff_seconds": 0.01}
    options.update(settings)
    async with httpx.AsyncClient() as http:
        client = OpenAIModelClient(ModelSettings(**options), http, sleep=no_sleep)
        chunks = [chunk async for chunk in client.stream(MESSAGES)]
    return chunks, sleeps


def text_of(chunks):
    reasoning = "".join(c.reasoning for c in chunks if isinstance(c, ModelDelta))
    content = "".join(c.content for c in chunks if isinstance(c, ModelDelta))
    return reasoning, content


@pytest.mark.parametrize("style", ["inline", "reasoning_content", "reasoning"])
async def test_three_styles_give_the_same_turn(style):
    reply = Reply(
        reasoning="Plan: search.",
        content=tool_call("search", {"query": ["x"]}),
        style=style,
    )
    with FakeOpenAI() as fake:
        fake.script(reply)
        chunks, _ = await run(fake)
    reasoning, content = text_of(chunks)
    turn = parse_turn(content, reasoning)
    assert turn.history_text == (
        "<think>\nPlan: search.\n</think>\n\n<tool_call>\n"
        '{"name": "search", "arguments": {"query": ["x"]}}\n</tool_call>'
    )
    assert ModelFinish("stop") in chunks


async def test_request_carries_reference_sampling_and_stops():
    with FakeOpenAI() as fake:
        fake.script(Reply(content=answer("x")))
        await run(fake, temperature=0.85, max_tokens=1234)
        body = fake.bodies[0]
        headers = fake.requests[0].headers
    assert body["stop"] == list(STOP_SEQUENCES)
    assert body["temperature"] == 0.85 and body["top_p"] == 0.95
    assert body["presence_penalty"] == 1.1 and body["max_tokens"] == 1234
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "authorization" not in headers  # keyless local server


async def test_api_key_is_sent_as_bearer():
    with FakeOpenAI() as fake:
        fake.script(Reply(content=answer("x")))
        await run(fake, api_key=KEY)
        assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"


async def test_usage_and_cost_are_reported():
    with FakeOpenAI() as fake:
        fake.script(Reply(content=answer("x"), prompt_tokens=1000, cost=0.0123))
        chunks, _ = await run(fake)
    usage = [c for c in chunks if isinstance(c, ModelUsage)]
    assert usage and usage[0].prompt_tokens == 1000 and usage[0].cost == 0.0123


async def test_stream_without_usage_still_works():
    with FakeOpenAI() as fake:
        fake.script(Reply(content=answer("x"), usage=False))
        chunks, _ = await run(fake)
    assert not [c for c in chunks if isinstance(c, ModelUsage)]
    assert text_of(chunks)[1].endswith("</answer>")


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        (Reply(fault="drop", content=answer("y" * 50)), "ended before"),
        (Reply(fault="garbage", content=answer("y" * 50)), "malformed"),
        (Reply(fault="empty_choices"), "empty reply"),
        (Reply(fault="empty"), "empty reply"),
        (Reply(status=500), "HTTP 500"),
        (Reply(status=503), "HTTP 503"),
    ],
)
async def test_transient_faults_are_retried(fault, reason):
    with FakeOpenAI() as fake:
        fake.script(fault, Reply(content=answer("ok")))
        chunks, sleeps = await run(fake)
    retries = [c for c in chunks if isinstance(c, ModelRetry)]
    assert len(retries) == 1 and reason in retries[0].reason
    assert len(sleeps) == 1
    assert text_of(chunks)[1].endswith("ok\n</answer>")


async def test_429_honours_retry_after():
    with FakeOpenAI() as fake:
        fake.script(
            Reply(status=429, headers={"Retry-After": "7"}), Reply(content=answer("ok"))
        )
        _, sleeps = await run(fake)
    assert sleeps == [7.0]


async def test_429_without_retry_after_backs_off_exponentially():
    with FakeOpenAI() as fake:
        fake.script(Reply(status=429), Reply(status=429), Reply(content=answer("ok")))
        _, sleeps = await run(fake, backoff_seconds=1.0)
    assert 1.0 <= sleeps[0] <= 2.0 and 2.0 <= sleeps[1] <= 3.0


@pytest.mark.parametrize(
    ("status", "valve"),
    [(401, "API_KEY"), (403, "API_KEY"), (404, "MODEL_ID"), (400, "MAX_TOKENS")],
)
async def test_configuration_errors_are_not_retried(status, valve):
    with FakeOpenAI() as fake:
        fake.script(
            Reply(status=status, error=f"bad key {KEY}"), Reply(content=answer("no"))
        )
        with pytest.raises(ModelError) as caught:
            await run(fake, api_key=KEY)
        assert len(fake.bodies) == 1
    assert valve in caught.value.message
    assert KEY not in caught.value.message


async def test_gives_up_after_max_attempts_with_a_clear_message():
    with FakeOpenAI() as fake:
        fake.script(*[Reply(status=502) for _ in range(3)])
        with pytest.raises(ModelError) as caught:
            await run(fake, max_attempts=3)
        assert len(fake.bodies) == 3
    assert "after 3 attempts" in caught.value.message
    assert "API_BASE_URL" in caught.value.message


async def test_refused_connection_is_retried_then_reported():
    with FakeOpenAI() as fake:
        url = fake.base_url
    # The server is gone: the port refuses connections.
    async with httpx.AsyncClient() as http:
        client = OpenAIModelClient(
            ModelSettings(base_url=url, model="m", max_attempts=2, backoff_seconds=0.0),
            http,
        )
        with pytest.raises(ModelError) as caught:
            [c async for c in client.stream(MESSAGES)]
    assert "connection failed" in caught.value.message


async def test_server_that_never_answers_times_out():
    with FakeOpenAI() as fake:
        fake.script(Reply(fault="hang"), Reply(fault="hang"))
        with pytest.raises(ModelError) as caught:
            await run(fake, timeout_seconds=0.3, max_attempts=2)
    assert "timed out" in caught.value.message


async def test_stream_options_rejected_is_retried_without_it():
    with FakeOpenAI() as fake:
        fake.script(
            Reply(status=400, error="unknown field stream_options"),
            Reply(content=answer("ok")),
        )
        chunks, _ = await run(fake)
        assert "stream_options" not in fake.bodies[1]
    assert text_of(chunks)[1].endswith("</answer>")


# -- the incremental SSE decoder ---------------------------------------------------

SSE = (
    ": comment\n\n"
    'data: {"choices": [{"delta": {"reasoning_content": "think "}}]}\n\n'
    'data: {"choices": [{"delta": {"content": "<answer>é"}}]}\r\n\r\n'
    'event: ping\ndata: {"choices": [{"delta": {"content": "</answer>"}, '
    '"finish_reason": "stop"}]}\n\n'
    'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}\n\n'
    "data: [DONE]\n\n"
    'data: {"choices": [{"delta": {"content": "after done"}}]}\n\n'
)


def decode_in_pieces(text: str, sizes: list[int]) -> list[dict]:
    decoder = SSEDecoder()
    payloads: list[dict] = []
    position = index = 0
    while position < len(text):
        size = max(1, sizes[index % len(sizes)])
        payloads += decoder.feed(text[position : position + size])
        position += size
        index += 1
    return payloads + decoder.flush()


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=8))
def test_sse_split_anywhere_gives_the_same_payloads(sizes):
    whole = decode_in_pieces(SSE, [len(SSE)])
    assert len(whole) == 4
    assert decode_in_pieces(SSE, sizes) == whole


def test_sse_last_line_without_newline_is_flushed():
    decoder = SSEDecoder()
    assert decoder.feed('data: {"a": 1}') == []
    assert decoder.flush() == [{"a": 1}]


def test_sse_broken_json_is_a_transient_failure():
    with pytest.raises(_Transient):
        SSEDecoder().feed("data: {broken\n\n")


def test_one_read_becomes_one_delta_in_order():
    payloads = decode_in_pieces(SSE, [len(SSE)])
    chunks = chunks_of(payloads)
    assert chunks == [
        ModelDelta("think ", "<answer>é</answer>"),
        ModelFinish("stop"),
        ModelUsage(3, 4, None),
    ]


def test_reasoning_after_content_starts_a_new_delta():
    payloads = [
        {"choices": [{"delta": {"content": "a"}}]},
        {"choices": [{"delta": {"reasoning": "b"}}]},
        {"choices": [{"delta": {"content": "c"}}]},
    ]
    assert chunks_of(payloads) == [ModelDelta("", "a"), ModelDelta("b", "c")]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "choices",
                    "delta",
                    "content",
                    "reasoning",
                    "usage",
                    "reasoning_content",
                    "finish_reason",
                    "prompt_tokens",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


def first_choice(payload: dict) -> dict | None:
    """The payload's first choice, when it is one (an object in a list)."""
    choices = payload.get("choices")
    if type(choices) is list and choices and type(choices[0]) is dict:
        return choices[0]
    return None


def delta_text(choice: dict, *fields: str) -> str:
    """The first non-empty of ``fields`` in the choice's delta, when it is text."""
    delta = choice.get("delta")
    if type(delta) is not dict:
        return ""
    value = next((delta[f] for f in fields if delta.get(f)), "")
    return value if type(value) is str else ""


def token_count(value: object) -> int:
    """A usage count as the client believes it: a whole number in range, else 0."""
    if type(value) is int and 0 <= value <= MAX_COUNTED_TOKENS:
        return value
    return 0


#: The most tokens one call is believed to count (the largest context believed).
MAX_COUNTED_TOKENS = 16 * 1024 * 1024
ODD_PAYLOADS = st.dictionaries(st.sampled_from(["choices", "usage", "id"]), JSON_VALUES)
# Payloads of the expected shape, with odd values where values go.
SHAPED_PAYLOADS = st.fixed_dictionaries(
    {
        "choices": st.lists(
            st.fixed_dictionaries(
                {
                    "delta": st.dictionaries(
                        st.sampled_from(["content", "reasoning", "reasoning_content"]),
                        st.text(max_size=5) | JSON_VALUES,
                    )
                },
                optional={"finish_reason": JSON_VALUES},
            ),
            min_size=1,
            max_size=2,
        )
    },
    optional={
        "usage": st.dictionaries(
            st.sampled_from(["prompt_tokens", "completion_tokens"]),
            st.integers(-2, MAX_COUNTED_TOKENS + 2) | JSON_VALUES,
        )
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ODD_PAYLOADS | SHAPED_PAYLOADS))
def test_odd_payload_shapes_keep_every_text_usage_and_finish(payloads):
    chunks = chunks_of(payloads)
    choices = [c for c in map(first_choice, payloads) if c is not None]
    deltas = [c for c in chunks if isinstance(c, ModelDelta)]
    assert "".join(d.content for d in deltas) == "".join(
        delta_text(c, "content") for c in choices
    )
    assert "".join(d.reasoning for d in deltas) == "".join(
        delta_text(c, "reasoning_content", "reasoning") for c in choices
    )
    usages = [c for c in chunks if isinstance(c, ModelUsage)]
    assert usages == [
        ModelUsage(
            token_count(p["usage"].get("prompt_tokens")),
            token_count(p["usage"].get("completion_tokens")),
            None,
        )
        for p in payloads
        if type(p.get("usage")) is dict and p["usage"]
    ]
    finishes = [c.reason for c in chunks if isinstance(c, ModelFinish)]
    assert finishes == [c["finish_reason"] for c in choices if c.get("finish_reason")]
    assert len(deltas) + len(usages) + len(finishes) == len(chunks)


async def test_served_context_is_read_from_the_model_list():
    model_client._CONTEXT_CACHE.clear()
    with FakeOpenAI(max_model_len=16384) as fake:
        async with httpx.AsyncClient() as http:
            settings = ModelSettings(base_url=fake.base_url, model=fake.model)
            assert await served_context_tokens(http, settings) == 16384
            other = ModelSettings(base_url=fake.base_url, model="another-model")
            assert await served_context_tokens(http, other) == 0
            missing = ModelSettings(base_url=fake.server.url("/nope"), model=fake.model)
            assert await served_context_tokens(http, missing) == 0
        url = fake.base_url
    async with httpx.AsyncClient() as http:  # the server is gone
        assert await served_context_tokens(http, ModelSettings(url, "m")) == 0


async def test_served_context_is_cached_per_endpoint_and_model():
    model_client._CONTEXT_CACHE.clear()
    with FakeOpenAI(max_model_len=32768) as fake:
        settings = ModelSettings(base_url=fake.base_url, model=fake.model)
        async with httpx.AsyncClient() as http:
            first = await served_context_tokens(http, settings)
            second = await served_context_tokens(http, settings)
        listings = [r for r in fake.requests if r.path == "/v1/models"]
    assert first == second == 32768
    assert len(listings) == 1
