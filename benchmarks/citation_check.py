"""Benchmark 15: the citation check's own accuracy, and what it costs.

A labelled set of (statement, evidence, verdict) cases is built at run time,
seeded, from the real pages in ``../shared/fixtures/article_pages`` (each
page's hand-made ``articleBody`` in ``ground-truth.json``; read from there,
never copied into the repository, see its NOTICE). Four kinds, as many each:

- **supported**: a sentence of a page; the evidence is the passage of that
  page around it (two sentences either side), as an extractor quotes it;
- **altered number**: the same sentence and evidence, one number in the
  sentence changed to one the passage never gives: NOT_SUPPORTED;
- **altered name**: the same, a capitalised name in the sentence (one the
  whole corpus never writes in lower case) swapped for a name from another
  page that this page never mentions: NOT_SUPPORTED;
- **other page**: a sentence from another page, whose names this page never
  mentions, against this page's passage: NOT_SUPPORTED. The request defines
  notes "about something else" as not backing the statement, and CANNOT_TELL
  as notes on the statement's subject too thin to judge; a citation to a
  page about another subject is a wrong citation, which the user must see.

Each case is one statement citing one source, run through the check itself
(`core.citation_check.check_citations`: the request, the concurrent calls,
the reply parser) against an OpenAI-compatible model through the package's
own client. Printed: accuracy, per-class precision and recall, accuracy per
kind, how often an unsupported statement passed as supported, calls, tokens
and seconds.

``python -m benchmarks.citation_check --base-url URL --model NAME
[--api-key KEY] [--cases N] [--concurrency N] [--max-tokens N] [--seed N]``

Without ``--base-url`` (and in ``python -m benchmarks.run``) it says in one
line that it skipped the real-model measurement, and checks the plumbing on a
fake model server on 127.0.0.1 that answers by rule (SUPPORTED when the
statement stands word for word in the evidence): every case must come back
with the rule's verdict, one call per case, the tokens the server reported
counted exactly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from tests.fakes.openai_server import FakeOpenAI, Reply

from tongyi_deepresearch_openwebui_pipeline.adapters.model_client import (
    ModelSettings,
    OpenAIModelClient,
)
from tongyi_deepresearch_openwebui_pipeline.core.citation_check import (
    MAX_EVIDENCE_CHARS,
    CitationReport,
    CitedStatement,
    Support,
    check_citations,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import ModelPort
from tongyi_deepresearch_openwebui_pipeline.core.sources import Source

from .report import Row, table

FIXTURES = Path(
    os.environ.get(
        "TDR_FIXTURES", Path(__file__).resolve().parents[2] / "shared" / "fixtures"
    )
)
PAGES = FIXTURES / "article_pages"
KINDS = ("supported", "altered number", "altered name", "other page")
LABELS = {
    "supported": Support.SUPPORTED,
    "altered number": Support.NOT_SUPPORTED,
    "altered name": Support.NOT_SUPPORTED,
    "other page": Support.NOT_SUPPORTED,
}
#: Cases per kind: the suite's quick run, and a measurement's default.
QUICK_PER_KIND, PER_KIND = 6, 25
SEED = 29
#: Sentences either side of a statement in its evidence passage.
CONTEXT_SENTENCES = 2
MIN_WORDS, MAX_WORDS, MAX_SENTENCE_CHARS = 10, 40, 300
SKIP_LINE = (
    "citation check: no --base-url given, the real-model measurement is skipped; "
    "checking the plumbing with a fake model that answers by rule"
)

_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_CAPITALISED = re.compile(r"\b[A-Z][a-z]{2,}\b")
_LOWER_WORD = re.compile(r"\b[a-z]+\b")
#: A number in a sentence: "1,200", "3.5", "2019" (not "COVID-19", not "v2").
_NUMBER = re.compile(r"(?<![\w.,-])(?:\d{1,3}(?:,\d{3})++|\d++)(?:\.\d+)?(?![\w-])")


@dataclass(frozen=True)
class Page:
    """One fixture page: its address, its sentences, its words."""

    url: str
    sentences: tuple[str, ...]
    body: str


@dataclass(frozen=True)
class Case:
    """A statement, the evidence it is checked against, and the right verdict."""

    kind: str
    statement: str
    evidence: str
    url: str

    @property
    def label(self) -> Support:
        """The verdict the check should give."""
        return LABELS[self.kind]


def load_pages() -> list[Page]:
    """The fixture pages, in a fixed order, each split into sentences."""
    truth = json.loads((PAGES / "ground-truth.json").read_text(encoding="utf-8"))
    pages = []
    for key in sorted(truth):
        body = str(truth[key].get("articleBody") or "")
        sentences = tuple(
            sentence.strip()
            for paragraph in body.splitlines()
            for sentence in _SENTENCE_BREAK.split(paragraph)
            if sentence.strip()
        )
        if len(sentences) > 2 * CONTEXT_SENTENCES:
            pages.append(Page(str(truth[key].get("url") or key), sentences, body))
    return pages


def _checkable(sentence: str) -> bool:
    words = len(sentence.split())
    return (
        MIN_WORDS <= words <= MAX_WORDS
        and len(sentence) <= MAX_SENTENCE_CHARS
        and sentence.endswith(".")
    )


def _passage(page: Page, index: int) -> str:
    low = max(0, index - CONTEXT_SENTENCES)
    return " ".join(page.sentences[low : index + CONTEXT_SENTENCES + 1])


class CaseBuilder:
    """Builds the labelled cases, deterministically for a seed."""

    def __init__(self, pages: Sequence[Page], seed: int) -> None:
        """Read the corpus once: which capitalised words are names."""
        self.pages = list(pages)
        self.rng = random.Random(seed)
        lower = {word for page in pages for word in _LOWER_WORD.findall(page.body)}
        self.names = {
            word
            for page in pages
            for word in _CAPITALISED.findall(page.body)
            if word.lower() not in lower
        }

    def build(self, per_kind: int) -> list[Case]:
        """``per_kind`` cases of each kind, pages taken in a seeded order."""
        builders = {
            "supported": self._supported,
            "altered number": self._altered_number,
            "altered name": self._altered_name,
            "other page": self._other_page,
        }
        cases: list[Case] = []
        for kind in KINDS:
            order = self.pages[:]
            self.rng.shuffle(order)
            made = [
                case
                for page in order
                if (case := builders[kind](page))
                and len(case.evidence) <= MAX_EVIDENCE_CHARS  # quoted whole
            ]
            if len(made) < per_kind:
                raise RuntimeError(f"only {len(made)} {kind!r} cases in the pages")
            cases += made[:per_kind]
        return cases

    def _pick(
        self, page: Page, wanted: Callable[[str], object] | None = None
    ) -> tuple[int, str] | None:
        """A seeded checkable sentence of ``page`` (meeting ``wanted``)."""
        indexes = [
            index
            for index, sentence in enumerate(page.sentences)
            if _checkable(sentence) and (wanted is None or wanted(sentence))
        ]
        if not indexes:
            return None
        index = self.rng.choice(indexes)
        return index, page.sentences[index]

    def _supported(self, page: Page) -> Case | None:
        picked = self._pick(page)
        if picked is None:
            return None
        index, sentence = picked
        return Case("supported", sentence, _passage(page, index), page.url)

    def _altered_number(self, page: Page) -> Case | None:
        picked = self._pick(page, _NUMBER.search)
        if picked is None:
            return None
        index, sentence = picked
        passage = _passage(page, index)
        match = self.rng.choice(list(_NUMBER.finditer(sentence)))
        changed = _other_number(match.group(0), self.rng)
        if re.search(rf"(?<![\d,.]){re.escape(changed)}(?!\d)", passage):
            return None  # the passage gives that number too
        statement = sentence[: match.start()] + changed + sentence[match.end() :]
        return Case("altered number", statement, passage, page.url)

    def _names_in(self, sentence: str) -> list[re.Match[str]]:
        return [
            match
            for match in _CAPITALISED.finditer(sentence)
            if match.start() > 0 and match.group(0) in self.names
        ]

    def _altered_name(self, page: Page) -> Case | None:
        picked = self._pick(page, self._names_in)
        if picked is None:
            return None
        index, sentence = picked
        match = self.rng.choice(self._names_in(sentence))
        others = sorted(
            {
                name
                for other in self.pages
                if other is not page
                for name in _CAPITALISED.findall(other.body)
                if name in self.names and name not in page.body
            }
        )
        if not others:
            return None
        name = self.rng.choice(others)
        statement = sentence[: match.start()] + name + sentence[match.end() :]
        return Case("altered name", statement, _passage(page, index), page.url)

    def _other_page(self, page: Page) -> Case | None:
        other = self.rng.choice(
            [candidate for candidate in self.pages if candidate is not page]
        )

        def foreign(sentence: str) -> bool:
            names = [match.group(0) for match in self._names_in(sentence)]
            return bool(names) and not any(name in page.body for name in names)

        statement = self._pick(other, foreign)
        evidence = self._pick(page)
        if statement is None or evidence is None:
            return None
        passage = _passage(page, evidence[0])
        return Case("other page", statement[1], passage, page.url)


def _other_number(number: str, rng: random.Random) -> str:
    """``number`` changed, written the same way (decimals and thousands kept)."""
    integer, _, fraction = number.replace(",", "").partition(".")
    value = int(integer)
    if 1900 <= value <= 2100 and number.isdigit():  # a year: a nearby one
        changed = value + rng.choice([-3, -2, -1, 1, 2, 3])
    else:
        changed = value + max(1, round(value * rng.choice([0.3, 0.5, 1.0])))
    written = f"{changed:,}" if "," in number else str(changed)
    return f"{written}.{fraction}" if fraction else written


# -- running the check --


@dataclass(frozen=True)
class Measured:
    """The check's verdicts on the cases, and what they cost."""

    cases: list[Case]
    report: CitationReport
    seconds: float

    @property
    def predicted(self) -> list[Support]:
        """The verdict of each case, in order."""
        return [item.verdict.support for item in self.report.verdicts]

    @property
    def accuracy(self) -> float:
        """Share of cases given their label."""
        pairs = zip(self.cases, self.predicted, strict=True)
        return sum(case.label is got for case, got in pairs) / len(self.cases)

    def precision_recall(self, support: Support) -> tuple[float | None, float | None]:
        """(precision, recall) of one verdict; None where nothing to divide by."""
        pairs = list(zip(self.cases, self.predicted, strict=True))
        given = sum(got is support for _, got in pairs)
        true = sum(case.label is support for case, _ in pairs)
        hits = sum(case.label is support is got for case, got in pairs)
        return (hits / given if given else None, hits / true if true else None)

    def kind_accuracy(self, kind: str) -> float:
        """Share of one kind's cases given their label."""
        pairs = [
            (case, got)
            for case, got in zip(self.cases, self.predicted, strict=True)
            if case.kind == kind
        ]
        return sum(case.label is got for case, got in pairs) / len(pairs)

    @property
    def false_supported(self) -> float:
        """Share of unsupported statements the check called supported."""
        pairs = [
            got
            for case, got in zip(self.cases, self.predicted, strict=True)
            if case.label is not Support.SUPPORTED
        ]
        return sum(got is Support.SUPPORTED for got in pairs) / len(pairs)


