"""Format: the exact text the model was trained on, and what the user sees.

The reference's result block per URL, the call's arguments as the model may
send them, status lines and the source card of a page read.
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import contextlib
import json
from typing import Any

from .convert import TRUNCATION_NOTE, _Page
from .extract import _Outcome

# --- snippet ---

INVALID_REQUEST = (
    "[Visit] Invalid request format: Input must be a JSON object containing "
    "'url' and 'goal' fields"
)
URL_SEPARATOR = "\n=======\n"


def _format_block(url: str, goal: str, evidence: str, summary: str) -> str:
    return (
        f"The useful information in {url} for user goal {goal} as follows: \n\n"
        f"Evidence in page: \n{evidence}\n\n"
        f"Summary: \n{summary}\n\n"
    )


def _coerce_urls(url: Any) -> list[str] | None:
    """A list of non-empty URL strings, or None if the input is unusable."""
    if isinstance(url, str):
        text = url.strip()
        if text.startswith("["):  # a JSON array sent as a string
            with contextlib.suppress(ValueError):
                url = json.loads(text)
        if isinstance(url, str):
            url = [text]
    if not isinstance(url, list | tuple) or not all(isinstance(u, str) for u in url):
        return None
    urls = [u.strip() for u in url if u.strip()]
    return urls or None


def _kept_note(page: _Page) -> str:
    """How much of the page the extractor reads, e.g. "main content, 5,210 of 10,377".

    Empty when not known (a page from an older cache).
    """
    text = page.text.removesuffix(TRUNCATION_NOTE).rstrip()
    kept = len(text)
    cut = ", cut to the reading budget" if len(text) < len(page.text) else ""
    if page.reading == "main" and page.page_chars:
        return f"main content, {kept:,} of {page.page_chars:,} characters{cut}"
    if page.reading == "whole":
        return f"whole page, {kept:,} characters{cut}"
    if page.reading == "document":
        return f"whole document, {kept:,} characters{cut}"
    if page.reading == "loader":
        return f"text from Open WebUI's loader, {kept:,} characters{cut}"
    return ""


def _status(description: str, done: bool = False) -> dict:
    return {"type": "status", "data": {"description": description, "done": done}}


def _source_event(url: str, goal: str, outcome: _Outcome) -> dict:
    """The source card: the evidence, and how much of the page was read."""
    page = outcome.page or _Page(url, "", "")
    title = page.title or url
    kept = _kept_note(page)
    card = f"{outcome.evidence}\n\n[Read: {kept}]" if kept else outcome.evidence
    meta = {
        "source": url,
        "name": title,
        "url": url,
        "final_url": page.final_url,
        "redirects": list(page.redirects),
        "goal": goal,
        "summary": outcome.summary,
        "kept": kept,
    }
    return {
        "type": "source",
        "data": {
            "source": {"name": title, "url": url},
            "document": [card],
            "metadata": [meta],
        },
    }
