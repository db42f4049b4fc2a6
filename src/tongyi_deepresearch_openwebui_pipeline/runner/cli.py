"""The ``tongyi-deepresearch`` command line: ``ask`` and ``batch``.

The only module of the runner that does I/O: it reads the arguments, files
and environment, writes the live view and progress to stderr (rendered by
`render`, which is pure) and the results to stdout or the output files, and
turns every failure into one line and an exit status.

What a person reads is never raw: everything written to stderr (the live
view, messages, logs), and the answer when stdout is a terminal, passes
through `render.terminal_safe`, since a page, the model or a server may put
control sequences in it. Written results are data and keep the text:
the answer file and piped stdout as the model wrote it (well-formed
UTF-8), JSON with every control character escaped (`results.json_line`).
Output files are checked before any research starts.

Exit statuses:

- 0: done (``ask``: an answer was given);
- 1: the research failed or no model server answered (``batch``: also when
  input lines were skipped or a record is a failed run's; the failures are
  counted, one line per distinct reason);
- 2: bad settings, arguments or files (``batch``: also an input without a
  question, or an input that is also an output);
- 130: interrupted (Ctrl-C); a batch keeps every finished record.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import logging
import os
import signal
import stat
import sys
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

from .. import __version__
from ..adapters.checkpoint_store import DirectoryStore
from ..adapters.export.bundle import FORMAT_NAMES, parse_formats
from ..adapters.openwebui.valves import Valves
from .batch import (
    ITER_FILE,
    BadLine,
    BatchState,
    Existing,
    Job,
    OutputFile,
    Question,
    RecordWriter,
    drop_lines,
    input_lines,
    jobs_to_run,
    lone_surrogate,
    output_files,
    parse_questions,
    read_existing,
    run_batch,
    too_long,
)
from .exports import (
    ask_base,
    batch_base,
    batch_directory,
    export_paths,
    exports_of,
    write_exports,
)
from .render import (
    Progress,
    TerminalRenderer,
    one_line,
    plural,
    progress_line,
    summary_table,
    terminal_safe,
)
from .research import RunnerError, open_researcher
from .results import Outcome, answer_markdown, json_line, outcome_json
from .settings import (
    SETTING_FLAGS,
    RunnerOptions,
    Settings,
    SettingsError,
    flag_of,
    load_settings,
    parse_assignments,
)

PROG = "tongyi-deepresearch"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
#: The longest failure reason shown in a batch's closing lines.
REASON_CHARS = 300

T = TypeVar("T")


def _description(name: str) -> str:
    fields = {**Valves.model_fields, **RunnerOptions.model_fields}
    text = fields[name].description or ""
    return f"{text} [{name}; env TDR_{name}]".replace("%", "%%")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of both commands."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("settings (flags > TDR_<NAME> > config file)")
    group.add_argument(
        "--config", type=Path, help="TOML config file (default: $TDR_CONFIG)"
    )
    for name in SETTING_FLAGS:
        group.add_argument(
            flag_of(name), dest=name, metavar="VALUE", help=_description(name)
        )
    group.add_argument(
        "--allow-private-urls",
        dest="ALLOW_PRIVATE_URLS",
        action="store_const",
        const=True,
        help=_description("ALLOW_PRIVATE_URLS"),
    )
    group.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other setting, by its valve name (repeatable)",
    )
    common.add_argument(
        "--heavy",
        type=int,
        default=0,
        metavar="N",
        help="heavy mode: N research rollouts at once, then one synthesis",
    )
    common.add_argument(
        "--export",
        default="",
        metavar="FORMATS",
        help="also write each research's sources and report beside the output: "
        f"any of {', '.join(FORMAT_NAMES)}, comma-separated",
    )
    common.add_argument(
        "--verbose", action="store_true", help="log details (and tracebacks)"
    )

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Tongyi DeepResearch without Open WebUI: research a "
        "question, or a JSONL file of them.",
    )
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(dest="command", required=True)
    ask = commands.add_parser(
        "ask", parents=[common], help="research one question, shown live"
    )
    ask.add_argument("question", help="the question")
    ask.add_argument(
        "--thinking", action="store_true", help="show the model's reasoning"
    )
    ask.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (answer, sources, termination, rounds, "
        "tokens, cost, seconds)",
    )
    ask.add_argument("--output", type=Path, help="write the result to this file")
    ask.add_argument("--quiet", action="store_true", help="no live view on stderr")
    batch = commands.add_parser(
        "batch",
        parents=[common],
        help="research every question of a JSONL file (resumable)",
    )
    batch.add_argument(
        "input", type=Path, help='JSONL input: {"question": …, "answer": …} a line'
    )
    where = batch.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--output", type=Path, help="JSONL results, every rollout (appended)"
    )
    where.add_argument(
        "--output-dir",
        type=Path,
        help="the lab's layout: DIR/iter1.jsonl … one file per rollout "
        "(appended; what the lab's scorers read)",
    )
    batch.add_argument(
        "--concurrency", type=int, default=4, help="questions at once (default 4)"
    )
    batch.add_argument(
        "--rollouts", type=int, default=1, help="rollouts per question (default 1)"
    )
    return parser


def _setting_flags(args: argparse.Namespace) -> dict[str, Any]:
    flags: dict[str, Any] = {name: getattr(args, name) for name in SETTING_FLAGS}
    flags["ALLOW_PRIVATE_URLS"] = args.ALLOW_PRIVATE_URLS
    flags.update(parse_assignments(args.assignments))
    return flags


def _show(text: str) -> None:
    """Write `text` to stderr as a terminal may show it."""
    sys.stderr.write(terminal_safe(text))
    sys.stderr.flush()


def _say(text: str) -> None:
    """One message (a line, or lines) on stderr."""
    _show(text if text.endswith("\n") else text + "\n")


class TerminalLogFormatter(logging.Formatter):
    """Log lines as a terminal may show them (a record may quote a page)."""

    def format(self, record: logging.LogRecord) -> str:
        """The formatted record without control sequences."""
        return terminal_safe(super().format(record))


def _configure_logging(verbose: bool) -> None:
    # Retries and tool problems are shown as events; logs only when asked.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TerminalLogFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(
        level=logging.INFO if verbose else logging.CRITICAL, handlers=[handler]
    )


def _cannot_write(path: Path, error: OSError) -> RunnerError:
    return RunnerError(f"cannot write {path}: {error.strerror or error}", code=2)


def _check_output(path: Path, *, read_back: bool) -> None:
    """Fail before any research when `path` cannot be written.

    A new file is created and removed again, an existing one opened for
    appending (not changed), so a directory, a path under a file, a missing
    directory or a read-only place is one line and exit 2 before the model
    server is even asked. Terminals, pipes and devices are left to the
    write, unless the output is read back (a batch resumes from it): then
    it must be a regular file.

    Raises:
        RunnerError: `path` cannot be written (exit 2).
    """
    try:
        mode: int | None = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as error:  # e.g. a path under a file
        raise _cannot_write(path, error) from None
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        if read_back:
            raise RunnerError(
                f"cannot write {path}: not a regular file (a batch reads its "
                "output back to resume)",
                code=2,
            )
        return
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as error:
        raise _cannot_write(path, error) from None
    os.close(descriptor)
    if mode is None:
        path.unlink(missing_ok=True)


async def _until_interrupted(work: Coroutine[Any, Any, T]) -> tuple[T | None, bool]:
    """Run `work` until it ends or SIGINT arrives: (result, interrupted).

    The first SIGINT cancels `work` (its runs close their connections and
    tools on the way out); a second one ends the process at once.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    interrupted = False

    def on_sigint() -> None:
        nonlocal interrupted
        if interrupted:
            os._exit(EXIT_INTERRUPTED)
        interrupted = True
        task.cancel()

    with contextlib.suppress(NotImplementedError, RuntimeError):  # Windows
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        return await task, False
    except asyncio.CancelledError:
        if not interrupted:
            raise
        return None, True
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)


