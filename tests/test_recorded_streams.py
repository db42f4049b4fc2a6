"""What real servers sent, replayed through the client, the turn parser and the loop.

Every file in tests/recorded/ is one response a real server (or a hosted
provider) was recorded or documented sending: the status, the headers worth
keeping and the body byte for byte. Each file says in its header comment
where it was published and exactly what was changed (only the model's text,
to make a Tongyi turn); tests/recorded/README.md lists the quirks that could
not be found recorded. The fake server in tests/fakes/openai_server.py
synthesises quirks; these files pin the real ones: one recorded stream, one
named test.

A replay server on 127.0.0.1 sends the recorded bytes over real HTTP, one
SSE event per write, to the real `OpenAIModelClient`; what the client makes of
them is asserted exactly, independent of how the reads fall.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.http import LocalServer, Request, Response
from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    ModelSettings,
    OpenAIModelClient,
    SSEDecoder,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    AnswerDelta,
    ContextOverflowError,
    ContextWarning,
    Event,
    ModelChunk,
    ModelDelta,
    ModelError,
    ModelFinish,
    ModelRetry,
    ModelUsage,
    RunFinished,
    ThinkingDelta,
    ToolOutcome,
    UsageUpdated,
    WrappingUp,
)
from tongyi_deepresearch_openwebui_pipeline.core.loop import (
    RAISE_CONTEXT_HINT,
    Limits,
    ResearchLoop,
    RunState,
)
from tongyi_deepresearch_openwebui_pipeline.core.prompts import WRAP_UP_MESSAGE
from tongyi_deepresearch_openwebui_pipeline.core.protocol import parse_turn
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import (
    ToolCall,
    parse_tool_call,
)

RECORDED = Path(__file__).parent / "recorded"
QUESTION = [{"role": "user", "content": "question"}]
SYSTEM = {"role": "system", "content": "You are a deep research assistant."}
MODEL = "recorded-model"
#: The Tongyi turn written into vllm_no_reasoning_parser.http.
VLLM_TURN = (
    "<think>\nThe user asks to count from 1 to 5, comma separated.\n</think>\n\n"
    "<answer>\n1, 2, 3, 4, 5\n</answer>"
)


# -- the recorded files --------------------------------------------------------


@dataclass(frozen=True)
class Transcript:
    """One recorded HTTP response: status, kept headers, body bytes."""

    status: int
    headers: dict[str, str]
    body: bytes

    @classmethod
    def load(cls, name: str) -> Transcript:
        """Read ``tests/recorded/<name>``.

        The file is ``#`` comment lines (where it was recorded, what changed),
        an ``HTTP/1.1 <status> <reason>`` line, header lines, a blank line,
        then the body exactly as the server sent it.
        """
        raw = (RECORDED / name).read_bytes()
        start = raw.index(b"HTTP/1.1 ")
        head, body = raw[start:].split(b"\n\n", 1)
        status_line, *header_lines = head.decode().split("\n")
        headers = dict(line.split(": ", 1) for line in header_lines)
        return cls(int(status_line.split(" ")[1]), headers, body)

    def events(self) -> list[bytes]:
        """The body cut after each blank line: what a server flushes at once."""
        pieces = self.body.split(b"\n\n")
        events = [piece + b"\n\n" for piece in pieces[:-1]]
        return [*events, pieces[-1]] if pieces[-1] else events

    def response(self) -> Response:
        """The recorded response, streamed one event per write."""
        return Response(self.status, dict(self.headers), iter(self.events()))


class ReplayServer:
    """Answers chat requests with recorded transcripts, in order.

    The last transcript answers every further request (a retry gets what
    the server sent the first time).
    """

    def __init__(self, *names: str) -> None:
        """Serve ``names`` (files in tests/recorded/) in this order."""
        self._queue = deque(Transcript.load(name) for name in names)
        self.bodies: list[dict[str, Any]] = []
        self._server = LocalServer({"/v1/chat/completions": self._answer})

    def _answer(self, request: Request) -> Response:
        self.bodies.append(request.json())
        transcript = self._queue.popleft() if len(self._queue) > 1 else self._queue[0]
        return transcript.response()

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (``…/v1``)."""
        return self._server.url("/v1")

    def __enter__(self) -> ReplayServer:
        """Start serving."""
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop serving."""
        self._server.stop()


# -- driving the client and the loop --------------------------------------------


def settings_for(server: ReplayServer, **fields: Any) -> ModelSettings:
    """Settings that reach the replay server; retries do not sleep."""
    options: dict[str, Any] = {
        "base_url": server.base_url,
        "model": MODEL,
        "backoff_seconds": 0.0,
        "max_attempts": 3,
    }
    options.update(fields)
    return ModelSettings(**options)


async def no_sleep(_delay: float) -> None:
    """Retries in tests wait for nothing."""


async def stream(server: ReplayServer, **fields: Any) -> list[ModelChunk]:
    """One reply through the real client, collected."""
    async with httpx.AsyncClient() as http:
        client = OpenAIModelClient(settings_for(server, **fields), http, no_sleep)
        return [chunk async for chunk in client.stream([SYSTEM, *QUESTION])]


async def refusal(server: ReplayServer) -> ModelError:
    """The error the client raises for the server's answer."""
    with pytest.raises(ModelError) as caught:
        await stream(server)
    return caught.value