async def measure(
    cases: list[Case], model: ModelPort, concurrency: int, max_tokens: int
) -> Measured:
    """Run the check on every case: one statement citing one source each."""
    statements = [
        CitedStatement(case.statement, (number,), 0, len(case.statement))
        for number, case in enumerate(cases, 1)
    ]
    sources = {
        number: Source(number, case.url, urlsplit(case.url).netloc, case.evidence)
        for number, case in enumerate(cases, 1)
    }
    started = time.perf_counter()
    report = await check_citations(
        statements,
        sources,
        model,
        concurrency=concurrency,
        deadline=None,
        max_tokens=max_tokens,
    )
    return Measured(cases, report, time.perf_counter() - started)


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def print_measurement(measured: Measured, label: str) -> None:
    """Every figure of a run, in a few lines."""
    report = measured.report
    print(f"  {label}: {len(measured.cases)} cases, accuracy {measured.accuracy:.3f}")
    for support in Support:
        precision, recall = measured.precision_recall(support)
        print(
            f"    {support.value}: precision {_share(precision)},"
            f" recall {_share(recall)}"
        )
    kinds = ", ".join(f"{kind} {measured.kind_accuracy(kind):.2f}" for kind in KINDS)
    print(f"    accuracy per kind: {kinds}")
    print(
        "    unsupported statements passed as supported:"
        f" {measured.false_supported:.2f}"
    )
    calls = max(report.calls, 1)
    print(
        f"    {report.calls} calls, {report.prompt_tokens} prompt + "
        f"{report.completion_tokens} completion tokens "
        f"({report.prompt_tokens / calls:.0f} + {report.completion_tokens / calls:.0f}"
        f" per call), {measured.seconds:.2f} s"
    )


