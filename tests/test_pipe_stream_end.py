"""A streamed reply ends with ``finish_reason`` and ``data: [DONE]`` on every version.

Open WebUI 0.6.43 and 0.8.12 send the finish chunk and ``data: [DONE]`` after
a pipe's stream only when the pipe returned a str or a *sync* generator; the
pipe is an async generator, so API clients got a stream that just stopped.
0.11.4 and 0.12.4 end every stream themselves. The stand-in runners below
have each version's behaviour (written for this test, as a small package on
``sys.path``); the pipe is driven through them end to end.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI, Reply, answer
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui import compat
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe

MODEL = "tongyi_deepresearch.tongyi-deepresearch"
#: The tool switches come from the tool catalog (not declared fields).
NO_WEB_TOOLS: dict[str, Any] = {
    "SEARCH_ENABLED": False,
    "SCHOLAR_ENABLED": False,
    "VISIT_ENABLED": False,
}

_COMMON = """
import json
from collections.abc import AsyncGenerator, Generator


def _chunk(model, delta, finish_reason=None):
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    return {"model": model, "choices": [choice], "object": "chat.completion.chunk"}


def _line(model, item):
    if isinstance(item, dict):
        item = "data: " + json.dumps(item)
    if item.startswith("data:"):
        return item + "\\n\\n"
    return "data: " + json.dumps(_chunk(model, {"content": item})) + "\\n\\n"


def _finish(model):
    return "data: " + json.dumps(_chunk(model, {}, "stop")) + "\\n\\n"
"""

# 0.6.43 / 0.8.12: the stream is closed only for str and sync-generator replies.
RUNNER_SYNC_ONLY_END = _COMMON + textwrap.dedent(
    """
    async def stream_reply(res, model):
        if isinstance(res, AsyncGenerator):
            async for item in res:
                yield _line(model, item)

        if isinstance(res, str) or isinstance(res, Generator):
            yield _finish(model)
            yield "data: [DONE]"
    """
)

# 0.11.4 / 0.12.4: every stream is closed.
RUNNER_ALWAYS_END = _COMMON + textwrap.dedent(
    """
    async def stream_reply(res, model):
        if isinstance(res, AsyncGenerator):
            async for item in res:
                yield _line(model, item)

        yield _finish(model)
        yield "data: [DONE]"
    """
)


def _open_webui_modules() -> list[str]:
    return [
        name
        for name in sys.modules
        if name == "open_webui" or name.startswith("open_webui.")
    ]


@pytest.fixture
def install_runner(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Callable[[str], Any]]:
    """Makes ``open_webui.functions`` importable as a given stand-in.

    The stand-in's modules leave ``sys.modules`` with the test: a later test's
    pipe must not find them there and take them for its host.
    """
    for name in _open_webui_modules():
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(source: str) -> Any:
        package = tmp_path / "open_webui"
        package.mkdir(exist_ok=True)
        (package / "__init__.py").write_text("", encoding="utf-8")
        (package / "functions.py").write_text(source, encoding="utf-8")
        sys.modules.pop("open_webui.functions", None)
        return importlib.import_module("open_webui.functions")

    yield install
    for name in _open_webui_modules():
        del sys.modules[name]


async def fresh_check() -> bool:
    """The pipe's check of its host, made again (not the process's kept answer)."""
    return await compat.host_ends_async_streams(cache={})


async def run_through(runner: Any, fake: FakeOpenAI, stream: bool) -> list[str]:
    """The SSE lines an API client receives for one question."""
    fake.script(Reply(reasoning="Easy.", content=answer("Paris.")))
    pipe = Pipe(host_ends_streams=fresh_check)
    pipe.valves = pipe.Valves(
        API_BASE_URL=fake.base_url,
        MODEL_ID=fake.model,
        **NO_WEB_TOOLS,
    )
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Capital of France?"}],
        "stream": stream,
    }
    reply = pipe.pipe(body, __user__={"id": "u1", "role": "user"})
    return [line async for line in runner.stream_reply(reply, MODEL)]


def choices(lines: list[str]) -> list[dict[str, Any]]:
    """Every choice of every chunk, in order."""
    found = []
    for line in lines:
        data = line.removeprefix("data:").strip()
        if data != "[DONE]":
            found.extend(json.loads(data).get("choices") or [])
    return found


def finish_reasons(lines: list[str]) -> list[str]:
    return [c["finish_reason"] for c in choices(lines) if c.get("finish_reason")]


def content(lines: list[str]) -> str:
    return "".join((c.get("delta") or {}).get("content") or "" for c in choices(lines))


@pytest.mark.parametrize(
    "source", [RUNNER_SYNC_ONLY_END, RUNNER_ALWAYS_END], ids=["0.6-0.8", "0.11+"]
)
async def test_streamed_reply_ends_exactly_once(
    install_runner: Callable[[str], Any], source: str
) -> None:
    runner = install_runner(source)
    with FakeOpenAI() as fake:
        lines = await run_through(runner, fake, stream=True)

    assert "Paris." in content(lines)
    ends = [line.strip() for line in lines if "[DONE]" in line]
    assert ends == ["data: [DONE]"]
    assert lines[-1].strip() == "data: [DONE]"
    assert finish_reasons(lines) == ["stop"]


async def test_the_pipe_adds_the_end_only_where_it_is_missing(
    install_runner: Callable[[str], Any],
) -> None:
    install_runner(RUNNER_SYNC_ONLY_END)
    assert await fresh_check() is False

    install_runner(RUNNER_ALWAYS_END)
    assert await fresh_check() is True


async def test_non_streamed_replies_get_no_stream_lines(
    install_runner: Callable[[str], Any],
) -> None:
    install_runner(RUNNER_SYNC_ONLY_END)
    with FakeOpenAI() as fake:
        fake.script(Reply(content=answer("Paris.")))
        pipe = Pipe()
        pipe.valves = pipe.Valves(
            API_BASE_URL=fake.base_url,
            MODEL_ID=fake.model,
            **NO_WEB_TOOLS,
        )
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Q?"}]}
        pieces = [piece async for piece in pipe.pipe(body)]

    assert pieces
    assert not any(piece.startswith("data:") for piece in pieces)


async def test_without_open_webui_nothing_is_added(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(sys.modules):
        if name == "open_webui" or name.startswith("open_webui."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "open_webui", None)  # type: ignore[arg-type]

    assert await fresh_check() is True