@dataclass(frozen=True)
class Outcome:
    """What a stream amounts to, whatever the network reads were."""

    reasoning: str
    content: str
    finishes: tuple[str | None, ...]
    usage: tuple[ModelUsage, ...]
    retries: tuple[str, ...] = ()


def outcome(chunks: list[ModelChunk]) -> Outcome:
    """Join the deltas; keep finishes, usage and retry reasons in order."""
    deltas = [c for c in chunks if isinstance(c, ModelDelta)]
    return Outcome(
        reasoning="".join(d.reasoning for d in deltas),
        content="".join(d.content for d in deltas),
        finishes=tuple(c.reason for c in chunks if isinstance(c, ModelFinish)),
        usage=tuple(c for c in chunks if isinstance(c, ModelUsage)),
        retries=tuple(c.reason for c in chunks if isinstance(c, ModelRetry)),
    )


class RecordingTools:
    """A tool port that records calls and answers each with a fixed text."""

    def __init__(self) -> None:
        """No calls yet."""
        self.calls: list[ToolCall] = []

    def available(self) -> list[str]:
        """The reference research tools."""
        return ["search", "visit"]

    async def run(self, call: ToolCall) -> ToolOutcome:
        """Record ``call``; answer with ``RESULT for <tool>``."""
        self.calls.append(call)
        return ToolOutcome(f"RESULT for {call.name}")


async def research(
    server: ReplayServer, tools: RecordingTools | None = None
) -> tuple[list[Event], RunState]:
    """A whole research run against the replay server."""
    state = RunState(messages=[SYSTEM, *QUESTION], started=0.0)
    async with httpx.AsyncClient() as http:
        client = OpenAIModelClient(settings_for(server), http, no_sleep)
        loop = ResearchLoop(
            state, client, tools or RecordingTools(), Limits(), clock=lambda: 0.0
        )
        return [event async for event in loop.run()], state


def shown(events: list[Event], kind: type[ThinkingDelta] | type[AnswerDelta]) -> str:
    """The text of every event of ``kind``, joined."""
    return "".join(e.text for e in events if isinstance(e, kind))


def streamed(name: str, field: str) -> str:
    """``choices[0].delta[field]`` of every event in ``tests/recorded/<name>``, joined.

    Read with the json module alone, apart from the client under test: the
    text a long recorded stream carries, to compare the client's with.
    """
    lines = Transcript.load(name).body.decode().split("\n")
    payloads = [
        json.loads(line[len("data: ") :]) for line in lines if line[:7] == "data: {"
    ]
    deltas = [
        payload["choices"][0]["delta"] for payload in payloads if payload["choices"]
    ]
    return "".join(delta.get(field) or "" for delta in deltas)