def print_misjudged(measured: Measured, shown: int = 5) -> None:
    """The first few cases the check got wrong, with the model's reason."""
    pairs = zip(measured.cases, measured.report.verdicts, strict=True)
    wrong = [
        (case, item) for case, item in pairs if item.verdict.support is not case.label
    ]
    for case, item in wrong[:shown]:
        print(
            f"    wrong ({case.kind}): {item.verdict.support.value}"
            f" ({item.verdict.reason or 'no reason'}): {case.statement[:120]}"
        )


def rows(measured: Measured, label: str) -> list[Row]:
    """The table's figures for a run on a real model (reported, no target)."""
    report = measured.report
    calls = max(report.calls, 1)
    return [
        Row(
            f"citation check: accuracy ({label})",
            f"{measured.accuracy:.3f}",
            "—",
            None,
            "reported",
            None,
            timing=False,
        ),
        Row(
            "citation check: unsupported passed as supported",
            f"{measured.false_supported:.2f}",
            "—",
            None,
            "reported",
            None,
            timing=False,
        ),
        Row(
            "citation check: seconds",
            f"{measured.seconds:.1f} s",
            "—",
            None,
            "reported",
            None,
            timing=False,
        ),
        Row(
            "citation check: tokens per statement",
            f"{(report.prompt_tokens + report.completion_tokens) / calls:.0f}",
            "—",
            None,
            "reported",
            None,
            timing=False,
        ),
    ]


