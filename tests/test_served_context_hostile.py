"""Served-context probes against odd and hostile answers.

Real HTTP on 127.0.0.1: `FakeOpenAI` plus the native routes of llama.cpp
(``/props``) and Ollama (``/api/ps``, ``/api/show``), answering with raw
bytes so any JSON a server can send is sent. A context that is a boolean,
zero, negative, fractional, absurd, a string or NaN is no context: the probe
says "unknown" (the valves' budget holds) and logs what it ignored. Replies
are read up to a cap, never inflated, and decoded a bounded piece at a time;
an Ollama parameters text over its cap is not read; a "too long" refusal that
names an implausible size names none.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fakes.http import Request, Response
from tests.fakes.openai_server import FakeOpenAI, Reply
from tongyi_deepresearch_openwebui_pipeline.adapters import model_client
from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    ModelSettings,
    OpenAIModelClient,
    served_context_tokens,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import ContextOverflowError

RANGE = "a whole number of tokens from 256 to 16,777,216"
UNKNOWN = "the served context counts as unknown."


@pytest.fixture
def model() -> str:
    # A fresh id per test: the probe caches its answer per (URL, model), and a
    # later test's server may get a port an earlier one used.
    return f"tongyi-{uuid.uuid4().hex}:30b"


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    # /v1/models lists another id: the model list says nothing of ours.
    with FakeOpenAI(model="listed-elsewhere") as server:
        yield server


def route(fake: FakeOpenAI, path: str, body: bytes, **headers: str) -> None:
    """Answer ``path`` with exactly ``body`` (JSON as a server wrote it)."""

    def answer(_request: Request) -> Response:
        return Response(200, {"Content-Type": "application/json", **headers}, body)

    fake.server.routes[path] = answer


async def served(fake: FakeOpenAI, model: str) -> int:
    settings = ModelSettings(base_url=fake.base_url, model=model)
    async with httpx.AsyncClient() as http:
        return await served_context_tokens(http, settings)


def logged(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """The probe's log lines as (level, message)."""
    return [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == model_client.log.name
    ]


def ignored(where: str, name: str, shown: str) -> tuple[str, str]:
    """The warning for a value that is no context."""
    return (
        "WARNING",
        f"The model server at {where} reported {name} = {shown}, which is no "
        f"context size ({RANGE}); {UNKNOWN}",
    )


def not_read(message: str) -> tuple[str, str]:
    """The note for a reply the probe does not read."""
    return ("INFO", f"{message}; {UNKNOWN}")


# -- odd values ----------------------------------------------------------------

# (what the server sent, how the log shows it)
ODD_VALUES = [
    ("true", "true"),
    ("false", "false"),
    ("0", "0"),
    ("-32768", "-32768"),
    ("1000000000000000000000000000000", "1000000000000000000000000000000"),
    ("32768.0", "32768.0"),
    ("3.2e4", "32000.0"),
    ('"32768"', '"32768"'),
    ('"32k"', '"32k"'),
    ("NaN", "NaN"),
    ("Infinity", "Infinity"),
    ("[32768]", "an array"),
    ('{"tokens": 32768}', "an object"),
]