def overflow_message(server: ReplayServer, held: str, said: str) -> str:
    """The client's message for a request refused as too long."""
    return (
        f"The model server at {server.base_url} refused the conversation as too "
        f"long for its context{held}. Serve a longer context or lower "
        f"MAX_CONTEXT_TOKENS. Server said: {said}"
    )


# -- streams --------------------------------------------------------------------


async def test_vllm_without_reasoning_parser_streams_the_think_inline():
    with ReplayServer("vllm_no_reasoning_parser.http") as server:
        chunks = await stream(server)
    assert outcome(chunks) == Outcome(
        reasoning="",
        content=VLLM_TURN,
        finishes=("stop",),
        usage=(ModelUsage(46, 14, None),),
    )


async def test_vllm_round_without_reasoning_parser_ends_with_the_answer():
    with ReplayServer("vllm_no_reasoning_parser.http") as server:
        events, state = await research(server)
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.reason, end.answer, end.answer_marked) == (
        "answer",
        "1, 2, 3, 4, 5",
        True,
    )
    assert shown(events, ThinkingDelta) == (
        "\nThe user asks to count from 1 to 5, comma separated.\n"
    )
    assert shown(events, AnswerDelta) == "\n1, 2, 3, 4, 5\n"
    assert [e for e in events if isinstance(e, UsageUpdated)] == [
        UsageUpdated(46, 14, 46, 14, None, 60)
    ]
    assert state.messages[-1] == {
        "role": "assistant",
        "content": VLLM_TURN,
    }


async def test_llamacpp_reasoning_inline_with_usage_in_the_finish_chunk():
    with ReplayServer("llamacpp_reasoning_inline.http") as server:
        chunks = await stream(server)
    assert outcome(chunks) == Outcome(
        reasoning="",
        content=(
            '<think>\nUser says "test". Likely wants a test response. '
            "We'll respond acknowledging.\n</think>\n\n<answer>\nGot it! If you "
            "have any questions or need assistance, just let me know.\n</answer>"
        ),
        finishes=("stop",),
        usage=(ModelUsage(82, 43, None),),
    )


async def test_llamacpp_round_with_inline_reasoning_ends_with_the_answer():
    with ReplayServer("llamacpp_reasoning_inline.http") as server:
        events, _ = await research(server)
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.reason, end.answer) == (
        "answer",
        "Got it! If you have any questions or need assistance, just let me know.",
    )
    assert shown(events, ThinkingDelta) == (
        '\nUser says "test". Likely wants a test response. We\'ll respond '
        "acknowledging.\n"
    )
    assert (end.stats.prompt_tokens, end.stats.completion_tokens) == (82, 43)


async def test_ollama_v1_escaped_angle_brackets_give_the_tool_call():
    with ReplayServer("ollama_v1.http") as server:
        chunks = await stream(server)
    result = outcome(chunks)
    assert result == Outcome(
        reasoning="",
        content=(
            "<think>\nI should look this up.\n</think>\n\n<tool_call>\n"
            '{"name": "search", "arguments": {"query": ["Neo Vim plugin"]}}'
            "\n</tool_call>"
        ),
        finishes=("stop",),
        usage=(),
    )
    turn = parse_turn(result.content, result.reasoning)
    assert turn.reasoning == "\nI should look this up.\n"
    assert [parse_tool_call(call) for call in turn.calls] == [
        ToolCall("search", {"query": ["Neo Vim plugin"]})
    ]


async def test_openrouter_reasoning_field_between_processing_comments():
    with ReplayServer("openrouter_reasoning.http") as server:
        chunks = await stream(server)
    assert outcome(chunks) == Outcome(
        reasoning="This is a simple arithmetic question. 2+2 equals 4.",
        content="<answer>\n2 + 2 = 4\n</answer>",
        finishes=("stop",),
        usage=(ModelUsage(43, 36, 0.000669),),
    )


async def test_openrouter_usage_and_cost_come_after_the_finish_chunk():
    with ReplayServer("openrouter_usage_cost.http") as server:
        chunks = await stream(server)
    result = outcome(chunks)
    assert result == Outcome(
        reasoning="",
        content=(
            '<tool_call>\n{"name": "search", "arguments": {"query": '
            '["pelican names"]}}\n</tool_call>'
        ),
        finishes=("stop",),
        usage=(ModelUsage(17, 6, 0.0001025),),
    )
    assert [parse_tool_call(c) for c in parse_turn(result.content).calls] == [
        ToolCall("search", {"query": ["pelican names"]})
    ]


