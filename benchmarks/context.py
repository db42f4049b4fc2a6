"""Benchmark 11: research beyond the context window.

The same scripted research (`tests.fakes.long_research.LongResearch`: 40
rounds, each reading one page of 2-3K tokens of evidence) runs on served
contexts of 128K, 64K, 32K and 16K tokens, through the real loop and the real
model client over HTTP against a fake server that refuses, like vLLM, any
request whose prompt plus max_tokens exceeds its context. Each context runs
twice: with `at_limit="consolidate"` (one summary call when the conversation
fills the usable context, then a restart from the question and the state)
and with the reference `at_limit="wrap_up"` (the forced answer at the limit).

Per context it prints the rounds completed, the consolidations and their
summary calls, what those cost (prompt + completion tokens, and their share
of the run's tokens), the peak context over the served one and the requests
the server refused, next to the rounds the reference completed before its
forced answer. Goals (reported, not tuned toward): every round completed,
peak ≤ 0.95 of the served context, consolidation overhead ≤ 15% of the run's
tokens.

The overhead is structural. With U the usable context (served minus the
reply room) and g the evidence a round adds, the conversation restarts about
every U/g rounds, and each restart re-reads about U, while a round reads on
average U/2: the share is about 2g / (2g + U), 38% at 16K (U = 8K), 18% at
32K (U = 22K), under 15% only from about 11 rounds' worth of usable context.

`--quick` runs 12 rounds on 32K and 16K only and fails on broken checks:
every round completed, no request refused, peak within the served context.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
from tests.fakes.long_research import (
    EvidenceTools,
    LongResearch,
    is_summary_request,
    page_url,
)
from tests.fakes.openai_server import FakeOpenAI

from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    ModelSettings,
    OpenAIModelClient,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    Event,
    RunFinished,
    WrappingUp,
)
from tongyi_deepresearch_openwebui_pipeline.core.loop import (
    AtLimit,
    Limits,
    ResearchLoop,
    RunState,
)

from .report import Row

CONTEXTS = (131072, 65536, 32768, 16384)
QUICK_CONTEXTS = (32768, 16384)
ROUNDS, QUICK_ROUNDS = 40, 12
MAX_CONSOLIDATIONS = 30
#: Goals of the full run (reported against, not tuned toward).
PEAK_GOAL = 0.95
OVERHEAD_GOAL = 0.15
QUESTION = "What are the properties of the items?"
SYSTEM = "You are a deep research assistant."


@dataclass(frozen=True)
class Outcome:
    """One scripted research on one served context."""

    context: int
    rounds: int  # scripted rounds in all, the last one the answer
    reason: str
    completed: int  # rounds completed before any forced answer
    consolidations: int
    summary_calls: int
    summary_prompt: int
    summary_completion: int
    run_tokens: int
    round_prompt: int  # prompt tokens of the research calls (summaries aside)
    round_calls: int
    peak: int
    served: int
    refused: int
    usable: int
    cites_first_page: bool
    seconds: float

    @property
    def summary_tokens(self) -> int:
        """Tokens the summary calls spent, prompt and completion."""
        return self.summary_prompt + self.summary_completion

    @property
    def share(self) -> float:
        """The summary calls' share of the run's tokens."""
        return self.summary_tokens / self.run_tokens if self.run_tokens else 0.0

    @property
    def peak_share(self) -> float:
        """Peak context over the served context."""
        return self.peak / self.served if self.served else float("inf")

    @property
    def all_rounds(self) -> bool:
        """Every scripted round ran and the run ended with the model's answer."""
        return self.reason == "answer" and self.completed == self.rounds


def label(context: int) -> str:
    """128K, 64K, …"""
    return f"{context // 1024}K"


def kilo(tokens: float) -> str:
    """Tokens in thousands, one decimal."""
    return f"{tokens / 1000:.1f}K"


