"""`batch` killed with SIGKILL goes on from its last finished round when run again.

The console script runs as a subprocess against a fake model server and a
local site over real HTTP. The model researches five pages, one a round, then
answers citing the first and the last. The first process is killed (SIGKILL,
nothing of it runs after) once the model is asked for round 4, so rounds 1-3
are finished and saved. The same command again asks the model for round 4
onwards only, reads no page twice, and writes one record whose answer cites
pages read by both processes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from tests.fakes.http import LocalServer, Request, Response
from tests.fakes.openai_server import FakeOpenAI, Reply, answer, tool_call
from tests.test_runner import clean_env, command, records, write_questions

QUESTION = "Which lighthouse came first?"
PAGES = 5
EVIDENCE = {
    "rational": "r",
    "evidence": "The page dates the lighthouse.",
    "summary": "s",
}


class Research:
    """The model's side: one page a round, then the answer; holds at a round."""

    def __init__(self, site: LocalServer, hold_at: int = 0) -> None:
        self.site = site
        self.hold_at = hold_at
        self.held = threading.Event()
        self.release = threading.Event()
        #: The number of earlier turns of every research request, in order.
        self.rounds_asked: list[int] = []

    def __call__(self, body: dict[str, Any]) -> Reply:
        if not body.get("stream"):  # the visit tool's extractor
            return Reply(content=json.dumps(EVIDENCE))
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        self.rounds_asked.append(done)
        if done + 1 == self.hold_at:
            self.held.set()
            self.release.wait(60)
        if done < PAGES:
            url = self.site.url(f"/page/{done + 1}")
            return Reply(content=tool_call("visit", {"url": [url], "goal": "dates"}))
        first, last = self.site.url("/page/1"), self.site.url(f"/page/{PAGES}")
        return Reply(content=answer(f"First [one]({first}); last [five]({last})."))


def page(request: Request) -> Response:
    number = request.path.rsplit("/", 1)[-1]
    return Response.text(
        f"<html><head><title>Page {number}</title></head><body><p>Lighthouse "
        f"history, part {number}.</p></body></html>",
        content_type="text/html",
    )


def test_a_batch_killed_mid_research_resumes_from_its_last_finished_round(
    tmp_path: Path,
):
    source = write_questions(tmp_path / "questions.jsonl", [QUESTION])
    out = tmp_path / "results.jsonl"
    with LocalServer({"/page/": page}) as site, FakeOpenAI() as model:
        env = clean_env(
            tmp_path,
            API_BASE_URL=model.base_url,
            SEARXNG_URL=site.url("/search"),
            ALLOW_PRIVATE_URLS="true",
            SCHOLAR_ENABLED="false",
            # The citation check after the answer has its own tests.
            CITATION_CHECK="false",
        )
        args = [*command(), "batch", str(source), "--output", str(out)]
        first = Research(site, hold_at=4)
        model.respond_with(first)
        process = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert first.held.wait(120), process.stderr
            process.send_signal(signal.SIGKILL)
            process.wait(60)
        finally:
            first.release.set()
            if process.poll() is None:
                process.kill()
        assert first.rounds_asked == [0, 1, 2, 3]
        assert not out.exists() or records(out) == []
        pages_before = [r.path for r in site.requests]

        second = Research(site)
        model.respond_with(second)
        again = subprocess.run(
            args, env=env, capture_output=True, text=True, timeout=240, check=False
        )
        pages_after = [r.path for r in site.requests][len(pages_before) :]

    assert again.returncode == 0, again.stderr
    # Rounds 1-3 were not asked again: the second process began at round 4.
    assert second.rounds_asked == [3, 4, 5]
    assert pages_before == ["/page/1", "/page/2", "/page/3"]
    assert pages_after == ["/page/4", "/page/5"]
    (record,) = records(out)
    assert record["question"] == QUESTION
    assert record["prediction"] == (
        f"First [one]({site.url('/page/1')}); last [five]({site.url('/page/5')})."
    )
    assert record["termination"] == "answer"
    # The record's trajectory spans both processes: 5 rounds and the answer.
    assert [m["role"] for m in record["messages"]].count("assistant") == PAGES + 1
    # Every run ended: no checkpoint is left beside the output.
    assert not (tmp_path / "results.jsonl.checkpoints").exists()
