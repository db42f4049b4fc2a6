"""Batch records as the lab writes them, and the runner's edges a new user meets.

The lab's batch runner (inference/run_multi_react.py in Alibaba-NLP/DeepResearch)
writes one ``iter{i}.jsonl`` per rollout, a record per question with its
agent's termination strings (inference/react_agent.py), a failed question as
an error record with the prediction ``[Failed]``, and asks failed questions
again when run again; its scorer (evaluation/evaluate_deepsearch_official.py)
reads those files. These tests run the installed console script against the
fakes of tests/fakes over real HTTP on 127.0.0.1, as tests/test_runner.py
does, and read the records the way the lab's scorer reads them.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.long_research import LongResearch
from tests.fakes.openai_server import FakeOpenAI, Reply, answer, tool_call
from tests.fakes.pages import PageSite
from tests.fakes.research_model import QuestionScript
from tests.fakes.searxng import FakeSearXNG
from tests.test_runner import World, clean_env, command, write_questions
from tongyi_deepresearch_openwebui_pipeline.core.events import RunFinished, RunStats
from tongyi_deepresearch_openwebui_pipeline.core.parallelmuse import (
    CONVERGE_SYSTEM_PROMPT,
)
from tongyi_deepresearch_openwebui_pipeline.core.prompts import WRAP_UP_MESSAGE
from tongyi_deepresearch_openwebui_pipeline.runner import (
    batch,
    research,
    results,
    settings,
)

PROG = "tongyi-deepresearch"
#: The lab's record of a run that ended, its keys in its order, then ours.
LAB_FIELDS = ["question", "answer", "messages", "prediction", "termination"]
OUR_FIELDS = ["rollout_id", "sources", "rounds", "tokens", "cost", "time"]


@pytest.fixture
def world() -> Iterator[World]:
    with FakeOpenAI() as model, FakeSearXNG() as engine, PageSite() as site:
        yield World(model, engine, site)


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command(), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def streamed(model: FakeOpenAI) -> list[dict[str, Any]]:
    """The research requests the model server received (not the extractor's)."""
    return [body for body in model.bodies if body.get("stream")]


def read_as_the_labs_scorer(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Each round's records, read as evaluation/evaluate_deepsearch_official.py does.

    It needs ``iter1.jsonl`` … ``iter3.jsonl`` in the folder; reads every line
    with ``json.loads`` (a blank or broken line stops it); judges
    ``item["prediction"].strip()`` against ``item["answer"]`` for
    ``item["question"]``; counts a run invalid unless ``messages[-1]``'s
    content holds ``<answer>`` and ``</answer>``; reads each message's
    ``role`` and ``content``; counts ``termination``; and finds a solved
    question's record by ``messages[1]["content"] == question``.
    """
    rounds: dict[str, list[dict[str, Any]]] = {}
    for number in (1, 2, 3):
        path = folder / f"iter{number}.jsonl"
        assert path.exists(), f"Prediction {path} not found, three rounds are required"
        with path.open(encoding="utf-8") as handle:
            items = [json.loads(line) for line in handle]
        read = []
        for item in items:
            messages = item["messages"]
            final = messages[-1]["content"] if messages else ""
            assert all(isinstance(m["content"], str) for m in messages)
            assert {m["role"] for m in messages} <= {"system", "user", "assistant"}
            read.append(
                {
                    "question": item["question"],
                    "answer": item["answer"],
                    "response": item["prediction"].strip(),
                    "termination": item.get("termination", "unknown"),
                    "valid": "<answer>" in final and "</answer>" in final,
                    "found_by_question": bool(messages)
                    and messages[1]["content"] == item["question"],
                }
            )
        rounds[f"round{number}"] = read
    return rounds


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").split("\n") if line]


# -- the lab's layout and records ----------------------------------------------------


def test_output_dir_writes_the_labs_iter_files_its_scorer_reads(world, tmp_path):
    source = write_questions(tmp_path / "questions.jsonl", ["Q1", "Q2"])
    folder = tmp_path / "model_sglang" / "dataset"
    done = world.run(
        tmp_path, "batch", str(source), "--output-dir", str(folder), "--rollouts", "3"
    )

    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in folder.iterdir()) == [
        "iter1.jsonl",
        "iter2.jsonl",
        "iter3.jsonl",
    ]
    assert f"Wrote 6 records to {folder} (iter1.jsonl … iter3.jsonl)." in (
        done.stderr.split("\n")
    )
    sent = {body["messages"][1]["content"]: body for body in streamed(world.model)}
    for rollout in (1, 2, 3):
        records = lines_of(folder / f"iter{rollout}.jsonl")
        assert sorted(r["question"] for r in records) == ["Q1", "Q2"]
        for record in records:
            question = record["question"]
            assert list(record) == LAB_FIELDS + OUR_FIELDS
            # The whole conversation: what the model was sent, then its reply.
            assert record["messages"] == [
                *sent[question]["messages"],
                {
                    "role": "assistant",
                    "content": "<think>\nEasy.\n</think>\n\n"
                    f"<answer>\nAnswer to {question}.\n</answer>",
                },
            ]
            assert record["answer"] == f"gold {question}"
            assert record["prediction"] == f"Answer to {question}."
            assert record["termination"] == "answer"
            assert record["rollout_id"] == rollout
    rounds = read_as_the_labs_scorer(folder)
    for read in rounds.values():
        assert sorted(
            (r["question"], r["answer"], r["response"], r["termination"]) for r in read
        ) == [
            ("Q1", "gold Q1", "Answer to Q1.", "answer"),
            ("Q2", "gold Q2", "Answer to Q2.", "answer"),
        ]
        assert all(r["valid"] and r["found_by_question"] for r in read)


def test_a_failed_batch_exits_1_and_a_rerun_asks_only_failed_and_unfinished(
    world, tmp_path
):
    source = write_questions(tmp_path / "questions.jsonl", ["Q1", "Q2", "Q3", "Q4"])
    folder = tmp_path / "results"
    args = ["batch", str(source), "--output-dir", str(folder), "--concurrency", "1"]
    world.script.failing = frozenset({"Q2"})
    first = world.run(tmp_path, *args, "--set", "MAX_RETRIES=1")

    assert first.returncode == 1, first.stderr
    reason = (
        f"The model server at {world.model.base_url} did not give a usable reply "
        "after 1 attempts (HTTP 500). Check that it is running and that "
        "API_BASE_URL is right, or try again later."
    )
    assert first.stderr.split("\n")[-3:] == [
        "1 record failed (run the same command again to ask it again):",
        f"  1 × {reason}",
        "",
    ]
    out = folder / "iter1.jsonl"
    failed = {
        "question": "Q2",
        "answer": "gold Q2",
        "rollout_idx": 1,
        "rollout_id": 1,
        "error": reason,
        "messages": [],
        "prediction": "[Failed]",
    }
    assert [r for r in lines_of(out) if r["question"] == "Q2"] == [failed]
    # Q4's run is unfinished: a crash cut its record in the middle.
    text = out.read_text("utf-8")
    q4 = next(line for line in text.split("\n") if '"question": "Q4"' in line)
    out.write_text(text.replace(q4 + "\n", "") + q4[: len(q4) // 2], "utf-8")

    world.script.failing = frozenset()
    world.script.counts.clear()
    again = world.run(tmp_path, *args)

    assert again.returncode == 0, again.stderr
    assert world.script.counts == {"Q2": 1, "Q4": 1}  # only those were asked
    assert f"Resuming: 2 records already in {folder}." in again.stderr.split("\n")
    assert "Asking again: 1 failed record replaced." in again.stderr.split("\n")
    records = lines_of(out)
    assert sorted(r["question"] for r in records) == ["Q1", "Q2", "Q3", "Q4"]
    assert all("error" not in r and r["termination"] == "answer" for r in records)


def test_a_failed_record_of_a_single_output_is_replaced_by_its_rerun(world, tmp_path):
    source = write_questions(tmp_path / "questions.jsonl", ["Q1", "Q2"])
    out = tmp_path / "results.jsonl"
    lab_failure = {
        "question": "Q2",
        "answer": "gold Q2",
        "rollout_idx": 2,
        "rollout_id": 2,
        "error": "Future resolution failed: boom",
        "messages": [],
        "prediction": "[Failed]",
    }
    kept = [
        {"question": "Q1", "rollout_id": 1},
        {"question": "Q1", "rollout_id": 2},
        {"question": "Q2", "rollout_id": 1},
        {"question": "Elsewhere", "error": "not in this input", "rollout_id": 1},
    ]
    out.write_text(
        "".join(json.dumps(r) + "\n" for r in [*kept[:3], lab_failure, kept[3]]),
        encoding="utf-8",
    )
    os.chmod(out, 0o640)
    done = world.run(
        tmp_path, "batch", str(source), "--output", str(out), "--rollouts", "2"
    )

    assert done.returncode == 0, done.stderr
    assert world.script.counts == {"Q2": 1}
    # The rest of the file byte for byte, the failed line gone, then the rerun.
    assert out.read_text("utf-8").startswith(
        "".join(json.dumps(r) + "\n" for r in kept)
    )
    records = lines_of(out)
    assert [
        (r["question"], r["rollout_id"], r["termination"]) for r in records[4:]
    ] == [("Q2", 2, "answer")]
    assert os.stat(out).st_mode & 0o777 == 0o640


class Consolidating(LongResearch):
    """`LongResearch` that also answers a summary asked as ReSum asks it (the
    whole trajectory folded into one user message), counting it."""

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        if body.get("stream") and len(messages) == 1 and messages[0]["role"] == "user":
            self.summaries += 1
            state = "- Items have numbered properties."
            return Reply(content=f"<summary>\n{state}\n</summary>")
        return super().__call__(body)


def test_a_record_keeps_the_whole_trajectory_across_consolidations(tmp_path):
    with (
        PageSite() as site,
        FakeOpenAI(max_model_len=16384, enforce_context=True) as model,
    ):
        research_script = Consolidating(lambda k: site.url(f"/count/{k}"), rounds=8)
        model.respond_with(research_script)
        env = clean_env(
            tmp_path,
            API_BASE_URL=model.base_url,
            SEARCH_ENABLED="false",
            SCHOLAR_ENABLED="false",
            ALLOW_PRIVATE_URLS="true",
        )
        source = write_questions(tmp_path / "questions.jsonl", ["Q1"])
        out = tmp_path / "results.jsonl"
        done = run(env, "batch", str(source), "--output", str(out))

    assert done.returncode == 0, done.stderr
    assert research_script.summaries >= 1  # the run did consolidate
    [record] = lines_of(out)
    messages = record["messages"]
    # The scorer finds a record by its question in messages[1].
    assert messages[1] == {"role": "user", "content": "Q1"}
    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    visits = [t for t in turns if "<tool_call>" in t]
    assert [site.url(f"/count/{k}") in v for k, v in enumerate(visits, 1)] == [True] * 7
    assert turns[-1].startswith("<think>\nEnough.\n</think>\n\n<answer>\n")
    assert record["termination"] == "answer"


class NoAnswerAtTheLimit:
    """Searches every round; at the wrap-up it only thinks (no answer)."""

    def __call__(self, body: dict[str, Any]) -> Reply:
        if not body.get("stream"):
            return Reply(content="{}")
        if body["messages"][-1]["content"] == WRAP_UP_MESSAGE:
            return Reply(reasoning="Still unsure.", content="")
        return Reply(reasoning="Look.", content=tool_call("search", {"query": ["x"]}))


def test_a_run_out_of_rounds_without_an_answer_is_the_labs_ending(world, tmp_path):
    world.model.respond_with(NoAnswerAtTheLimit())
    source = write_questions(tmp_path / "questions.jsonl", ["Q1"])
    out = tmp_path / "results.jsonl"
    done = world.run(
        tmp_path, "batch", str(source), "--output", str(out), "--max-tool-rounds", "1"
    )

    assert done.returncode == 0, done.stderr
    [record] = lines_of(out)
    assert (record["termination"], record["prediction"]) == (
        "exceed available llm calls",
        "No answer found.",
    )
    assert record["messages"][-1] == {
        "role": "assistant",
        "content": "<think>\nStill unsure.\n</think>",
    }


def finished(
    reason: str, text: str = "", *, marked: bool = True, error: str = "", lab: str = ""
) -> RunFinished:
    stats = RunStats(1, 0, 0, 0, 1, 1, None, 1.0)
    return RunFinished(
        reason,  # type: ignore[arg-type]
        text,
        stats,
        error=error,
        answer_marked=marked,
        lab_termination=lab,
    )


@pytest.mark.parametrize(
    ("ending", "wrapped_up", "expected"),
    [
        (finished("answer", " It. "), "", ("answer", "It.")),
        (finished("answer", "It", marked=False), "", ("format error: answer", "It")),
        (
            finished("context_limit", "It"),
            "context_limit",
            ("generate an answer as token limit reached", "It"),
        ),
        (
            finished("context_limit", "It", marked=False),
            "context_limit",
            ("format error: generate an answer as token limit reached", "It"),
        ),
        (
            finished("no_answer"),
            "context_limit",
            (
                "format error: generate an answer as token limit reached",
                "<think>\nHm.\n</think>",
            ),
        ),
        (
            finished("no_answer"),
            "round_limit",
            ("exceed available llm calls", "No answer found."),
        ),
        (finished("round_limit", "It"), "round_limit", ("round_limit", "It")),
        (
            finished("round_limit", "It", marked=False),
            "round_limit",
            ("format error: round_limit", "It"),
        ),
        (
            finished("time_limit"),
            "time_limit",
            ("No answer found after 2h30mins", "No answer found after 2h30mins"),
        ),
        (
            finished("no_answer"),
            "time_limit",
            ("No answer found after 2h30mins", "No answer found after 2h30mins"),
        ),
        (finished("time_limit", "It"), "time_limit", ("time_limit", "It")),
        (finished("no_answer"), "", ("answer not found", "No answer found.")),
        (
            finished("round_limit", "It", lab="exceed available llm calls"),
            "round_limit",
            ("exceed available llm calls", "No answer found."),
        ),
        (
            finished("no_answer", lab="format error: x"),
            "",
            ("format error: x", "<think>\nHm.\n</think>"),
        ),
    ],
    ids=[
        "answer",
        "unmarked-answer",
        "context-answer",
        "context-unmarked",
        "context-nothing",
        "rounds-nothing",
        "rounds-answer",
        "rounds-unmarked",
        "time-nothing",
        "time-wrap-up-nothing",
        "time-answer",
        "nothing",
        "the-runs-own-name-wins",
        "the-runs-own-format-error",
    ],
)
def test_each_ending_has_the_labs_termination_and_prediction(
    ending, wrapped_up, expected
):
    last = "<think>\nHm.\n</think>\n\n"
    assert results.lab_ending(ending, wrapped_up, last.strip()) == expected


def test_a_run_an_error_stopped_is_the_labs_error_record():
    outcome = results.Outcome("Q1", finished("error", error="It broke."))
    assert list(results.batch_record(outcome, "gold", 3).items()) == [
        ("question", "Q1"),
        ("answer", "gold"),
        ("rollout_idx", 3),
        ("rollout_id", 3),
        ("error", "It broke."),
        ("messages", []),
        ("prediction", "[Failed]"),
    ]


# -- the input and the outputs ---------------------------------------------------------


@pytest.mark.parametrize("content", ["", "\n\n  \n"], ids=["empty", "blank-lines"])
def test_an_input_without_questions_is_a_usage_error(world, tmp_path, content):
    source = tmp_path / "questions.jsonl"
    source.write_text(content, encoding="utf-8")
    out = tmp_path / "results.jsonl"
    done = world.run(tmp_path, "batch", str(source), "--output", str(out))

    assert done.returncode == 2
    assert done.stderr == f"{PROG}: {source} holds no question (the file is empty)\n"
    assert world.model.requests == []
    assert not out.exists()


@pytest.mark.parametrize("spelling", ["same", "dotted", "link", "iter-file"])
def test_the_input_as_its_own_output_is_a_usage_error(world, tmp_path, spelling):
    folder = tmp_path / "results"
    folder.mkdir()
    source = write_questions(
        folder / ("iter1.jsonl" if spelling == "iter-file" else "questions.jsonl"),
        ["Q1"],
    )
    before = source.read_bytes()
    if spelling == "link":
        (tmp_path / "link.jsonl").symlink_to(source)
    where = {
        "same": ["--output", str(source)],
        "dotted": ["--output", str(folder / "." / source.name)],
        "link": ["--output", str(tmp_path / "link.jsonl")],
        "iter-file": ["--output-dir", str(folder)],
    }[spelling]
    done = world.run(tmp_path, "batch", str(source), *where)

    assert done.returncode == 2
    assert done.stderr == (
        f"{PROG}: {source} is both the input and an output: write the results "
        "to another file\n"
    )
    assert source.read_bytes() == before
    assert world.model.requests == []


def test_an_output_that_is_not_a_file_is_refused_before_anything_is_read(
    world, tmp_path
):
    source = write_questions(tmp_path / "questions.jsonl", ["Q1"])
    done = world.run(tmp_path, "batch", str(source), "--output", "/dev/stdout")

    assert done.returncode == 2
    assert done.stderr == (
        f"{PROG}: cannot write /dev/stdout: not a regular file (a batch reads "
        "its output back to resume)\n"
    )
    assert world.model.requests == []


def test_resuming_never_reads_from_a_fifo(tmp_path):
    fifo = tmp_path / "results.jsonl"
    os.mkfifo(fifo)

    def writer() -> None:  # a record fed through the FIFO, should it be read
        try:
            with fifo.open("wb") as handle:
                handle.write(b'{"question": "Q1", "rollout_id": 1}\n')
        except BrokenPipeError:  # the reader left without reading
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        with pytest.raises(research.RunnerError) as raised:
            batch.read_existing(fifo)
    finally:
        # Release the writer should the reader never have opened the FIFO.
        release = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        thread.join(60)
        os.close(release)
    assert str(raised.value) == (
        f"cannot resume from {fifo}: not a regular file (a batch reads its "
        "output back to resume)"
    )
    assert raised.value.code == 2


def test_an_output_is_read_back_a_line_at_a_time_with_a_cap(tmp_path):
    out = tmp_path / "results.jsonl"
    lines = [
        b'{"question": "Q1", "rollout_id": 1}\n',
        b'{"question": "Q9", "prediction": "' + b"x" * (4 << 20) + b'"}\n',
        b'{"question": "Q2", "rollout_id": 1, "error": "boom"}\n',
        b'{"question": "Q3", "rollout_id": 1}\n',
    ]
    out.write_bytes(b"".join(lines))
    tracemalloc.start()
    try:
        existing = batch.read_existing(out, max_line_bytes=64 << 10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert existing.done == {("Q1", 1), ("Q3", 1)}
    assert existing.too_long == [2]
    start = len(lines[0]) + len(lines[1])
    assert existing.failed == {("Q2", 1): [(start, start + len(lines[2]))]}
    assert peak < 512 << 10  # the 4 MiB line was never held whole


def test_a_line_longer_than_the_cap_is_reported_and_left(world, tmp_path):
    source = write_questions(tmp_path / "questions.jsonl", ["Q1", "Q2"])
    out = tmp_path / "results.jsonl"
    with out.open("wb") as handle:
        handle.write(b'{"question": "Q1", "rollout_id": 1}\n')
        handle.write(b"[" * ((64 << 20) + 1) + b"\n")  # 64 MiB: the cap
    done = world.run(tmp_path, "batch", str(source), "--output", str(out))

    assert done.returncode == 0, done.stderr
    assert done.stderr.split("\n")[0] == (
        f"{out}:2: longer than 64 MiB, not read; left as it is"
    )
    assert world.script.counts == {"Q2": 1}
    assert out.stat().st_size > 64 << 20  # left as it was


def test_an_input_line_longer_than_the_cap_is_a_bad_line(tmp_path):
    source = tmp_path / "questions.jsonl"
    source.write_bytes(
        b'\xef\xbb\xbf{"question": "Q1"}\r\n'
        + b'{"question": "'
        + b"q" * 5000
        + b'"}\n{"question": "Q3"}'
    )
    with source.open("rb") as handle:
        lines = batch.input_lines(handle, max_bytes=1024)
        questions, bad = batch.parse_questions(lines, max_bytes=1024)

    assert [(q.line, q.question) for q in questions] == [(1, "Q1"), (3, "Q3")]
    assert [(b.line, b.reason) for b in bad] == [(2, "longer than 1,024 bytes")]


def test_a_failed_last_record_without_its_newline_is_dropped_whole(tmp_path):
    out = tmp_path / "iter1.jsonl"
    out.write_bytes(b'{"question": "Q1"}\n{"question": "Q2", "error": "boom"}')
    existing = batch.read_existing(out, 1)
    batch.drop_lines(out, existing.failed_lines([("Q2", 1)]))

    assert out.read_bytes() == b'{"question": "Q1"}\n'  # no blank line left


def test_dropping_lines_rewrites_the_rest_byte_for_byte(tmp_path):
    path = tmp_path / "iter1.jsonl"
    path.write_bytes(b"one\ntwo\nthree\nfour\n")
    path.chmod(0o600)
    batch.drop_lines(path, [(14, 19), (4, 8)])

    assert path.read_bytes() == b"one\nthree\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter1.jsonl"]


# -- settings and messages in the runner's words ------------------------------------


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("sk-live-SECRET42", "--set (argument 1 of --set): expected NAME=VALUE"),
        ("=sk-live-SECRET42", "--set (argument 1 of --set): expected NAME=VALUE"),
        (
            "sk-live-SECRET42=x",
            "--set (argument 1 of --set): unknown setting (not a setting name)",
        ),
        (
            "MAX_TOOL_ROUNDS=sk-live-SECRET42",
            "setting MAX_TOOL_ROUNDS (from the command line): Input should be a "
            "valid integer, unable to parse string as an integer",
        ),
        (
            "TEMPERATURE=sk-live-SECRET42",
            "setting TEMPERATURE (from the command line): Input should be a valid "
            "number, unable to parse string as a number",
        ),
    ],
    ids=["no-equals", "no-name", "not-a-name", "not-an-integer", "not-a-number"],
)
def test_set_never_echoes_what_it_rejects(tmp_path, argument, message):
    done = run(clean_env(tmp_path), "ask", "q", "--set", argument)

    assert done.returncode == 2
    assert done.stderr == f"{PROG}: {message}\n"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (
            "ftp://sk-live-SECRET42@host/v1",
            "Value error, must start with http:// or https:// (e.g. "
            "http://localhost:8000/v1)",
        ),
        ("http:", "invalid value"),  # the message holds the value: not given
    ],
)
def test_a_reason_that_holds_the_value_is_not_given(value, reason):
    with pytest.raises(settings.SettingsError) as refused:
        settings.load_settings({"API_BASE_URL": value}, env={})
    assert str(refused.value) == (
        f"setting API_BASE_URL (from the command line): {reason}"
    )


class OneRolloutReads:
    """The first rollout to start researches (search, read, answer); the
    others answer at once. Heavy rollouts send the same first request, so
    the first one to arrive is the one that researches."""

    def __init__(self, script: QuestionScript) -> None:
        self.script = script
        self.starts = 0
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        if not body.get("stream") or messages[0]["content"] == CONVERGE_SYSTEM_PROMPT:
            return self.script(body)
        if not any(m["role"] == "assistant" for m in messages):
            with self._lock:
                self.starts += 1
                first = self.starts == 1
            if not first:
                return Reply(reasoning="Known.", content=answer("Right away."))
        return self.script(body)


def test_each_rollout_of_a_heavy_run_counts_its_own_sources(world, tmp_path):
    world.model.respond_with(OneRolloutReads(world.script))
    # One rollout at a time: the one that read the page ends first.
    done = world.run(
        tmp_path,
        "ask",
        "research: photosynthesis",
        "--heavy",
        "2",
        "--set",
        "HEAVY_CONCURRENT_ROLLOUTS=1",
    )

    ends = [
        line.split(" tokens in")[0].rsplit(" · ", 1)[0]
        for line in done.stderr.split("\n")
        if line.startswith("[rollout") and "── Done:" in line
    ]
    assert ends == [
        "[rollout 1/2] ── Done: the model gave its answer · 3 rounds · 1 source",
        "[rollout 2/2] ── Done: the model gave its answer · 1 round · 0 sources",
    ], done.stderr


def test_a_private_address_refusal_names_the_runners_flag(world, tmp_path):
    env = clean_env(
        tmp_path,
        API_BASE_URL=world.model.base_url,
        SEARXNG_URL=world.engine.url("/search"),
        SCHOLAR_ENABLED="false",
    )
    done = run(env, "ask", "research: photosynthesis")

    assert done.returncode == 0, done.stderr
    assert (
        f"  · Could not read {world.article}: refused: 127.0.0.1 is a private or "
        "reserved address (127.0.0.1); --allow-private-urls (or "
        "TDR_ALLOW_PRIVATE_URLS=true) lets visit read it"
    ) in done.stderr.split("\n")


def test_a_refused_key_during_a_run_names_the_runners_key_setting(tmp_path):
    with FakeOpenAI() as model:
        model.respond_with(lambda _body: Reply(status=401, error="no such key"))
        env = clean_env(
            tmp_path,
            API_BASE_URL=model.base_url,
            SEARCH_ENABLED="false",
            VISIT_ENABLED="false",
            SCHOLAR_ENABLED="false",
        )
        asked = run(env, "ask", "Q1")
        source = write_questions(tmp_path / "questions.jsonl", ["Q1"])
        out = tmp_path / "results.jsonl"
        batched = run(env, "batch", str(source), "--output", str(out))

    error = (
        f"The model server at {model.base_url} (model "
        "'Alibaba-NLP/Tongyi-DeepResearch-30B-A3B') refused the request (HTTP "
        "401). Check the API_KEY setting (--api-key or TDR_API_KEY; leave it "
        "empty for a local server that needs no key). Server said: no such key"
    )
    assert asked.returncode == 1
    assert asked.stdout == f"> **The research stopped:** {error}\n"
    assert f"  ✗ {error}" in asked.stderr.split("\n")
    assert batched.returncode == 1
    assert [r["error"] for r in lines_of(out)] == [error]
    assert f"  1 × {error}" in batched.stderr.split("\n")