async def research(context: int, rounds: int, at_limit: AtLimit) -> Outcome:
    """The scripted research on `context` tokens served, through the real client."""
    limits = Limits(
        model_context_tokens=context,
        at_limit=at_limit,
        max_consolidations=MAX_CONSOLIDATIONS,
    )
    script = LongResearch(page_url, rounds=rounds)
    started = time.perf_counter()
    with FakeOpenAI(max_model_len=context, enforce_context=True) as fake:
        fake.respond_with(script)
        settings = ModelSettings(
            base_url=fake.base_url, model=fake.model, max_attempts=1
        )
        async with httpx.AsyncClient() as http:
            state = RunState(
                messages=[
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": QUESTION},
                ],
                started=time.monotonic(),
            )
            loop = ResearchLoop(
                state, OpenAIModelClient(settings, http), EvidenceTools(), limits
            )
            events: list[Event] = [event async for event in loop.run()]
        summary_calls = sum(
            is_summary_request(body["messages"]) for body in fake.bodies
        )
        refused = fake.refused
    finished = events[-1]
    if not isinstance(finished, RunFinished):
        raise RuntimeError(f"the run did not finish: {finished!r}")
    stats = finished.stats
    wrapped = any(isinstance(event, WrappingUp) for event in events)
    return Outcome(
        context=context,
        rounds=rounds,
        reason=finished.reason,
        # The wrap-up is counted as a round: the forced answer is not research.
        completed=stats.rounds - wrapped,
        consolidations=stats.consolidations,
        summary_calls=summary_calls,
        summary_prompt=stats.consolidation_prompt_tokens,
        summary_completion=stats.consolidation_completion_tokens,
        run_tokens=stats.prompt_tokens + stats.completion_tokens,
        round_prompt=stats.prompt_tokens - stats.consolidation_prompt_tokens,
        round_calls=stats.rounds,
        peak=stats.peak_context_tokens,
        served=stats.served_context_tokens,
        refused=refused,
        usable=limits.context_limit(),
        cites_first_page=f"[page 1]({page_url(1)})" in finished.answer,
        seconds=time.perf_counter() - started,
    )


def _calls(count: int) -> str:
    return f"{count} summary call" + ("" if count == 1 else "s")


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def side_by_side(runs: list[Outcome], references: list[Outcome], quick: bool) -> str:
    """The printed table: one column per served context."""
    rounds = runs[0].rounds
    lines: list[tuple[str, ...]] = [
        ("served context", *(f"{label(o.context)} ({o.context:,})" for o in runs)),
        (f"rounds completed (of {rounds})", *(f"{o.completed}" for o in runs)),
        ("consolidations", *(f"{o.consolidations}" for o in runs)),
        ("extra model calls (summary calls)", *(f"{o.summary_calls}" for o in runs)),
        (
            "tokens on them (prompt + completion)",
            *(
                f"{o.summary_tokens:,} ({o.summary_prompt:,} + "
                f"{o.summary_completion:,})"
                for o in runs
            ),
        ),
        (
            "share of the run's tokens",
            *(f"{o.share:.1%} of {o.run_tokens:,}" for o in runs),
        ),
        (
            "peak context / served context",
            *(f"{o.peak_share:.2f} ({o.peak:,} / {o.served:,})" for o in runs),
        ),
        ("requests refused by the server", *(f"{o.refused}" for o in runs)),
        (
            "answer cites page 1 (read in round 1)",
            *("yes" if o.cites_first_page else "no" for o in runs),
        ),
        (
            "reference wrap-up: rounds before the forced answer",
            *(
                f"{r.completed} (forced answer)"
                if r.reason == "context_limit"
                else f"{r.completed} (no wrap-up, {r.reason})"
                for r in references
            ),
        ),
    ]
    if quick:
        lines.append(
            (
                "checks: every round, no refusal, peak ≤ served",
                *(
                    "PASS"
                    if o.all_rounds and o.refused == 0 and o.peak <= o.served
                    else "FAIL"
                    for o in runs
                ),
            )
        )
    else:
        lines += [
            (
                "goal: every round completed",
                *(_verdict(o.all_rounds) for o in runs),
            ),
            (
                f"goal: peak ≤ {PEAK_GOAL:.2f} of served",
                *(_verdict(o.peak_share <= PEAK_GOAL) for o in runs),
            ),
            (
                f"goal: overhead ≤ {OVERHEAD_GOAL:.0%} of the run's tokens",
                *(_verdict(o.share <= OVERHEAD_GOAL) for o in runs),
            ),
        ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]

    def row(cells: tuple[str, ...]) -> str:
        padded = (c.ljust(w) for c, w in zip(cells, widths, strict=True))
        return "  | " + " | ".join(padded) + " |"

    rule = "  |" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([row(lines[0]), rule, *(row(line) for line in lines[1:])])


