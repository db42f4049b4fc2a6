"""The citation check: cited statements, verdict requests and replies, the calls.

The statements are read from answers as the run engine's rewriter leaves them
(" [n]" after a link or URL, the unverified mark, the model's own numbers
escaped). The calls go to an in-process model port (`ScriptedModel`); the
deadline is either already past or moved by the test (an event loop whose
clock it steers), never waited for.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakes.scripted_model import ScriptedModel
from tongyi_deepresearch_openwebui_pipeline.core.citation_check import (
    CALL_FAILED,
    CONFLICTING_VERDICTS,
    MAX_REASON_CHARS,
    MAX_SOURCES_PER_STATEMENT,
    MAX_STATEMENT_CHARS,
    NO_SUCH_SOURCE,
    NO_VERDICT,
    NOTHING_RECORDED,
    OUT_OF_TIME,
    VERDICT_SYSTEM_PROMPT,
    CitationReport,
    CitedStatement,
    SourceVerdict,
    StatementVerdict,
    Support,
    Verdict,
    check_citations,
    cited_statements,
    parse_verdict,
    scan_statements,
    verdict_request,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    ModelDelta,
    ModelError,
    ModelFinish,
    ModelRetry,
    ModelUsage,
)
from tongyi_deepresearch_openwebui_pipeline.core.sources import (
    UNVERIFIED_MARK,
    PageRead,
    Source,
    SourceLedger,
    rewrite_answer,
)

SUPPORTED, NOT_SUPPORTED, CANNOT_TELL = (
    Support.SUPPORTED,
    Support.NOT_SUPPORTED,
    Support.CANNOT_TELL,
)


def found(answer: str, cap: int = 100) -> list[tuple[str, tuple[int, ...], str]]:
    """(text, numbers, the span as it stands) of each cited statement."""
    return [
        (statement.text, statement.numbers, answer[statement.start : statement.end])
        for statement in cited_statements(answer, cap)
    ]


# -- finding the cited statements ----------------------------------------------


def test_each_sentence_carrying_citations_is_a_statement() -> None:
    answer = (
        "Sales rose 5% in 2023 [1]. Costs fell, e.g. in the U.S. by 3.5% [2]. "
        "Nothing cited here. Prices doubled [1]!"
    )
    assert found(answer) == [
        ("Sales rose 5% in 2023.", (1,), "Sales rose 5% in 2023 [1]."),
        (
            "Costs fell, e.g. in the U.S. by 3.5%.",
            (2,),
            "Costs fell, e.g. in the U.S. by 3.5% [2].",
        ),
        ("Prices doubled!", (1,), "Prices doubled [1]!"),
    ]


def test_a_citation_after_the_period_belongs_to_the_sentence_before() -> None:
    answer = (
        "Prices rose. [3] Then they fell [3]. Sales in the U.S. [4] Europe fell [5]."
    )
    assert found(answer) == [
        ("Prices rose.", (3,), "Prices rose. [3]"),
        ("Then they fell.", (3,), "Then they fell [3]."),
        ("Sales in the U.S.", (4,), "Sales in the U.S. [4]"),
        ("Europe fell.", (5,), "Europe fell [5]."),
    ]


def test_an_abbreviation_followed_by_a_citation_ends_no_sentence_mid_clause() -> None:
    answer = "Fruit, e.g. [1] apples, grew."
    assert found(answer) == [("Fruit, e.g. apples, grew.", (1,), answer)]


def test_grouped_citations_are_one_group_each_number_once() -> None:
    answer = "Rates fell [2] [1] [2] after the vote."
    assert found(answer) == [("Rates fell after the vote.", (2, 1), answer)]


def test_a_citation_inside_a_sentence_ends_a_clause_with_words_on_both_sides() -> None:
    answer = "Revenue grew 5% in 2023 [1], while costs fell 3% last year [2]."
    assert found(answer) == [
        ("Revenue grew 5% in 2023", (1,), "Revenue grew 5% in 2023 [1]"),
        ("while costs fell 3% last year.", (2,), "while costs fell 3% last year [2]."),
    ]


def test_a_citation_after_a_short_lead_keeps_the_sentence_whole() -> None:
    answer = "According to [Reuters](https://r.example/a) [1], revenue grew 5% [2]."
    assert found(answer) == [("According to Reuters, revenue grew 5%.", (1, 2), answer)]


def test_several_statements_citing_one_source_are_each_checked() -> None:
    answer = "A rose [1]. B fell [1]. C held [1]."
    assert [numbers for _, numbers, _ in found(answer)] == [(1,), (1,), (1,)]
    assert [text for text, _, _ in found(answer)] == ["A rose.", "B fell.", "C held."]


def test_markdown_lists_headings_and_quotes() -> None:
    answer = (
        "# Results [4]\n"
        "\n"
        "- first item [1]\n"
        "- second item\n"
        "  continues here [2]\n"
        "1. numbered **claim** [3]\n"
        "> quoted claim [5]\n"
        "> goes on.\n"
    )
    assert found(answer) == [
        ("Results", (4,), "Results [4]"),
        ("first item", (1,), "first item [1]"),
        ("second item continues here", (2,), "second item\n  continues here [2]"),
        ("numbered claim", (3,), "numbered **claim** [3]"),
        ("quoted claim goes on.", (5,), "quoted claim [5]\n> goes on."),
    ]


def test_a_table_row_is_one_statement_named_by_its_header() -> None:
    answer = (
        "| Year | Growth |\n"
        "|---|:---:|\n"
        "| 2023 | 5% [1] |\n"
        "| 2024 | 7% [2] [3] |\n"
        "\n"
        "| no header [6] | here |\n"
    )
    assert found(answer) == [
        ("Year: 2023; Growth: 5%", (1,), "| 2023 | 5% [1] |"),
        ("Year: 2024; Growth: 7%", (2, 3), "| 2024 | 7% [2] [3] |"),
        ("no header | here", (6,), "| no header [6] | here |"),
    ]


def test_code_is_never_read_for_citations() -> None:
    answer = (
        "```python\n"
        "x = a [1]. y [2]\n"
        "```\n"
        "~~~\n"
        "also code [3]\n"
        "~~~\n"
        "Text with `code [4]. here` stays one sentence [5].\n"
    )
    assert found(answer) == [
        (
            "Text with `code [4]. here` stays one sentence.",
            (5,),
            "Text with `code [4]. here` stays one sentence [5].",
        )
    ]


def test_an_unclosed_code_block_runs_to_the_end() -> None:
    assert found("Real claim [1].\n```\nnot prose [2].\n") == [
        ("Real claim.", (1,), "Real claim [1].")
    ]


def test_the_unverified_mark_and_escaped_numbers() -> None:
    answer = (
        f"A [page](https://never.read/x) {UNVERIFIED_MARK} says so. "
        "The model wrote \\[2\\] itself. Both [3] [a](https://b.example/) "
        f"{UNVERIFIED_MARK}."
    )
    statements = cited_statements(answer, 10)
    assert [(s.text, s.numbers, s.unverified) for s in statements] == [
        ("A page says so.", (), True),
        ("Both a.", (3,), True),
    ]


def test_citations_alone_are_no_statement() -> None:
    assert found("Intro.\n\n [1] [2]\n\n| [3] |\n") == []


def test_statements_read_from_the_rewriters_output() -> None:
    ledger = SourceLedger()
    ledger.record(PageRead("https://reuters.example/a", "Reuters", "e"))
    ledger.record(PageRead("https://ft.example/b", "FT", "e"))
    answer = rewrite_answer(
        "Sales rose 5% ([Reuters](https://reuters.example/a)). Costs fell "
        "([FT](https://ft.example/b), [Reuters](https://reuters.example/a)); "
        "see https://ft.example/b. The model wrote [2] itself. "
        "Other [blog](https://never.read/x).",
        ledger,
    )
    statements = cited_statements(answer, 10)
    assert [(s.text, s.numbers, s.unverified) for s in statements] == [
        ("Sales rose 5% (Reuters).", (1,), False),
        ("Costs fell (FT, Reuters); see https://ft.example/b.", (2, 1), False),
        ("Other blog.", (), True),
    ]
    assert answer[statements[2].start : statements[2].end] == (
        f"Other [blog](https://never.read/x) {UNVERIFIED_MARK}."
    )


def test_only_the_first_statements_are_kept_and_all_are_counted() -> None:
    answer = "One [1]. Two [2]. Three [3]. Four [4]. Five [5]."
    scan = scan_statements(answer, 2)
    assert [s.text for s in scan.statements] == ["One.", "Two."]
    assert (scan.found, scan.skipped) == (5, 3)
    assert cited_statements(answer, 2) == list(scan.statements)
    assert cited_statements(answer, 0) == []


def test_a_statement_over_the_cap_keeps_its_two_ends() -> None:
    words = " ".join(f"w{i}" for i in range(600))  # 3,889 characters
    answer = f"{words} [1]."
    (statement,) = cited_statements(answer, 1)
    assert MAX_STATEMENT_CHARS == 1000
    assert statement.cut
    assert len(statement.text) <= MAX_STATEMENT_CHARS
    head, tail = statement.text.split(" … ")
    assert words.startswith(head) and head.startswith("w0 w1 w2 ")
    assert (words + ".").endswith(tail) and tail.endswith("w598 w599.")
    assert (statement.start, statement.end) == (0, len(answer))


# Pieces Markdown answers are made of, hostile ones included.
PIECES = st.sampled_from(
    [
        "a",
        "Word",
        " ",
        ".",
        "!",
        "\n",
        "\n\n",
        "[",
        "]",
        "(",
        ")",
        " [1]",
        " [2]",
        " [17]",
        f" {UNVERIFIED_MARK}",
        "`",
        "```\n",
        "|",
        "|---|\n",
        "- ",
        "# ",
        "> ",
        "e.g.",
        "U.S.",
        "3.5%",
        "\\",
        "[x](https://e.example/a)",
        "*",
    ]
)


@settings(max_examples=300)
@given(st.lists(PIECES, max_size=60).map("".join))
def test_statements_always_stand_where_their_citations_are(answer: str) -> None:
    scan = scan_statements(answer, 1000)
    previous_end = 0
    for statement in scan.statements:
        span = answer[statement.start : statement.end]
        assert previous_end <= statement.start < statement.end <= len(answer)
        assert span == span.strip()
        for number in statement.numbers:
            assert f" [{number}]" in span
        assert len(set(statement.numbers)) == len(statement.numbers)
        assert statement.numbers or statement.unverified
        assert (UNVERIFIED_MARK in span) >= statement.unverified
        assert len(statement.text) <= MAX_STATEMENT_CHARS
        previous_end = statement.end
    assert scan.found == len(scan.statements)
    assert scan_statements(answer, 3).statements == scan.statements[:3]


# -- the request and the reply -------------------------------------------------


def test_the_request_quotes_the_statement_and_the_pages_record() -> None:
    source = Source(
        1, "https://e.example/a", "Sales report", "Sales rose 5% in 2023.", ""
    )
    messages = verdict_request("Sales rose 5% in 2023.", source)
    assert messages == [
        {"role": "system", "content": VERDICT_SYSTEM_PROMPT},
        {
            "role": "user",
            "content": (
                "<statement>\nSales rose 5% in 2023.\n</statement>\n\n"
                "The notes recorded for the cited page:\n"
                "<page_title>\nSales report\n</page_title>\n"
                "<evidence>\nSales rose 5% in 2023.\n</evidence>\n"
                "<summary>\n(none)\n</summary>\n\n"
                "Do these notes back the statement? Reply with SUPPORTED, "
                "NOT_SUPPORTED or CANNOT_TELL, then at most one short line "
                "saying why."
            ),
        },
    ]


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("SUPPORTED", Verdict(SUPPORTED)),
        ("supported.", Verdict(SUPPORTED)),
        ("NOT_SUPPORTED: the page says 4%", Verdict(NOT_SUPPORTED, "the page says 4%")),
        ("Not supported - other year", Verdict(NOT_SUPPORTED, "other year")),
        ("**UNSUPPORTED**", Verdict(NOT_SUPPORTED)),
        ("CANNOT_TELL", Verdict(CANNOT_TELL)),
        (
            "can't tell — the notes stop early",
            Verdict(CANNOT_TELL, "the notes stop early"),
        ),
        (
            "Verdict: **NOT_SUPPORTED** (wrong name)",
            Verdict(NOT_SUPPORTED, "wrong name"),
        ),
        (
            "<think>Is it SUPPORTED? No.</think>\n\nNOT_SUPPORTED\nThe page says 2019.",
            Verdict(NOT_SUPPORTED, "The page says 2019."),
        ),
        (
            "Checking the notes.\nSUPPORTED — the first line says so",
            Verdict(SUPPORTED, "the first line says so"),
        ),
        ("SUPPORTED\nNOT_SUPPORTED", Verdict(CANNOT_TELL, CONFLICTING_VERDICTS)),
        ("The statement is supported.", Verdict(CANNOT_TELL, NO_VERDICT)),
        ("SUPPORTEDLY true", Verdict(CANNOT_TELL, NO_VERDICT)),
        ("", Verdict(CANNOT_TELL, NO_VERDICT)),
        ("<think>SUPPORTED", Verdict(CANNOT_TELL, NO_VERDICT)),
        ("yes", Verdict(CANNOT_TELL, NO_VERDICT)),
    ],
)
def test_a_reply_gives_a_verdict_only_when_it_plainly_does(
    reply: str, verdict: Verdict
) -> None:
    assert parse_verdict(reply) == verdict


def test_a_long_reason_is_cut() -> None:
    verdict = parse_verdict("SUPPORTED " + "why " * 200)
    assert len(verdict.reason) == MAX_REASON_CHARS
    assert verdict.reason.endswith("…")


# -- the check -----------------------------------------------------------------


def source(number: int, evidence: str = "", summary: str = "") -> Source:
    return Source(
        number, f"https://e.example/{number}", f"Page {number}", evidence, summary
    )


def block(request: list[dict[str, Any]], name: str) -> str:
    """The text of one quoted block of a verdict request."""
    content = request[-1]["content"]
    match = re.search(rf"<{name}>\n(.*?)\n</{name}>", content, re.DOTALL)
    assert match is not None
    return match.group(1)


def by_rule(messages: list[dict[str, Any]]) -> str:
    """A model that supports a statement its evidence holds word for word."""
    statement = block(messages, "statement").rstrip(".")
    evidence = block(messages, "evidence")
    return "SUPPORTED" if statement in evidence else "NOT_SUPPORTED: not in the notes"


def statement(
    text: str, *numbers: int, unverified: bool = False, start: int = 0
) -> CitedStatement:
    return CitedStatement(text, numbers, start, start + len(text), unverified)


async def test_each_statement_gets_its_verdict_and_each_source_its_own() -> None:
    sources = {
        1: source(1, "Sales rose 5% in 2023, the report says."),
        2: source(2, "Costs fell 3% in 2023."),
    }
    statements = [
        statement("Sales rose 5% in 2023.", 2, 1),
        statement("Costs fell 9% in 2023.", 2),
        statement("Profits doubled.", 7),
        statement("A page never read says so.", unverified=True),
    ]
    model = ScriptedModel(respond=by_rule)
    report = await check_citations(
        statements, sources, model, concurrency=4, deadline=None, max_tokens=64
    )
    not_in_notes = Verdict(NOT_SUPPORTED, "not in the notes")
    no_source = Verdict(NOT_SUPPORTED, NO_SUCH_SOURCE)
    assert report.verdicts == (
        StatementVerdict(
            statements[0],
            Verdict(SUPPORTED),
            (SourceVerdict(2, not_in_notes), SourceVerdict(1, Verdict(SUPPORTED))),
        ),
        StatementVerdict(
            statements[1], not_in_notes, (SourceVerdict(2, not_in_notes),)
        ),
        StatementVerdict(statements[2], no_source, (SourceVerdict(7, no_source),)),
        StatementVerdict(statements[3], no_source, (SourceVerdict(None, no_source),)),
    )
    assert (report.supported, report.not_supported, report.checked) == (1, 3, 4)
    assert report.calls == len(model.seen) == 3
    assert model.max_tokens == [64, 64, 64]
    assert report.summary_line() == (
        "Citations: 1 of 4 statements supported by the pages they cite"
    )


async def test_calls_and_reported_tokens_are_counted() -> None:
    reply = [
        ModelDelta(reasoning="Reading the notes."),
        ModelDelta(content="SUPPORTED"),
        ModelUsage(120, 7, cost=0.25),
        ModelFinish("stop"),
    ]
    quiet = [ModelDelta(content="NOT_SUPPORTED"), ModelFinish("stop")]
    model = ScriptedModel(reply, reply, quiet)
    sources = {1: source(1, "E"), 2: source(2, "E"), 3: source(3, "E")}
    statements = [statement("A.", 1), statement("B.", 2), statement("C.", 3)]
    report = await check_citations(
        statements, sources, model, concurrency=1, deadline=None, max_tokens=32
    )
    assert (report.calls, report.prompt_tokens, report.completion_tokens) == (
        3,
        240,
        14,
    )
    assert report.cost == 0.5
    assert [item.verdict.support for item in report.verdicts] == [
        SUPPORTED,
        SUPPORTED,
        NOT_SUPPORTED,
    ]


async def test_a_retried_call_reads_only_the_last_attempt() -> None:
    model = ScriptedModel(
        [
            ModelDelta(content="NOT_SUPP"),
            ModelRetry(1, 3, "connection reset", 0.0),
            ModelDelta(content="SUPPORTED"),
            ModelFinish("stop"),
        ]
    )
    report = await check_citations(
        [statement("A.", 1)],
        {1: source(1, "E")},
        model,
        concurrency=1,
        deadline=None,
        max_tokens=32,
    )
    assert report.verdicts[0].verdict == Verdict(SUPPORTED)


async def test_a_failed_call_is_one_cannot_tell() -> None:
    model = ScriptedModel(
        ModelError("the server refused"),
        [ModelDelta(content="SUPP"), RuntimeError("stream broke")],
        "SUPPORTED",
    )
    statements = [statement("A.", 1), statement("B.", 1), statement("C.", 1)]
    report = await check_citations(
        statements,
        {1: source(1, "E")},
        model,
        concurrency=1,
        deadline=None,
        max_tokens=32,
    )
    assert [item.verdict for item in report.verdicts] == [
        Verdict(CANNOT_TELL, CALL_FAILED),
        Verdict(CANNOT_TELL, CALL_FAILED),
        Verdict(SUPPORTED),
    ]
    assert report.calls == 3


async def test_a_page_with_nothing_recorded_is_not_asked_about() -> None:
    model = ScriptedModel()
    report = await check_citations(
        [statement("A.", 1)],
        {1: source(1, evidence=" ", summary="")},
        model,
        concurrency=1,
        deadline=None,
        max_tokens=32,
    )
    assert report.verdicts[0].verdict == Verdict(CANNOT_TELL, NOTHING_RECORDED)
    assert (report.calls, model.seen) == (0, [])


async def test_only_the_first_sources_of_a_statement_are_checked() -> None:
    cited = tuple(range(1, MAX_SOURCES_PER_STATEMENT + 3))
    sources = {number: source(number, "E") for number in cited}
    model = ScriptedModel(respond=lambda _messages: "NOT_SUPPORTED")
    report = await check_citations(
        [statement("A.", *cited)],
        sources,
        model,
        concurrency=2,
        deadline=None,
        max_tokens=32,
    )
    assert MAX_SOURCES_PER_STATEMENT == 3
    assert report.calls == 3
    assert [item.number for item in report.verdicts[0].sources] == [1, 2, 3]
    assert report.verdicts[0].verdict == Verdict(
        CANNOT_TELL, "only its first 3 of 5 sources were checked"
    )


async def test_statements_over_the_cap_are_reported_as_not_checked() -> None:
    answer = "One [1]. Two [1]. Three [1]. Four [1]. Five [1]."
    scan = scan_statements(answer, 2)
    model = ScriptedModel(respond=lambda _messages: "SUPPORTED")
    report = await check_citations(
        scan.statements,
        {1: source(1, "E")},
        model,
        concurrency=2,
        deadline=None,
        max_tokens=32,
        skipped=scan.skipped,
    )
    assert (report.checked, report.skipped, report.calls) == (2, 3, 2)
    assert report.summary_line() == (
        "Citations: 2 of 2 statements supported by the pages they cite "
        "(3 more not checked)"
    )


async def test_a_deadline_already_past_makes_no_call() -> None:
    model = ScriptedModel()  # any call would fail: nothing is scripted
    deadline = asyncio.get_running_loop().time()
    report = await check_citations(
        [statement("A.", 1), statement("B.", 1, 2)],
        {1: source(1, "E"), 2: source(2, "E")},
        model,
        concurrency=2,
        deadline=deadline,
        max_tokens=32,
    )
    out_of_time = Verdict(CANNOT_TELL, OUT_OF_TIME)
    assert [item.verdict for item in report.verdicts] == [out_of_time, out_of_time]
    assert [v.verdict for v in report.verdicts[1].sources] == [out_of_time] * 2
    assert (report.calls, model.seen) == (0, [])
    assert report.summary_line() == (
        "Citations: 0 of 2 statements supported by the pages they cite (2 out of time)"
    )


class SteeredClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock the test moves on (never waited for)."""

    def __init__(self) -> None:
        super().__init__()
        self.moved = 0.0

    def time(self) -> float:
        return super().time() + self.moved


