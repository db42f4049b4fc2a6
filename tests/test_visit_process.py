"""Every page is converted in a worker process, never in the server.

The worker runs the convert module, written into visit_tool.py as a string
(`_CONVERT_SOURCE`), and stays warm for the next page. These tests check
that it gives exactly what the in-process conversion gives, that it needs
neither the package nor the file afterwards (Open WebUI deletes it), and that a
worker that cannot start, breaks, is killed, hangs or is cancelled never leaves
a process behind nor hides a page: a worker that cannot start falls back to the
budgeted converter in a thread; one that breaks on a page reports a clear
reason, and page content never switches the workers off.

Each test converts with a converter of its own (`_ConverterState`, passed to
`_convert_page` or as the tool's seam) that records the workers it starts and
the pages it converts in a thread. Child processes are counted in /proc
(Linux), zombies included.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import dis
import functools
import importlib.util
import inspect
import os
import sys
import threading
import types
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.pages import (
    ARTICLE_HTML,
    NEWS_HTML,
    PNG_BYTES,
    VISIT_TOOL_PATH,
    PageSite,
    load_visit_tool,
    make_pdf,
)
from tests.fakes.visit_seams import Clock, ConverterWatch

vt = load_visit_tool("visit_tool_process_tests")

HUNG = "import time\ntime.sleep(120)\n"
KILLED = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
# Starts like the real worker, then dies on the first page it is sent.
KILLED_ON_PAGE = (
    "import json, os, signal, sys\n"
    "sys.stdin.buffer.readline()\n"
    "print(json.dumps({'ready': True}), flush=True)\n"
    "sys.stdin.buffer.readline()\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n"
)
BROKEN = "import sys\nsys.exit(3)\n"
GARBLED = "print('this is not the converter')\n"

PDF = make_pdf(
    ["First (page) text.", "Second page: Ünïcode ✓ and 日本語."], title="Doc Title"
)
# Big enough to cut at the token budget used below, small enough to be quick.
LONG_HTML = (
    "<html><head><title>Long</title></head><body>"
    + "<p>Lorem ipsum <a href='/x'>dolor</a> sit amet.</p>\n" * 3000
    + "</body></html>"
)
DOCUMENTS = {
    "article": vt._RawPage("https://s.example/a", ARTICLE_HTML.encode(), "text/html"),
    "pdf": vt._RawPage("https://s.example/d.pdf", PDF, "application/pdf"),
    "long html, cut": vt._RawPage(
        "https://s.example/l", LONG_HTML.encode(), "text/html", redirects=["r"]
    ),
    "download cut": vt._RawPage(
        "https://s.example/t", b"<p>partial page</p>", "text/html", truncated=True
    ),
    "plain text": vt._RawPage("https://s.example/t", "naïve ✓".encode(), "text/plain"),
    "news, main content": vt._RawPage(
        "https://news.example/2026/tidal", NEWS_HTML.encode(), "text/html"
    ),
}

needs_proc = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="counts processes in /proc"
)


def child_pids() -> set[int]:
    """Every process whose parent is this one (zombies too)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        state_and_parent = stat.rsplit(")", 1)[1].split()
        if int(state_and_parent[1]) == os.getpid():
            found.add(int(entry))
    return found


async def wait_for_children(count: int, before: set[int]) -> set[int]:
    """Wait (bounded) until `count` new child processes exist."""
    for _ in range(500):
        new = child_pids() - before
        if len(new) >= count:
            return new
        await asyncio.sleep(0.02)
    raise AssertionError(f"{count} child process(es) never started")


@pytest.fixture
def watch() -> ConverterWatch:
    """Records the workers the test's converters start and their thread pages."""
    return ConverterWatch(vt)


@pytest.fixture
async def converters(watch: ConverterWatch) -> AsyncIterator[Callable[..., Any]]:
    """Makes the test's converters; their warm workers are stopped at the end."""
    made: list[Any] = []

    def make(program: str | None = None, **fields: Any) -> Any:
        made.append(watch.converter(program, **fields))
        return made[-1]

    yield make
    for converter in made:
        await vt._stop_idle_workers(converter)


