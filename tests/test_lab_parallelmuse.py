"""ParallelMuse, the lab's Heavy mode, exactly as published.

The lab's prompts, record formats and sampling are kept as test data
(tests/fixtures/lab/parallelmuse_prompts.json, from Alibaba-NLP/DeepResearch
WebAgent/ParallelMuse; see tests/fixtures/lab/NOTICE.md) and read only to
compare: the requests a heavy run sends to a real local SSE server must hold
them byte for byte. Partial rollouts branch at the most uncertain step when
the server returns token log-probabilities, and start from the question
(saying so) when it does not.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.openai_server import FakeOpenAI, Reply, answer, tool_call
from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    ModelSettings,
    OpenAIModelClient,
    logprobs_of,
)
from tongyi_deepresearch_openwebui_pipeline.core import parallelmuse as pm
from tongyi_deepresearch_openwebui_pipeline.core.budget import messages_tokens
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    ContextWarning,
    ModelDelta,
    RolloutEvent,
    RoundStarted,
    RunFinished,
    ToolOutcome,
)
from tongyi_deepresearch_openwebui_pipeline.core.sources import SourceLedger
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import ToolCall
from tongyi_deepresearch_openwebui_pipeline.engine import runs

LAB = json.loads(
    (Path(__file__).parent / "fixtures/lab/parallelmuse_prompts.json").read_text(
        encoding="utf-8"
    )
)
RECORD = LAB["record_formats"]
QUESTION = "Who wrote it?"
PLAN_MESSAGES = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": QUESTION},
]
SERVED = 32768


# -- the lab's words and numbers ------------------------------------------------------


def test_the_prompts_and_formats_are_the_labs_bytes() -> None:
    assert LAB["CONVERGE_SYSTEM_PROMPT"] == pm.CONVERGE_SYSTEM_PROMPT
    assert LAB["REPORT_PROMPT"] == pm.REPORT_PROMPT
    assert LAB["INTEGRATE_PROMPT"] == pm.INTEGRATE_PROMPT
    assert LAB["report_entry"] == pm.REPORT_ENTRY
    assert RECORD["tool_call_turn"] == pm.TOOL_CALL_RECORD
    assert RECORD["tool_response"] == pm.TOOL_RESPONSE_RECORD
    assert RECORD["answer_turn"] == pm.ANSWER_RECORD
    assert RECORD["other_message"] == pm.MESSAGE_RECORD
    assert RECORD["no_prediction"] == pm.NO_PREDICTION


def test_the_sampling_and_reply_lengths_are_the_labs() -> None:
    sampling = LAB["sampling"]
    assert (
        pm.Sampling(
            sampling["temperature"], sampling["top_p"], sampling["presence_penalty"], ()
        )
        == pm.AGGREGATION_SAMPLING
    )
    assert LAB["max_tokens"]["report"] == pm.REPORT_MAX_TOKENS
    assert LAB["max_tokens"]["integrate"] == pm.INTEGRATE_MAX_TOKENS
    partial = LAB["partial_rollout"]
    assert partial["top_logprobs"] == pm.TOP_LOGPROBS
    assert partial["partial_sampling_topk"] == pm.BRANCH_STEPS
    assert partial["initial_rollout_num"] == pm.INITIAL_ROLLOUTS
    assert runs.HeavySettings() == runs.HeavySettings(
        rollouts=3,
        concurrency=3,
        synthesis_reserve=0.15,
        partial_rollouts=True,
        initial_rollouts=partial["initial_rollout_num"],
        branch_steps=partial["partial_sampling_topk"],
        top_logprobs=partial["top_logprobs"],
    )


# -- the trajectory, the report, the answer -------------------------------------------

CALL = tool_call("search", {"query": ["who wrote it"]})
CALL_JSON = '{"name": "search", "arguments": {"query": ["who wrote it"]}}'


def test_a_rollout_reads_as_the_labs_trajectory() -> None:
    messages = [
        *PLAN_MESSAGES,
        {"role": "assistant", "content": f"<think>\nSearch first.\n</think>\n\n{CALL}"},
        {"role": "user", "content": "<tool_response>\nAda wrote it.\n</tool_response>"},
        {"role": "assistant", "content": "Nothing marked."},
        {
            "role": "assistant",
            "content": "<think>\nDone.\n</think>\n\n<answer>\nAda\n</answer>",
        },
    ]
    text = pm.fit_trajectory(pm.trajectory_records(messages, 2), 100_000)

    assert (
        text
        == (
            RECORD["other_message"].format(role="system", content="s")
            + RECORD["other_message"].format(role="user", content=QUESTION)
            + RECORD["tool_call_turn"].format(
                role="assistant", thinking="Search first.", tool_call=CALL_JSON
            )
            + RECORD["tool_response"].format(tool_response="Ada wrote it.")
            + RECORD["answer_turn"].format(
                role="assistant",
                thinking="Nothing marked.",
                prediction=RECORD["no_prediction"],
            )
            + RECORD["answer_turn"].format(
                role="assistant", thinking="Done.", prediction="Ada"
            )
        ).strip()
    )


def test_the_report_is_read_as_the_lab_reads_it() -> None:
    assert pm.report_from_reply("<think>\nx\n</think>\n\n<report>\nR\n</report>") == "R"
    assert pm.report_from_reply("<report>\nUnclosed") == "Unclosed"
    assert pm.report_from_reply("No tags at all.\n") == "No tags at all."
    assert pm.report_from_reply("<report>a</report> <report>b</report>") == "b"
    assert pm.report_from_reply("<think>\nonly thinking\n</think>") == ""


# -- uncertainty and branch points ----------------------------------------------------


def test_a_tokens_entropy_is_the_labs() -> None:
    half, quarter = math.log(0.5), math.log(0.25)
    # Renormalised (2/3, 1/3) weighing the log-probabilities as served.
    token = pm.TokenLogprob("a", half, (half, quarter))
    assert pm.token_entropy(token) == pytest.approx(-(2 / 3 * half + 1 / 3 * quarter))
    # One alternative: the token's own surprise (the paper's perplexity term).
    assert pm.token_entropy(pm.TokenLogprob("a", half)) == pytest.approx(-half)
    # What is no log-probability counts for nothing.
    bad = pm.TokenLogprob("a", math.nan, (math.inf, math.nan))
    assert pm.token_entropy(bad) == 0.0


def tokens(*pieces: tuple[str, float]) -> pm.TokenLogprobs:
    """Tokens whose single alternative has ``logprob`` (entropy = -logprob)."""
    return pm.TokenLogprobs(
        tuple(pm.TokenLogprob(text, lp, (lp,)) for text, lp in pieces)
    )


def test_a_steps_uncertainty_is_its_tool_calls_perplexity() -> None:
    reply = pm.ReplyUncertainty()
    reply.add(tokens(("<think>", -9.0), ("<tool_call>", -9.0), ("x", -9.0)))
    reply.add(tokens(("</tool_call>", -9.0), ("</think>", -9.0), ("\n\n", -9.0)))
    reply.add(tokens(("<tool_call>", -9.0), ("{", -1.0), ("}", -3.0)))
    reply.add(tokens(("</tool_call>", -9.0)))
    # Only the call after the thinking, and only the tokens inside it.
    assert reply.tool_call_uncertainty() == pytest.approx(math.exp(2.0))
    assert reply.served
    answered = pm.ReplyUncertainty()
    answered.add(tokens(("<answer>", -1.0), ("Ada", -1.0), ("</answer>", -1.0)))
    assert answered.tool_call_uncertainty() is None
    assert not pm.ReplyUncertainty().served


def step(uncertainty: float, round_: int) -> pm.Step:
    return pm.Step(uncertainty, round_, ())


def test_branches_go_to_the_most_uncertain_steps_first() -> None:
    first = [step(1.0, 1), step(5.0, 2), step(3.0, 3), step(5.0, 4)]
    second = [step(2.0, 1)]
    # One initial rollout: its top two steps (ties: the earlier), in turn.
    assert pm.branch_points([first], 5, top_k=2) == [
        first[1],
        first[3],
        first[1],
        first[3],
        first[1],
    ]
    # Two: each gets its share; a rollout short of steps leaves the rest to
    # rollouts from the question.
    assert pm.branch_points([first, second], 4, top_k=2) == [
        first[1],
        second[0],
        first[3],
        None,
    ]
    assert pm.branch_points([[]], 2) == [None, None]


# -- the model client: log-probabilities as servers stream them -----------------------


def test_logprobs_are_read_as_vllm_streams_them_and_garbage_is_skipped() -> None:
    def entry(token: Any, logprob: Any, top: Any) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "top_logprobs": top}

    payloads: list[dict[str, Any]] = [
        {
            "choices": [
                {
                    "delta": {"content": "a"},
                    "logprobs": {
                        "content": [
                            entry(
                                "a",
                                -0.5,
                                [{"token": "a", "logprob": -0.5}, {"logprob": -2}],
                            ),
                            entry(7, -0.5, []),  # not a token
                            entry("b", True, []),  # a boolean is no number
                            entry(
                                "c",
                                -1.0,
                                [{"logprob": "x"}, "junk", {"logprob": -3.0}] * 10,
                            ),
                        ]
                    },
                }
            ]
        },
        {"choices": [{"delta": {}, "logprobs": None}]},
        {"choices": "junk"},
        {"usage": {"prompt_tokens": 1}},
    ]
    assert logprobs_of(payloads, top=3) == pm.TokenLogprobs(
        (
            pm.TokenLogprob("a", -0.5, (-0.5, -2.0)),
            pm.TokenLogprob("c", -1.0, (-3.0,)),
        )
    )
    assert logprobs_of(payloads[1:], top=3) is None


def client_body(**fields: Any) -> bytes:
    """A request body as the client sends it (httpx's JSON encoding)."""
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()


async def test_a_server_refusing_logprobs_is_asked_again_without_them() -> None:
    def refuse(body: dict[str, Any]) -> Reply:
        if body.get("logprobs"):
            return Reply(status=400, error="logprobs is not supported by this model")
        return Reply(content="Hi.")

    messages = [{"role": "user", "content": "Hi?"}]
    with FakeOpenAI() as fake:
        fake.respond_with(refuse)
        settings = ModelSettings(base_url=fake.base_url, model=fake.model)
        async with httpx.AsyncClient() as http:
            client = OpenAIModelClient(settings, http)
            first = [
                c async for c in client.stream_scored(messages, 50, top_logprobs=4)
            ]
            second = [
                c async for c in client.stream_scored(messages, 50, top_logprobs=4)
            ]
        bodies = [request.body for request in fake.requests]

    common: dict[str, Any] = {
        "model": fake.model,
        "messages": messages,
        "stream": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "presence_penalty": 1.1,
        "max_tokens": 50,
        "stop": ["\n<tool_response>", "<tool_response>"],
    }
    usage = {"stream_options": {"include_usage": True}}
    assert bodies == [
        client_body(**common, logprobs=True, top_logprobs=4, **usage),
        client_body(**common, **usage),
        client_body(**common, **usage),  # the refusal is remembered
    ]
    assert [c for c in first if isinstance(c, ModelDelta)] == [ModelDelta("", "Hi.")]
    assert not any(isinstance(c, pm.TokenLogprobs) for c in first + second)


# -- a heavy run against a real local server ---------------------------------------


class Pages:
    """A tool port: search and visit return one fixed page."""

    def available(self) -> list[str]:
        return ["search", "visit"]

    async def run(self, call: ToolCall) -> ToolOutcome:
        return ToolOutcome(f"{call.name}: Ada wrote it (https://example.org/ada).")


#: Top log-probabilities of every token of rollout 1's steps: a confident
#: first search, a very uncertain visit, a fairly uncertain second search.
CONFIDENT = (-0.01, -5.0, -6.0)
UNSURE = (-1.05, -1.1, -1.15)
FAIRLY = (-0.4, -1.2, -2.0)
STEPS = [
    Reply(
        reasoning="Search.",
        content=tool_call("search", {"query": ["a"]}),
        logprobs=CONFIDENT,
    ),
    Reply(
        reasoning="Visit.",
        content=tool_call("visit", {"url": ["https://example.org/ada"], "goal": "g"}),
        logprobs=UNSURE,
    ),
    Reply(
        reasoning="Again.",
        content=tool_call("search", {"query": ["b"]}),
        logprobs=FAIRLY,
    ),
    Reply(reasoning="Done.", content=answer("Ada."), logprobs=CONFIDENT),
]


class Script:
    """Rollout 1 (asked for log-probabilities) plays `STEPS`; branches answer.

    Without ``served`` the replies carry no log-probabilities. Report calls
    get ``<report>`` tags around the rollout's answer; the integrate call
    answers ``Ada wrote it.``
    """

    def __init__(self, served: bool = True) -> None:
        self.served = served

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        if messages[0]["content"] == pm.CONVERGE_SYSTEM_PROMPT:
            request = messages[-1]["content"]
            if request.startswith("Given the following"):
                return Reply(content="<report>\nA report.\n</report>")
            return Reply(reasoning="One report.", content=answer("Ada wrote it."))
        done = sum(1 for m in messages if m["role"] == "assistant")
        if body.get("logprobs"):
            reply = STEPS[done]
            return reply if self.served else Reply(reply.content, reply.reasoning)
        if done == 0:  # a rollout from the question
            return Reply(content=answer("From the question."))
        return Reply(reasoning="Branch.", content=answer(f"Branched after {done}."))


async def heavy_run(script: Script, rollouts: int = 3) -> tuple[FakeOpenAI, list[Any]]:
    plan = runs.RunPlan(
        messages=PLAN_MESSAGES,
        limits=runs.Limits(max_rounds=10, model_context_tokens=SERVED),
        today=dt.date(2026, 11, 24),
        heavy=runs.HeavySettings(rollouts=rollouts),
    )
    with FakeOpenAI() as fake:
        fake.respond_with(script)
        settings = ModelSettings(base_url=fake.base_url, model=fake.model)
        async with httpx.AsyncClient() as http:
            model = OpenAIModelClient(settings, http)
            events = [
                e
                async for e in runs.research(
                    plan, model, lambda _k: Pages(), SourceLedger()
                )
            ]
    return fake, events


def chat_bodies(fake: FakeOpenAI) -> list[dict[str, Any]]:
    return [json.loads(request.body) for request in fake.requests]


def research_bodies(fake: FakeOpenAI) -> list[dict[str, Any]]:
    return [
        body
        for body in chat_bodies(fake)
        if body["messages"][0]["content"] != pm.CONVERGE_SYSTEM_PROMPT
    ]


async def test_branches_start_before_the_most_uncertain_steps() -> None:
    fake, events = await heavy_run(Script())

    bodies = research_bodies(fake)
    scored = [b for b in bodies if b.get("logprobs")]
    plain = [b for b in bodies if "logprobs" not in b]
    # Rollout 1 asked for the lab's 16 alternatives on each of its 4 steps.
    assert [b["top_logprobs"] for b in scored] == [16] * 4
    # Two branches, continuing the conversation rollout 1 had before its
    # most uncertain step (the visit, step 2) and the next (step 3).
    assert sorted(b["messages"] for b in plain) == sorted(
        [scored[1]["messages"], scored[2]["messages"]]
    )
    assert all("top_logprobs" not in b for b in plain)
    # Each branch's first round is the step it branches at; nothing was said
    # about log-probabilities (they came).
    first_rounds = {
        e.rollout: e.event.round
        for e in reversed(events)
        if isinstance(e, RolloutEvent) and isinstance(e.event, RoundStarted)
    }
    assert first_rounds == {1: 1, 2: 2, 3: 3}
    assert not any(
        isinstance(e, RolloutEvent) and isinstance(e.event, ContextWarning)
        for e in events
    )
    # A branch's figures are its own: the rounds it ran, not its parent's.
    ends = {
        e.rollout: e.event
        for e in events
        if isinstance(e, RolloutEvent) and isinstance(e.event, RunFinished)
    }
    assert {k: (end.answer, end.stats.rounds) for k, end in ends.items()} == {
        1: ("Ada.", 4),
        2: ("Branched after 1.", 1),
        3: ("Branched after 2.", 1),
    }
    end = events[-1]
    assert isinstance(end, RunFinished) and end.answer == "Ada wrote it."
    assert end.stats.rounds == 4 + 1 + 1 + 1  # and the integrate call's


async def test_without_logprobs_the_rollouts_start_from_the_question_and_say_so() -> (
    None
):
    fake, events = await heavy_run(Script(served=False))

    bodies = research_bodies(fake)
    plain_first = [
        b["messages"] for b in bodies if "logprobs" not in b and len(b["messages"]) == 2
    ]
    assert plain_first == [PLAN_MESSAGES, PLAN_MESSAGES]
    rollout_events = [e for e in events if isinstance(e, RolloutEvent)]
    notices = [
        (i, e.rollout, e.event)
        for i, e in enumerate(rollout_events)
        if isinstance(e.event, ContextWarning)
    ]
    assert [(k, event) for _, k, event in notices] == [
        (1, ContextWarning(runs.NO_LOGPROBS_NOTICE))
    ]
    # Said once the first reply came, before the later rollouts started.
    later = [i for i, e in enumerate(rollout_events) if e.rollout > 1]
    assert notices[0][0] < min(later)


def call_json(name: str, arguments: dict[str, Any]) -> str:
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def lab_trajectory(*turns: tuple[str, str, str]) -> str:
    """The plan's messages, then (thinking, call or "", answer) turns, as records."""
    records = [
        RECORD["other_message"].format(role="system", content="s"),
        RECORD["other_message"].format(role="user", content=QUESTION),
    ]
    for thinking, call, answer_text in turns:
        if call:
            records.append(
                RECORD["tool_call_turn"].format(
                    role="assistant", thinking=thinking, tool_call=call
                )
            )
            tool = json.loads(call)["name"]
            result = f"{tool}: Ada wrote it (https://example.org/ada)."
            records.append(RECORD["tool_response"].format(tool_response=result))
        else:
            records.append(
                RECORD["answer_turn"].format(
                    role="assistant", thinking=thinking, prediction=answer_text
                )
            )
    return "".join(records).strip()


def lab_request(messages: list[dict[str, Any]], max_tokens: int, model: str) -> bytes:
    """The exact body of a report or integrate call, as the lab sends it."""
    sampling = LAB["sampling"]
    return client_body(
        model=model,
        messages=messages,
        stream=True,
        temperature=sampling["temperature"],
        top_p=sampling["top_p"],
        presence_penalty=sampling["presence_penalty"],
        max_tokens=max_tokens,
        stream_options={"include_usage": True},
    )


def within_served(messages: list[dict[str, Any]], most: int) -> int:
    """``most``, or less: what fits the served context beside ``messages``."""
    margin = max(32, int(SERVED * 0.01))
    return min(most, SERVED - messages_tokens(messages) - margin)


async def test_reports_and_integration_carry_the_labs_prompts_and_sampling() -> None:
    fake, events = await heavy_run(Script(), rollouts=2)

    search_a = call_json("search", {"query": ["a"]})
    visit = call_json("visit", {"url": ["https://example.org/ada"], "goal": "g"})
    search_b = call_json("search", {"query": ["b"]})
    trajectories = {
        # Rollout 1: its four steps.
        1: lab_trajectory(
            ("Search.", search_a, ""),
            ("Visit.", visit, ""),
            ("Again.", search_b, ""),
            ("Done.", "", "Ada."),
        ),
        # Rollout 2: rollout 1's first step, then its own answer.
        2: lab_trajectory(
            ("Search.", search_a, ""), ("Branch.", "", "Branched after 1.")
        ),
    }
    system = {"role": "system", "content": LAB["CONVERGE_SYSTEM_PROMPT"]}
    aggregation = [
        r.body for r in fake.requests if json.loads(r.body)["messages"][0] == system
    ]
    reports = {
        2 if b"Branched after 1." in body else 1: body
        for body in aggregation
        if b"Given the following problem-solving trajectory" in body
    }
    assert sorted(reports) == [1, 2]
    for rollout, body in reports.items():
        messages = [
            system,
            {
                "role": "user",
                "content": LAB["REPORT_PROMPT"].format(traj=trajectories[rollout]),
            },
        ]
        most = LAB["max_tokens"]["report"]
        assert body == lab_request(messages, within_served(messages, most), fake.model)
    (integrate,) = [body for body in aggregation if body not in reports.values()]
    messages = [
        system,
        {
            "role": "user",
            "content": LAB["INTEGRATE_PROMPT"].format(question=QUESTION)
            + LAB["report_entry"].format(number=1, report="A report.")
            + LAB["report_entry"].format(number=2, report="A report."),
        },
    ]
    most = LAB["max_tokens"]["integrate"]
    assert integrate == lab_request(messages, within_served(messages, most), fake.model)
    # Its answer is the run's.
    end = events[-1]
    assert isinstance(end, RunFinished) and end.answer == "Ada wrote it."


async def test_without_partial_rollouts_every_rollout_starts_at_once() -> None:
    barrier = threading.Barrier(3, timeout=30)

    def respond(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        if messages[0]["content"] == pm.CONVERGE_SYSTEM_PROMPT:
            return Reply(content=answer("Ada wrote it."))
        barrier.wait()  # the three first requests are in flight together
        return Reply(content=answer("Ada."))

    plan = runs.RunPlan(
        messages=PLAN_MESSAGES,
        limits=runs.Limits(max_rounds=10, model_context_tokens=SERVED),
        today=dt.date(2026, 11, 24),
        heavy=runs.HeavySettings(rollouts=3, partial_rollouts=False),
    )
    with FakeOpenAI() as fake:
        fake.respond_with(respond)
        settings = ModelSettings(base_url=fake.base_url, model=fake.model)
        async with httpx.AsyncClient() as http:
            model = OpenAIModelClient(settings, http)
            events = [
                e
                async for e in runs.research(
                    plan, model, lambda _k: Pages(), SourceLedger()
                )
            ]
    assert not barrier.broken
    research = research_bodies(fake)
    assert [b["messages"] for b in research] == [PLAN_MESSAGES] * 3
    assert not any("logprobs" in b for b in research)
    end = events[-1]
    assert isinstance(end, RunFinished) and end.answer == "Ada wrote it."