async def test_openrouter_research_round_runs_the_call_then_answers():
    tools = RecordingTools()
    turns = ("openrouter_usage_cost.http", "openrouter_reasoning.http")
    with ReplayServer(*turns) as server:
        events, state = await research(server, tools)
        second_request = server.bodies[1]["messages"]
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.reason, end.answer, end.stats.rounds) == ("answer", "2 + 2 = 4", 2)
    assert tools.calls == [ToolCall("search", {"query": ["pelican names"]})]
    assert second_request[-1] == {
        "role": "user",
        "content": "<tool_response>\nRESULT for search\n</tool_response>",
    }
    assert (end.stats.prompt_tokens, end.stats.completion_tokens) == (60, 42)
    assert end.stats.cost == (0.0 + 0.0001025) + 0.000669
    assert state.messages[-1]["content"] == (
        "<think>\nThis is a simple arithmetic question. 2+2 equals 4.\n</think>"
        "\n\n<answer>\n2 + 2 = 4\n</answer>"
    )


async def test_openrouter_documented_error_event_is_retried_then_reported():
    with ReplayServer("openrouter_error_event_documented.http") as server:
        error = await refusal(server)
        requests = len(server.bodies)
    assert requests == 3
    assert error.message == (
        f"The model server at {server.base_url} did not give a usable reply "
        "after 3 attempts (server error in stream: Provider disconnected "
        "unexpectedly). Check that it is running and that API_BASE_URL is "
        "right, or try again later."
    )


async def test_openrouter_error_after_length_finish_is_not_retried():
    with ReplayServer("openrouter_error_after_length.http") as server:
        chunks = await stream(server)
        requests = len(server.bodies)
    assert requests == 1
    result = outcome(chunks)
    assert (result.reasoning, result.retries, result.usage) == (
        "We need to respond to a greeting. The user",
        (),
        (ModelUsage(43, 10, 0.0),),
    )
    assert result.finishes == ("length", "length")


#: The reasoning vLLM's parser sent in vllm_reasoning_parser.http.
VLLM_REASONING = (
    "\nOkay, the user wants a reminder to go to the library tomorrow at 2pm. I "
    "need to use the add_todo function. The parameters required are task and "
    'time. The task is "go to the library" and the time is "tomorrow at 2pm". '
    "I should structure the JSON call with those values. Let me make sure the "
    "keys are correct and the time format is as specified. Alright, that "
    "should do it.\n"
)
VLLM_ANSWER = "Go to the library tomorrow at 2pm."


async def test_vllm_reasoning_parser_streams_reasoning_content_then_the_answer():
    with ReplayServer("vllm_reasoning_parser.http") as server:
        chunks = await stream(server)
    result = outcome(chunks)
    assert (result.reasoning, result.content, result.finishes) == (
        VLLM_REASONING,
        f"\n\n<answer>\n{VLLM_ANSWER}\n</answer>",
        ("tool_calls",),
    )
    assert result.usage[-1] == ModelUsage(192, 127, None)


async def test_vllm_round_with_reasoning_parser_ends_with_the_answer():
    with ReplayServer("vllm_reasoning_parser.http") as server:
        events, _ = await research(server)
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.reason, end.answer, end.answer_marked) == ("answer", VLLM_ANSWER, True)
    assert shown(events, ThinkingDelta) == VLLM_REASONING.removeprefix("\n")
    assert shown(events, AnswerDelta) == f"\n{VLLM_ANSWER}\n"


async def test_vllm_running_usage_in_every_chunk_counts_the_call_once():
    # Usage in every chunk is the call's running total: the last one counts.
    with ReplayServer("vllm_reasoning_parser.http") as server:
        events, _ = await research(server)
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.stats.prompt_tokens, end.stats.completion_tokens) == (192, 127)