def why_structural(runs: list[Outcome]) -> str:
    """The one line under the table: why the overhead is what it is."""
    parts = []
    for o in runs:
        if not o.summary_calls:
            parts.append(f"{label(o.context)}: no summary call")
            continue
        summary_read = o.summary_prompt / o.summary_calls
        round_read = o.round_prompt / max(o.round_calls, 1)
        parts.append(
            f"{label(o.context)}: a summary call read {kilo(summary_read)} of "
            f"{kilo(o.usable)} usable, a round {kilo(round_read)}"
        )
    return (
        "  Why the overhead is structural: each consolidation re-reads about one "
        "usable context while a round reads on average half of one, so the share "
        f"falls as the context grows ({'; '.join(parts)})."
    )


def _rows(runs: list[Outcome], references: list[Outcome], quick: bool) -> list[Row]:
    rows = []
    for o, ref in zip(runs, references, strict=True):
        name = f"context {label(o.context)}"
        rows += [
            Row(
                f"{name}: rounds completed (of {o.rounds})",
                f"{o.completed} ({o.reason})",
                f"{ref.completed} (wrap-up, reference)",
                o.completed / ref.completed if ref.completed else None,
                f"{o.rounds} (every round)",
                o.all_rounds,
                timing=False,
            ),
            Row(
                f"{name}: requests refused",
                f"{o.refused}",
                f"{ref.refused} (wrap-up, reference)",
                None,
                "0",
                o.refused == 0,
                timing=False,
            ),
            Row(
                f"{name}: peak context / served",
                f"{o.peak_share:.2f} ({o.peak:,} / {o.served:,})",
                "—",
                None,
                "≤ 1.00 (served)" if quick else f"≤ {PEAK_GOAL:.2f}",
                o.peak <= o.served if quick else o.peak_share <= PEAK_GOAL,
                timing=False,
            ),
            Row(
                f"{name}: consolidation overhead",
                f"{o.share:.1%} ({_calls(o.summary_calls)}, {o.summary_tokens:,} tok)",
                "—",
                None,
                f"≤ {OVERHEAD_GOAL:.0%} (full run)"
                if quick
                else f"≤ {OVERHEAD_GOAL:.0%}",
                None if quick else o.share <= OVERHEAD_GOAL,
                timing=False,
            ),
        ]
    return rows


async def run(quick: bool) -> list[Row]:
    """Each served context, consolidating and with the reference wrap-up."""
    contexts = QUICK_CONTEXTS if quick else CONTEXTS
    rounds = QUICK_ROUNDS if quick else ROUNDS
    runs, references = [], []
    for context in contexts:
        runs.append(await research(context, rounds, "consolidate"))
        references.append(await research(context, rounds, "wrap_up"))
    seconds = sum(o.seconds for o in runs + references)
    print(
        f"  scripted research of {rounds} rounds, one page of 2-3K tokens per "
        f'round; at_limit="consolidate" (at most {MAX_CONSOLIDATIONS}) against '
        f'the reference at_limit="wrap_up"; {len(runs) * 2} runs in {seconds:.1f} s'
    )
    print(side_by_side(runs, references, quick))
    print(why_structural(runs))
    return _rows(runs, references, quick)
