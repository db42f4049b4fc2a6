"""The headless runner: ``tongyi-deepresearch ask|batch`` as a user runs it.

The console script runs as a subprocess against a fake model server, a fake
SearXNG and a local web site on 127.0.0.1 (tests/fakes). Nothing waits for
time to pass: an interrupted batch is interrupted once the fake server holds
a question whose arrival proves the earlier records were written.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.pages import PageSite
from tests.fakes.research_model import EVIDENCE, QuestionScript
from tests.fakes.searxng import FakeSearXNG, result
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    RoundStarted,
    RunFinished,
    RunStats,
    ThinkingDelta,
    ToolCallStarted,
    UsageUpdated,
)
from tongyi_deepresearch_openwebui_pipeline.runner.batch import (
    parse_questions,
    read_existing,
)
from tongyi_deepresearch_openwebui_pipeline.runner.render import (
    TerminalRenderer,
    summary_table,
)
from tongyi_deepresearch_openwebui_pipeline.runner.settings import (
    SettingsError,
    load_settings,
)

SCRIPT = "tongyi-deepresearch"
RECORD_FIELDS = {
    "question",
    "answer",
    "prediction",
    "termination",
    "messages",
    "rollout_id",
    "sources",
    "rounds",
    "tokens",
    "cost",
    "time",
}


def command() -> list[str]:
    """The console script installed with the package (next to this Python)."""
    installed = shutil.which(SCRIPT, path=str(Path(sys.executable).parent))
    assert installed, f"{SCRIPT} is not installed: pip install -e '.[dev]'"
    return [installed]


def clean_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("TDR_") and key != "WEBUI_SECRET_KEY"
    }
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # no user config file
    env.update({f"TDR_{name}": value for name, value in settings.items()})
    return env


class World:
    """The fake model, search engine and web site of one test."""

    def __init__(self, model: FakeOpenAI, engine: FakeSearXNG, site: PageSite):
        self.model, self.engine, self.site = model, engine, site
        self.article = site.url("/article")
        self.script = QuestionScript(self.article)
        model.respond_with(self.script)
        engine.script(
            "photosynthesis",
            results=[result(self.article, "Plant Biology Notes", "How plants eat.")],
        )

    def env(self, tmp_path: Path, **extra: str) -> dict[str, str]:
        return clean_env(
            tmp_path,
            API_BASE_URL=self.model.base_url,
            SEARXNG_URL=self.engine.url("/search"),
            ALLOW_PRIVATE_URLS="true",
            SCHOLAR_ENABLED="false",
            **extra,
        )

    def run(
        self, tmp_path: Path, *args: str, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command(), *args],
            env=self.env(tmp_path, **extra),
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )


@pytest.fixture
def world() -> Iterator[World]:
    with FakeOpenAI() as model, FakeSearXNG() as engine, PageSite() as site:
        yield World(model, engine, site)


def write_questions(path: Path, questions: list[str]) -> Path:
    lines = [json.dumps({"question": q, "answer": f"gold {q}"}) for q in questions]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


# -- ask ----------------------------------------------------------------------------


def test_ask_streams_the_research_and_prints_the_answer_with_sources(world, tmp_path):
    done = world.run(tmp_path, "ask", "research: photosynthesis", "--thinking")

    assert done.returncode == 0, done.stderr
    article = world.article
    assert done.stdout == (
        f"It converts light into chemical energy ([notes]({article}) [1]).\n\n"
        "**Sources read**\n\n"
        f"1. [Solar Panels \\& Efficiency]({article})\n"
    )
    live = done.stderr
    assert "── Round 1/100" in live
    assert "  → Searching: photosynthesis" in live
    assert f"  → Reading: {article}" in live
    assert f"  + [1] Solar Panels & Efficiency <{article}>" in live
    assert "  │ Search first." in live  # --thinking
    assert "tokens in /" in live
    assert "── Done: the model gave its answer · 3 rounds · 1 source" in live
    # The extractor was the research model's own endpoint, as in the pipe.
    assert EVIDENCE["evidence"] in json.dumps(
        [b for b in world.model.bodies if b.get("stream")][-1]["messages"]
    )


def test_ask_json_is_one_object_for_scripts(world, tmp_path):
    out = tmp_path / "answer.json"
    done = world.run(
        tmp_path, "ask", "research: photosynthesis", "--json", "--output", str(out)
    )

    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text("utf-8"))
    assert set(result) == {
        "question",
        "answer",
        "sources",
        "termination",
        "rounds",
        "tokens",
        "cost",
        "seconds",
        "citations",
    }
    assert result["termination"] == "answer"
    assert result["rounds"] == 3
    assert result["sources"] == [
        {"number": 1, "title": "Solar Panels & Efficiency", "url": world.article}
    ]
    assert result["answer"].endswith(f"({world.article}) [1]).")
    assert result["tokens"]["total"] == (
        result["tokens"]["prompt"] + result["tokens"]["completion"]
    )
    assert result["tokens"]["total"] > 0
    assert result["seconds"] >= 0


def test_ask_heavy_runs_rollouts_and_a_synthesis(world, tmp_path):
    done = world.run(tmp_path, "ask", "What is it?", "--heavy", "2", "--json")

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["answer"] == "Synthesised from 2 reports."
    assert world.script.counts["What is it?"] == 2
    assert "[rollout 1/2] ── Round 1/100" in done.stderr
    assert "── Synthesis of the answers of 2 of 2 rollouts" in done.stderr


# -- batch --------------------------------------------------------------------------


def test_a_batch_of_twenty_at_concurrency_four(world, tmp_path):
    questions = [f"Q{n:02d}" for n in range(1, 21)]
    source = write_questions(tmp_path / "questions.jsonl", questions)
    out = tmp_path / "results.jsonl"
    done = world.run(
        tmp_path, "batch", str(source), "--output", str(out), "--concurrency", "4"
    )

    assert done.returncode == 0, done.stderr
    written = records(out)
    assert sorted(r["question"] for r in written) == questions
    for record in written:
        assert set(record) == RECORD_FIELDS
        assert record["answer"] == f"gold {record['question']}"
        assert record["prediction"] == f"Answer to {record['question']}."
        assert record["termination"] == "answer"
        assert record["rollout_id"] == 1
        assert record["messages"][0]["role"] == "system"
        assert record["messages"][1] == {"role": "user", "content": record["question"]}
    assert world.script.max_in_flight <= 4
    assert "[20/20]" in done.stderr
    assert "termination: answer  20" in done.stderr


def test_a_failing_question_is_recorded_and_the_batch_goes_on(world, tmp_path):
    world.script.failing = frozenset({"Q2"})
    source = write_questions(tmp_path / "questions.jsonl", ["Q1", "Q2", "Q3"])
    out = tmp_path / "results.jsonl"
    done = world.run(
        tmp_path, "batch", str(source), "--output", str(out), "--set", "MAX_RETRIES=1"
    )

    # A failed record fails the batch (exit 1); the other questions ran.
    assert done.returncode == 1, done.stderr
    by_question = {r["question"]: r for r in records(out)}
    error = (
        f"The model server at {world.model.base_url} did not give a usable reply "
        "after 1 attempts (HTTP 500). Check that it is running and that "
        "API_BASE_URL is right, or try again later."
    )
    # The lab's error record, field for field (inference/run_multi_react.py).
    assert list(by_question["Q2"].items()) == [
        ("question", "Q2"),
        ("answer", "gold Q2"),
        ("rollout_idx", 1),
        ("rollout_id", 1),
        ("error", error),
        ("messages", []),
        ("prediction", "[Failed]"),
    ]
    assert by_question["Q1"]["termination"] == by_question["Q3"]["termination"]
    assert by_question["Q3"]["termination"] == "answer"
    assert "termination: failed  1" in done.stderr
    assert done.stderr.endswith(
        "1 record failed (run the same command again to ask it again):\n"
        f"  1 × {error}\n"
    )


def test_rollouts_give_one_record_each(world, tmp_path):
    source = write_questions(tmp_path / "questions.jsonl", ["Q1", "Q2"])
    out = tmp_path / "results.jsonl"
    done = world.run(
        tmp_path, "batch", str(source), "--output", str(out), "--rollouts", "3"
    )

    assert done.returncode == 0, done.stderr
    keys = sorted((r["question"], r["rollout_id"]) for r in records(out))
    assert keys == [(q, k) for q in ("Q1", "Q2") for k in (1, 2, 3)]
    assert world.script.counts == {"Q1": 3, "Q2": 3}


def test_an_interrupted_batch_resumes_without_redoing_finished_questions(
    world, tmp_path
):
    questions = [f"Q{n:02d}" for n in range(1, 11)]
    source = write_questions(tmp_path / "questions.jsonl", questions)
    out = tmp_path / "results.jsonl"
    args = [*command(), "batch", str(source), "--output", str(out)]
    world.script.holding = frozenset({"Q03"})
    process = subprocess.Popen(
        [*args, "--concurrency", "1"],
        env=world.env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # One question at a time: Q03 arriving means Q01 and Q02 were written.
        assert world.script.held.wait(120), process.stderr
        assert [r["question"] for r in records(out)] == ["Q01", "Q02"]
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        world.script.release.set()
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "Interrupted: 2 records written" in stderr
    assert out.read_text("utf-8").endswith("\n")
    assert [r["question"] for r in records(out)] == ["Q01", "Q02"]

    world.script.holding = frozenset()
    again = subprocess.run(
        [*args, "--concurrency", "4"],
        env=world.env(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert "Resuming: 2 records already in" in again.stderr
    assert sorted(r["question"] for r in records(out)) == questions
    # Finished questions were not asked again; the interrupted one was.
    assert world.script.counts["Q01"] == world.script.counts["Q02"] == 1
    assert world.script.counts["Q03"] == 2
    assert all(world.script.counts[q] == 1 for q in questions[3:])


def test_a_bad_input_line_is_reported_with_its_number(world, tmp_path):
    source = tmp_path / "questions.jsonl"
    source.write_text(
        '{"question": "Q1", "answer": "a"}\n'
        "this is not json\n"
        "\n"
        '{"answer": "no question"}\n'
        '["a list"]\n'
        '{"question": "Q2"}\n',
        encoding="utf-8",
    )
    out = tmp_path / "results.jsonl"
    done = world.run(tmp_path, "batch", str(source), "--output", str(out))

    assert done.returncode == 1
    assert f"{source}:2: not valid JSON" in done.stderr
    assert f'{source}:4: no "question" text; line skipped' in done.stderr
    assert f"{source}:5: not a JSON object" in done.stderr
    assert sorted(r["question"] for r in records(out)) == ["Q1", "Q2"]
    assert {r["question"]: r["answer"] for r in records(out)} == {"Q1": "a", "Q2": None}


# -- clear errors -------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_no_model_server_is_one_clear_line(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    done = subprocess.run(
        [*command(), "ask", "anything"],
        env=clean_env(tmp_path, API_BASE_URL=url, SEARXNG_URL="http://127.0.0.1:9/s"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"tongyi-deepresearch: no model server reachable at {url}"
    )
    assert "API_BASE_URL" in lines[0]
    assert done.stdout == ""


def test_no_search_engine_names_the_setting(tmp_path):
    done = subprocess.run(
        [*command(), "ask", "anything"],
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "no search engine configured: set SEARXNG_URL" in done.stderr


def test_a_bad_setting_is_one_line_without_its_value(tmp_path):
    done = subprocess.run(
        [*command(), "ask", "anything"],
        env=clean_env(tmp_path, MAX_TOOL_ROUNDS="lots-of-them"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(
        "tongyi-deepresearch: setting MAX_TOOL_ROUNDS (from TDR_MAX_TOOL_ROUNDS): "
    )
    assert "lots-of-them" not in done.stderr
    assert done.stderr.count("\n") == 1


# -- the parts, in process ------------------------------------------------------------


def test_settings_come_from_the_file_then_the_environment_then_flags(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(
        'MAX_TOOL_ROUNDS = 7\nmodel_id = "from-file"\n'
        "[tools.visit]\nCONCURRENT_URLS = 2\n",
        encoding="utf-8",
    )
    env = {"TDR_CONFIG": str(config), "TDR_MAX_TOOL_ROUNDS": "8"}
    settings = load_settings({}, env)
    assert settings.valves.MAX_TOOL_ROUNDS == 8
    assert settings.valves.MODEL_ID == "from-file"
    assert settings.valves.API_BASE_URL == "http://localhost:8000/v1"  # the valve's
    assert settings.api_key == ""  # keyless by default
    assert settings.tool_valves == {"visit": {"CONCURRENT_URLS": 2}}
    flags = {"MAX_TOOL_ROUNDS": "9", "API_BASE_URL": None}
    assert load_settings(flags, env).valves.MAX_TOOL_ROUNDS == 9
    config.write_text("MAX_TOOLS_ROUNDS = 7\n", encoding="utf-8")
    with pytest.raises(SettingsError, match="unknown setting MAX_TOOLS_ROUNDS"):
        load_settings({}, env)


def test_input_lines_and_an_unfinished_output_line(tmp_path):
    questions, bad = parse_questions(['{"question": " Q "}', "{", "", "3"])
    assert [(q.line, q.question) for q in questions] == [(1, "Q")]
    assert [(b.line, b.reason.split(" (")[0]) for b in bad] == [
        (2, "not valid JSON"),
        (4, "not a JSON object"),
    ]
    out = tmp_path / "results.jsonl"
    out.write_text('{"question": "Q1", "rollout_id": 1}\n{"question": "Q2", "ro')
    existing = read_existing(out)
    assert existing.done == {("Q1", 1)}
    assert existing.repaired
    assert out.read_text() == '{"question": "Q1", "rollout_id": 1}\n'


def test_rendering_is_a_function_of_the_events():
    renderer = TerminalRenderer(thinking=True)
    shown = [
        renderer.render(RoundStarted(1, 100)),
        renderer.render(ThinkingDelta("Let me ")),
        renderer.render(ThinkingDelta("search.\nThen")),
        renderer.render(ToolCallStarted(0, "search", {"query": ["a", "b"]})),
        renderer.render(UsageUpdated(10, 5, 10, 5, None, 15)),
        renderer.render(RoundStarted(2, 100)),
        renderer.render(
            RunFinished("answer", "x", RunStats(2, 1, 0, 1, 10, 5, None, 1.0))
        ),
    ]
    assert shown == [
        "── Round 1/100\n",
        "",
        "  │ Let me search.\n",
        "  │ Then\n  → Searching: a · b\n",
        "",
        "── Round 2/100 · 10 tokens in / 5 out\n",
        "── Done: the model gave its answer · 2 rounds · 0 sources · "
        "10 tokens in / 5 out · 1 s\n",
    ]
    table = summary_table(
        [
            {"termination": "answer", "rounds": 3, "tokens": {"total": 100}},
            {"termination": "error", "rounds": 1, "tokens": {"total": 10}},
        ]
    )
    assert "termination: answer  1" in table
    assert "110 in all" in table
