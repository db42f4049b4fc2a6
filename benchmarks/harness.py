"""Driving the pipe and the real tools the way Open WebUI does.

`make_pipe` builds ONE `Pipe` with the given tool classes (the resolver seam
the tests use); `drive` runs one chat through ``pipe.pipe(...)`` and keeps
every yielded chunk and emitted event with the time it arrived. `with_valves`
gives a real tool class different valve defaults (the pipe makes a fresh
``Tools()`` per call, so valves cannot be set on an instance).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import create_model

from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.toolbox import (
    ToolResolver,
)
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe

MODEL_ID = "Alibaba-NLP/Tongyi-DeepResearch-30B-A3B"
NO_TOOLS: dict[str, type | None] = {
    "search": None,
    "visit": None,
    "google_scholar": None,
}


def with_valves(tools_cls: type, **defaults: Any) -> type:
    """A subclass of `tools_cls` whose ``Valves`` default to `defaults`."""
    fields: dict[str, Any] = {k: (type(v), v) for k, v in defaults.items()}
    valves = create_model("Valves", __base__=tools_cls.Valves, **fields)
    return type(tools_cls.__name__, (tools_cls,), {"Valves": valves})


def make_pipe(model_url: str, classes: dict[str, type | None], **valves: Any) -> Pipe:
    """One pipe against `model_url`, with these tool classes (None = absent)."""
    pipe = Pipe(tool_resolver=ToolResolver(classes={**NO_TOOLS, **classes}))
    settings: dict[str, Any] = {
        "API_BASE_URL": model_url,
        "MODEL_ID": MODEL_ID,
        "MAX_RETRIES": 1,
        "REQUEST_TIMEOUT_SECONDS": 120.0,
        "TOOL_TIMEOUT_SECONDS": 300.0,
        **valves,
    }
    pipe.valves = pipe.Valves(**settings)
    return pipe


@dataclass
class Transcript:
    """One chat as Open WebUI saw it; times are seconds since the call."""

    chunks: list[tuple[float, str]] = field(default_factory=list)
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    finished: float = 0.0

    @property
    def text(self) -> str:
        """Everything the pipe yielded."""
        return "".join(text for _, text in self.chunks)

    def first_visible(self) -> float:
        """When the first non-blank text was yielded."""
        return next(t for t, text in self.chunks if text.strip())

    def event_time(self, prefix: str) -> float:
        """When the first status whose description starts with `prefix` came."""
        return next(
            t
            for t, event in self.events
            if event.get("type") == "status"
            and str(event["data"].get("description", "")).startswith(prefix)
        )


async def drive(
    pipe: Pipe, question: str, chat_id: str, model: str = "tongyi-deepresearch"
) -> Transcript:
    """One chat turn through ``pipe.pipe`` (streamed, with an event emitter).

    `model` is the pipe's model the chat picked (the heavy one, say).
    """
    transcript = Transcript()
    started = time.perf_counter()

    async def emitter(event: dict[str, Any]) -> None:
        transcript.events.append((time.perf_counter() - started, event))

    body = {
        "model": f"tongyi_deepresearch.{model}",
        "messages": [{"role": "user", "content": question}],
        "stream": True,
    }
    async for chunk in pipe.pipe(
        body,
        __user__={"id": f"user-{chat_id}", "role": "user", "name": "Bench"},
        __event_emitter__=emitter,
        __chat_id__=chat_id,
        __metadata__={"variables": {"{{CURRENT_DATE}}": "2026-01-15"}},
    ):
        transcript.chunks.append((time.perf_counter() - started, chunk))
    transcript.finished = time.perf_counter() - started
    return transcript