async def test_sglang_reasoning_parser_nulls_and_matched_stop_give_the_turn():
    name = "sglang_reasoning_parser.http"
    with ReplayServer(name) as server:
        chunks = await stream(server)
    assert outcome(chunks) == Outcome(
        reasoning=streamed(name, "reasoning_content"),
        content=streamed(name, "content"),
        finishes=("stop",),
        usage=(ModelUsage(19, 1720, None),),
    )


async def test_sglang_round_with_reasoning_parser_ends_with_the_answer():
    name = "sglang_reasoning_parser.http"
    with ReplayServer(name) as server:
        events, _ = await research(server)
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.reason, end.answer_marked) == ("answer", True)
    assert f"<answer>\n{end.answer}\n</answer>" == streamed(name, "content")
    assert shown(events, ThinkingDelta) == streamed(name, "reasoning_content")
    assert (end.stats.prompt_tokens, end.stats.completion_tokens) == (19, 1720)


async def test_dashscope_reasoning_content_beside_null_content_and_usage():
    name = "dashscope_reasoning_content.http"
    with ReplayServer(name) as server:
        chunks = await stream(server)
    assert outcome(chunks) == Outcome(
        reasoning=streamed(name, "reasoning_content"),
        content=streamed(name, "content"),
        finishes=("stop",),
        usage=(ModelUsage(24, 1355, None),),
    )


async def test_dashscope_round_with_reasoning_content_ends_with_the_answer():
    name = "dashscope_reasoning_content.http"
    with ReplayServer(name) as server:
        events, _ = await research(server)
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.reason, end.answer_marked) == ("answer", True)
    assert f"<answer>\n{end.answer}\n</answer>" == streamed(name, "content")
    assert end.answer.splitlines()[-1] == "**Answer: 3**"
    assert shown(events, ThinkingDelta) == streamed(name, "reasoning_content")


#: The reasoning llama.cpp parsed out in llamacpp_reasoning_content.http.
LLAMACPP_REASONING = (
    'The user: "Say hi in Portuguese". They want a greeting in Portuguese. '
    'Simple: "Olá!" or "Oi!". Probably respond with "Olá!" or "Oi!".\n\n'
    "We should keep it concise. We'll respond."
)


async def test_llamacpp_reasoning_content_with_usage_and_timings_after_finish():
    with ReplayServer("llamacpp_reasoning_content.http") as server:
        chunks = await stream(server)
    assert outcome(chunks) == Outcome(
        reasoning=LLAMACPP_REASONING,
        content="<answer>\nOlá!\n</answer>",
        finishes=("stop",),
        usage=(ModelUsage(84, 57, None),),
    )


async def test_llamacpp_round_with_reasoning_content_ends_with_the_answer():
    with ReplayServer("llamacpp_reasoning_content.http") as server:
        events, _ = await research(server)
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.reason, end.answer, end.answer_marked) == ("answer", "Olá!", True)
    assert shown(events, ThinkingDelta) == LLAMACPP_REASONING
    assert shown(events, AnswerDelta) == "\nOlá!\n"


async def test_ollama_v1_reasoning_field_with_usage_after_the_finish():
    name = "ollama_v1_reasoning.http"
    with ReplayServer(name) as server:
        chunks = await stream(server)
    assert outcome(chunks) == Outcome(
        reasoning=streamed(name, "reasoning"),
        content="<answer>\n1  \n2  \n3\n</answer>",
        finishes=("stop",),
        usage=(ModelUsage(17, 289, None),),
    )


async def test_ollama_v1_round_with_reasoning_field_ends_with_the_answer():
    name = "ollama_v1_reasoning.http"
    with ReplayServer(name) as server:
        events, _ = await research(server)
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.reason, end.answer, end.answer_marked) == (
        "answer",
        "1  \n2  \n3",
        True,
    )
    assert shown(events, ThinkingDelta) == streamed(name, "reasoning")
    assert (end.stats.prompt_tokens, end.stats.completion_tokens) == (17, 289)


# -- refusals -------------------------------------------------------------------


