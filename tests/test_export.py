"""Each export format, read back by a real reader of that format.

BibTeX by bibtexparser (the values' LaTeX and the author lists by citeproc-py's
BibTeX reader), RIS by rispy, CSL-JSON by the json module and rendered by
citeproc-py with its bundled Harvard style. The sources hold non-ASCII names
and titles, a DOI with brackets and an underscore, and URLs with query
strings, percent-escapes and a fragment; the numbers are not their positions
(1, 2, 10, given out of order), so a key can only come from its number.
The readers' helpers here are shared with tests/test_export_hostile.py.
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

import pytest
import rispy
from bibtexparser.entrypoint import parse_string
from bibtexparser.library import Library
from citeproc import (
    Citation,
    CitationItem,
    CitationStylesBibliography,
    CitationStylesStyle,
    formatter,
)
from citeproc.source.bibtex.bibtex import parse_name, split_names
from citeproc.source.bibtex.latex import Tokenizer, dispatch
from citeproc.source.bibtex.latex.macro import Symbol
from citeproc.source.json import CiteProcJSON

from tongyi_deepresearch_openwebui_pipeline.adapters.export import (
    ExportSource,
    Scholarly,
    export_sources,
    to_bibtex,
    to_csl_json,
    to_markdown_report,
    to_ris,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.export.records import (
    TITLE_CHARS,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.export.report import TRACE_CHARS
from tongyi_deepresearch_openwebui_pipeline.core.sources import Source

DAY = datetime.date(2025, 3, 14)
WEB = ExportSource(
    number=1,
    url="https://example.org/search?a=1&b=%20c#frag",
    title="Søren Kierkegaard: Journals & Papers",
    accessed=DAY,
)
PAPER = ExportSource(
    number=2,
    url="https://journals.example.edu/article?id=7&lang=da",
    title="Angst og 山田 — Zoë's reading",
    accessed=DAY,
    doi="10.1000/xyz(123)_a",
    authors=("Kierkegaard, Søren", "山田 太郎", "O'Brien-Łukasiewicz, Zoë"),
    year="2020",
    venue="Journal of Ünïcode Studies",
)
LATER = ExportSource(
    number=10,
    url="https://blog.example.net/post?x=%E2%9C%93&y=a+b",
    title="Ten",
    site="Example Blog",
    accessed=DAY,
)
SOURCES = [LATER, WEB, PAPER]


# -- the readers (shared with the hostile tests) --


#: citeproc-py's LaTeX reader defines \textbraceleft and \textbraceright as
#: str.format templates "{" and "}", which raise: the tests give the reader
#: working definitions under their own names, through its macros argument
#: (where \newcommand puts a preamble's). Every backslash in an export
#: starts a command, so the renaming cannot touch anything else.
_BRACE_MACROS = {"exportbraceleft": Symbol("{{"), "exportbraceright": Symbol("}}")}


def latex_to_text(value: str) -> str:
    """A BibTeX value's LaTeX as text, by citeproc-py's LaTeX reader.

    Its `parse_latex` also applies TeX's typographic ligatures ("--" to an en
    dash), a typesetting step, not what the field holds: the reader's own
    dispatcher is used without it.
    """
    value = value.replace("\\textbraceleft{}", "\\exportbraceleft{}")
    value = value.replace("\\textbraceright{}", "\\exportbraceright{}")
    return "".join(dispatch(Tokenizer(value), _BRACE_MACROS))


def bibtex_names(value: str) -> list[str]:
    """An author field as "Family, Given" / literal strings (BibTeX's rules)."""
    names = []
    for name in split_names(value):
        first, von, last, jr = parse_name(name)
        assert jr is None, name
        if first is None and von is None:
            names.append(latex_to_text(last))
        else:
            family = " ".join(part for part in (von, last) if part)
            names.append(f"{latex_to_text(family)}, {latex_to_text(first or '')}")
    return names


def parse_bibtex(text: str) -> Library:
    """The file as bibtexparser reads it: every block parsed, and only entries."""
    library = parse_string(text)
    assert library.failed_blocks == []
    assert library.blocks == library.entries
    return library


def read_bibtex(text: str) -> list[dict[str, Any]]:
    """The entries bibtexparser reads, text fields decoded, authors split."""
    entries = []
    for entry in parse_bibtex(text).entries:
        fields: dict[str, Any] = {"ENTRYTYPE": entry.entry_type, "ID": entry.key}
        for field in entry.fields:
            name, value = field.key, field.value
            assert name not in fields, name
            if name in ("title", "journal", "howpublished", "year", "note"):
                fields[name] = latex_to_text(value)
            elif name == "author":
                fields[name] = bibtex_names(value)
            else:  # the verbatim fields: url, doi, urldate
                fields[name] = value
        entries.append(fields)
    return entries


HARVARD = CitationStylesStyle("harvard-cite-them-right", validate=False)


def render_csl(text: str, key: str) -> list[str]:
    """The bibliography citeproc-py renders from the CSL-JSON for ``key``."""
    source = CiteProcJSON(json.loads(text))
    bibliography = CitationStylesBibliography(HARVARD, source, formatter.plain)
    bibliography.register(Citation([CitationItem(key)]))
    return [str(entry) for entry in bibliography.bibliography()]


# -- BibTeX --


def test_bibtex_is_read_back_by_bibtexparser_with_every_field() -> None:
    assert read_bibtex(to_bibtex(SOURCES)) == [
        {
            "ENTRYTYPE": "misc",
            "ID": "ref1",
            "title": "Søren Kierkegaard: Journals & Papers",
            "howpublished": "example.org",
            "url": "https://example.org/search?a=1&b=%20c#frag",
            "urldate": "2025-03-14",
            "note": "Accessed 2025-03-14",
        },
        {
            "ENTRYTYPE": "article",
            "ID": "ref2",
            "title": "Angst og 山田 — Zoë's reading",
            "author": ["Kierkegaard, Søren", "山田 太郎", "O'Brien-Łukasiewicz, Zoë"],
            "journal": "Journal of Ünïcode Studies",
            "year": "2020",
            "doi": "10.1000/xyz(123)_a",
            "url": "https://journals.example.edu/article?id=7&lang=da",
            "urldate": "2025-03-14",
        },
        {
            "ENTRYTYPE": "misc",
            "ID": "ref10",
            "title": "Ten",
            "howpublished": "Example Blog",
            "url": "https://blog.example.net/post?x=%E2%9C%93&y=a+b",
            "urldate": "2025-03-14",
            "note": "Accessed 2025-03-14",
        },
    ]


def test_bibtex_writes_latex_specials_as_commands_and_utf8_as_is() -> None:
    source = ExportSource(
        number=3,
        url="https://example.org/a?b=1&c=100%25",
        title="50% of $x_1$ & {y} ~ ^ # \\ in Zürich",
        accessed=DAY,
    )
    assert to_bibtex([source]).splitlines()[:2] == [
        "@misc{ref3,",
        "  title = {50\\% of \\$x\\_1\\$ \\& \\textbraceleft{}y\\textbraceright{}"
        " \\textasciitilde{} \\textasciicircum{} \\# \\textbackslash{} in Zürich},",
    ]


def test_bibtex_braces_a_literal_name_and_a_name_part_holding_and() -> None:
    paper = ExportSource(
        number=4,
        url="https://example.org/p",
        title="T",
        accessed=DAY,
        authors=("Smith and Sons", "Barnes AND Noble, Inc., Ltd", "Kierkegaard, Søren"),
    )
    line = next(line for line in to_bibtex([paper]).splitlines() if "author =" in line)
    assert line == (
        "  author = {{Smith and Sons} and {Barnes AND Noble}, {Inc., Ltd}"
        " and Kierkegaard, Søren},"
    )
    assert read_bibtex(to_bibtex([paper]))[0]["author"] == [
        "Smith and Sons",
        "Barnes AND Noble, Inc., Ltd",
        "Kierkegaard, Søren",
    ]


# -- RIS --


def test_ris_is_read_back_by_rispy_with_every_field() -> None:
    assert rispy.loads(to_ris(SOURCES)) == [
        {
            "type_of_reference": "ELEC",
            "id": "ref1",
            "title": "Søren Kierkegaard: Journals & Papers",
            "secondary_title": "example.org",
            "urls": ["https://example.org/search?a=1&b=%20c#frag"],
            "access_date": "2025/03/14",
        },
        {
            "type_of_reference": "JOUR",
            "id": "ref2",
            "title": "Angst og 山田 — Zoë's reading",
            "authors": ["Kierkegaard, Søren", "山田 太郎", "O'Brien-Łukasiewicz, Zoë"],
            "year": "2020",
            "secondary_title": "Journal of Ünïcode Studies",
            "doi": "10.1000/xyz(123)_a",
            "urls": ["https://journals.example.edu/article?id=7&lang=da"],
            "access_date": "2025/03/14",
        },
        {
            "type_of_reference": "ELEC",
            "id": "ref10",
            "title": "Ten",
            "secondary_title": "Example Blog",
            "urls": ["https://blog.example.net/post?x=%E2%9C%93&y=a+b"],
            "access_date": "2025/03/14",
        },
    ]


def test_ris_starts_each_record_with_its_type_line() -> None:
    lines = to_ris([WEB]).splitlines()
    assert lines[0] == "TY  - ELEC"
    assert lines[-1] == "ER  - "


def test_ris_writes_a_semicolon_in_a_url_encoded() -> None:
    # RIS splits a UR line at ";" (several URLs): a URL keeps its one piece.
    source = ExportSource(
        number=1, url="https://example.org/a;b?c=d;e", title="T", accessed=DAY
    )
    assert rispy.loads(to_ris([source]))[0]["urls"] == [
        "https://example.org/a%3Bb?c=d%3Be"
    ]


# -- CSL-JSON --


def test_csl_json_is_read_back_with_every_field() -> None:
    accessed = {"date-parts": [[2025, 3, 14]]}
    assert json.loads(to_csl_json(SOURCES)) == [
        {
            "id": "ref1",
            "type": "webpage",
            "title": "Søren Kierkegaard: Journals & Papers",
            "container-title": "example.org",
            "URL": "https://example.org/search?a=1&b=%20c#frag",
            "accessed": accessed,
        },
        {
            "id": "ref2",
            "type": "article-journal",
            "title": "Angst og 山田 — Zoë's reading",
            "author": [
                {"family": "Kierkegaard", "given": "Søren"},
                {"literal": "山田 太郎"},
                {"family": "O'Brien-Łukasiewicz", "given": "Zoë"},
            ],
            "issued": {"date-parts": [[2020]]},
            "container-title": "Journal of Ünïcode Studies",
            "DOI": "10.1000/xyz(123)_a",
            "URL": "https://journals.example.edu/article?id=7&lang=da",
            "accessed": accessed,
        },
        {
            "id": "ref10",
            "type": "webpage",
            "title": "Ten",
            "container-title": "Example Blog",
            "URL": "https://blog.example.net/post?x=%E2%9C%93&y=a+b",
            "accessed": accessed,
        },
    ]


def test_csl_json_is_rendered_by_citeproc_py() -> None:
    text = to_csl_json(SOURCES)
    assert render_csl(text, "ref1") == [
        "Søren Kierkegaard: Journals & Papers (no date) Søren Kierkegaard: Journals"
        " & Papers, example.org. Available at:"
        " https://example.org/search?a=1&b=%20c#frag (Accessed: March 14, 2025)."
    ]
    assert render_csl(text, "ref2") == [
        "Kierkegaard, S., 山田 太郎 and O'Brien-Łukasiewicz, Z. (2020)"
        " “Angst og 山田 — Zoë's reading”, Journal of Ünïcode Studies [Preprint]."
        " Available at: https://doi.org/10.1000/xyz(123)_a."
    ]
    assert render_csl(text, "ref10") == [
        "Ten (no date) Ten, Example Blog. Available at:"
        " https://blog.example.net/post?x=%E2%9C%93&y=a+b (Accessed: March 14, 2025)."
    ]


def test_csl_json_gives_a_year_that_is_no_number_as_a_literal() -> None:
    paper = ExportSource(
        number=1, url="https://e.org/", title="T", accessed=DAY, year="n.d.", venue="V"
    )
    assert json.loads(to_csl_json([paper]))[0]["issued"] == {"literal": "n.d."}


# -- the Markdown report --

QUESTION = "What did Kierkegaard write\nabout angst?"
ANSWER = "He kept journals [1].\n\nHe wrote on angst [2]."
TWO_SOURCE_REPORT = """\
# Research report

## Question

> What did Kierkegaard write
> about angst?

## Answer

He kept journals [1].

He wrote on angst [2].

## References

- \\[1\\] Søren Kierkegaard: Journals \\& Papers. example.org. <https://example.org/search?a=1&b=%20c#frag> (accessed 2025-03-14)
- \\[2\\] Angst og 山田 — Zoë's reading. Kierkegaard, Søren; 山田 太郎; O'Brien-Łukasiewicz, Zoë. Journal of Ünïcode Studies, 2020. <https://doi.org/10.1000/xyz(123)_a> <https://journals.example.edu/article?id=7&lang=da> (accessed 2025-03-14)

<details>
<summary>Research trace</summary>

```text
Round 1: search
Round 2: visit
```

</details>
"""  # noqa: E501


def answer_section(report: str) -> str:
    """The text between the answer's heading and the references' heading."""
    start = report.index("## Answer\n\n") + len("## Answer\n\n")
    return report[start : report.index("\n## References\n")]


def reference_numbers(report: str) -> list[int]:
    """The numbers of the report's reference list, in order."""
    references = report[report.index("## References\n") :]
    return [int(n) for n in re.findall(r"^- \\\[(\d+)\\\] ", references, re.MULTILINE)]


def test_markdown_report_for_two_sources() -> None:
    report = to_markdown_report(
        QUESTION, ANSWER, [PAPER, WEB], trace="Round 1: search\nRound 2: visit"
    )
    assert report == TWO_SOURCE_REPORT


def test_markdown_report_keeps_the_answer_byte_for_byte() -> None:
    answer = "Line one [1]\r\nA *list*:\n- x [10]\n\n| a | b |\n|---|---|\n\n"
    report = to_markdown_report(QUESTION, answer, SOURCES)
    assert answer_section(report) == answer


def test_markdown_report_references_follow_the_numbers() -> None:
    report = to_markdown_report(QUESTION, ANSWER, SOURCES)
    assert reference_numbers(report) == [1, 2, 10]
    assert report.endswith(
        "- \\[10\\] Ten. Example Blog."
        " <https://blog.example.net/post?x=%E2%9C%93&y=a+b> (accessed 2025-03-14)\n"
    )


def test_markdown_report_without_a_trace_has_no_trace_block() -> None:
    assert "<details>" not in to_markdown_report(QUESTION, ANSWER, [WEB])


def test_markdown_report_closes_a_code_fence_the_answer_leaves_open() -> None:
    # An answer cut off inside a code block would turn the references to code.
    report = to_markdown_report(QUESTION, "Code [1]:\n~~~~python\nx = 1", [WEB])
    assert answer_section(report) == "Code [1]:\n~~~~python\nx = 1\n~~~~\n"


def test_markdown_report_leaves_a_closed_fence_alone() -> None:
    answer = "```\nx = 1\n```\n"
    assert answer_section(to_markdown_report(QUESTION, answer, [WEB])) == answer


def test_markdown_report_trace_fence_outgrows_its_backticks() -> None:
    report = to_markdown_report(QUESTION, ANSWER, [WEB], trace="a ````` b\n```")
    assert report.endswith(
        "<details>\n<summary>Research trace</summary>\n\n"
        "``````text\na ````` b\n```\n``````\n\n</details>\n"
    )


def test_markdown_report_cuts_a_long_trace() -> None:
    report = to_markdown_report(QUESTION, ANSWER, [WEB], trace="x" * (TRACE_CHARS + 5))
    assert report.endswith(
        f"```text\n{'x' * TRACE_CHARS}\n```\n\n"
        f"(The trace is cut at {TRACE_CHARS:,} characters.)\n\n</details>\n"
    )


# -- the records --


def test_export_sources_takes_numbers_and_scholarly_metadata() -> None:
    ledger = [
        Source(number=2, url="https://example.org/paper", title="Paper", evidence="e"),
        Source(
            number=1, url="https://news.example.com/a?id=1", title="News", evidence=""
        ),
    ]
    # The scholar tool's address differs only as normalise_url forgives.
    scholarly = {
        "http://www.Example.org/paper/": Scholarly(
            doi="https://doi.org/10.1000/ABC",
            authors=("Kierkegaard, Søren",),
            year="1844",
            venue="Copenhagen Review",
        )
    }
    records = export_sources(ledger, DAY, scholarly)
    assert records == [
        ExportSource(
            number=1, url="https://news.example.com/a?id=1", title="News", accessed=DAY
        ),
        ExportSource(
            number=2,
            url="https://example.org/paper",
            title="Paper",
            accessed=DAY,
            doi="10.1000/ABC",
            authors=("Kierkegaard, Søren",),
            year="1844",
            venue="Copenhagen Review",
        ),
    ]
    assert [(record.key, record.kind, record.site) for record in records] == [
        ("ref1", "webpage", "news.example.com"),
        ("ref2", "article", "example.org"),
    ]


def test_export_source_defaults_its_site_and_title_from_the_url() -> None:
    source = ExportSource(
        number=1, url="https://Docs.Example.org/x", title="  \n ", accessed=DAY
    )
    assert (source.site, source.title) == ("docs.example.org", "docs.example.org")


def test_export_source_keeps_the_day_of_a_moment() -> None:
    moment = datetime.datetime(2025, 3, 14, 23, 59, tzinfo=datetime.UTC)
    source = ExportSource(number=1, url="https://e.org/", title="T", accessed=moment)
    assert json.loads(to_csl_json([source]))[0]["accessed"] == {
        "date-parts": [[2025, 3, 14]]
    }
    assert "  urldate = {2025-03-14}," in to_bibtex([source]).splitlines()


def test_an_author_that_says_no_name_is_left_out() -> None:
    source = ExportSource(
        number=1,
        url="https://e.org/",
        title="T",
        accessed=DAY,
        authors=(",", " , ", "\n", "Kierkegaard ,  Søren", "Family,", ", Given"),
    )
    assert source.authors == ("Kierkegaard, Søren", "Family", "Given")


def test_export_source_caps_a_title() -> None:
    source = ExportSource(
        number=1, url="https://e.org/", title="x" * 5000, accessed=DAY
    )
    assert source.title == "x" * (TITLE_CHARS - 1) + "…"


@pytest.mark.parametrize("number", [0, -1, True])
def test_export_source_refuses_a_number_that_is_no_citation(number: int) -> None:
    with pytest.raises(ValueError, match="a source number is a positive int"):
        ExportSource(number=number, url="https://e.org/", title="T", accessed=DAY)


@pytest.mark.parametrize("write", [to_bibtex, to_ris, to_csl_json])
def test_writers_refuse_two_sources_with_one_number(write: Any) -> None:
    twin = ExportSource(number=2, url="https://e.org/", title="Twin", accessed=DAY)
    with pytest.raises(ValueError, match="two sources are numbered 2"):
        write([PAPER, twin])


def test_no_sources_make_empty_files() -> None:
    assert (to_bibtex([]), to_ris([]), to_csl_json([])) == ("", "", "[]\n")
