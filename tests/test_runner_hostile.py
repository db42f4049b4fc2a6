"""The headless runner against hostile terminal output and hostile input files.

A page, the model or a server can put terminal control sequences (window
title, clear screen, clipboard writes) in what the runner shows; a file
handed to the runner can hold lone surrogates, deep nesting, line
separators or a missing final newline; an output path can be a directory.
None of it may reach the terminal raw, crash the runner, forge a record or
lose an answer: each is one clear line and the documented exit status.

The console script runs as a subprocess against the fakes of
tests/fakes, as in tests/test_runner.py.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pty
import re
import subprocess
import tty
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fakes.http import LocalServer, Response
from tests.fakes.openai_server import FakeOpenAI, Reply, answer, tool_call
from tests.fakes.pages import PageSite
from tests.fakes.research_model import EVIDENCE
from tests.fakes.searxng import FakeSearXNG, result
from tests.test_runner import World, clean_env, command
from tongyi_deepresearch_openwebui_pipeline.core.events import ThinkingDelta
from tongyi_deepresearch_openwebui_pipeline.runner import batch, cli, render, research

PROG = "tongyi-deepresearch"
#: What a terminal must never receive from the runner's text: C0 controls but
#: newline and tab, DEL, C1 controls, bidi embeddings, overrides and isolates.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
SURROGATE = re.compile("[\ud800-\udfff]")

WINDOW_TITLE = "\x1b]0;pwned\x07"
CLEAR_SCREEN = "\x1b[2J\x1b[H"
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"  # OSC 52: "rm -rf ~" to the clipboard
C1_CLEAR = "\x9b2J\x9d0;c1 title\x9c"  # 8-bit CSI and OSC
RTL_OVERRIDE = "\u202e"


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command(), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def jsonl(path: Path) -> list[Any]:
    """The records of a JSON Lines file (only "\\n" ends a record)."""
    return [json.loads(line) for line in path.read_text("utf-8").split("\n") if line]


def streamed(model: FakeOpenAI) -> list[dict[str, Any]]:
    """The research requests the model server received (not the extractor's)."""
    return [body for body in model.bodies if body.get("stream")]


# -- a hostile world: the model, a search result and a page write escapes ----------


class HostileScript:
    """Three rounds whose reasoning, query, page title and answer hold escapes."""

    def __init__(self, page_url: str) -> None:
        self.page_url = page_url

    def __call__(self, body: dict[str, Any]) -> Reply:
        if not body.get("stream"):
            return Reply(content=json.dumps(EVIDENCE))
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if done == 0:
            return Reply(
                reasoning=f"Search{WINDOW_TITLE} first.",
                content=tool_call("search", {"query": [f"photo{CLEAR_SCREEN}synth"]}),
            )
        if done == 1:
            return Reply(
                reasoning=f"Read{C1_CLEAR} it.",
                content=tool_call("visit", {"url": [self.page_url], "goal": "facts"}),
            )
        return Reply(reasoning="Done.", content=answer(hostile_answer(self.page_url)))


def hostile_answer(page: str) -> str:
    return (
        f"Light{WINDOW_TITLE} becomes{CLEAR_SCREEN} energy{RTL_OVERRIDE}"
        f"{C1_CLEAR} \u2028([notes]({page}))."
    )


HOSTILE_PAGE = (
    f"<html><head><title>Solar{CLIPBOARD} Notes</title></head>"
    "<body><p>Photosynthesis converts light into chemical energy.</p></body></html>"
)


class Hostile:
    """The fake model, search engine and page of the terminal tests."""

    def __init__(self, model: FakeOpenAI, engine: FakeSearXNG, site: LocalServer):
        self.model, self.engine = model, engine
        self.page = site.url("/hostile")
        model.respond_with(HostileScript(self.page))
        engine.script(
            f"photo{CLEAR_SCREEN}synth",
            results=[result(self.page, "Plant Biology Notes", "How plants eat.")],
        )

    def env(self, tmp_path: Path) -> dict[str, str]:
        return clean_env(
            tmp_path,
            API_BASE_URL=self.model.base_url,
            SEARXNG_URL=self.engine.url("/search"),
            ALLOW_PRIVATE_URLS="true",
            SCHOLAR_ENABLED="false",
        )


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    page = HOSTILE_PAGE.encode()
    site = LocalServer(
        {"/hostile": lambda _r: Response(200, {"Content-Type": "text/html"}, page)}
    )
    with FakeOpenAI() as model, FakeSearXNG() as engine, site:
        yield Hostile(model, engine, site)


@pytest.fixture
def world() -> Iterator[World]:
    with FakeOpenAI() as model, FakeSearXNG() as engine, PageSite() as site:
        yield World(model, engine, site)


def test_escape_sequences_from_the_model_and_a_page_never_reach_stderr(
    hostile, tmp_path
):
    done = run(hostile.env(tmp_path), "ask", "research it", "--thinking")

    assert done.returncode == 0, done.stderr
    assert UNSAFE.findall(done.stderr) == []
    lines = done.stderr.split("\n")
    assert "  │ Search first." in lines  # the window title is gone
    assert "  → Searching: photosynth" in lines  # and the clear screen
    assert "  │ Read it." in lines  # 8-bit CSI and OSC too
    assert f"  + [1] Solar Notes <{hostile.page}>" in lines  # the clipboard write
    # Piped stdout is data, like an answer file: the answer is kept as written;
    # the list of sources shows titles without control characters (Markdown
    # escapes the title's "]").
    assert done.stdout == (
        f"{hostile_answer(hostile.page).removesuffix(')).')}) [1]).\n\n"
        "**Sources read**\n\n"
        f"1. [Solar\\]52;c;cm0gLXJmIH4= Notes]({hostile.page})\n"
    )


def read_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run `args` with stdout and stderr on a terminal: (status, all it showed)."""
    leader, follower = pty.openpty()
    tty.setraw(follower)  # bytes as written: no "\r" added before "\n"
    process = subprocess.Popen(
        args, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower
    )
    os.close(follower)
    shown = bytearray()
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError as error:  # EIO: every writer has closed the terminal
            if error.errno != errno.EIO:
                raise
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return process.wait(timeout=240), shown.decode("utf-8")


def test_on_a_terminal_the_answer_is_shown_without_control_sequences(hostile, tmp_path):
    status, shown = read_terminal(
        [*command(), "ask", "research it"], hostile.env(tmp_path)
    )

    assert status == 0, shown
    assert UNSAFE.findall(shown) == []
    # The title's control characters are gone before Markdown escapes its "]"
    # (else the escape made the clipboard write's "ESC ]" an "ESC \\").
    assert shown.endswith(
        f"\nLight becomes energy \u2028([notes]({hostile.page}) [1]).\n\n"
        "**Sources read**\n\n"
        f"1. [Solar\\]52;c;cm0gLXJmIH4= Notes]({hostile.page})\n"
    )


def test_json_escapes_every_control_character_and_reads_back_the_same(
    hostile, tmp_path
):
    out = tmp_path / "answer.json"
    done = run(hostile.env(tmp_path), "ask", "research it", "--json")
    written = run(
        hostile.env(tmp_path), "ask", "research it", "--json", "--output", str(out)
    )

    assert done.returncode == written.returncode == 0, done.stderr + written.stderr
    expected = hostile_answer(hostile.page).removesuffix(")).") + ") [1])."
    for text in (done.stdout, out.read_text("utf-8")):
        assert UNSAFE.findall(text) == []
        assert "\u2028" not in text  # a line separator for JavaScript and splitlines
        assert text.count("\n") == 1
        assert text.endswith("}\n")
        result = json.loads(text)
        assert result["answer"] == expected
        assert result["sources"] == [
            {"number": 1, "title": f"Solar{CLIPBOARD} Notes", "url": hostile.page}
        ]


# -- batch input: JSON Lines -------------------------------------------------------


def test_batch_input_is_json_lines_ended_only_by_newlines(world, tmp_path):
    source = tmp_path / "questions.jsonl"
    source.write_bytes(
        b"\xef\xbb\xbf"  # a UTF-8 byte order mark at the start of the file
        + b'{"question": "Q1"}\r\n'
        + '{"question": "Q2\u2028two"}\n'.encode()
        + '{"question": "Q3", "answer": "a\x85b"}\n'.encode()
        + b'{"question": "Q4"}'  # no final newline
    )
    out = tmp_path / "results.jsonl"
    done = world.run(tmp_path, "batch", str(source), "--output", str(out))

    assert done.returncode == 0, done.stderr
    assert "line skipped" not in done.stderr
    written = {r["question"]: r["answer"] for r in jsonl(out)}
    assert written == {"Q1": None, "Q2\u2028two": None, "Q3": "a\x85b", "Q4": None}


def test_records_holding_line_separators_are_found_again_on_resume(world, tmp_path):
    prediction = f"One\u2028two\x85three\u2029four{RTL_OVERRIDE}{C1_CLEAR}."
    world.model.respond_with(lambda _body: Reply(content=answer(prediction)))
    source = tmp_path / "questions.jsonl"
    source.write_text('{"question": "Q1"}\n{"question": "Q2"}\n', encoding="utf-8")
    out = tmp_path / "results.jsonl"
    first = world.run(tmp_path, "batch", str(source), "--output", str(out))
    again = world.run(tmp_path, "batch", str(source), "--output", str(out))

    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    text = out.read_text("utf-8")
    assert UNSAFE.findall(text) == []
    assert text.splitlines() == text.rstrip("\n").split("\n")  # any splitter agrees
    assert sorted((r["question"], r["prediction"]) for r in jsonl(out)) == [
        ("Q1", prediction),
        ("Q2", prediction),
    ]
    assert f"Nothing to do: all 2 records are already in {out}." in again.stderr
    assert len(streamed(world.model)) == 2


def test_a_lone_surrogate_question_is_a_bad_line_and_the_batch_goes_on(world, tmp_path):
    source = tmp_path / "questions.jsonl"
    source.write_text(
        '{"question": "Q1"}\n'
        '{"question": "bad \\udc80"}\n'
        '{"question": "Q3", "answer": "gold \\udc80"}\n',
        encoding="utf-8",
    )
    out = tmp_path / "results.jsonl"
    first = world.run(tmp_path, "batch", str(source), "--output", str(out))
    again = world.run(tmp_path, "batch", str(source), "--output", str(out))

    skipped = (
        f'{source}:2: the "question" is not Unicode text (a lone surrogate '
        "\\udc80); line skipped"
    )
    for done in (first, again):
        assert done.returncode == 1, done.stderr
        assert skipped in done.stderr.split("\n")
        assert "unexpected error" not in done.stderr
    # Any other field is carried as it is: escaped, so the file is UTF-8.
    assert sorted((r["question"], r["answer"]) for r in jsonl(out)) == [
        ("Q1", None),
        ("Q3", "gold \udc80"),
    ]
    assert f"Nothing to do: all 2 records are already in {out}." in again.stderr


class EscapingFakeOpenAI(FakeOpenAI):
    """A model server that writes its JSON ASCII-only (lone surrogates escaped)."""

    def _chunk(
        self,
        delta: dict[str, Any],
        finish: str | None = None,
        logprobs: dict[str, Any] | None = None,
    ) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        if logprobs is not None:
            choice["logprobs"] = logprobs
        payload = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": self.model,
            "choices": [choice],
        }
        return f"data: {json.dumps(payload)}\n\n".encode()


def test_a_lone_surrogate_from_the_model_is_written_without_crashing(tmp_path):
    with EscapingFakeOpenAI() as model:
        model.respond_with(lambda _body: Reply(content=answer("Half \ud83d here")))
        env = clean_env(
            tmp_path,
            API_BASE_URL=model.base_url,
            SEARCH_ENABLED="false",
            VISIT_ENABLED="false",
            SCHOLAR_ENABLED="false",
        )
        markdown = tmp_path / "answer.md"
        asked = run(env, "ask", "q", "--output", str(markdown))
        as_json = run(env, "ask", "q", "--json")
        source = tmp_path / "questions.jsonl"
        source.write_text('{"question": "Q1"}\n', encoding="utf-8")
        out = tmp_path / "results.jsonl"
        batched = run(env, "batch", str(source), "--output", str(out))

    assert asked.returncode == 0, asked.stderr
    assert markdown.read_text("utf-8") == "Half \ufffd here\n"
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["answer"] == "Half \ud83d here"
    assert batched.returncode == 0, batched.stderr
    assert [r["prediction"] for r in jsonl(out)] == ["Half \ud83d here"]


def test_deep_nesting_and_huge_numbers_are_bad_lines(world, tmp_path):
    source = tmp_path / "questions.jsonl"
    source.write_text(
        '{"question": "Q1"}\n'
        + "[" * 100_000
        + "\n"
        + '{"question": "Q3", "answer": '
        + "[" * 900
        + "]" * 900
        + "}\n"
        + '{"question": "Q4", "answer": '
        + "7" * 5000
        + "}\n"
        + '{"question": "Q5"}\n',
        encoding="utf-8",
    )
    out = tmp_path / "results.jsonl"
    done = world.run(tmp_path, "batch", str(source), "--output", str(out))

    assert done.returncode == 1, done.stderr
    lines = done.stderr.split("\n")
    assert lines[:3] == [
        f"{source}:2: nested more than 100 levels deep; line skipped",
        f"{source}:3: nested more than 100 levels deep; line skipped",
        f"{source}:4: not valid JSON (a number longer than 4,300 digits); line skipped",
    ]
    assert sorted(r["question"] for r in jsonl(out)) == ["Q1", "Q5"]


def test_an_input_line_that_is_not_utf8_is_a_bad_line(world, tmp_path):
    source = tmp_path / "questions.jsonl"
    source.write_bytes(
        b'{"question": "Q1"}\n{"question": "caf\xe9"}\n{"question": "Q3"}\n'
    )
    out = tmp_path / "results.jsonl"
    done = world.run(tmp_path, "batch", str(source), "--output", str(out))

    assert done.returncode == 1, done.stderr
    assert done.stderr.split("\n")[0] == f"{source}:2: not UTF-8 text; line skipped"
    assert sorted(r["question"] for r in jsonl(out)) == ["Q1", "Q3"]


# -- batch output: resuming ----------------------------------------------------------


def test_a_complete_last_record_without_a_newline_is_kept_on_resume(world, tmp_path):
    source = tmp_path / "questions.jsonl"
    source.write_text(
        '{"question": "Q1"}\n{"question": "Q2"}\n{"question": "Q3"}\n',
        encoding="utf-8",
    )
    out = tmp_path / "results.jsonl"
    kept = '{"question": "Q1", "rollout_id": 1}\n{"question": "Q2", "rollout_id": 1}'
    out.write_text(kept, encoding="utf-8")
    done = world.run(tmp_path, "batch", str(source), "--output", str(out))

    assert done.returncode == 0, done.stderr
    assert "cut off" not in done.stderr
    assert f"Resuming: 2 records already in {out}." in done.stderr.split("\n")
    assert world.script.counts == {"Q3": 1}
    text = out.read_text("utf-8")
    assert text.startswith(kept + "\n{")
    assert [r["question"] for r in jsonl(out)] == ["Q1", "Q2", "Q3"]
    assert text.endswith("}\n")


def test_unreadable_lines_of_the_output_are_left_as_they_are(world, tmp_path):
    source = tmp_path / "questions.jsonl"
    source.write_text('{"question": "Q1"}\n{"question": "Q2"}\n', encoding="utf-8")
    out = tmp_path / "results.jsonl"
    hostile_lines = "[" * 100_000 + "\n" + '{"question": ' + "9" * 5000 + "}\n"
    out.write_text(
        hostile_lines + '{"question": "Q1", "rollout_id": 1}\n', encoding="utf-8"
    )
    done = world.run(tmp_path, "batch", str(source), "--output", str(out))

    assert done.returncode == 0, done.stderr
    assert done.stderr.split("\n")[:2] == [
        f"{out}:1: not a record; left as it is",
        f"{out}:2: not a record; left as it is",
    ]
    assert world.script.counts == {"Q2": 1}
    assert out.read_text("utf-8").startswith(hostile_lines)


def test_a_record_that_cannot_be_written_is_a_clear_error():
    class FullDisk:
        name = "results.jsonl"

        def write(self, _text: str) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self) -> None:
            pass

    writer = batch.RecordWriter(FullDisk())  # type: ignore[arg-type]
    with pytest.raises(research.RunnerError) as raised:
        writer.write({"question": "Q1"})
    assert str(raised.value) == ("cannot write results.jsonl: No space left on device")
    assert raised.value.code == 2


# -- files that cannot be read or written --------------------------------------------


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'MODEL_ID = "caf\xe9"\n', "is not UTF-8 text"),
        (b"MODEL_ID = " + b"[" * 5000 + b"]" * 5000 + b"\n", "is nested too deeply"),
        (b"# " + b"x" * (1 << 20) + b"\n", "is larger than 1 MiB"),
    ],
    ids=["not-utf8", "nested-5000-deep", "over-1-MiB"],
)
def test_a_hostile_config_file_is_a_usage_error(tmp_path, content, problem):
    config = tmp_path / "config.toml"
    config.write_bytes(content)
    done = run(clean_env(tmp_path), "ask", "anything", "--config", str(config))

    assert done.returncode == 2
    assert done.stderr == f"{PROG}: config file {config} {problem}\n"


def _unwritable(tmp_path: Path, case: str) -> tuple[Path, str]:
    if case == "directory":
        (tmp_path / "out").mkdir()
        return tmp_path / "out", "Is a directory"
    if case == "under-a-file":
        (tmp_path / "file").write_text("x")
        return tmp_path / "file" / "out", "Not a directory"
    return tmp_path / "missing" / "out", "No such file or directory"


@pytest.mark.parametrize("command_name", ["ask", "batch"])
@pytest.mark.parametrize("case", ["directory", "under-a-file", "missing-parent"])
def test_an_output_that_cannot_be_written_is_refused_before_any_research(
    world, tmp_path, command_name, case
):
    out, reason = _unwritable(tmp_path, case)
    source = tmp_path / "questions.jsonl"
    source.write_text('{"question": "Q1"}\n', encoding="utf-8")
    args = ["ask", "Q1"] if command_name == "ask" else ["batch", str(source)]
    done = world.run(tmp_path, *args, "--output", str(out))

    assert done.returncode == 2
    assert done.stderr == f"{PROG}: cannot write {out}: {reason}\n"
    assert world.model.requests == []  # not even the model server's check
    assert done.stdout == ""


def test_ask_prints_the_answer_when_it_cannot_be_written(world, tmp_path):
    out = tmp_path / "answer.md"

    def answer_then_take_the_path(_body: dict[str, Any]) -> Reply:
        out.mkdir(exist_ok=True)  # after the check: the write itself fails
        return Reply(content=answer("The answer."))

    world.model.respond_with(answer_then_take_the_path)
    done = world.run(tmp_path, "ask", "Q1", "--output", str(out), "--quiet")

    assert done.returncode == 2
    assert done.stdout == "The answer.\n"
    assert done.stderr == f"{PROG}: cannot write {out}: Is a directory\n"


# -- terminal text, in process ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\x1b]0;pwned\x07b", "ab"),  # window title (OSC, BEL)
        ("a\x1b]52;c;cm0gLXJmIH4=\x1b\\b", "ab"),  # clipboard (OSC, ST)
        ("a\x1b[2J\x1b[Hb", "ab"),  # clear screen, cursor home (CSI)
        ("a\x1b[38;5;196mred\x1b[0m", "ared"),  # colours
        ("a\x1b[?1049hb", "ab"),  # private CSI: alternate screen
        ("a\x9b2Jb", "ab"),  # 8-bit CSI
        ("a\x9d0;t\x9cb", "ab"),  # 8-bit OSC and ST
        ("a\x1bP1$r\x1b\\b", "ab"),  # DCS
        ("a\x1b_apc\x1b\\b\x1b^pm\x07c\x1bXsos\x9cd", "abcd"),  # APC, PM, SOS
        ("a\x1bcb", "ab"),  # full reset
        ("a\x1b(Bb\x1b#8c", "abc"),  # charset, screen alignment
        ("a\x1b]0;no end", "a0;no end"),  # unterminated: nothing hidden
        ("a\x1b]0;x\x1b[31mb", "a0;xb"),  # an escape inside ends the string
        ("a\x1b[12", "a12"),
        ("a\x1b", "a"),
        ("one\r\ntwo\tcol\bX\x00\x7f\x85", "one\ntwo\tcolX"),
        ("\u202eevil\u202c \u2066iso\u2069", "evil iso"),
        ("x\ud83dy", "x\ufffdy"),  # a lone surrogate
        ("\ud83d\ude00", "\U0001f600"),  # a split pair is one character
        (
            "plain: ünïcode — 東京 \U0001f600 \u200f\n",
            "plain: ünïcode — 東京 \U0001f600 \u200f\n",
        ),
    ],
)
def test_terminal_text_has_no_control_sequences(text, shown):
    assert render.terminal_safe(text) == shown


ESCAPE_PIECES = st.sampled_from(
    ["\x1b", "[", "]", "P", "\\", "\x07", "\x9b", "\x9c", "\x9d", "0;", "2J", "a"]
)


@given(st.lists(st.one_of(ESCAPE_PIECES, st.text()), max_size=30))
def test_no_text_reaches_a_terminal_with_a_control_character(pieces):
    text = "".join(pieces)
    shown = render.terminal_safe(text)
    assert UNSAFE.findall(shown) == []
    assert render.terminal_safe(shown) == shown
    if not UNSAFE.search(text) and not SURROGATE.search(text):
        assert shown == text


@pytest.mark.parametrize(
    "text",
    [
        "\x1b]" * 100_000,  # string introducers, none ended
        "\x1b]" + "a" * 200_000,  # one never ended
        ("\x1b]" + "a" * 100 + "\x1b[") * 2_000,  # each cut by the next escape
        "\x1b[" + "1;" * 100_000,  # a CSI whose final byte never comes
        ("\x1b[" + "1;" * 1_000) * 200,
        "\x9d" * 200_000,
        "\x1b" * 200_000,
        "x" * 200_000 + "\x07",
    ],
    ids=[
        "introducers",
        "unended",
        "cut-strings",
        "long-csi",
        "many-long-csi",
        "c1-osc",
        "escapes",
        "one-late-control",
    ],
)
def test_terminal_text_work_is_linear(text):
    scanned: list[int] = []
    shown = render.terminal_safe(text, count=scanned.append)
    assert UNSAFE.findall(shown) == []
    # Rescanning from each escape to the end would be ~len(text)² / 2.
    assert sum(scanned) <= 3 * len(text)


class CountedPiece(str):
    """A piece of streamed reasoning that counts the characters copied by
    concatenating it (as tests/test_model_client_hostile.py's CountedRead)."""

    copied = 0

    def __add__(self, other: str) -> str:
        CountedPiece.copied += len(self) + len(other)
        return str.__add__(self, other)

    def __radd__(self, other: str) -> str:
        CountedPiece.copied += len(other) + len(self)
        return str.__add__(other, self)


def test_a_long_line_of_reasoning_is_not_copied_again_for_each_piece():
    """100 kB of reasoning without a newline, in 10-character pieces."""
    renderer = render.TerminalRenderer(thinking=True)
    CountedPiece.copied = 0
    shown = [
        renderer.render(ThinkingDelta(CountedPiece("0123456789")))
        for _ in range(10_000)
    ]
    shown.append(renderer.render(ThinkingDelta(CountedPiece("end\nnext"))))
    assert shown[:-1] == [""] * 10_000
    assert shown[-1] == "  │ " + "0123456789" * 10_000 + "end\n"
    assert CountedPiece.copied <= 2 * 100_000  # re-joining each time: ~5·10⁸


def test_a_question_that_is_not_utf8_is_a_usage_error(world, tmp_path):
    done = subprocess.run(
        [*command(), "ask", b"caf\xe9?"],
        env=world.env(tmp_path),
        capture_output=True,
        timeout=240,
        check=False,
    )

    assert done.returncode == 2
    assert done.stderr == f"{PROG}: the question is not UTF-8 text\n".encode()
    assert world.model.requests == []


def test_log_lines_reach_the_terminal_without_control_sequences():
    record = logging.LogRecord(
        "tools", logging.WARNING, __file__, 1, "failed for %s", (CLIPBOARD,), None
    )
    formatter = cli.TerminalLogFormatter("%(levelname)s %(name)s: %(message)s")
    assert formatter.format(record) == "WARNING tools: failed for "