# -- ask --------------------------------------------------------------------------


def _print_result(text: str, quiet: bool) -> None:
    """The answer on stdout: as written when piped, safe on a terminal."""
    if not quiet:
        sys.stderr.write("\n")
    sys.stdout.write(terminal_safe(text) if sys.stdout.isatty() else text)
    sys.stdout.flush()


def _today() -> dt.date:
    """The day the pages were read (the research's date, UTC)."""
    return dt.datetime.now(dt.UTC).date()


def _export_formats(args: argparse.Namespace) -> tuple[str, ...]:
    try:
        return parse_formats(args.export)
    except ValueError as error:
        raise RunnerError(f"--export: {error}", code=2) from None


def _ask_export_formats(args: argparse.Namespace) -> tuple[str, ...]:
    """``ask``'s export formats, their files checked before any research."""
    formats = _export_formats(args)
    if not formats:
        return formats
    if not args.output:
        raise RunnerError(
            "--export writes beside the output: give --output FILE", code=2
        )
    if args.output.exists() and not args.output.is_file():
        raise RunnerError(
            f"--export writes beside the output: {args.output} is not a file",
            code=2,
        )
    for path in export_paths(formats, ask_base(args.output)):
        _check_output(path, read_back=True)
    return formats


def _write_ask_exports(
    outcome: Outcome, formats: tuple[str, ...], output: Path
) -> None:
    if not formats:
        return
    files = exports_of(outcome, formats, _today())
    try:
        written = write_exports(files, ask_base(output))
    except OSError as error:
        raise _cannot_write(output.parent, error) from None
    _say("Wrote " + ", ".join(str(path) for path in written))