@pytest.mark.parametrize(("literal", "shown"), ODD_VALUES)
async def test_an_odd_context_is_unknown_and_logged(
    fake: FakeOpenAI,
    model: str,
    literal: str,
    shown: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = '{"default_generation_settings": {"n_ctx": %s}, "total_slots": 1}'
    route(fake, "/props", (body % literal).encode())
    caplog.set_level(logging.INFO)
    assert await served(fake, model) == 0
    where = fake.server.url("/props")
    assert logged(caplog) == [
        ignored(where, "default_generation_settings.n_ctx", shown)
    ]


def place_true(fake: FakeOpenAI, model: str, place: str) -> tuple[str, str]:
    """Report ``true`` as the context at ``place``; the URL and field it names."""
    entry: dict[str, Any] = {"id": model, "object": "model"}
    if place == "max_model_len":  # vLLM
        entry["max_model_len"] = True
    elif place == "context_length":  # OpenRouter
        entry["context_length"] = True
    elif place == "top_provider.context_length":
        entry["top_provider"] = {"context_length": True}
    elif place == "n_ctx":  # an older llama.cpp /props
        route(fake, "/props", b'{"n_ctx": true}')
        return fake.server.url("/props"), "n_ctx"
    else:  # Ollama, the loaded model
        models = {"models": [{"name": model, "model": model, "context_length": True}]}
        route(fake, "/api/ps", json.dumps(models).encode())
        return fake.server.url("/api/ps"), "context_length"
    route(fake, "/v1/models", json.dumps({"object": "list", "data": [entry]}).encode())
    return fake.base_url + "/models", place


@pytest.mark.parametrize(
    "place",
    [
        "max_model_len",
        "context_length",
        "top_provider.context_length",
        "n_ctx",
        "ollama context_length",
    ],
)
async def test_a_boolean_is_no_context_wherever_it_is_reported(
    fake: FakeOpenAI, model: str, place: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`true` is an int in Python: taken as a context of 1 token it ends every run."""
    where, name = place_true(fake, model, place)
    caplog.set_level(logging.INFO)
    assert await served(fake, model) == 0
    assert logged(caplog) == [ignored(where, name, "true")]


async def test_the_plausible_range_is_256_to_16_mebi_tokens(
    fake: FakeOpenAI, model: str
) -> None:
    answers = []
    for n_ctx in (255, 256, 16 * 1024 * 1024, 16 * 1024 * 1024 + 1):
        route(fake, "/props", b'{"n_ctx": %d}' % n_ctx)
        answers.append(await served(fake, f"{model}-{n_ctx}"))
    assert answers == [0, 256, 16 * 1024 * 1024, 0]


async def test_an_ignored_value_does_not_hide_a_plausible_one(
    fake: FakeOpenAI, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    entry = {"id": model, "max_model_len": True, "context_length": 32768}
    route(fake, "/v1/models", json.dumps({"data": [entry]}).encode())
    caplog.set_level(logging.INFO)
    assert await served(fake, model) == 32768
    where = fake.base_url + "/models"
    assert logged(caplog) == [ignored(where, "max_model_len", "true")]


# -- Ollama's Modelfile parameters ---------------------------------------------


def ollama_show(fake: FakeOpenAI, parameters: str) -> None:
    route(fake, "/api/ps", b'{"models": []}')  # not loaded yet
    shown = {"parameters": parameters, "license": "Apache-2.0", "model_info": {}}
    route(fake, "/api/show", json.dumps(shown).encode())


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("num_ctx                        12", "12"),
        ("num_ctx                        99999999", "99999999"),
        ("num_ctx                        1e+06", "1e+06"),
        ("num_ctx                        ٤٠٩٦٠", "٤٠٩٦٠"),  # Arabic-Indic digits
    ],
)
async def test_an_implausible_num_ctx_is_unknown_and_logged(
    fake: FakeOpenAI,
    model: str,
    line: str,
    shown: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ollama_show(fake, f'{line}\nstop                           "<|im_end|>"')
    caplog.set_level(logging.INFO)
    assert await served(fake, model) == 0
    where = fake.server.url("/api/show")
    assert logged(caplog) == [ignored(where, "num_ctx", shown)]


async def test_ollama_parameters_past_their_cap_are_not_read(
    fake: FakeOpenAI, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Modelfile's parameters are a line per setting; 16 KiB is far past any."""
    cap = 16 * 1024
    filler = 'stop                           "<|x|>"\n' * (cap // 39 + 1)
    parameters = "num_ctx                        40960\n" + filler
    ollama_show(fake, parameters)
    caplog.set_level(logging.INFO)
    assert await served(fake, model) == 0
    assert logged(caplog) == [
        not_read(
            f"The model server at {fake.server.url('/api/show')} sent Modelfile "
            f"parameters of {len(parameters):,} characters, more than the "
            f"{cap:,} read"
        )
    ]


# -- what is read of a reply -----------------------------------------------------


async def test_a_native_reply_over_one_mebibyte_is_not_read(
    fake: FakeOpenAI, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    """llama.cpp's /props is a few kB: 1 MiB is its cap (the model list keeps 8 MiB)."""
    body = b'{"n_ctx": 65536, "chat_template": "' + b"x" * (1024 * 1024) + b'"}'
    route(fake, "/props", body)
    caplog.set_level(logging.INFO)
    assert await served(fake, model) == 0
    assert logged(caplog) == [
        not_read(
            f"The model server's reply to {fake.server.url('/props')} is over "
            "1,048,576 bytes"
        )
    ]


async def test_probes_ask_for_plain_replies_and_never_inflate_one(
    fake: FakeOpenAI, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A compressed reply can inflate a thousandfold in one read: it is not read."""
    route(
        fake,
        "/props",
        gzip.compress(b'{"n_ctx": 65536}'),
        **{"Content-Encoding": "gzip"},
    )
    caplog.set_level(logging.INFO)
    assert await served(fake, model) == 0
    asked = {r.headers.get("accept-encoding") for r in fake.requests}
    assert asked == {"identity"}
    assert logged(caplog) == [
        not_read(
            f"The model server at {fake.server.url('/props')} sent a reply "
            "encoded as 'gzip' though asked for a plain one"
        )
    ]


async def test_a_reply_that_is_not_utf8_is_not_read(
    fake: FakeOpenAI, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    route(fake, "/props", b'{"n_ctx": 65536, "model_path": "/m/\xff.gguf"}')
    caplog.set_level(logging.INFO)
    assert await served(fake, model) == 0
    assert logged(caplog) == [
        not_read(
            f"The model server's reply to {fake.server.url('/props')} is not UTF-8 text"
        )
    ]


async def test_a_model_list_entry_longer_than_a_piece_is_not_decoded(
    fake: FakeOpenAI, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No step decodes more than one window: a real entry is a few kB."""
    entry = {"id": model, "max_model_len": 32768, "description": "d" * 200_000}
    route(fake, "/v1/models", json.dumps({"data": [entry]}).encode())
    caplog.set_level(logging.INFO)
    assert await served(fake, model) == 0
    assert logged(caplog) == [unreadable(fake.base_url + "/models")]


def unreadable(where: str) -> tuple[str, str]:
    return not_read(
        f"The model server's reply to {where} is not JSON the probe reads "
        "(malformed, over 50,000 pieces, or a piece over 65,536 characters)"
    )


async def test_a_model_list_of_more_pieces_than_any_real_one_is_not_read(
    fake: FakeOpenAI, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each piece costs Python work: 8 MB of "0," would be four million of them."""
    listing = b'{"data": [' + b"0," * 50_000 + b'{"id": "%s", "max_model_len": 32768}]}'
    route(fake, "/v1/models", listing % model.encode())
    caplog.set_level(logging.INFO)
    assert await served(fake, model) == 0
    assert logged(caplog) == [unreadable(fake.base_url + "/models")]


# -- the piece-by-piece reader ---------------------------------------------------


def expected_pieces(document: dict[str, Any]) -> list[tuple[str, Any, bool]]:
    """What the reader yields: each member, an array once per element."""
    pieces: list[tuple[str, Any, bool]] = []
    for key, value in document.items():
        if isinstance(value, list):
            pieces += [(key, item, True) for item in value]
        else:
            pieces.append((key, value, False))
    return pieces


SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=12)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=10,
)
DOCUMENTS = st.dictionaries(st.text(max_size=6), VALUES | st.lists(VALUES), max_size=6)


def text_length(value: Any, indent: int | None, level: int) -> int:
    """How long ``value`` is where `json.dumps(..., indent=indent)` puts it."""
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    return len(text) + text.count("\n") * (indent or 0) * level


@given(
    document=DOCUMENTS,
    indent=st.sampled_from([None, 2]),
    window=st.integers(1, 120),
)
def test_pieces_are_the_members_json_gives_at_any_window(document, indent, window):
    """Unreadable exactly when a key, value or element does not fit a window."""
    text = json.dumps(document, indent=indent, ensure_ascii=False)
    pieces = expected_pieces(document)
    longest = max(
        [
            text_length(value, indent, 2 if element else 1)
            for _, value, element in pieces
        ]
        + [len(json.dumps(key, ensure_ascii=False)) for key in document],
        default=0,
    )
    reader = model_client._JsonPieces(text, window=window)
    if longest < window:
        assert list(reader.members()) == pieces
    else:
        with pytest.raises(model_client._Unreadable):
            list(reader.members())


NUMBERS = st.integers(-(10**15), 10**15) | st.floats(
    allow_nan=False, allow_infinity=False
)


@given(window=st.integers(25, 60), numbers=st.lists(NUMBERS, max_size=30))
def test_a_number_cut_by_the_window_is_read_whole(window, numbers):
    """Numbers fit the window (24 characters at most) but windows cut them."""
    text = json.dumps({"n": numbers})
    pieces = model_client._JsonPieces(text, window=window)
    assert list(pieces.members()) == [("n", n, True) for n in numbers]


HOSTILE = {
    "empty lists": b'{"data": [' + b"[]," * 200_000 + b'{"id": "m", "n": 1}]}',
    "small numbers": b'{"data": [' + b"0," * 300_000 + b'{"id": "m", "n": 1}]}',
    "white space": b'{"data": [' + b" " * 600_000 + b'{"id": "m", "n": 1}]}',
    "members": b"{" + b'"k": 0,' * 100_000 + b'"data": [{"id": "m", "n": 1}]}',
    "entries": b'{"data": ['
    + b'{"id": "x", "n": 12345678},' * 30_000
    + b'{"id": "m", "n": 1}]}',
}


@pytest.mark.slow  # counts the decoder's work over replies of megabytes
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_reading_work_is_linear_whatever_the_shape(name):
    """Characters copied into windows (each decoded at most twice) stay linear."""
    text = HOSTILE[name].decode()
    window = 4096
    pieces = model_client._JsonPieces(text, window=window, max_pieces=len(text))
    last = list(pieces.members())[-1]
    assert last == ("data", {"id": "m", "n": 1}, True)
    assert pieces.copied <= 2 * len(text) + 2 * window


async def test_reading_gives_the_loop_a_turn_every_window_and_thousand_pieces():
    text = '{"data": [' + ",".join(['{"id": "x"}'] * 5000 + ["0"] * 5000) + "]}"
    pieces = model_client._JsonPieces(text, window=10_000)
    seen: list[tuple[int, int]] = []  # (windows, pieces) read at each turn

    async def watch() -> None:
        while True:
            seen.append((pieces.windows, pieces.read))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0)  # the watcher has seen the start
    kept = await model_client._read_pieces(pieces, lambda piece: piece.value == 0)
    watcher.cancel()
    seen.append((pieces.windows, pieces.read))
    assert len(kept) == 5000
    steps = list(itertools.pairwise(seen))
    assert max(after[0] - before[0] for before, after in steps) == 1
    assert max(after[1] - before[1] for before, after in steps) == 1000


# -- "too long" refusals ---------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        "This model's maximum context length is 123456789 tokens.",  # 9 digits
        "This model's maximum context length is 20000000 tokens.",  # > 16 Mi
        "the request exceeds the available context size (n_ctx: 200)",
    ],
)
async def test_a_refusal_naming_an_implausible_context_names_none(message):
    with FakeOpenAI() as fake:
        fake.script(Reply(status=400, error=message))
        settings = ModelSettings(base_url=fake.base_url, model=fake.model)
        async with httpx.AsyncClient() as http:
            client = OpenAIModelClient(settings, http)
            with pytest.raises(ContextOverflowError) as raised:
                async for _ in client.stream([{"role": "user", "content": "q"}]):
                    pass
    assert raised.value.limit == 0