# -- the fake model: answers by rule --


class RuleModel:
    """A fake server's responder: SUPPORTED when the statement is in the evidence.

    It reports usage it chose itself (a token per 4 characters of the
    request, and the fake server's count of the reply), so the check's totals
    can be compared with what was reported.
    """

    def __init__(self) -> None:
        """Nothing answered yet."""
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        """The reply to one request (on the server's thread)."""
        content = str(body["messages"][-1]["content"])
        statement = _quoted(content, "statement").rstrip(".")
        word = (
            "SUPPORTED"
            if statement in _quoted(content, "evidence")
            else "NOT_SUPPORTED"
        )
        reply = Reply(
            content=f"{word}\nThe rule looked for the statement in the notes.",
            reasoning="Comparing the statement with the notes.",
            style="inline",
            prompt_tokens=len(content) // 4 + 1,
        )
        with self._lock:
            self.prompt_tokens += reply.prompt_tokens or 0
            self.completion_tokens += len(reply.full_inline()) // 4
        return reply


def _quoted(content: str, name: str) -> str:
    match = re.search(rf"<{name}>\n(.*?)\n</{name}>", content, re.DOTALL)
    return match.group(1) if match else ""


def plumbing_problems(measured: Measured, rule: RuleModel, requests: int) -> list[str]:
    """What went wrong between the cases and the rule's verdicts (none: [])."""
    report = measured.report
    problems = []
    if report.calls != len(measured.cases) or requests != len(measured.cases):
        problems.append(
            f"{report.calls} calls and {requests} requests"
            f" for {len(measured.cases)} cases"
        )
    if (report.prompt_tokens, report.completion_tokens) != (
        rule.prompt_tokens,
        rule.completion_tokens,
    ):
        problems.append(
            f"tokens counted {report.prompt_tokens}+{report.completion_tokens}, "
            f"reported {rule.prompt_tokens}+{rule.completion_tokens}"
        )
    wrong = sum(
        case.label is not got
        for case, got in zip(measured.cases, measured.predicted, strict=True)
    )
    if wrong:
        problems.append(f"{wrong} cases not given the rule's verdict")
    return problems