async def _ask(args: argparse.Namespace, settings: Settings) -> int:
    if lone_surrogate(args.question) is not None:  # bytes argv could not decode
        raise RunnerError("the question is not UTF-8 text", code=2)
    formats = _ask_export_formats(args)
    if args.output:
        _check_output(args.output, read_back=False)
    renderer = TerminalRenderer(thinking=args.thinking)

    def show(event: Any) -> None:
        text = renderer.render(event)
        if text:
            _show(text)

    checkpoints = checkpoint_store(args.output, None, settings)

    async def research() -> Outcome:
        async with open_researcher(settings, checkpoints=checkpoints) as researcher:
            return await researcher.run(
                args.question,
                heavy=args.heavy,
                sink=None if args.quiet else show,
                run_id="ask",
            )

    outcome, interrupted = await _until_interrupted(research())
    if interrupted or outcome is None:
        _say("Stopped.")
        return EXIT_INTERRUPTED
    text = json_line(outcome_json(outcome)) if args.json else answer_markdown(outcome)
    if args.output:
        try:
            args.output.write_text(text, encoding="utf-8")
        except OSError as error:  # it changed since the check: keep the answer
            _print_result(text, args.quiet)
            raise _cannot_write(args.output, error) from None
        _say(f"Wrote {args.output}")
        _write_ask_exports(outcome, formats, args.output)
    else:
        _print_result(text, args.quiet)
    if checkpoints is not None:  # the run ended: nothing is left to resume
        with contextlib.suppress(OSError):
            checkpoints.directory.rmdir()
    return EXIT_OK if outcome.finished.answer else EXIT_FAILED


# -- batch ------------------------------------------------------------------------


def _read_input(path: Path) -> tuple[list[Question], list[BadLine]]:
    """The questions of the input, read line by line (a pipe will do)."""
    try:
        with path.open("rb") as handle:
            return parse_questions(input_lines(handle))
    except OSError as error:
        raise RunnerError(
            f"cannot read {path}: {error.strerror or error}", code=2
        ) from None


def _same_file(one: Path, other: Path) -> bool:
    """Whether two paths name one existing file (links and spellings aside)."""
    try:
        return os.path.samefile(one, other)
    except OSError:  # one is missing (or unreadable): not the same file
        return False


def _check_outputs(args: argparse.Namespace, outputs: list[OutputFile]) -> None:
    """Fail before any research when the results cannot go where asked.

    Raises:
        RunnerError: An output is the input, or cannot be written (exit 2).
    """
    for output in outputs:
        if _same_file(args.input, output.path):
            raise RunnerError(
                f"{args.input} is both the input and an output: write the "
                "results to another file",
                code=2,
            )
    if args.output_dir is not None:
        try:
            args.output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise _cannot_write(args.output_dir, error) from None
    for output in outputs:
        _check_output(output.path, read_back=True)


def _questions(args: argparse.Namespace) -> tuple[list[Question], bool]:
    """The input's questions, bad lines reported: (questions, any skipped).

    Raises:
        RunnerError: The input holds no question (exit 2).
    """
    questions, bad = _read_input(args.input)
    for line in bad:
        _say(f"{args.input}:{line.line}: {line.reason}; line skipped")
    if not questions:
        why = "every line was skipped" if bad else "the file is empty"
        raise RunnerError(f"{args.input} holds no question ({why})", code=2)
    return questions, bool(bad)


