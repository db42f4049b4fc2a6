"""Converter process: every page is converted in a worker process, never here.

Converting a page in the server is unsafe twice over. A thread cannot be
stopped, and some pages cost seconds to hours (CPython's HTMLParser is
quadratic or worse on unterminated tags), so a page could go on burning a
core long after the tool answered "timed out". And even a normal big page
stalls the event loop from a thread (the GIL, collector pauses in a large
heap). A worker process shares none of that and can be killed.

Workers are persistent: started on first use, reused page after page (heavy
imports are paid once per worker), at most `max_children` busy per event
loop and `max_idle` kept warm. A page runs under the caller's deadline (the
page timeout); at the deadline, on cancellation or if the worker breaks, it
is killed and reaped, and the next page starts a fresh one. Only a worker
that fails to start (before any page reached it) counts against the child
process converter; page content cannot switch it off.

A worker's program is the convert module, whole: the generator writes its
source into the tool file as `_CONVERT_SOURCE` (Open WebUI executes a tool
from a temporary file that it deletes right after, so nothing is read from a
file). When no worker can run (no interpreter to start, no process support,
an event loop that cannot watch pipes), pages are converted in a worker
thread by `_convert_budgeted` (thread_fallback.py).
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from weakref import WeakKeyDictionary

from . import convert
from .convert import _classify, _Page, _PageError, _RawPage
from .thread_fallback import _MAX_CONVERT_SECONDS, _convert_in_thread

log = logging.getLogger(__name__)

# The generated tool file holds this source as a constant (see the module doc).
_CONVERT_SOURCE = Path(convert.__file__).read_text(encoding="utf-8")

# --- snippet ---

_PIPE_SLICE_BYTES = 256 * 1024
# After this many workers in a row fail to start, pages are converted in a
# thread for `_START_RETRY_SECONDS`, then a worker is tried again.
_MAX_START_FAILURES = 3
_START_RETRY_SECONDS = 600.0
# Modules a worker imports when it starts, before its first page.
# trafilatura costs ~0.5 s to import: paid when the worker starts, once.
_WARM_IMPORTS: tuple[str, ...] = ("trafilatura",)
# The child's command line: it reads its program from stdin (a length line,
# then the source), which keeps 40 kB of code out of `ps` and out of the
# command-line length limits, runs it, then its `_converter_main`; setup and
# pages follow on the same stdin.
_CHILD_BOOT = (
    "import sys; size = int(sys.stdin.buffer.readline()); "
    "exec(compile(sys.stdin.buffer.read(size), '<deepresearch converter>', 'exec')); "
    "_converter_main()"
)


def _converter_program() -> str:
    """The converter process's program: the convert module ("" if none can run)."""
    if getattr(sys, "frozen", False) or not sys.executable:
        return ""  # no Python interpreter to start (an embedded or frozen app)
    return _CONVERT_SOURCE


