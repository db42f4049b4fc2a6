"""A model script for whole research runs, told apart by their question.

`QuestionScript` answers `FakeOpenAI` requests (use it with
``fake.respond_with(script)``):

- a question starting with ``research:`` searches for the rest of it, reads
  ``page_url`` and answers citing it (three rounds);
- a question in ``failing`` gets HTTP 500 on every request;
- a question in ``holding`` is held until `release` is set (`held` is set
  when it arrives): a run that is in flight, for as long as the test needs;
- any other question is answered at once: ``Answer to <question>.``;
- a heavy run's report calls (ParallelMuse) get ``<report>`` tags around
  ``Report N.`` (N counts the report calls), its integrate call answers
  ``Synthesised from N reports.`` (N: the reports in the request);
- the visit tool's extractor (a request that is not streamed) gets
  `EVIDENCE`.

Streamed requests are counted per question (`counts`), and the most in
flight at once is kept (`max_in_flight`, counted while a reply is chosen).
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from typing import Any

from tongyi_deepresearch_openwebui_pipeline.core.parallelmuse import (
    CONVERGE_SYSTEM_PROMPT,
)

from .openai_server import Reply, answer, tool_call

EVIDENCE = {
    "rational": "The page explains photosynthesis.",
    "evidence": "Photosynthesis converts light into chemical energy.",
    "summary": "Light becomes chemical energy.",
}


def question_of(body: dict[str, Any]) -> str:
    """The first user message of a request (the question)."""
    for message in body.get("messages") or []:
        if message.get("role") == "user":
            return str(message.get("content", ""))
    return ""


class QuestionScript:
    """The model server's side of research runs (see the module doc)."""

    def __init__(
        self,
        page_url: str = "",
        *,
        failing: frozenset[str] = frozenset(),
        holding: frozenset[str] = frozenset(),
    ) -> None:
        self.page_url = page_url
        self.failing = failing
        self.holding = holding
        self.counts: Counter[str] = Counter()
        self.held = threading.Event()
        self.release = threading.Event()
        self.max_in_flight = 0
        #: How many report calls heavy runs have made.
        self.reports = 0
        self._in_flight = 0
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        if not body.get("stream"):
            return Reply(content=json.dumps(EVIDENCE))
        messages = body["messages"]
        if messages[0]["content"] == CONVERGE_SYSTEM_PROMPT:
            return self._aggregation(str(messages[-1]["content"]))
        question = question_of(body)
        with self._lock:
            self.counts[question] += 1
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            return self._reply(question, messages)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _aggregation(self, request: str) -> Reply:
        """A heavy run's report call, or its integrate call."""
        if request.startswith("Given the following problem-solving trajectory:"):
            with self._lock:
                self.reports += 1
                number = self.reports
            return Reply(content=f"<report>\nReport {number}.\n</report>")
        reports = len(re.findall(r"\n\n\[Report \d+\]: ", request))
        return Reply(content=answer(f"Synthesised from {reports} reports."))

    def _reply(self, question: str, messages: list[dict[str, Any]]) -> Reply:
        if question in self.failing:
            return Reply(status=500, error="the model broke")
        if question in self.holding:
            self.held.set()
            self.release.wait(120)
            return Reply(content=answer("Too late."))
        if not question.startswith("research:"):
            return Reply(reasoning="Easy.", content=answer(f"Answer to {question}."))
        done = sum(1 for m in messages if m["role"] == "assistant")
        topic = question.removeprefix("research:").strip()
        if done == 0:
            return Reply(
                reasoning="Search first.",
                content=tool_call("search", {"query": [topic]}),
            )
        if done == 1:
            return Reply(
                reasoning="Read it.",
                content=tool_call("visit", {"url": [self.page_url], "goal": topic}),
            )
        return Reply(
            reasoning="Done.",
            content=answer(
                f"It converts light into chemical energy ([notes]({self.page_url}))."
            ),
        )
