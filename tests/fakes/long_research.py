"""A long scripted research for the context-consolidation tests and benchmark.

The model reads one page per round (`/count/<k>` of a `PageSite`, or any URL
`page_url` gives) for `rounds - 1` rounds, each page's evidence 2-3K tokens,
then answers citing the first page it read, but only if that page's URL is
still in the conversation it was sent: a summary that lost it loses the
citation. Asked for the answer (the reference wrap-up), it answers at once.
Asked for a summary (ReSum's request: one user message of the lab's summary
prompt), it writes what the prompt asks for, the essential information: the
first finding with the URL of its page (the first URL of the request, the
history's or the last summary's) and the latest page read; ``forgetful``
keeps the latest page only. The citation check's verdict calls about the
answer (told apart by their system message) are no research turns: they are
counted apart (`LongResearch.verdicts`) and find the statement supported.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any

from tongyi_deepresearch_openwebui_pipeline.core.citation_check import (
    VERDICT_SYSTEM_PROMPT,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import ToolOutcome
from tongyi_deepresearch_openwebui_pipeline.core.prompts import (
    QUERY_SUMMARY_PROMPT,
    WRAP_UP_MESSAGE,
)
from tongyi_deepresearch_openwebui_pipeline.core.sources import PageRead
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import ToolCall

from .openai_server import Reply, answer, tool_call

_PAGE_NUMBER = re.compile(r"/count/(\d+)")
#: A page's URL where a summary request writes it (inside a Python string).
_PAGE_URL = re.compile(r"https?://[^\s'\"\\]+?/count/\d+")
#: Both of ReSum's summary prompts open with this line.
_SUMMARY_HEAD = QUERY_SUMMARY_PROMPT.split("\n", 1)[0]


def is_summary_request(messages: list[dict[str, Any]]) -> bool:
    """ReSum's summary request: one user message holding one of its prompts."""
    return len(messages) == 1 and str(messages[0].get("content")).startswith(
        _SUMMARY_HEAD
    )


def evidence_for(page: int) -> str:
    """Evidence of 2-3K tokens (by the package's estimate) for page `page`."""
    sentences = 105 + (page * 37) % 40
    return " ".join(
        f"Finding {page}.{i}: item {page} has property number {i}."
        for i in range(sentences)
    )


class LongResearch:
    """Answers every request of one scripted research (thread-safe)."""

    def __init__(
        self,
        page_url: Callable[[int], str],
        rounds: int = 40,
        summary_fails: bool = False,
        forgetful: bool = False,
    ) -> None:
        """`rounds` research turns in all, the last one the answer."""
        self.page_url = page_url
        self.rounds = rounds
        self.summary_fails = summary_fails
        self.forgetful = forgetful
        self.turns = 0
        self.summaries = 0
        self.extractions = 0
        self.verdicts = 0
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        """The reply to one request (research turn, summary, extraction, verdict)."""
        messages = body["messages"]
        if not body.get("stream"):
            return self._extraction(messages)
        if messages[0].get("content") == VERDICT_SYSTEM_PROMPT:
            with self._lock:
                self.verdicts += 1
            return Reply("SUPPORTED\nThe notes hold the first finding.")
        if is_summary_request(messages):
            return self._summary(str(messages[0]["content"]))
        with self._lock:
            self.turns += 1
            turn = self.turns
        wrap_up = messages[-1].get("content") == WRAP_UP_MESSAGE
        if turn < self.rounds and not wrap_up:
            return Reply(
                reasoning=f"Round {turn}: read the next page.",
                content=tool_call(
                    "visit", {"url": [self.page_url(turn)], "goal": f"facts {turn}"}
                ),
            )
        first = self.page_url(1)
        seen = any(first in str(m.get("content")) for m in messages)
        cited = f"The first finding is on [page 1]({first})." if seen else "No source."
        return Reply(reasoning="Enough.", content=answer(cited))

    def _summary(self, request: str) -> Reply:
        with self._lock:
            self.summaries += 1
        if self.summary_fails:
            return Reply(status=500, error="summary model down")
        urls = _PAGE_URL.findall(request) or ["nothing yet"]
        first = "" if self.forgetful else f"the first finding is on {urls[0]}; "
        return Reply(
            reasoning="Condense what was found.",
            content=(
                f"<summary>\n- Essential Information: {first}items have numbered "
                f"properties (latest page: {urls[-1]}).\n</summary>"
            ),
        )

    def _extraction(self, messages: list[dict[str, Any]]) -> Reply:
        with self._lock:
            self.extractions += 1
        found = _PAGE_NUMBER.search(str(messages[-1].get("content")))
        page = int(found.group(1)) if found else 0
        evidence = {"rational": "r", "evidence": evidence_for(page), "summary": "s"}
        return Reply(content=json.dumps(evidence))


def page_url(page: int) -> str:
    """The URL of scripted page `page` (never fetched: `EvidenceTools` reads it)."""
    return f"https://pages.example/count/{page}"


class EvidenceTools:
    """`ToolPort`: visit returns the page's 2-3K tokens of evidence and the page."""

    def available(self) -> list[str]:
        """Only visit."""
        return ["visit"]

    async def run(self, call: ToolCall) -> ToolOutcome:
        """The page's evidence, and the page as a source."""
        url = call.arguments["url"][0]
        page = int(url.rsplit("/", 1)[1])
        text = f"The useful information in {url}:\n{evidence_for(page)}"
        read = PageRead(url, f"Page {page}", text)
        return ToolOutcome(text, pages=(read,), counts=(("pages_requested", 1),))