async def test_azure_detail_refusing_stream_options_is_asked_again_without():
    with ReplayServer(
        "azure_stream_options_400.http", "vllm_no_reasoning_parser.http"
    ) as server:
        chunks = await stream(server)
        bodies = list(server.bodies)
    assert [("stream_options" in body) for body in bodies] == [True, False]
    assert outcome(chunks) == Outcome(
        reasoning="",
        content=VLLM_TURN,
        finishes=("stop",),
        usage=(ModelUsage(46, 14, None),),
        retries=("server does not accept stream_options",),
    )


async def test_vllm_extra_forbidden_stream_options_is_asked_again_without():
    with ReplayServer(
        "vllm_stream_options_400.http", "vllm_no_reasoning_parser.http"
    ) as server:
        chunks = await stream(server)
        bodies = list(server.bodies)
    assert [("stream_options" in body) for body in bodies] == [True, False]
    assert outcome(chunks) == Outcome(
        reasoning="",
        content=VLLM_TURN,
        finishes=("stop",),
        usage=(ModelUsage(46, 14, None),),
        retries=("server does not accept stream_options",),
    )


#: What Ollama Cloud said in ollama_cloud_context_overflow_400.http.
OLLAMA_CLOUD_OVERFLOW = (
    "prompt too long; exceeded max context length by 1119046 tokens "
    "(ref: 96164522-08b2-4cbf-886e-e5a38961a688)"
)


async def test_ollama_cloud_context_overflow_400_says_by_how_much_not_the_limit():
    with ReplayServer("ollama_cloud_context_overflow_400.http") as server:
        error = await refusal(server)
        requests = len(server.bodies)
    assert requests == 1
    assert isinstance(error, ContextOverflowError)
    assert error.limit == 0
    assert error.message == overflow_message(server, "", OLLAMA_CLOUD_OVERFLOW)


async def test_ollama_cloud_context_overflow_round_wraps_up_with_the_answer():
    with ReplayServer(
        "ollama_cloud_context_overflow_400.http", "ollama_v1_reasoning.http"
    ) as server:
        events, _ = await research(server)
        last_request = server.bodies[-1]["messages"]
    refused = overflow_message(server, "", OLLAMA_CLOUD_OVERFLOW)
    assert [e for e in events if isinstance(e, ContextWarning)] == [
        ContextWarning(
            f"{refused} Making room and asking for the answer. {RAISE_CONTEXT_HINT}"
        )
    ]
    assert last_request[-1] == {"role": "user", "content": WRAP_UP_MESSAGE}
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.reason, end.answer) == ("context_limit", "1  \n2  \n3")


async def test_vllm_context_overflow_400_names_its_limit():
    with ReplayServer("vllm_context_overflow_400.http") as server:
        error = await refusal(server)
        requests = len(server.bodies)
    assert requests == 1
    assert isinstance(error, ContextOverflowError)
    assert error.limit == 16384
    assert error.message == overflow_message(
        server,
        " (it holds 16,384 tokens)",
        "This model's maximum context length is 16384 tokens. However, you "
        "requested 19591 tokens (9591 in the messages, 10000 in the completion)."
        " Please reduce the length of the messages or completion. None",
    )


async def test_vllm_context_overflow_round_wraps_up_with_the_answer():
    with ReplayServer(
        "vllm_context_overflow_400.http", "vllm_no_reasoning_parser.http"
    ) as server:
        events, _ = await research(server)
        last_request = server.bodies[-1]["messages"]
    said = (
        "This model's maximum context length is 16384 tokens. However, you "
        "requested 19591 tokens (9591 in the messages, 10000 in the completion)."
        " Please reduce the length of the messages or completion. None"
    )
    refused = overflow_message(server, " (it holds 16,384 tokens)", said)
    assert [e for e in events if isinstance(e, ContextWarning)] == [
        ContextWarning(
            f"{refused} Making room and asking for the answer. {RAISE_CONTEXT_HINT}"
        )
    ]
    assert [e for e in events if isinstance(e, WrappingUp)] == [
        WrappingUp("context_limit")
    ]
    assert last_request[-1] == {"role": "user", "content": WRAP_UP_MESSAGE}
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert (end.reason, end.answer) == ("context_limit", "1, 2, 3, 4, 5")