@pytest.fixture
def converter(converters: Callable[..., Any]) -> Any:
    """A converter running the tool's own program."""
    return converters()


def tool_with(converter: Any, **valves: Any) -> Any:
    """A visit tool that converts with `converter` and reads loopback pages."""
    tool = vt.Tools(seams=vt._Seams(converter=converter, pages=vt._PageCache()))
    tool.valves = tool.Valves(ALLOW_PRIVATE_URLS=True, **valves)
    return tool


# -- the child gives exactly what the thread gives -----------------------------------


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
async def test_child_result_equals_the_in_thread_conversion(
    name: str, converter: Any
) -> None:
    raw = DOCUMENTS[name]
    expected = vt._convert(raw, 2000)
    page = await vt._convert_in_child(raw, 2000, converter)
    assert page == expected
    assert converter.start_failures == 0


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (vt._RawPage("u", PNG_BYTES, "text/html"), "the URL points to a PNG image"),
        (vt._RawPage("u", make_pdf([""]), "application/pdf"), "no extractable text"),
        (vt._RawPage("u", b"%PDF-1.4 junk", "application/pdf"), "could not be read"),
        (vt._RawPage("u", b"<p> </p>", "text/html"), "no readable text"),
    ],
)
async def test_child_page_errors_are_the_same_page_errors(
    raw: Any, reason: str, converter: Any
) -> None:
    with pytest.raises(vt._PageError) as in_thread:
        vt._convert(raw, 1000)
    with pytest.raises(vt._PageError, match=reason) as in_child:
        await vt._convert_in_child(raw, 1000, converter)
    assert str(in_child.value) == str(in_thread.value)
    assert converter.start_failures == 0  # a bad page is not a broken child


def test_the_child_program_is_the_convert_section_alone() -> None:
    program = vt._CONVERTER.program
    compile(program, "converter", "exec")
    assert "def _converter_main" in program
    assert "def _convert(" in program
    for outside in ("import httpx", "pydantic", "class Tools", "_check_url"):
        assert outside not in program


def _global_names(code: types.CodeType) -> set[str]:
    """Names a code object (and the code inside it) looks up as globals."""
    names = {
        op.argval
        for op in dis.get_instructions(code)
        if op.opname in ("LOAD_GLOBAL", "LOAD_NAME")
    }
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def test_the_child_program_defines_every_name_it_uses() -> None:
    # Catches a convert-section edit that uses a name from outside the section
    # (an import at the top of the file, a helper of another section) on any
    # path, not only the paths the documents above happen to take.
    program = vt._CONVERTER.program
    tree = ast.parse(program)
    defined = set(dir(builtins)) | {"__annotations__"}  # module-level
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
    used = _global_names(compile(program, "converter", "exec"))
    assert used - defined == set()


# -- which documents go to a child ---------------------------------------------------


async def test_every_page_goes_to_one_warm_child(
    converter: Any, watch: ConverterWatch
) -> None:
    pages = [DOCUMENTS[name] for name in sorted(DOCUMENTS)]
    for raw in pages:  # small HTML and plain text too: no size threshold
        assert await vt._convert_page(raw, 2000, converter) == vt._convert(raw, 2000)
    assert watch.threaded == []  # every page went to a worker
    assert len(watch.spawned) == 1  # one worker, reused page after page
    assert [worker.process for worker in converter.idle] == watch.spawned
    assert os.getpid() not in watch.pids()


async def test_a_pdf_cut_by_the_download_limit_needs_no_child(
    converter: Any, watch: ConverterWatch
) -> None:
    raw = vt._RawPage("https://s.example/c.pdf", PDF, "application/pdf", True)
    with pytest.raises(vt._PageError, match="larger than the download limit"):
        await vt._convert_page(raw, 1000, converter)
    assert (watch.spawned, watch.threaded) == ([], [])


