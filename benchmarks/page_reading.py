"""Benchmark 9: page reading, what the visit tool hands its extractor.

Real pages from ``../shared/fixtures/article_pages`` (91 news, blog and magazine
pages with a hand-made article body each; read from there, never copied into
the repository, see its NOTICE) are converted twice, side by side in one run:

- **old**: the whole readable page (the visit tool's own HTML reader alone, as
  before main-content extraction, and as the tool still reads a page when the
  library is missing or finds too little);
- **new**: what the visit tool does now (`_convert`): the page's main content
  as Markdown (trafilatura), with the whole page as the fallback.

Scored like the benchmark the pages come from: both texts split into word
tokens (``\\w+``), 4-word shingles counted with repeats; per page the shared,
extra and missing shingles are normalised to sum to one; precision and recall
are averaged over pages and F1 is taken of the two averages. Markdown link
targets are removed before scoring (anchor text kept): the model needs them,
the article body has none. Also printed: characters and estimated tokens per
page, and the median and worst conversion time per page (the work the
converter process does for each page, in this process).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tongyi_deepresearch_openwebui_pipeline.core.budget import estimate_text_tokens
from tongyi_deepresearch_openwebui_pipeline.tools import visit_tool

from .report import Row, ms

FIXTURES = Path(
    os.environ.get(
        "TDR_FIXTURES", Path(__file__).resolve().parents[2] / "shared" / "fixtures"
    )
)
PAGES = FIXTURES / "article_pages"
#: Targets on these pages (issue: page reading).
MIN_PRECISION, MIN_RECALL, MAX_MEDIAN_SECONDS = 0.90, 0.96, 0.060
#: The visit tool's default reading budget per page (MAX_PAGE_TOKENS).
PAGE_TOKENS = visit_tool.Tools.Valves().MAX_PAGE_TOKENS
QUICK_PAGES = 20
SHINGLE = 4
_WORD = re.compile(r"\w+")


@dataclass
class Scores:
    """One conversion's figures over the pages."""

    precision: float
    recall: float
    chars: float
    tokens: float
    median_seconds: float
    worst_seconds: float

    @property
    def f1(self) -> float:
        """Harmonic mean of the averaged precision and recall."""
        total = self.precision + self.recall
        return 2 * self.precision * self.recall / total if total else 0.0


def shingles(text: str) -> Counter[tuple[str, ...]]:
    """Word 4-grams with their counts (one shorter gram for a short text)."""
    words = _WORD.findall(text)
    last = max(1, len(words) - SHINGLE + 1)
    return Counter(tuple(words[i : i + SHINGLE]) for i in range(last) if words)


def page_scores(truth: str, predicted: str) -> tuple[float | None, float | None]:
    """(precision, recall) of one page; None where the evaluator skips a page."""
    true, pred = shingles(truth), shingles(visit_tool._LINK_TARGET.sub("]", predicted))
    shared = sum((true & pred).values())
    extra = sum((pred - true).values())
    missing = sum((true - pred).values())
    # Normalised per page, so long pages do not weigh more; then the
    # evaluator's rules for empty sides.
    total = shared + extra + missing
    if total:
        shared, extra, missing = shared / total, extra / total, missing / total
    if extra == missing == 0:
        return 1.0, 1.0
    precision = shared / (shared + extra) if shared + extra else None
    recall = shared / (shared + missing) if shared + missing else None
    return precision, recall


def convert_old(raw: visit_tool._RawPage) -> str:
    """The whole readable page (no main-content extraction)."""
    return visit_tool._convert(raw, PAGE_TOKENS, read_main=None).text


def convert_new(raw: visit_tool._RawPage) -> str:
    """What the visit tool hands its extractor now."""
    return visit_tool._convert(raw, PAGE_TOKENS).text


def load_pages(limit: int | None) -> list[tuple[visit_tool._RawPage, str]]:
    """(downloaded page, article body) for each page with ground truth."""
    truth = json.loads((PAGES / "ground-truth.json").read_text(encoding="utf-8"))
    pages = []
    for key, item in list(truth.items())[:limit]:
        body = gzip.decompress((PAGES / "html" / f"{key}.html.gz").read_bytes())
        raw = visit_tool._RawPage(str(item.get("url") or ""), body, "text/html")
        pages.append((raw, str(item.get("articleBody") or "")))
    return pages