def _existing(outputs: list[OutputFile]) -> dict[Path, Existing]:
    """What each output already holds, its lines reported as it goes."""
    found: dict[Path, Existing] = {}
    for output in outputs:
        path = output.path
        try:
            existing = read_existing(path, output.rollout)
        except OSError as error:
            raise RunnerError(
                f"cannot resume from {path}: {error.strerror or error}", code=2
            ) from None
        if existing.repaired:
            _say(f"{path}: an unfinished last record was cut off (it runs again)")
        for number in existing.unreadable:
            _say(f"{path}:{number}: not a record; left as it is")
        for number in existing.too_long:
            _say(f"{path}:{number}: {too_long()}, not read; left as it is")
        found[path] = existing
    return found


def _progress_writer(state: BatchState) -> Callable[[dict[str, Any]], None]:
    live = sys.stderr.isatty()

    def show(_record: dict[str, Any]) -> None:
        line = progress_line(
            Progress(
                done=state.skipped + state.done,
                total=state.total,
                errors=state.errors,
                running=state.running,
                skipped=state.skipped,
                seconds=time.monotonic() - state.started,
            )
        )
        line = terminal_safe(line)
        sys.stderr.write(f"\r\x1b[2K{line}" if live else f"{line}\n")
        sys.stderr.flush()

    return show


@dataclass
class _Plan:
    """What a batch runs, and where its records go."""

    outputs: list[OutputFile]
    jobs: list[Job]
    skipped: int
    #: Per output file, the byte ranges of failed records asked again.
    stale: dict[Path, list[tuple[int, int]]]
    #: How the results are named in messages: the file or the directory.
    where: Path


def _plan(args: argparse.Namespace, questions: list[Question]) -> _Plan:
    outputs = output_files(args.output, args.output_dir, args.rollouts)
    existing = _existing(outputs)
    done = {key for found in existing.values() for key in found.done}
    jobs, skipped = jobs_to_run(questions, args.rollouts, done)
    # A failed record of the input's questions goes: it is asked again, or
    # a run of it that ended is there too. A scorer sees one of each.
    asked = {(q.question, k) for q in questions for k in range(1, args.rollouts + 1)}
    stale = {
        path: found.failed_lines(asked & set(found.failed))
        for path, found in existing.items()
    }
    where = args.output_dir if args.output_dir is not None else args.output
    return _Plan(outputs, jobs, skipped, stale, where)


def _drop_stale(plan: _Plan) -> int:
    """Drop the failed records asked again; how many went."""
    dropped = 0
    for path, spans in plan.stale.items():
        if not spans:
            continue
        try:
            drop_lines(path, spans)
        except OSError as error:
            raise _cannot_write(path, error) from None
        dropped += len(spans)
    return dropped


def _say_failures(state: BatchState) -> None:
    """How many records failed and why: one line per distinct reason."""
    count = sum(state.failures.values())
    if not count:
        return
    them = "it" if count == 1 else "them"
    _say(
        f"{plural(count, 'record')} failed (run the same command again to ask "
        f"{them} again):"
    )
    for reason, times in state.failures.most_common():
        _say(f"  {times} × {one_line(reason, REASON_CHARS)}")