class NeverAnswers:
    """Streams that wait forever, recording when they start and how they end."""

    def __init__(self, when_started: int = 0, then: Any = None) -> None:
        self.started = 0
        self.cancelled = 0
        self.closed = 0
        self.when_started, self.then = when_started, then
        self.all_started = asyncio.Event()

    async def __call__(self, _messages: Any) -> AsyncGenerator[Any, None]:
        self.started += 1
        if self.started == self.when_started:
            self.all_started.set()
            if self.then is not None:
                self.then()
        try:
            await asyncio.Event().wait()
            yield ModelDelta(content="SUPPORTED")  # never reached
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.closed += 1


def test_calls_still_running_at_the_deadline_are_stopped() -> None:
    async def check(loop: SteeredClockLoop) -> tuple[CitationReport, NeverAnswers]:
        def past_the_deadline() -> None:
            loop.moved += 3600.0

        # Both slots taken, the clock passes the deadline: the two calls
        # running and the one waiting for a slot are all out of time.
        streams = NeverAnswers(when_started=2, then=past_the_deadline)
        model = ScriptedModel(respond=lambda _messages: streams)
        report = await check_citations(
            [statement("A.", 1), statement("B.", 1), statement("C.", 1)],
            {1: source(1, "E")},
            model,
            concurrency=2,
            deadline=loop.time() + 60.0,
            max_tokens=32,
        )
        return report, streams

    with asyncio.Runner(loop_factory=SteeredClockLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, SteeredClockLoop)
        report, streams = runner.run(check(loop))
    out_of_time = Verdict(CANNOT_TELL, OUT_OF_TIME)
    assert [item.verdict for item in report.verdicts] == [out_of_time] * 3
    assert (streams.started, streams.cancelled, streams.closed) == (2, 2, 2)
    assert report.calls == 2