async def test_the_tool_reads_a_pdf_through_a_child(
    converter: Any, watch: ConverterWatch
) -> None:
    with PageSite() as site, FakeOpenAI() as extractor:
        result = await tool_with(converter).visit(url=[site.url("/pdf")], goal="g")
        assert extractor.requests == []  # no extractor configured: an excerpt
    assert "--- Page 1 ---\nPhotosynthesis converts light" in result
    assert len(watch.spawned) == 1
    assert watch.threaded == []


# -- when the child cannot do it ----------------------------------------------------


async def test_no_python_to_start_falls_back_to_a_thread(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    converter: Any,
    watch: ConverterWatch,
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    raw = DOCUMENTS["pdf"]
    assert await vt._convert_in_child(raw, 2000, converter) is None
    assert await vt._convert_page(raw, 2000, converter) == vt._convert(raw, 2000)
    assert watch.threaded == [raw.final_url]
    assert converter.start_failures == 0  # may be passing: try again next time


@pytest.mark.parametrize("program", [BROKEN, GARBLED])
async def test_a_broken_child_falls_back_then_stops_being_tried(
    program: str, converters: Callable[..., Any], watch: ConverterWatch
) -> None:
    clock = Clock()
    converter = converters(program, clock=clock)
    raw = DOCUMENTS["pdf"]
    expected = vt._convert(raw, 2000)
    for _ in range(vt._MAX_START_FAILURES + 2):
        assert await vt._convert_page(raw, 2000, converter) == expected
    assert len(watch.spawned) == vt._MAX_START_FAILURES
    assert len(watch.threaded) == vt._MAX_START_FAILURES + 2
    # Not for ever: once the retry time has passed, a worker is tried again.
    clock.now += vt._START_RETRY_SECONDS
    assert await vt._convert_page(raw, 2000, converter) == expected
    assert len(watch.spawned) == vt._MAX_START_FAILURES + 1


@needs_proc
async def test_a_child_killed_before_it_is_ready_is_a_start_failure(
    converters: Callable[..., Any], watch: ConverterWatch
) -> None:
    converter = converters(KILLED)
    before = child_pids()
    raw = DOCUMENTS["pdf"]
    assert await vt._convert_page(raw, 2000, converter) == vt._convert(raw, 2000)
    assert converter.start_failures == 1
    assert watch.threaded == [raw.final_url]
    assert child_pids() - before == set()


@needs_proc
async def test_a_child_killed_on_a_page_is_reported_never_switched_off(
    converters: Callable[..., Any], watch: ConverterWatch
) -> None:
    converter = converters(KILLED_ON_PAGE)
    before = child_pids()
    for _ in range(vt._MAX_START_FAILURES + 2):  # pages can kill it, any number
        with pytest.raises(vt._PageError, match="its converter was stopped"):
            await vt._convert_page(DOCUMENTS["pdf"], 2000, converter)
    assert watch.threaded == []  # never retried inside the server
    assert len(watch.spawned) == vt._MAX_START_FAILURES + 2
    assert converter.usable()
    assert converter.start_failures == 0
    assert child_pids() - before == set()


async def test_a_module_without_a_file_converts_in_a_child() -> None:
    namespace: dict[str, Any] = {"__name__": "visit_without_file"}
    source = VISIT_TOOL_PATH.read_text(encoding="utf-8")
    code = compile(source, "<tool>", "exec", dont_inherit=True)  # no __future__
    exec(code, namespace)  # noqa: S102  (how some loaders run a tool)
    # The program is a string in the module: no file is needed to start a worker.
    converter = namespace["_CONVERTER"]
    assert converter.program == namespace["_CONVERT_SOURCE"]
    assert converter.usable()
    raw = DOCUMENTS["pdf"]
    expected = vt._convert(raw, 2000)
    try:
        page = await namespace["_convert_in_child"](raw, 2000)
    finally:
        await namespace["_stop_idle_workers"]()
    assert page is not None  # None: no worker could start
    assert (page.title, page.text) == (expected.title, expected.text)


async def test_the_child_works_after_the_tool_file_is_deleted(tmp_path: Path) -> None:
    # Open WebUI writes the tool to a temporary file, executes it, deletes it.
    path = tmp_path / "tool_deepresearch_visit.py"
    path.write_bytes(VISIT_TOOL_PATH.read_bytes())
    spec = importlib.util.spec_from_file_location("visit_from_temp_file", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path.unlink()
    raw = DOCUMENTS["pdf"]
    expected = vt._convert(raw, 2000)
    try:
        page = await module._convert_in_child(raw, 2000)
    finally:
        await module._stop_idle_workers()
    assert page is not None
    assert (page.title, page.text) == (expected.title, expected.text)


# -- no process is ever left behind --------------------------------------------------


@needs_proc
async def test_a_hung_child_is_killed_at_the_page_timeout(
    converters: Callable[..., Any],
) -> None:
    converter = converters(HUNG)
    before = child_pids()
    statuses: list[str] = []

    async def emitter(event: dict) -> None:
        statuses.append(event["data"].get("description", ""))

    with PageSite() as site:
        tool = tool_with(converter, PAGE_TIMEOUT_SECONDS=1.5)
        result = await tool.visit(
            url=[site.url("/pdf")], goal="g", __event_emitter__=emitter
        )
    assert vt.FAILURE_EVIDENCE in result
    assert f"Could not read {site.url('/pdf')}: timed out" in statuses
    assert child_pids() - before == set()
    assert converter.start_failures == 0  # too slow is not broken


@needs_proc
async def test_cancelling_a_conversion_kills_and_reaps_the_child(
    converters: Callable[..., Any],
) -> None:
    converter = converters(HUNG)
    before = child_pids()
    task = asyncio.create_task(vt._convert_page(DOCUMENTS["pdf"], 2000, converter))
    await wait_for_children(1, before)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert child_pids() - before == set()


@needs_proc
async def test_children_at_once_are_limited_per_event_loop(
    converters: Callable[..., Any], watch: ConverterWatch
) -> None:
    converter = converters(HUNG, max_children=2)
    # Each conversion reaches the spawn in its first step unless the limit holds
    # it back: counting spawns needs no "wait and see if a third child shows up".
    before = child_pids()
    tasks = [
        asyncio.create_task(vt._convert_page(DOCUMENTS["pdf"], 2000, converter))
        for _ in range(4)
    ]
    await wait_for_children(2, before)
    running = child_pids() - before
    waiting = [task for task in tasks if not task.done()]
    spawned = len(watch.spawned)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert spawned == 2
    assert len(running) == 2
    assert len(waiting) == 4
    assert child_pids() - before == set()


def test_the_conversion_never_runs_on_the_event_loop_thread() -> None:
    # With the child unavailable, the fallback still runs in a worker thread.
    ran: list[tuple[str, threading.Thread]] = []

    async def to_thread(func: Callable[..., Any], *args: Any) -> Any:
        def run() -> Any:
            ran.append((func.__name__, threading.current_thread()))
            return func(*args)

        return await asyncio.to_thread(run)

    in_thread = functools.partial(vt._convert_in_thread, run_in_thread=to_thread)
    converter = vt._ConverterState("", in_thread=in_thread)
    raw = DOCUMENTS["pdf"]
    page = asyncio.run(vt._convert_page(raw, 2000, converter))
    assert page == vt._convert_budgeted(raw, 2000)
    assert [name for name, _thread in ran] == ["_convert_budgeted"]
    assert ran[0][1] is not threading.main_thread()
    # And what the tool runs it with, unless told otherwise: a worker thread.
    defaults = inspect.signature(vt._convert_in_thread).parameters
    assert defaults["run_in_thread"].default is asyncio.to_thread
    assert vt._CONVERTER.in_thread is vt._convert_in_thread
