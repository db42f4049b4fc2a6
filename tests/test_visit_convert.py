"""Bytes to readable text: HTML to markdown, charsets, sniffing, budget, PDF.

The HTML tests run against both whole-page readers: the HTML parser's
(`_html_to_text`, in a converter process) and the linear one a thread uses
when no converter process can run (`_html_to_text_linear`).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable

import pytest

from tests.fakes.pages import ARTICLE_HTML, PNG_BYTES, load_visit_tool, make_pdf

vt = load_visit_tool("visit_tool_convert_tests")

SHIFT_JIS_PAGE = (
    '<meta http-equiv="Content-Type" content="text/html; charset=shift_jis">日本'
).encode("shift_jis")


HtmlReader = Callable[[str, str, int], tuple[str, str]]


@pytest.fixture(
    params=[vt._html_to_text, vt._html_to_text_linear],
    ids=["html parser", "linear reader"],
)
def read_html(request: pytest.FixtureRequest) -> HtmlReader:
    """A whole-page HTML reader: (html, base URL, character limit) -> (text, title)."""
    return request.param


@pytest.fixture
def html_text(read_html: HtmlReader) -> Callable[..., str]:
    """The text `read_html` makes of a snippet of HTML."""

    def text(html: str, base: str = "https://site.example/dir/page.html") -> str:
        return read_html(html, base, 10**7)[0]

    return text


# -- HTML ---------------------------------------------------------------------------


def test_article_structure_and_boilerplate(read_html: HtmlReader) -> None:
    text, title = read_html(ARTICLE_HTML, "https://s.example/a", 10**7)
    assert title == "Solar Panels & Efficiency"
    assert text.startswith("# Solar panel efficiency in 2024\n\nModern panels reach")
    assert "[annual report](https://s.example/reports/2024.html)" in text
    for junk in ("SCRIPT", "STYLE", "NAV", "HIDDEN", "ASIDE", "FOOTER", "SITE-HEADER"):
        assert junk not in text


def test_headings_lists_and_numbering(html_text: Callable[..., str]) -> None:
    text = html_text(
        "<h3>Three</h3><ol><li>a<li>b<ol><li>b1</ol></ol><ul><li>x</li><li></li></ul>"
    )
    assert text == "### Three\n\n1. a\n2. b\n  1. b1\n\n- x"


def test_tables_become_pipe_rows(html_text: Callable[..., str]) -> None:
    text = html_text(
        "<table><thead><tr><th>A</th><th>B|C</th></tr></thead>"
        "<tr><td>1<td><p>two</p><p>lines</p></tr>"
        "<tr><td><a href='/x'>link</a></td><td></td></tr></table><p>after</p>"
    )
    assert text == (
        "| A | B\\|C |\n| --- | --- |\n| 1 | two lines |\n"
        "| [link](https://site.example/x) |  |\n\nafter"
    )


def test_table_without_header_has_no_separator(html_text: Callable[..., str]) -> None:
    assert html_text("<table><tr><td>a</td><td>b</td></tr></table>") == "| a | b |"


def test_links_meaningful_or_plain(html_text: Callable[..., str]) -> None:
    text = html_text(
        '<p><a href="../up.html">Up</a> <a href="#frag">Jump</a> '
        '<a href="javascript:void(0)">JS</a> <a href="mailto:a@b.c">Mail</a> '
        '<a href="https://o.example/">https://o.example/</a> '
        '<a href="/i"><img alt="Logo"></a> '
        '<a href="/e"></a>end</p>'
    )
    assert text == (
        "[Up](https://site.example/up.html) Jump JS Mail https://o.example/ "
        "[Logo](https://site.example/i) end"
    )


def test_base_href_is_honoured(html_text: Callable[..., str]) -> None:
    text = html_text('<base href="https://cdn.example/root/"><a href="p">P</a>')
    assert text == "[P](https://cdn.example/root/p)"


def test_whitespace_entities_and_inline_spacing(html_text: Callable[..., str]) -> None:
    text = html_text(
        "<p>  a&nbsp;&amp;\n\n  <b>bold</b>text <i> it </i>. </p><p>x<br>y</p>"
    )
    assert text == "a & boldtext it .\n\nx\ny"  # nbsp is whitespace too


def test_pre_keeps_its_layout(html_text: Callable[..., str]) -> None:
    assert html_text("<pre>a  b\n  c</pre>") == "```\na  b\n  c\n```"


def test_hidden_and_chrome_elements(html_text: Callable[..., str]) -> None:
    text = html_text(
        '<div aria-hidden="true">A</div><div style="visibility: hidden">B</div>'
        '<div role="navigation">C</div>'
        "<section hidden>D<section>D2</section>D3</section>"
        "<header>E</header><main><header>Kept header</header><p>body</p>"
        "<footer>Kept footer</footer></main><footer>F</footer>"
    )
    assert text == "Kept header\n\nbody\n\nKept footer"


def test_title_fallbacks(read_html: HtmlReader) -> None:
    og = '<meta property="og:title" content="OG Title"><p>x</p>'
    assert read_html(og, "https://a/", 10**6)[1] == "OG Title"
    assert read_html("<h1>Heading</h1>", "https://a/", 10**6)[1] == "Heading"
    svg = "<svg><title>icon</title></svg><title>Real</title>"
    assert read_html(svg, "https://a/", 10**6)[1] == "Real"


# Broken HTML and the text each reader makes of it (without a crash).
MALFORMED = {
    "<p>unclosed <a href='/x'>link": "unclosed [link](https://a/x)",
    "<table><tr><td>cell": "| cell |",
    "</div></p><li>": "",
    "<![CDATA[x]]>": "",
    "<p <p>": "",
    "<" * 100: "<" * 100,
    "<a href='x'><table><td>a</table>": "[| a |](https://a/x)",
}


@pytest.mark.parametrize(("html", "expected"), list(MALFORMED.items()))
def test_malformed_html_never_crashes(
    html: str, expected: str, read_html: HtmlReader
) -> None:
    assert read_html(html, "https://a/", 10**6) == (expected, "")


def test_an_empty_comment_of_three_dashes() -> None:
    # A browser reads "<!-->" as an empty comment, and so does the linear
    # reader; Python's HTML parser leaves it as text.
    assert vt._html_to_text_linear("<!-->", "https://a/", 10**6) == ("", "")
    assert vt._html_to_text("<!-->", "https://a/", 10**6) == ("<!-->", "")


def test_unclosed_link_text_is_kept(html_text: Callable[..., str]) -> None:
    assert "link" in html_text("<p>unclosed <a href='/x'>link")


def test_conversion_stops_early_on_huge_pages(read_html: HtmlReader) -> None:
    html = "<p>" + "word " * 2_000_000 + "</p>"
    text, _ = read_html(html, "https://a/", 100_000)
    assert 100_000 < len(text) < 200_000


# -- sniffing and charsets ---------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "body", "kind"),
    [
        ("text/html", b"%PDF-1.7 ...", "pdf"),
        ("application/octet-stream", b"  %PDF-1.4", "pdf"),
        ("application/pdf", b"<html><body>Error</body></html>", "html"),
        ("application/octet-stream", b"<!DOCTYPE html><p>x", "html"),
        ("", b"<html><p>x", "html"),
        ("text/plain", b"<html> shown as text", "text"),
        ("application/json", b'{"a": 1}', "text"),
        ("application/vnd.api+json", b'{"a": 1}', "text"),
        ("text/markdown", b"# x", "text"),
        ("application/octet-stream", b"just some words", "text"),
        ("text/html", PNG_BYTES, "binary"),
        ("image/png", b"not really", "binary"),
        ("application/octet-stream", bytes(range(256)), "binary"),
        ("text/plain", b"a\x00b", "binary"),
        ("text/plain", codecs.BOM_UTF16_LE + "wide".encode("utf-16-le"), "text"),
        ("video/mp4", b"\x00\x00\x00\x18ftypmp42", "binary"),
    ],
)
def test_classify_by_headers_and_bytes(
    content_type: str, body: bytes, kind: str
) -> None:
    assert vt._classify(content_type, body)[0] == kind


@pytest.mark.parametrize(
    ("body", "content_type", "html", "expected"),
    [
        ("ü".encode(), "text/plain", False, "ü"),
        ("é".encode("latin-1"), "text/plain; charset=ISO-8859-1", False, "é"),
        ("é".encode("latin-1"), 'text/plain; charset="latin1"', False, "é"),
        (codecs.BOM_UTF8 + "ü".encode(), "text/plain; charset=latin-1", False, "ü"),
        (codecs.BOM_UTF16_BE + "ü".encode("utf-16-be"), "", False, "ü"),
        ('<meta charset="koi8-r">Ж'.encode("koi8-r"), "text/html", True, "Ж"),
        (SHIFT_JIS_PAGE, "text/html", True, "日本"),
        (b"\xff\xfe\xfd bad", "text/plain; charset=bogus", False, "\ufffd"),
        (b"ok \xc3", "text/plain; charset=utf-8", False, "ok \ufffd"),
        ('<meta charset="utf-16">é'.encode(), "text/html", True, "é"),
    ],
)
def test_decode(body: bytes, content_type: str, html: bool, expected: str) -> None:
    assert expected in vt._decode(body, content_type, html)


# -- token budget ----------------------------------------------------------------


def test_budget_latin_text() -> None:
    text, cut = vt._fit_budget("abcd" * 10_000, 1000)
    assert cut
    assert len(text) == 4000
    assert vt._fit_budget("short", 1000) == ("short", False)


def test_budget_counts_cjk_as_one_token_each() -> None:
    text, cut = vt._fit_budget("研究" * 5_000, 1000)
    assert cut
    assert len(text) == 1000
    mixed, _ = vt._fit_budget(("ab" * 2 + "中") * 10_000, 1000)
    assert vt._estimate_tokens(mixed) <= 1000
    assert vt._estimate_tokens(mixed) > 990


@pytest.mark.parametrize(
    ("text", "kept", "cut"),
    [
        ("a" * 4000, 4000, False),  # exactly the budget: 4 characters a token
        ("a" * 4001, 4000, True),
        ("中" + "a" * 3996, 3997, False),  # 1 + 999 tokens
        ("中" + "a" * 3997, 3997, True),
        ("中" * 1001, 1000, True),  # short, but over the budget
        ("a" * 3000 + "中" * 300 + "a" * 10, 3000 + 250, True),
    ],
)
def test_budget_edges(text: str, kept: int, cut: bool) -> None:
    fitted, was_cut = vt._fit_budget(text, 1000)
    assert (len(fitted), was_cut) == (kept, cut)
    assert fitted == text[:kept]


def test_budget_of_a_huge_text_only_reads_its_beginning() -> None:
    seen: list[int] = []

    def spy(text: str) -> float:
        seen.append(len(text))
        return vt._estimate_tokens(text)

    text, cut = vt._fit_budget("abcd" * 2_500_000, 1000, spy)  # 10 MB of text
    assert (len(text), cut) == (4000, True)
    assert max(seen) <= 4096  # never a regex pass over the whole text


def test_fitted_appends_the_note_once() -> None:
    page = vt._Page("u", "t", "x" * 10_000)
    fitted = vt._fitted(page, 1000)
    assert fitted.text.endswith("\n\n[Page truncated to fit the reading budget]")
    assert fitted.text.count("[Page truncated") == 1
    assert vt._fitted(vt._Page("u", "t", "short"), 1000).text == "short"


# -- PDF ---------------------------------------------------------------------------


def test_pdf_pages_are_separated_and_titled() -> None:
    data = make_pdf(["First (page) text.", "Second page text."], title="Doc Title")
    text, title = vt._pdf_to_text(data, 10**6)
    assert title == "Doc Title"
    assert (
        text
        == "--- Page 1 ---\nFirst (page) text.\n\n--- Page 2 ---\nSecond page text."
    )


def test_pdf_reading_stops_at_the_character_limit() -> None:
    data = make_pdf([f"Page number {n} " + "x" * 50 for n in range(20)])
    text, _ = vt._pdf_to_text(data, 200)
    assert "--- Page 3 ---" in text
    assert "--- Page 5 ---" not in text


def test_pdf_errors_are_page_errors() -> None:
    with pytest.raises(vt._PageError, match="could not be read"):
        vt._pdf_to_text(b"%PDF-1.4 nonsense", 1000)
    with pytest.raises(vt._PageError, match="no extractable text"):
        vt._pdf_to_text(make_pdf([""]), 1000)


def test_convert_truncated_pdf_is_refused() -> None:
    raw = vt._RawPage("https://a/x.pdf", make_pdf(["x"]), "application/pdf", True)
    with pytest.raises(vt._PageError, match="larger than the download limit"):
        vt._convert(raw, 1000)


def test_convert_plain_text_is_passed_through() -> None:
    raw = vt._RawPage("https://a/t", b"  line one\nline two  ", "text/plain", False)
    page = vt._convert(raw, 1000)
    assert (page.text, page.title, page.final_url) == (
        "line one\nline two",
        "",
        "https://a/t",
    )