@pytest.mark.parametrize("cap", [1, 3])
async def test_at_most_the_cap_of_calls_run_at_once(cap: int) -> None:
    active = peak = 0

    async def counted(_messages: Any) -> AsyncGenerator[Any, None]:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        try:
            await asyncio.sleep(0)  # every call that may run now starts first
            yield ModelDelta(content="SUPPORTED")
        finally:
            active -= 1

    model = ScriptedModel(respond=lambda _messages: counted)
    statements = [statement(f"S{i}.", 1) for i in range(7)]
    report = await check_citations(
        statements,
        {1: source(1, "E")},
        model,
        concurrency=cap,
        deadline=None,
        max_tokens=32,
    )
    assert peak == cap
    assert (report.calls, report.supported) == (7, 7)


async def test_cancelling_the_check_cancels_and_closes_every_call() -> None:
    before = asyncio.all_tasks()
    streams = NeverAnswers(when_started=2)
    model = ScriptedModel(respond=lambda _messages: streams)
    check = asyncio.create_task(
        check_citations(
            [statement("A.", 1), statement("B.", 1), statement("C.", 1)],
            {1: source(1, "E")},
            model,
            concurrency=2,
            deadline=None,
            max_tokens=32,
        )
    )
    await streams.all_started.wait()
    check.cancel()
    with pytest.raises(asyncio.CancelledError):
        await check
    assert (streams.started, streams.cancelled, streams.closed) == (2, 2, 2)
    assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()