def _spawn_worker() -> subprocess.Popen | None:
    """Start the interpreter of a worker (it takes milliseconds: vfork + exec)."""
    command = [sys.executable, "-I", "-S", "-c", _CHILD_BOOT]
    try:
        # Isolated (no cwd on the path, no PYTHON* variables) and without
        # `site` (~30 ms): `_converter_main` takes the server's sys.path.
        return subprocess.Popen(  # noqa: S603  (our own interpreter and code)
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        log.info("no converter process (%s): converting in a thread", exc)
        return None


class _WorkerGoneError(Exception):
    """The worker process ended, or said something that is not an answer."""


@dataclass
class _Worker:
    """One converter process; its pipes are non-blocking, watched by the loop."""

    process: subprocess.Popen

    def fd(self, name: Literal["stdin", "stdout", "stderr"]) -> int:
        stream = getattr(self.process, name)
        return -1 if stream is None or stream.closed else stream.fileno()


# A page converted in a thread instead: `_convert_in_thread`'s signature.
ThreadConverter = Callable[[_RawPage, int], Awaitable[_Page]]


@dataclass
class _ConverterState:
    """The child program, the warm workers and what failed when starting one.

    The process has one (`_CONVERTER`); a visit call may be given another
    (its seams), with its own program, limits, process starter, thread
    fallback and clock.
    """

    program: str
    start_failures: int = 0  # workers in a row that failed to start
    disabled_until: float = 0.0  # `clock()` until which threads are used
    # Busy workers at once per event loop.
    max_children: int = max(2, min(8, os.cpu_count() or 2))
    max_idle: int = 2  # warm workers kept between pages
    idle: list[_Worker] = field(default_factory=list)
    dying: list[subprocess.Popen] = field(default_factory=list)  # killed, not reaped
    owner: int = field(default_factory=os.getpid)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Not a string annotation: dataclasses would look this module up in
    # sys.modules, where a tool loaded from a file may not be.
    slots: WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = field(
        default_factory=WeakKeyDictionary
    )
    # Starts a worker's interpreter (None when none can start).
    spawn: Callable[[], subprocess.Popen | None] = _spawn_worker
    # Converts a page when no worker can.
    in_thread: ThreadConverter = _convert_in_thread
    clock: Callable[[], float] = time.monotonic

    def slot(self) -> asyncio.Semaphore:
        """This event loop's limit on busy workers."""
        loop = asyncio.get_running_loop()
        semaphore = self.slots.get(loop)
        if semaphore is None:
            semaphore = self.slots[loop] = asyncio.Semaphore(self.max_children)
        return semaphore

    def usable(self) -> bool:
        """Whether pages go to a worker process (else to `_convert_budgeted`)."""
        return bool(self.program) and self.clock() >= self.disabled_until

    def take_idle(self) -> _Worker | None:
        """A warm worker that still runs, or None."""
        with self.lock:
            if self.owner != os.getpid():  # a forked server: those are not ours
                self.idle, self.dying, self.owner = [], [], os.getpid()
            while self.idle:
                worker = self.idle.pop()
                if worker.process.poll() is None:
                    return worker
                _close_pipes(worker.process)
        return None

    def keep_idle(self, worker: _Worker) -> bool:
        """Keep a worker warm for the next page; False when enough are kept."""
        with self.lock:
            if len(self.idle) >= self.max_idle or self.owner != os.getpid():
                return False
            self.idle.append(worker)
            return True

    def reap(self) -> int:
        """Collect killed workers that have exited; how many are still exiting."""
        with self.lock:
            self.dying = [p for p in self.dying if p.poll() is None]
            return len(self.dying)


_CONVERTER = _ConverterState(_converter_program())


async def _convert_page(
    raw: _RawPage, max_tokens: int, converter: _ConverterState = _CONVERTER
) -> _Page:
    """Bytes -> `_Page` off the event loop: in a worker process (or a thread).

    Args:
        raw: The page as downloaded.
        max_tokens: The reading budget.
        converter: The workers to use (the process's by default).

    Returns:
        The converted page (`_PageError` when it has no readable text).
    """
    _refuse_at_once(raw)
    if converter.usable():
        page = await _convert_in_child(raw, max_tokens, converter)
        if page is not None:
            return page
    return await converter.in_thread(raw, max_tokens)


def _refuse_at_once(raw: _RawPage) -> None:
    """Page errors the first bytes show, so no worker is needed for them."""
    if not raw.body:
        raise _PageError("the page is empty")
    kind, label = _classify(raw.content_type, raw.body)  # looks at the head only
    if kind == "binary":
        raise _PageError(f"the URL points to {label}, not a readable page")
    if kind == "pdf" and raw.truncated:
        raise _PageError("the PDF is larger than the download limit")


async def _convert_in_child(
    raw: _RawPage, max_tokens: int, converter: _ConverterState = _CONVERTER
) -> _Page | None:
    """`_convert` in a worker process; None when no worker could be started.

    A page error found by the worker is raised as usual. The caller's deadline
    bounds the page: on timeout or cancellation the worker is killed and
    reaped, so nothing goes on converting after the tool answered.
    """
    async with converter.slot(), asyncio.timeout(_MAX_CONVERT_SECONDS):
        worker = converter.take_idle() or await _start_worker(converter)
        if worker is None:
            return None
        answer: dict = {}
        try:
            answer = await _run_job(worker, raw, max_tokens)
        except _WorkerGoneError as exc:
            # Killed (the OOM killer, an administrator) or crashed: converting
            # the same document inside the server could do the same harm there.
            raise _PageError(
                "the page could not be converted (its converter was stopped)"
            ) from exc
        finally:
            if not answer or not converter.keep_idle(worker):
                await _discard(worker, converter)
    if "error" in answer:
        raise _PageError(str(answer["error"]))
    return _Page(
        raw.final_url,
        str(answer["title"]),
        str(answer["text"]),
        raw.redirects,
        str(answer.get("reading") or ""),
        _count(answer.get("page_chars")),
    )


def _count(value: Any) -> int:
    """A non-negative int from the worker's answer (0 for anything else)."""
    return value if isinstance(value, int) and value > 0 else 0


async def _run_job(worker: _Worker, raw: _RawPage, max_tokens: int) -> dict:
    """Send one page to the worker and read its answer."""
    header = {
        "size": len(raw.body),
        "url": raw.final_url,
        "content_type": raw.content_type,
        "cut": raw.truncated,
        "max_tokens": max_tokens,
        "seconds": _MAX_CONVERT_SECONDS + 5,
    }
    await _send(worker, json.dumps(header).encode() + b"\n", raw.body)
    answer = await _receive(worker)
    if not isinstance(answer, dict) or not ("error" in answer or "text" in answer):
        raise _WorkerGoneError("not a converter answer")
    return answer


async def _start_worker(converter: _ConverterState) -> _Worker | None:
    """A new worker that said it is ready; None (converting in a thread) if none."""
    process = converter.spawn()
    if process is None:
        return None
    worker = _Worker(process)
    setup = {
        "path": [entry for entry in sys.path if isinstance(entry, str)],
        "warm": list(_WARM_IMPORTS),
    }
    program = converter.program.encode()
    try:
        for name in ("stdin", "stdout", "stderr"):
            os.set_blocking(worker.fd(name), False)
        await _send(worker, b"%d\n%s" % (len(program), program))
        await _send(worker, json.dumps(setup).encode() + b"\n")
        ready = await _receive(worker) == {"ready": True}
    except _WorkerGoneError:
        ready = False
    except NotImplementedError:  # an event loop that cannot watch pipes
        log.info("the event loop cannot watch pipes: converting in threads")
        converter.disabled_until = float("inf")
        await _discard(worker, converter)
        return None
    except BaseException:  # cancelled or timed out while starting: not a failure
        await _discard(worker, converter)
        raise
    if not ready:
        await _discard(worker, converter, _stderr_tail(worker))
        converter.start_failures += 1
        if converter.start_failures >= _MAX_START_FAILURES:
            converter.start_failures = 0
            converter.disabled_until = converter.clock() + _START_RETRY_SECONDS
        return None
    converter.start_failures = 0
    _close_stream(process.stderr)  # the worker sent its stderr to /dev/null
    return worker


def _stderr_tail(worker: _Worker) -> str:
    """What a worker that failed to start wrote to stderr (its last line)."""
    fd = worker.fd("stderr")
    if fd < 0:
        return ""
    try:
        data = os.read(fd, 65536)
    except OSError:
        return ""
    return data.decode("utf-8", "replace").strip()[-300:]


async def _discard(
    worker: _Worker, converter: _ConverterState, why: str | None = None
) -> None:
    """Kill the worker if it still runs, then reap it: no process is left behind."""
    process = worker.process
    if process.poll() is None:
        with contextlib.suppress(OSError):
            process.kill()
    if why is not None:
        log.warning(
            "converter process failed to start (exit %s): %s", process.poll(), why
        )
    _close_pipes(process)
    with converter.lock:
        converter.dying.append(process)
    # A killed process is gone within milliseconds; one still exiting after a
    # second (or when this task is cancelled again) is reaped by a later call.
    for _ in range(200):
        if not converter.reap():
            return
        await asyncio.sleep(0.005)


async def _stop_idle_workers(converter: _ConverterState = _CONVERTER) -> None:
    """Stop the warm workers (a fresh one starts for the next page)."""
    while (worker := converter.take_idle()) is not None:
        await _discard(worker, converter)


def _close_pipes(process: subprocess.Popen) -> None:
    for stream in (process.stdin, process.stdout, process.stderr):
        _close_stream(stream)


def _close_stream(stream: Any) -> None:
    if stream is not None:
        with contextlib.suppress(OSError):
            stream.close()


async def _send(worker: _Worker, *parts: bytes) -> None:
    """Write to the worker's stdin slice by slice, never blocking the loop."""
    fd = worker.fd("stdin")
    for part in parts:
        view = memoryview(part)
        while view:
            try:
                written = os.write(fd, view[:_PIPE_SLICE_BYTES])
            except BlockingIOError:
                await _fd_ready(fd, write=True)
                continue
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise _WorkerGoneError("the worker stopped reading") from exc
            view = view[written:]


async def _receive(worker: _Worker) -> Any:
    """One JSON line from the worker's stdout."""
    fd = worker.fd("stdout")
    parts: list[bytes] = []
    while True:
        try:
            data = os.read(fd, 1 << 20)
        except BlockingIOError:
            await _fd_ready(fd, write=False)
            continue
        if not data:
            raise _WorkerGoneError("the worker exited")
        end = data.find(b"\n")
        if end >= 0:
            parts.append(data[:end])
            break
        parts.append(data)
    try:
        return json.loads(b"".join(parts))
    except ValueError as exc:
        raise _WorkerGoneError("the worker answered something else") from exc


async def _fd_ready(fd: int, write: bool) -> None:
    """Wait until a pipe can be read or written (NotImplementedError if no way)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    if write:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        if write:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)