def measure(
    convert: Callable[[visit_tool._RawPage], str],
    pages: list[tuple[visit_tool._RawPage, str]],
) -> Scores:
    """Convert every page, timing each, and score the texts."""
    precisions, recalls, chars, tokens, seconds = [], [], [], [], []
    for raw, truth in pages:
        started = time.perf_counter()
        text = convert(raw)
        seconds.append(time.perf_counter() - started)
        precision, recall = page_scores(truth, text)
        if precision is not None:
            precisions.append(precision)
        if recall is not None:
            recalls.append(recall)
        chars.append(len(text))
        tokens.append(estimate_text_tokens(text))
    return Scores(
        statistics.mean(precisions),
        statistics.mean(recalls),
        statistics.mean(chars),
        statistics.mean(tokens),
        statistics.median(seconds),
        max(seconds),
    )


def _trafilatura_version() -> str | None:
    try:
        import trafilatura
    except Exception:  # absent or broken: the new conversion equals the old
        return None
    return str(getattr(trafilatura, "__version__", "?"))


async def run(quick: bool) -> list[Row]:
    """Old and new conversion of the same pages, scored and timed in one run."""
    version = _trafilatura_version()
    if not (PAGES / "ground-truth.json").is_file() or version is None:
        why = "no ../shared/fixtures/article_pages" if version else "no trafilatura"
        return [Row("page reading", "skipped", why, None, "-", None, timing=False)]
    pages = load_pages(QUICK_PAGES if quick else None)
    measure(convert_new, pages[:3])  # imports and caches warm, as in a worker
    # Interleaved, so both see the same machine load.
    old, new = measure(convert_old, pages), measure(convert_new, pages)
    old_again, new_again = measure(convert_old, pages), measure(convert_new, pages)
    old_time = min(old.median_seconds, old_again.median_seconds)
    new_time = min(new.median_seconds, new_again.median_seconds)
    label = f"{len(pages)} pages, trafilatura {version}"
    # The quality targets hold for all the pages; a quick run's subset reports.
    scope = " (all pages)" if quick else ""
    readings = Counter(
        visit_tool._convert(raw, PAGE_TOKENS).reading for raw, _ in pages
    )
    print(
        f"  {label}: old P={old.precision:.3f} R={old.recall:.3f} F1={old.f1:.3f}"
        f" {old.chars:,.0f} chars; new P={new.precision:.3f} R={new.recall:.3f}"
        f" F1={new.f1:.3f} {new.chars:,.0f} chars; read as main content:"
        f" {readings['main']} pages, whole: {readings['whole']}"
    )
    return [
        Row(
            f"page reading: precision ({label})",
            f"{new.precision:.3f}",
            f"{old.precision:.3f} (whole page)",
            new.precision / old.precision,
            f"≥ {MIN_PRECISION:.2f}{scope}",
            None if quick else new.precision >= MIN_PRECISION,
            timing=False,
        ),
        Row(
            "page reading: recall",
            f"{new.recall:.3f}",
            f"{old.recall:.3f} (whole page)",
            new.recall / old.recall,
            f"≥ {MIN_RECALL:.2f}{scope}",
            None if quick else new.recall >= MIN_RECALL,
            timing=False,
        ),
        Row(
            "page reading: F1",
            f"{new.f1:.3f}",
            f"{old.f1:.3f} (whole page)",
            new.f1 / old.f1,
            "reported",
            None,
        ),
        Row(
            "page reading: characters per page",
            f"{new.chars:,.0f}",
            f"{old.chars:,.0f} (whole page)",
            new.chars / old.chars,
            "reported",
            None,
        ),
        Row(
            "page reading: estimated tokens per page",
            f"{new.tokens:,.0f}",
            f"{old.tokens:,.0f} (whole page)",
            new.tokens / old.tokens,
            "reported",
            None,
        ),
        Row(
            "page reading: median time per page",
            ms(new_time),
            f"{ms(old_time)} (whole page)",
            new_time / old_time,
            f"≤ {MAX_MEDIAN_SECONDS * 1000:.0f} ms",
            new_time <= MAX_MEDIAN_SECONDS,
        ),
        Row(
            "page reading: worst time per page",
            ms(max(new.worst_seconds, new_again.worst_seconds)),
            f"{ms(max(old.worst_seconds, old_again.worst_seconds))} (whole page)",
            new.worst_seconds / old.worst_seconds,
            "reported",
            None,
        ),
    ]