def test_concurrency_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        asyncio.run(
            check_citations(
                [], {}, ScriptedModel(), concurrency=0, deadline=None, max_tokens=1
            )
        )


# -- the report ----------------------------------------------------------------


def report_of(*supports: Support, numbers: int = 1, **fields: Any) -> CitationReport:
    cited = statement("S.", *range(1, numbers + 1))
    verdicts = tuple(
        StatementVerdict(
            cited,
            Verdict(support, OUT_OF_TIME if support is CANNOT_TELL else ""),
            (),
        )
        for support in supports
    )
    return CitationReport(verdicts, **fields)


@pytest.mark.parametrize(
    ("report", "line"),
    [
        (
            report_of(*[SUPPORTED] * 11, NOT_SUPPORTED),
            "Citations: 11 of 12 statements supported by the pages they cite",
        ),
        (
            report_of(SUPPORTED),
            "Citations: 1 of 1 statement supported by the page it cites",
        ),
        (
            report_of(NOT_SUPPORTED, numbers=2),
            "Citations: 0 of 1 statement supported by the pages it cites",
        ),
        (
            report_of(SUPPORTED, CANNOT_TELL, CANNOT_TELL, skipped=1),
            "Citations: 1 of 3 statements supported by the pages they cite "
            "(2 out of time; 1 more not checked)",
        ),
        (report_of(), "Citations: no cited statements to check"),
        (report_of(skipped=1), "Citations: 1 cited statement not checked"),
        (report_of(skipped=4), "Citations: 4 cited statements not checked"),
    ],
)
def test_the_summary_line(report: CitationReport, line: str) -> None:
    assert report.summary_line() == line