async def plumbing(per_kind: int, concurrency: int) -> list[Row]:
    """The check against the fake server: every count must be exact."""
    cases = CaseBuilder(load_pages(), SEED).build(per_kind)
    rule = RuleModel()
    with FakeOpenAI() as fake:
        fake.respond_with(rule)
        settings = ModelSettings(
            base_url=fake.base_url, model=fake.model, max_attempts=1
        )
        async with httpx.AsyncClient() as http:
            model = OpenAIModelClient(settings, http)
            measured = await measure(cases, model, concurrency, max_tokens=64)
        requests = len(fake.bodies)
    print_measurement(measured, "fake model (answers by rule)")
    problems = plumbing_problems(measured, rule, requests)
    for problem in problems:
        print(f"  PROBLEM: {problem}")
    return [
        Row(
            f"citation check: plumbing ({len(cases)} cases, fake model)",
            f"{len(problems)} problems",
            "—",
            None,
            "0",
            not problems,
            timing=False,
        )
    ]


def _skipped() -> list[Row]:
    return [
        Row(
            "citation check",
            "skipped",
            "no ../shared/fixtures/article_pages",
            None,
            "-",
            None,
            timing=False,
        )
    ]


async def run(
    quick: bool, per_kind: int | None = None, concurrency: int = 4
) -> list[Row]:
    """The suite's run: no real model, so the plumbing on the fake one."""
    if not (PAGES / "ground-truth.json").is_file():
        return _skipped()
    print(SKIP_LINE)
    if per_kind is None:
        per_kind = QUICK_PER_KIND if quick else PER_KIND
    return await plumbing(per_kind, concurrency)


async def real(args: argparse.Namespace) -> list[Row]:
    """The check's own accuracy on the model at ``args.base_url``."""
    cases = CaseBuilder(load_pages(), args.seed).build(args.cases)
    settings = ModelSettings(
        base_url=args.base_url,
        model=args.model,
        api_key=args.api_key,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        stop=(),
        max_attempts=3,
        timeout_seconds=300.0,
    )
    async with httpx.AsyncClient() as http:
        model = OpenAIModelClient(settings, http)
        measured = await measure(cases, model, args.concurrency, args.max_tokens)
    print_measurement(measured, args.model)
    print_misjudged(measured)
    return rows(measured, f"{args.model}, {len(cases)} cases")


def main(argv: list[str] | None = None) -> int:
    """Measure on the model given, or check the plumbing without one."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.citation_check")
    parser.add_argument("--base-url", default="", help="OpenAI-compatible /v1 URL")
    parser.add_argument("--model", default="", help="the model's name on that server")
    parser.add_argument("--api-key", default="", help="optional bearer key")
    parser.add_argument("--cases", type=int, default=PER_KIND, help="cases per kind")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    if not (PAGES / "ground-truth.json").is_file():
        print(f"citation check: skipped, no {PAGES}")
        return 1
    if args.base_url and not args.model:
        parser.error("--model is required with --base-url")
    if args.base_url:
        found = asyncio.run(real(args))
    else:
        found = asyncio.run(run(False, args.cases, args.concurrency))
    print(f"\n{table(found, quick=False)}")
    return 1 if any(row.fails(quick=False) for row in found) else 0


if __name__ == "__main__":
    sys.exit(main())
