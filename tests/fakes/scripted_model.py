"""The suite's one in-process model: a `ModelPort` that replays scripted turns.

For tests of the loop, the engine and the pipe that need no HTTP. (Tests of
the HTTP client, its SSE decoder and the server styles use the fake server in
`openai_server.py` instead.) Each call to `stream` plays the next turn:

- a string: the reply's content, then the finish reason ``stop``;
- a sequence: its chunks as they are (`ModelDelta`, `ModelUsage`,
  `ModelFinish`, `ModelRetry`); an exception in it is raised when reached
  (a stream that breaks part way);
- an exception: the call fails at once (a `ModelError`: the server's final
  refusal);
- a function of the request's messages giving an async generator of chunks:
  a stream with its own pace (one that never ends, or holds until it is
  closed; closing the model's stream closes it).

Once the scripted turns are played (or without any), ``respond`` chooses each
turn from the request (a model that answers a summary request one way and a
research request another).
Every request is recorded (`seen`, `max_tokens`). `client` is a model-client
factory, so a `Pipe` can run on the script:
``Pipe(model_client=model.client)``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any

import httpx

from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import ModelSettings
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    ModelChunk,
    ModelDelta,
    ModelFinish,
)

Messages = list[dict[str, Any]]
#: A stream with its own pace: called with the request's messages.
Streamer = Callable[[Messages], AsyncGenerator[Any, None]]
Turn = str | Sequence[ModelChunk | BaseException] | BaseException | Streamer


class ScriptExhaustedError(AssertionError):
    """The code under test called the model more often than the test scripted."""


class ScriptedModel:
    """A model port that plays one scripted turn per call and records the calls."""

    def __init__(
        self, *turns: Turn, respond: Callable[[Messages], Turn] | None = None
    ) -> None:
        """Script the turns, in order, or give ``respond`` to choose each one.

        Args:
            turns: One turn per call (see the module's docstring).
            respond: Chooses the turn from the request's messages; used
                once the scripted turns are played.
        """
        self.turns: list[Turn] = list(turns)
        self.respond = respond
        #: Each request's messages, copied when it was made.
        self.seen: list[Messages] = []
        #: Each request's ``max_tokens``.
        self.max_tokens: list[int | None] = []
        #: The settings of every client the pipe built (see `client`).
        self.settings: list[ModelSettings] = []

    async def stream(
        self, messages: Messages, max_tokens: int | None = None
    ) -> AsyncIterator[ModelChunk]:
        """Play the next turn as the reply to ``messages``."""
        self.seen.append([dict(message) for message in messages])
        self.max_tokens.append(max_tokens)
        turn = self._next_turn(messages)
        if isinstance(turn, BaseException):
            raise turn
        if callable(turn):
            # Closing this stream closes the turn's at once, as a real client's
            # connection is closed with it.
            async with aclosing(turn(messages)) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        for chunk in _chunks(turn):
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk

    def client(
        self, settings: ModelSettings, http_client: httpx.AsyncClient, sleep: Any, /
    ) -> ScriptedModel:
        """A `Pipe`'s model-client factory: every client it builds is this model."""
        self.settings.append(settings)
        return self

    def _next_turn(self, messages: Messages) -> Turn:
        if self.turns:
            return self.turns.pop(0)
        if self.respond is not None:
            return self.respond(messages)
        raise ScriptExhaustedError(
            f"call {len(self.seen)} of the model, but only "
            f"{len(self.seen) - 1} turns were scripted"
        )


def _chunks(turn: str | Sequence[ModelChunk | BaseException]) -> Sequence[Any]:
    if isinstance(turn, str):
        return (ModelDelta(content=turn), ModelFinish("stop"))
    return turn
