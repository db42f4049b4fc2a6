"""The emitted source payloads number citations right on each Open WebUI version.

The two numbering rules below restate what the Open WebUI frontends do with
the `sources` of a message (0.12.4 keys documents by ``metadata.source``; 0.6.43
labels documents and de-duplicates by label); `[n]` in the answer refers to
the n-th entry. Whatever pages are read, in whatever order, with whatever
titles, the pipe's number for a page must be that page's entry.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.render import (
    source_event,
)
from tongyi_deepresearch_openwebui_pipeline.core.sources import PageRead, SourceLedger


def frontend_0_12(sources: list[dict[str, Any]]) -> list[str]:
    keys: list[str] = []
    for source in sources:
        for index, _document in enumerate(source.get("document") or []):
            metadata = (source.get("metadata") or [{}])[index]
            key = metadata.get("source") or source["source"].get("id") or "N/A"
            if key not in keys:
                keys.append(key)
    return keys


def frontend_0_6(sources: list[dict[str, Any]]) -> list[str]:
    labels: list[str] = []
    for source in sources:
        for index, _document in enumerate(source.get("document") or []):
            metadata = (source.get("metadata") or [{}])[index]
            url = metadata.get("source", "")
            label = metadata.get("name") or (
                url if url.startswith("http") else source["source"]["name"]
            )
            if label not in labels:
                labels.append(label)
    return labels


def read(ledger: SourceLedger, url: str, title: str, emitted: list[dict[str, Any]]):
    recorded = ledger.record(PageRead(url, title, f"evidence of {url}"))
    if recorded.new:  # what the renderer emits for a new source
        emitted.append(source_event(recorded.source)["data"])


PAGES = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "https://a.org/1",
                "https://a.org/1/",
                "https://b.org/x",
                "http://www.b.org/x",
                "https://c.org/y?utm_source=z",
                "https://c.org/y",
                "https://d.org/",
            ]
        ),
        st.sampled_from(["Home", "Home", "Report", "", "Report (2)"]),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(PAGES)
def test_numbers_match_both_frontends(pages):
    ledger = SourceLedger()
    emitted: list[dict[str, Any]] = []
    for url, title in pages:
        read(ledger, url, title, emitted)
    new_list = frontend_0_12(emitted)
    old_list = frontend_0_6(emitted)
    assert len(new_list) == len(old_list) == len(ledger.sources)
    for source in ledger.sources:
        assert new_list[source.number - 1] == source.url
        assert old_list[source.number - 1] == source.title
