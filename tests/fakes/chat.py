"""One chat turn through `Pipe.pipe()`, called the way Open WebUI calls it.

`drive` consumes the pipe's reply and records its events with the suite's one
collector (`Events`); the `ChatTurn` it returns unpacks as
``text, chunks, events`` and reads the two outcomes tests assert: the answer
as the chat shows it, and the run's closing status line.

`FakeSearchTools` and `FakeVisitTools` stand in for the tool classes at the
pipe's seam (its `ToolResolver`), so a test of the pipe needs no search engine
or web page; the real tools run through the pipe in
tests/test_pipe_with_tools.py.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, NamedTuple

from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.toolbox import (
    ToolResolver,
)
from tongyi_deepresearch_openwebui_pipeline.core.phrasing import UNMARKED_ANSWER_NOTE
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe

from .events import Events
from .openai_server import FakeOpenAI, StreamGate

QUESTION = [{"role": "user", "content": "Who wrote it?"}]

# Where the blocks above the answer end (a reasoning block, a tool card).
_BLOCK_END = re.compile(r"</details>\n\n|\n</think>\n\n")
# What the chat shows at the end, under the answer: the sources, the summary.
_AT_THE_END = ("\n\n**Sources read**", "\n\n<details>\n<summary>Research summary")
# The run's notes right under the answer: warnings, an unmarked answer.
_NOTES = ("\n\n> ⚠️", f"\n\n{UNMARKED_ANSWER_NOTE}")


def answer_in(text: str) -> str:
    """A chat's answer as it shows it, without the blocks and notes around it.

    The text after the last reasoning block or tool card, up to the first of
    the notes, sources and summary under it.
    """
    body = text
    for tail in _AT_THE_END:
        body = body.rpartition(tail)[0] or body
    start = max((m.end() for m in _BLOCK_END.finditer(body)), default=0)
    shown = body[start:]
    for note in _NOTES:
        shown = shown.partition(note)[0]
    return shown.strip()


class ChatTurn(NamedTuple):
    """What one chat turn showed: the text, as it was streamed, and the events."""

    text: str
    chunks: list[str]
    events: Events

    @property
    def answer(self) -> str:
        """The answer as the chat shows it (see `answer_in`)."""
        return answer_in(self.text)

    @property
    def ending(self) -> str:
        """The run's closing status line (see `Events.ending`)."""
        return self.events.ending


class FakeSearchTools:
    """The search tool's class: one result per query, reported as a search."""

    class Valves:  # a pydantic-less Valves is fine for the toolbox
        model_fields: ClassVar[dict[str, Any]] = {}

        def __init__(self, **_: Any) -> None:
            pass

    async def search(self, query: list[str], __event_emitter__=None, **_: Any) -> str:
        """One result per query, in the search tool's format."""
        blocks = []
        for q in query:
            if __event_emitter__:
                await __event_emitter__(
                    {
                        "type": "status",
                        "data": {
                            "action": "web_search",
                            "description": "Searched {{count}} sites",
                            "query": q,
                            "urls": [f"https://example.org/{q}"],
                            "done": True,
                        },
                    }
                )
            blocks.append(
                f"A Google search for '{q}' found 1 results:\n\n## Web Results\n"
                f"1. [Page {q}](https://example.org/{q})\n\nSnippet {q}"
            )
        return "\n=======\n".join(blocks)


class Result(str):
    """A tool's result as our tools return it (their ToolResult's shape)."""

    ok: bool
    sources: tuple

    def __new__(cls, text: str, sources: tuple = ()) -> Result:
        """The text, worked, with the pages read."""
        result = super().__new__(cls, text)
        result.ok, result.sources = True, sources
        return result


class FakeVisitTools:
    """The visit tool's class: every page is read and gives one line of evidence."""

    async def visit(
        self, url: list[str], goal: str, __event_emitter__=None, **_: Any
    ) -> str:
        """Each page's evidence, in the visit tool's format, with its source."""
        out, sources = [], []
        for u in url:
            source = {
                "source": {"name": f"Title of {u}", "url": u},
                "document": [f"Evidence from {u}"],
                "metadata": [{"source": u, "url": u, "name": f"Title of {u}"}],
            }
            if __event_emitter__:  # as the real tool does, for use on its own
                await __event_emitter__({"type": "source", "data": source})
            sources.append(source)
            out.append(
                f"The useful information in {u} for user goal {goal} as follows: \n\n"
                f"Evidence in page: \nEvidence from {u}\n\nSummary: \nSummary\n\n"
            )
        return Result("\n=======\n".join(out).strip(), tuple(sources))


def fake_tools() -> ToolResolver:
    """The pipe's tool seam with the fake search and visit (no scholar)."""
    return ToolResolver(
        classes={
            "search": FakeSearchTools,
            "visit": FakeVisitTools,
            "google_scholar": None,
        }
    )


def make_pipe(fake: FakeOpenAI, pipe: Pipe | None = None, **valves: Any) -> Pipe:
    """A pipe with the fake tools, pointed at ``fake`` (``valves`` on top).

    Args:
        fake: The model server.
        pipe: The pipe to set up (default: one with the fake tools), for a
            test that gives the pipe other parts (its sleep, its model
            client).
        valves: Valves other than the server's URL and model.
    """
    pipe = pipe or Pipe(tool_resolver=fake_tools())
    pipe.valves = pipe.Valves(API_BASE_URL=fake.base_url, MODEL_ID=fake.model, **valves)
    return pipe


async def drive(
    pipe: Pipe,
    messages: list[dict[str, Any]],
    gates: tuple[StreamGate, ...] = (),
    body_model: str | None = None,
    **kwargs: Any,
) -> ChatTurn:
    """Consume one chat; each of `gates` observes the output as it arrives.

    `body_model` is the model the chat picked, as Open WebUI names it;
    ``kwargs`` replace the reserved arguments (a test's own emitter gets the
    events instead of the turn's collector).
    """
    events = Events()
    params: dict[str, Any] = {
        "__user__": {"id": "u1", "role": "user", "name": "U"},
        "__event_emitter__": events,
        "__chat_id__": "chat-1",
        "__metadata__": {"variables": {"{{CURRENT_DATE}}": "2026-11-22"}},
    }
    params.update(kwargs)
    chunks: list[str] = []
    body: dict[str, Any] = {"messages": messages, "stream": True}
    if body_model is not None:
        body["model"] = body_model
    async for chunk in pipe.pipe(body, **params):
        chunks.append(chunk)
        for gate in gates:
            gate.observe("".join(chunks))
    return ChatTurn("".join(chunks), chunks, events)
