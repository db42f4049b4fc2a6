"""Source numbering and citation rewriting."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tongyi_deepresearch_openwebui_pipeline.core.sources import (
    UNVERIFIED_MARK,
    CitationRewriter,
    SourceLedger,
    normalise_url,
    rewrite_answer,
)


def page(url, title="T", evidence="E", final_url=None, redirects=()):
    return {
        "source": {"name": title, "url": url},
        "document": [evidence],
        "metadata": [
            {
                "source": url,
                "url": url,
                "name": title,
                "final_url": final_url or url,
                "redirects": list(redirects),
            }
        ],
    }


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("https://Example.org/a/", "https://example.org/a"),
        ("http://www.example.org/a", "https://example.org/a"),
        ("https://example.org:443/a#section", "https://example.org/a"),
        (
            "https://example.org/a?utm_source=x&id=3&fbclid=y",
            "https://example.org/a?id=3",
        ),
        ("https://example.org/a?b=2&a=1", "https://example.org/a?a=1&b=2"),
        ("https://example.org//a//b/", "https://example.org/a/b"),
    ],
)
def test_normalisation_equates(a, b):
    assert normalise_url(a) == normalise_url(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("https://example.org/a?id=3", "https://example.org/a?id=4"),
        ("https://example.org:8443/a", "https://example.org/a"),
        ("https://example.org/a", "https://example.com/a"),
    ],
)
def test_normalisation_distinguishes(a, b):
    assert normalise_url(a) != normalise_url(b)


def test_ledger_numbers_in_read_order_and_dedupes():
    ledger = SourceLedger()
    first = ledger.add_read_page(page("https://a.org/x", "A"))
    second = ledger.add_read_page(page("https://b.org/y", "B"))
    again = ledger.add_read_page(
        page("https://a.org/x/", "A", evidence="longer evidence")
    )
    assert first is not None and second is not None and again is None
    assert [s.number for s in ledger.sources] == [1, 2]
    assert ledger.sources[0].evidence == "longer evidence"
    data = first["data"]
    assert data["metadata"][0]["source"] == "https://a.org/x"
    assert data["document"] == ["E"]


def test_duplicate_titles_are_made_unique():
    ledger = SourceLedger()
    ledger.add_read_page(page("https://a.org/1", "Home"))
    event = ledger.add_read_page(page("https://a.org/2", "Home"))
    assert event is not None
    assert event["data"]["source"]["name"] == "Home (2)"


def test_redirects_recorded_by_visit_match():
    ledger = SourceLedger()
    ledger.add_read_page(
        page(
            "https://short.ly/abc",
            "A",
            final_url="https://long.org/article",
            redirects=["https://long.org/article?ref=1"],
        )
    )
    assert ledger.match("https://long.org/article") is ledger.sources[0]
    assert ledger.match("https://long.org/article/#top") is ledger.sources[0]


def test_non_http_sources_are_ignored():
    ledger = SourceLedger()
    assert ledger.add_read_page(page("file:///etc/passwd")) is None
    assert len(ledger) == 0


def make_ledger():
    led = SourceLedger()
    led.add_read_page(page("https://a.org/x", "A"))
    led.add_read_page(page("https://b.org/y", "B"))
    return led


@pytest.fixture
def ledger():
    return make_ledger()


def test_markdown_link_to_read_page_gets_number(ledger):
    assert (
        rewrite_answer("See [B](https://b.org/y).", ledger)
        == "See [B](https://b.org/y) [2]."
    )


def test_link_with_tracking_and_fragment_matches(ledger):
    text = "[A](https://www.a.org/x/?utm_medium=s#p)"
    assert rewrite_answer(text, ledger) == text + " [1]"


def test_unread_link_is_marked_unverified(ledger):
    assert (
        rewrite_answer("[C](https://c.org/z)", ledger)
        == f"[C](https://c.org/z) {UNVERIFIED_MARK}"
    )


def test_bare_urls_and_trailing_punctuation(ledger):
    text = "Read https://a.org/x, then https://c.org/z."
    assert rewrite_answer(text, ledger) == (
        f"Read https://a.org/x [1], then https://c.org/z {UNVERIFIED_MARK}."
    )


def test_model_numbers_are_escaped(ledger):
    assert (
        rewrite_answer("As shown [1] and [2, 3].", ledger)
        == "As shown \\[1\\] and \\[2, 3\\]."
    )


def test_images_are_left_alone(ledger):
    text = "![chart](https://c.org/img.png)"
    assert rewrite_answer(text, ledger) == text


def test_url_inside_link_text_is_not_double_marked(ledger):
    text = "[https://a.org/x](https://a.org/x)"
    assert rewrite_answer(text, ledger) == text + " [1]"


ANSWERS = st.lists(
    st.sampled_from(
        [
            "word ",
            "[A](https://a.org/x)",
            "https://b.org/y",
            " [1] ",
            "\n",
            "[",
            "](",
            "http",
            "://",
            "c.org",
            ".",
            ",",
            "(",
            ")",
            "[text]",
            "https://c.org/z ",
            "_(planet)",
            ' "title"',
        ]
    ),
    max_size=30,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=ANSWERS, size=st.integers(1, 12))
def test_streaming_equals_whole(text, size):
    ledger = make_ledger()
    rewriter = CitationRewriter(ledger)
    streamed = "".join(
        rewriter.feed(text[i : i + size]) for i in range(0, len(text), size)
    )
    streamed += rewriter.flush()
    assert streamed == rewrite_answer(text, ledger)


def test_streaming_holds_back_only_unfinished_links(ledger):
    rewriter = CitationRewriter(ledger)
    assert rewriter.feed("Plain text ") == "Plain text "
    assert rewriter.feed("[A](https://a.o") == ""
    assert rewriter.feed("rg/x) done") == "[A](https://a.org/x) [1] done"
    assert rewriter.feed(" see htt") == " see "
    assert rewriter.flush() == "htt"


def test_wikipedia_style_parentheses_stay_in_the_url():
    ledger = SourceLedger()
    ledger.add_read_page(
        page("https://en.wikipedia.org/wiki/Mercury_(planet)", "Mercury")
    )
    text = "See https://en.wikipedia.org/wiki/Mercury_(planet)."
    assert rewrite_answer(text, ledger) == (
        "See https://en.wikipedia.org/wiki/Mercury_(planet) [1]."
    )
    assert rewrite_answer(
        "(https://en.wikipedia.org/wiki/Mercury_(planet))", ledger
    ) == ("(https://en.wikipedia.org/wiki/Mercury_(planet) [1])")


def test_markdown_link_with_parentheses_in_url():
    ledger = SourceLedger()
    ledger.add_read_page(
        page("https://en.wikipedia.org/wiki/Mercury_(planet)", "Mercury")
    )
    text = "[Mercury](https://en.wikipedia.org/wiki/Mercury_(planet))"
    assert rewrite_answer(text, ledger) == text + " [1]"