def test_the_report_as_plain_data() -> None:
    cited = CitedStatement("A rose.", (2, 1), 10, 22, unverified=False)
    no_source = Verdict(NOT_SUPPORTED, NO_SUCH_SOURCE)
    report = CitationReport(
        (
            StatementVerdict(
                cited,
                Verdict(SUPPORTED, "says so"),
                (
                    SourceVerdict(2, no_source),
                    SourceVerdict(1, Verdict(SUPPORTED, "says so")),
                ),
            ),
        ),
        skipped=1,
        calls=1,
        prompt_tokens=100,
        completion_tokens=5,
    )
    assert report.as_dict() == {
        "supported": 1,
        "checked": 1,
        "skipped": 1,
        "support_rate": 1.0,
        "calls": 1,
        "prompt_tokens": 100,
        "completion_tokens": 5,
        "cost": None,
        "statements": [
            {
                "start": 10,
                "end": 22,
                "numbers": [2, 1],
                "unverified": False,
                "text": "A rose.",
                "verdict": "supported",
                "reason": "says so",
                "sources": [
                    {
                        "number": 2,
                        "verdict": "not_supported",
                        "reason": "no such source",
                    },
                    {"number": 1, "verdict": "supported", "reason": "says so"},
                ],
            }
        ],
    }


def test_a_bracketed_number_that_is_link_text_is_no_citation() -> None:
    answer = (
        "The bridge opened in [1931](https://example.org/b) [1]. "
        "See [2][ref] and the [3](https://x.org) page [2]."
    )
    statements = cited_statements(answer, 10)
    assert [(s.text, s.numbers) for s in statements] == [
        ("The bridge opened in 1931.", (1,)),
        ("See [2][ref] and the 3 page.", (2,)),
    ]