async def test_sglang_context_overflow_400_names_its_limit():
    with ReplayServer("sglang_context_overflow_400.http") as server:
        error = await refusal(server)
    assert isinstance(error, ContextOverflowError)
    assert error.limit == 40960
    assert error.message == overflow_message(
        server,
        " (it holds 40,960 tokens)",
        "The input (61709 tokens) is longer than the model's context length "
        "(40960 tokens).",
    )


async def test_sglang_router_context_overflow_400_names_its_limit():
    with ReplayServer("sglang_router_context_overflow_400.http") as server:
        error = await refusal(server)
    assert isinstance(error, ContextOverflowError)
    assert error.limit == 4096


async def test_llamacpp_context_overflow_400_limit_comes_from_n_ctx():
    with ReplayServer("llamacpp_context_overflow_400.http") as server:
        error = await refusal(server)
    assert isinstance(error, ContextOverflowError)
    assert error.limit == 8192
    assert error.message == overflow_message(
        server,
        " (it holds 8,192 tokens)",
        "the request exceeds the available context size. try increasing the "
        "context size or enable context shift",
    )


async def test_openai_context_length_exceeded_400_names_its_limit():
    with ReplayServer("openai_context_overflow_400.http") as server:
        error = await refusal(server)
    assert isinstance(error, ContextOverflowError)
    assert error.limit == 4097
    assert error.message == overflow_message(
        server,
        " (it holds 4,097 tokens)",
        "This model's maximum context length is 4097 tokens. However, you "
        "requested 4120 tokens (3120 in the messages, 1000 in the completion). "
        "Please reduce the length of the messages or completion.",
    )


async def test_openrouter_context_overflow_400_names_its_limit():
    with ReplayServer("openrouter_context_overflow_400.http") as server:
        error = await refusal(server)
    assert isinstance(error, ContextOverflowError)
    assert error.limit == 131072
    said = (
        "This endpoint's maximum context length is 131072 tokens. However, you "
        "requested about 141607 tokens (10535 of text input, 131072 in the "
        'output). Please reduce the length of either one, or use the "middle-out"'
        " transform to compress your prompt automatically."
    )
    assert error.message == overflow_message(
        server, " (it holds 131,072 tokens)", said[:300]
    )


# -- the decoder, on every recorded stream ---------------------------------------

STREAMS = sorted(
    path.name
    for path in RECORDED.glob("*.http")
    if Transcript.load(path.name).body.startswith((b"data:", b":"))
)


def decoded(body: str, step: int) -> tuple[list[dict[str, Any]], str]:
    """``body`` fed to a decoder ``step`` characters at a time.

    Returns the payloads and the name of the exception the decoder raised
    ("" if none): a stream with an error event ends in an exception, and the
    payloads decoded before it depend on where the reads fell.
    """
    decoder = SSEDecoder()
    payloads: list[dict[str, Any]] = []
    try:
        for start in range(0, len(body), step):
            payloads += decoder.feed(body[start : start + step])
        payloads += decoder.flush()
    except Exception as error:  # the exception's type is the result
        return payloads, type(error).__name__
    return payloads, ""


@pytest.mark.parametrize("name", STREAMS)
def test_recorded_stream_decodes_alike_however_it_is_split(name: str):
    body = Transcript.load(name).body.decode()
    whole, raised = decoded(body, len(body))
    splits = [decoded(body, step) for step in (1, 7, 64)]
    if raised:
        assert [error for _, error in splits] == [raised] * 3 == ["_Transient"] * 3
        return
    data = [line[len("data: ") :] for line in body.split("\n")]
    expected = [json.loads(text) for text in data if text.startswith("{")]
    assert whole == expected
    assert splits == [(expected, "")] * 3


def test_every_recorded_file_says_where_it_comes_from():
    names = sorted(path.name for path in RECORDED.glob("*.http"))
    assert names
    for name in names:
        head = (RECORDED / name).read_text().split("HTTP/1.1 ", 1)[0]
        assert "\n# Source: https://" in "\n" + head, name