async def _batch(args: argparse.Namespace, settings: Settings) -> int:
    formats = _export_formats(args)
    if args.concurrency < 1 or args.rollouts < 1:
        raise RunnerError("--concurrency and --rollouts must be at least 1", code=2)
    _check_outputs(args, output_files(args.output, args.output_dir, args.rollouts))
    questions, skipped_lines = _questions(args)
    plan = _plan(args, questions)
    status = EXIT_FAILED if skipped_lines else EXIT_OK
    if not plan.jobs:
        _drop_stale(plan)  # failed records an ended run of theirs replaced
        _say(f"Nothing to do: all {plan.skipped} records are already in {plan.where}.")
        return status
    state = BatchState(total=len(plan.jobs) + plan.skipped, skipped=plan.skipped)
    checkpoints = checkpoint_store(args.output, args.output_dir, settings)
    exports_dir = batch_directory(args.output, args.output_dir)
    if formats:  # a place for them, before any research
        try:
            exports_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise _cannot_write(exports_dir, error) from None
    if plan.skipped:
        _say(f"Resuming: {plan.skipped} records already in {plan.where}.")

    async def work() -> None:
        async with open_researcher(settings, checkpoints=checkpoints) as researcher:
            # The server answers: only now are failed records given up.
            dropped = _drop_stale(plan)
            if dropped:
                _say(f"Asking again: {plural(dropped, 'failed record')} replaced.")

            async def research(job: Job) -> Outcome:
                outcome = await researcher.run(
                    job.question.question,
                    heavy=args.heavy,
                    run_id=f"{job.rollout_id}:{job.question.question}",
                )
                if formats and outcome.finished.reason != "error":
                    base = batch_base(exports_dir, job.question.line, job.rollout_id)
                    files = exports_of(outcome, formats, _today())
                    try:
                        await asyncio.to_thread(write_exports, files, base)
                    except OSError as error:  # the research is kept all the same
                        _say(
                            f"Exports of line {job.question.line} not written: "
                            f"{type(error).__name__}: {error.strerror or error}"
                        )
                return outcome

            with contextlib.ExitStack() as files:
                writers = {
                    output.rollout: RecordWriter(
                        files.enter_context(_open_for_records(output.path))
                    )
                    for output in plan.outputs
                }

                def writer_for(rollout: int) -> RecordWriter:
                    # One file for all (None), or the lab's file of the rollout.
                    return writers[None if None in writers else rollout]

                await run_batch(
                    plan.jobs,
                    research,
                    writer_for(1),
                    state,
                    concurrency=args.concurrency,
                    on_record=_progress_writer(state),
                    writer_for=writer_for,
                    redact=settings.redactor(),
                )

    _, interrupted = await _until_interrupted(work())
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    _say(summary_table(state.records))
    if interrupted:
        _say(
            f"Interrupted: {state.done} records written to {plan.where} "
            f"({state.skipped + state.done} of {state.total}); run the same "
            "command again to resume."
        )
        _say_failures(state)
        return EXIT_INTERRUPTED
    _say(f"Wrote {state.done} records to {_written_to(args, plan)}.")
    if checkpoints is not None:  # every run ended: nothing is left to resume
        with contextlib.suppress(OSError):
            checkpoints.directory.rmdir()
    _say_failures(state)
    return EXIT_FAILED if state.failures else status


def checkpoint_store(
    output: Path | None, output_dir: Path | None, settings: Settings
) -> DirectoryStore | None:
    """Where a command keeps its runs' progress: beside its output.

    ``DIR/checkpoints/`` for ``--output-dir DIR``, ``FILE.checkpoints/`` for
    ``--output FILE`` (a regular file, or one still to be made); none
    without an output, for one that is not a file (``/dev/stdout``), or with
    ``RESUME_INTERRUPTED_RUNS`` off.
    """
    if not settings.valves.RESUME_INTERRUPTED_RUNS:
        return None
    if output_dir is not None:
        return DirectoryStore(output_dir / "checkpoints")
    if output is None:
        return None
    try:
        kind = output.stat().st_mode
    except FileNotFoundError:
        kind = stat.S_IFREG
    except OSError:
        return None
    if not stat.S_ISREG(kind):
        return None
    return DirectoryStore(output.with_name(output.name + ".checkpoints"))


def _written_to(args: argparse.Namespace, plan: _Plan) -> str:
    if args.output_dir is None:
        return str(plan.where)
    files = ITER_FILE.format(rollout=1)
    if len(plan.outputs) > 1:
        files += f" … {ITER_FILE.format(rollout=len(plan.outputs))}"
    return f"{plan.where} ({files})"


def _open_for_records(path: Path) -> TextIO:
    """The batch output, opened for appending records."""
    try:
        return path.open("a", encoding="utf-8")
    except OSError as error:
        raise _cannot_write(path, error) from None


# -- main -------------------------------------------------------------------------

Command = Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]]
COMMANDS: dict[str, Command] = {"ask": _ask, "batch": _batch}


def _utf8_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="replace")


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status says how it went (see the module doc)."""
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose)
    _utf8_streams()
    settings: Settings | None = None
    try:
        settings = load_settings(_setting_flags(args), os.environ, args.config)
        if args.heavy < 0 or args.heavy == 1 or args.heavy > 8:
            raise SettingsError("--heavy takes 2 to 8 rollouts")
        return asyncio.run(COMMANDS[args.command](args, settings))
    except SettingsError as error:
        _say(f"{PROG}: {error}")
        return EXIT_USAGE
    except RunnerError as error:
        _say(f"{PROG}: {error}")
        return error.code
    except KeyboardInterrupt:
        _say("Stopped.")
        return EXIT_INTERRUPTED
    except Exception as error:
        redact = settings.redactor() if settings else (lambda text: text)
        if args.verbose:
            _say(redact("".join(traceback.format_exception(error))))
        _say(
            redact(
                f"{PROG}: unexpected error: {type(error).__name__}: {error} "
                "(--verbose shows where)"
            )
        )
        return EXIT_FAILED
