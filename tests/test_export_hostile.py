"""Hostile titles, names and URLs cannot break an export file.

A title, an author or a URL may hold BibTeX syntax (braces, "@entry{", "%",
backslashes, quotes), RIS lines ("ER  - ", "TY  - " after a newline), Markdown
(links, headings, HTML, math), control characters, lone surrogates, or be
huge. Each file still holds one well-formed record per source: read back by
the real readers, the count, the keys and every field equal the record's
(the cleaned input: one line, capped), and the caps bound every file.
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

import rispy
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_export import (
    answer_section,
    parse_bibtex,
    read_bibtex,
    reference_numbers,
    render_csl,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.export import (
    ExportSource,
    to_bibtex,
    to_csl_json,
    to_markdown_report,
    to_ris,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.export.records import (
    AUTHOR_CHARS,
    MAX_AUTHORS,
    SITE_CHARS,
    TITLE_CHARS,
    URL_CHARS,
    VENUE_CHARS,
)

DAY = datetime.date(2025, 3, 14)

HOSTILE_TEXTS = [
    "}",
    "{",
    "}}} @article{evil, title = {pwned}}",
    "@comment{x} @string{jan = {x}} @preamble{\\def}",
    "100% sure % not a comment",
    "back\\slash \\textbf{bold} \\",
    "say \"hi\" 'there'",
    "line\nER  - \nTY  - BOOK\nTI  - forged",
    "TY  - JOUR",
    "ER  - ",
    "ctl\x00\x07\x1b[31m red\x7f\x9b end",
    "lone \ud800 surrogate \udfff",
    "& % $ # _ { } ~ ^ \\",
    "<script>alert(1)</script>",
    "[click](javascript:alert(1)) ![img](https://evil.example/x.png)",
    "# heading\n## two\n---",
    "para\u2028graph\u2029end\x85next\r\nwin\rmac\ttab",
    "Smith and Sons, and Daughters",
    "others",
    "$x^2$ -- `code` *em* _u_ ~~s~~ | t |",
]
HOSTILE_URLS = [
    'https://e.org/p?q={x}&r="y"#<z>',
    "https://e.org/a b\nc\td",
    "https://e.org/semi;colon?a=1;b=2",
    "https://e.org/back\\slash^`|",
    "https://e.org/\ud800?x=\x00y",
    "https://e.org/ER  - \nTY  - BOOK",
    "  https://e.org/padded  ",
]


def hostile_sources() -> list[ExportSource]:
    """One source per hostile text, every text field and a URL hostile."""
    sources = []
    for number, text in enumerate(HOSTILE_TEXTS, start=1):
        scholarly = number % 2 == 0
        sources.append(
            ExportSource(
                number=number,
                url=HOSTILE_URLS[number % len(HOSTILE_URLS)] + text,
                title=text,
                accessed=DAY,
                site=text,
                authors=(text, f"{text}, {text}", f"Family {text}, Given {text}")
                if scholarly
                else (),
                year=text if scholarly else "",
                venue=text if scholarly else "",
                doi=f"10.1000/{text}" if scholarly else "",
            )
        )
    return sources


# -- what each reader must give back for a record --


def bibtex_view(source: ExportSource) -> dict[str, Any]:
    accessed = source.accessed.isoformat()
    if source.kind == "article":
        fields = {
            "ENTRYTYPE": "article",
            "ID": source.key,
            "title": source.title,
            "author": list(source.authors),
            "journal": source.venue,
            "year": source.year,
            "doi": source.doi,
        }
    else:
        fields = {
            "ENTRYTYPE": "misc",
            "ID": source.key,
            "title": source.title,
            "howpublished": source.site,
            "note": f"Accessed {accessed}",
        }
    fields |= {"url": source.url, "urldate": accessed if source.url else ""}
    return {name: value for name, value in fields.items() if value}


def ris_view(source: ExportSource) -> dict[str, Any]:
    article = source.kind == "article"
    fields = {
        "type_of_reference": "JOUR" if article else "ELEC",
        "id": source.key,
        "title": source.title,
        "authors": list(source.authors),
        "year": source.year,
        "secondary_title": source.venue if article else source.site,
        "doi": source.doi,
        "urls": [source.url.replace(";", "%3B")] if source.url else [],
        "access_date": source.accessed.strftime("%Y/%m/%d"),
    }
    return {name: value for name, value in fields.items() if value}


def csl_view(source: ExportSource) -> dict[str, Any]:
    article = source.kind == "article"
    year = source.year
    issued = (
        {"date-parts": [[int(year)]]}
        if re.fullmatch(r"[0-9]{1,4}", year)
        else ({"literal": year} if year else {})
    )
    authors = [
        {"literal": name.literal}
        if name.literal
        else {"family": name.family, "given": name.given}
        for name in source.names
    ]
    fields = {
        "id": source.key,
        "type": "article-journal" if article else "webpage",
        "title": source.title,
        "author": authors,
        "issued": issued,
        "container-title": source.venue if article else source.site,
        "DOI": source.doi,
        "URL": source.url,
        "accessed": {"date-parts": [[2025, 3, 14]]},
    }
    return {name: value for name, value in fields.items() if value}


#: What the report may hold of a source outside its escapes: autolinks,
#: and the access date. Nothing in it may be live Markdown syntax.
_AUTOLINK = re.compile(r" <https?://[^\s<>]*>")
_ESCAPED = re.compile(r"\\[!-/:-@\[-`{-~]")
_LIVE_SYNTAX = re.compile(r"[\\`*_\[\]<>&~$|#!]")


def live_syntax(reference_line: str) -> list[str]:
    """Markdown syntax characters a reference line leaves unescaped."""
    text = reference_line.removeprefix("- ")
    text = re.sub(r" \(accessed \d{4}-\d{2}-\d{2}\)$", "", text)
    text = _ESCAPED.sub("", _AUTOLINK.sub("", text))
    return _LIVE_SYNTAX.findall(text)


def check_every_format(sources: list[ExportSource]) -> None:
    """Each file read back: one entry per source, by number, fields intact."""
    ordered = sorted(sources, key=lambda source: source.number)
    assert read_bibtex(to_bibtex(sources)) == [bibtex_view(s) for s in ordered]
    assert rispy.loads(to_ris(sources)) == [ris_view(s) for s in ordered]
    csl = to_csl_json(sources)
    assert json.loads(csl) == [csl_view(s) for s in ordered]
    for source in ordered:
        assert len(render_csl(csl, source.key)) == 1
    report = to_markdown_report("Q?", "A [1].", sources)
    assert reference_numbers(report) == [source.number for source in ordered]
    references = report.split("## References\n\n", 1)[1].splitlines()
    assert len(references) == len(ordered)
    assert [live_syntax(line) for line in references] == [[] for _ in ordered]


# -- the hostile cases, one by one --


def test_hostile_fields_keep_one_entry_each_in_every_format() -> None:
    check_every_format(hostile_sources())


def test_a_title_is_one_line_without_control_characters() -> None:
    titles = [
        ExportSource(number=1, url="https://e.org/", title=text, accessed=DAY).title
        for text in (
            "line\nER  - \nTY  - BOOK\nTI  - forged",
            "ctl\x00\x07\x1b[31m red\x7f\x9b end",
            "lone \ud800 surrogate \udfff",
            "para\u2028graph\u2029end\x85next\r\nwin\rmac\ttab",
        )
    ]
    assert titles == [
        "line ER - TY - BOOK TI - forged",
        "ctl[31m red end",
        "lone \ufffd surrogate \ufffd",
        "para graph end next win mac tab",
    ]


def test_a_url_keeps_its_bytes_but_what_no_url_may_hold() -> None:
    urls = [
        ExportSource(number=1, url=url, title="T", accessed=DAY).url
        for url in HOSTILE_URLS
    ]
    assert urls == [
        "https://e.org/p?q=%7Bx%7D&r=%22y%22#%3Cz%3E",
        "https://e.org/a%20bcd",
        "https://e.org/semi;colon?a=1;b=2",
        "https://e.org/back%5Cslash%5E%60%7C",
        "https://e.org/\ufffd?x=y",
        "https://e.org/ER%20%20-%20TY%20%20-%20BOOK",
        "https://e.org/padded",
    ]


def test_ris_title_with_record_lines_stays_one_record() -> None:
    source = ExportSource(
        number=7,
        url="https://e.org/",
        title="x\nER  - \nTY  - BOOK\nTI  - forged",
        accessed=DAY,
    )
    text = to_ris([source])
    assert text.splitlines() == [
        "TY  - ELEC",
        "ID  - ref7",
        "TI  - x ER - TY - BOOK TI - forged",
        "T2  - e.org",
        "UR  - https://e.org/",
        "Y2  - 2025/03/14",
        "ER  - ",
    ]
    assert rispy.loads(text) == [ris_view(source)]


def test_bibtex_title_with_entry_syntax_stays_in_its_field() -> None:
    source = ExportSource(
        number=3,
        url="https://e.org/?q={x}",
        title="}} @article{evil, title = {pwned}} %",
        accessed=DAY,
    )
    text = to_bibtex([source])
    assert text.splitlines()[:4] == [
        "@misc{ref3,",
        "  title = {\\textbraceright{}\\textbraceright{} @article\\textbraceleft{}evil,"
        " title = \\textbraceleft{}pwned\\textbraceright{}\\textbraceright{} \\%},",
        "  howpublished = {e.org},",
        "  url = {https://e.org/?q=%7Bx%7D},",
    ]
    assert [entry.key for entry in parse_bibtex(text).entries] == ["ref3"]


def test_markdown_title_cannot_make_links_headings_or_html() -> None:
    sources = [
        ExportSource(number=n, url="https://e.org/", title=title, accessed=DAY)
        for n, title in enumerate(
            [
                "[click](javascript:alert(1))",
                "# heading\n## two",
                "<script>alert(1)</script>",
                "$x$ & `y` ![i](https://evil.example/i.png)",
            ],
            start=1,
        )
    ]
    report = to_markdown_report("Q?", "A.", sources)
    assert report.split("## References\n\n", 1)[1].splitlines() == [
        "- \\[1\\] \\[click\\](javascript:alert(1)). e.org. <https://e.org/>"
        " (accessed 2025-03-14)",
        "- \\[2\\] \\# heading \\#\\# two. e.org. <https://e.org/>"
        " (accessed 2025-03-14)",
        "- \\[3\\] \\<script\\>alert(1)\\</script\\>. e.org. <https://e.org/>"
        " (accessed 2025-03-14)",
        "- \\[4\\] \\$x\\$ \\& \\`y\\` \\!\\[i\\](https://evil.example/i.png). e.org."
        " <https://e.org/> (accessed 2025-03-14)",
    ]


def test_markdown_report_writes_lone_surrogates_as_replacement_characters() -> None:
    report = to_markdown_report("Q \ud800?", "A \udfff [1].", [], trace="t \ud83d")
    assert report.encode("utf-8").decode("utf-8") == report
    assert answer_section(report) == "A \ufffd [1].\n"


def test_caps_bound_every_field_and_file() -> None:
    huge = "x" * 1_000_000
    source = ExportSource(
        number=1,
        url="https://e.org/" + huge,
        title=huge,
        accessed=DAY,
        site=huge,
        authors=(huge,) * 1000,
        year=huge,
        venue=huge,
        doi="10.1000/" + huge,
    )
    assert (len(source.title), len(source.site), len(source.venue)) == (
        TITLE_CHARS,
        SITE_CHARS,
        VENUE_CHARS,
    )
    assert [len(author) for author in source.authors] == [AUTHOR_CHARS] * MAX_AUTHORS
    # A URL or DOI too long is left out, never cut into another address.
    assert (source.url, source.doi) == ("", "")
    files = [
        to_bibtex([source]),
        to_ris([source]),
        to_csl_json([source]),
        to_markdown_report("Q", "A", [source]),
    ]
    assert max(len(text) for text in files) < 30_000
    check_every_format([source])


def test_a_url_at_its_cap_is_kept_whole() -> None:
    url = "https://e.org/" + "a" * (URL_CHARS - len("https://e.org/"))
    source = ExportSource(number=1, url=url, title="T", accessed=DAY)
    assert source.url == url
    assert rispy.loads(to_ris([source]))[0]["urls"] == [url]


# -- any text at all --

#: Pieces of every syntax involved, mixed with arbitrary characters.
SYNTAX = [
    "{", "}", "@", "%", "\\", '"', "\n", "\r\n", "ER  - ", "TY  - ", " and ",
    " AND ", ",", "$", "~", "^", "#", "_", "&", ";", "[", "]", "(", ")", "<",
    ">", "`", "|", "!", "others", "\ud800", "\udfff", "\x00", "\x1b", "\u2028",
    "--", "``", "''", "http://", "www.", "<span class=\"nocase\">", "</span>",
]  # fmt: skip
any_text = st.lists(
    st.one_of(st.characters(), st.sampled_from(SYNTAX)), max_size=25
).map("".join)


@st.composite
def export_source(draw: st.DrawFn, number: int) -> ExportSource:
    return ExportSource(
        number=number,
        url=draw(st.sampled_from(["https://e.org/", "http://x.example/", ""]))
        + draw(any_text),
        title=draw(any_text),
        accessed=DAY,
        site=draw(any_text),
        authors=tuple(draw(st.lists(any_text, max_size=3))),
        year=draw(st.one_of(st.just(""), st.just("2020"), any_text)),
        venue=draw(st.one_of(st.just(""), any_text)),
        doi=draw(st.one_of(st.just(""), any_text.map("10.1000/".__add__))),
    )


@st.composite
def export_sources(draw: st.DrawFn) -> list[ExportSource]:
    numbers = draw(st.lists(st.integers(1, 60), min_size=1, max_size=3, unique=True))
    return [draw(export_source(number)) for number in numbers]


@settings(max_examples=100)
@given(export_sources())
def test_any_text_keeps_entry_count_keys_and_fields(
    sources: list[ExportSource],
) -> None:
    check_every_format(sources)


@settings(max_examples=100)
@given(any_text.filter(lambda text: "```" not in text and "~~~" not in text))
def test_any_answer_without_fences_is_kept_byte_for_byte(answer: str) -> None:
    answer = answer.replace("\ud800", "").replace("\udfff", "")
    report = to_markdown_report("Q?", answer, [])
    kept = answer if answer.endswith("\n") else answer + "\n"
    assert answer_section(report) == kept
