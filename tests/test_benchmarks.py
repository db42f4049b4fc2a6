"""The benchmark suite runs end to end and prints every figure.

`python -m benchmarks.run --quick` is run as a user would run it. Timings are
NOT asserted (CI machines are noisy; the quick run never fails on timing):
what is checked is that every benchmark ran, printed its figure next to its
baseline, and that the correctness checks inside (e.g. no cross-talk between
concurrent chats) held.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from benchmarks import checkpoints
from benchmarks.report import Row, table

from tongyi_deepresearch_openwebui_pipeline.adapters.checkpoint_store import (
    DirectoryStore,
)

# Runs the benchmarks (`--quick`): over a minute, so out of the quick loop
# (`-m "not slow and …"`, see pyproject.toml); the full run has it.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

# Every figure the suite must report (the start of its name in the table).
FIGURES = (
    "search: 5 queries in 1 call",
    "visit: 5 URLs in 1 call",
    "streaming throughput (pipe)",
    "time to first token (pipe)",
    "per-round overhead (pipe over HTTP)",
    "per-round time (in process, no I/O)",
    "10 chats at once, one Pipe",
    "cross-talk between chats",
    "peak memory, 10 chats",
    "event-loop lag, visit",
    "SDK stream throughput",
    "SDK time to first token",
    "worst event-loop stall",
    "heavy run, 3 rollouts + synthesis",
    "page fetches when 3 rollouts read it",
    "context 32K: rounds completed (of 12)",
    "context 32K: requests refused",
    "context 32K: peak context / served",
    "context 32K: consolidation overhead",
    "context 16K: rounds completed (of 12)",
    "context 16K: requests refused",
    "context 16K: peak context / served",
    "context 16K: consolidation overhead",
    "runner batch: questions/min at concurrency 4",
    "runner batch: questions/min at concurrency 16",
    "runner batch: wrong or missing records",
    "round-2 hostile inputs (",
    "checkpoint save, 10 rounds, directory: per round",
    "checkpoint save, 10 rounds, directory: vs a real round",
    "checkpoint save, 10 rounds, database: per round",
    "checkpoint save, 10 rounds, database: vs a real round",
    "checkpoint size after round 10",
)


@pytest.fixture(scope="module")
def quick_run() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


def _table_rows(output: str) -> dict[str, list[str]]:
    rows = {}
    for line in output.splitlines():
        if not line.startswith("| ") or line.startswith("| name "):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


def test_quick_run_completes_and_passes_its_checks(quick_run):
    assert quick_run.returncode == 0, quick_run.stdout[-3000:] + quick_run.stderr
    assert "all checks passed" in quick_run.stdout
    assert "could not run" not in quick_run.stdout


def test_quick_run_prints_every_figure_with_its_baseline(quick_run):
    rows = _table_rows(quick_run.stdout)
    for figure in FIGURES:
        matches = [cells for name, cells in rows.items() if name.startswith(figure)]
        assert matches, f"{figure!r} missing from:\n{quick_run.stdout[-3000:]}"
        name, measured, baseline, ratio, target, result = matches[0]
        assert re.search(r"\d", measured), (name, measured)
        assert result.split()[0] in ("PASS", "FAIL", "INFO"), (name, result)
        assert target, name
        if result != "INFO" and "cross-talk" not in name:
            # a timed figure always comes with its side-by-side baseline
            assert re.search(r"\d", baseline) or ratio == "—", (name, baseline)
    assert rows["cross-talk between chats"][1] == "0 problems"
    assert rows["cross-talk between chats"][5] == "PASS"
    # Research beyond the context window: the quick run's correctness checks.
    for context in ("32K", "16K"):
        rounds = rows[f"context {context}: rounds completed (of 12)"]
        refused = rows[f"context {context}: requests refused"]
        peak = rows[f"context {context}: peak context / served"]
        assert rounds[1] == "12 (answer)" and refused[1] == "0", (rounds, refused)
        assert {rounds[5], refused[5], peak[5]} == {"PASS"}, (rounds, refused, peak)
    # Checkpointing: every round saved, read back and removed, on both stores.
    for store in ("directory", "database"):
        for rounds in (10, 30):
            checks = rows[f"checkpoint save, {rounds} rounds, {store}: checks"]
            assert checks[1] == "0 problems" and checks[5] == "PASS", checks
    for rounds in (10, 30):
        assert rows[f"checkpoint size after round {rounds}"][5] == "PASS"


def test_quick_run_reports_the_machine_and_each_benchmark(quick_run):
    out = quick_run.stdout
    assert re.search(r"\d+ cores, load average [\d.]+", out)
    assert out.count("\n## ") == 15
    assert "reference wrap-up: rounds before the forced answer" in out
    assert "Why the overhead is structural" in out
    assert "max loop lag" in out and "idle loop" in out
    assert "5 one-query calls in a row" in out
    assert "round's wall time, no checkpoint" in out


def test_quick_runs_never_fail_on_timing_but_fail_on_checks():
    slow = Row("slow", "2 s", "1 s", 2.0, "≤ 1.3×", False)
    broken = Row("cross-talk", "3 problems", "—", None, "0", False, timing=False)
    fine = Row("fast", "1 s", "1 s", 1.0, "≤ 1.3×", True)
    assert not slow.fails(quick=True) and slow.fails(quick=False)
    assert broken.fails(quick=True) and broken.fails(quick=False)
    assert not fine.fails(quick=False)
    rows = _table_rows(table([slow, broken, fine], quick=True))
    assert rows["slow"][5] == "FAIL (not enforced: --quick)"
    assert rows["cross-talk"][5] == "FAIL"
    assert rows["fast"][5] == "PASS"


async def test_checkpoint_checks_name_what_went_wrong(tmp_path: Path) -> None:
    texts = checkpoints.synthetic_texts()
    store = DirectoryStore(tmp_path)
    run = await checkpoints.one_run(6, texts, store, "directory", "chat")
    assert checkpoints.problems(run, "chat") == []
    assert [save.size for save in run.saves][-1] == len(run.last)
    kept = replace(run, left_behind=True)
    assert checkpoints.problems(kept, "chat") == [
        "the finished run's checkpoint was left in the store"
    ]
    unsaved = replace(run, saves=run.saves[:-1])
    assert checkpoints.problems(unsaved, "chat") == ["5 saves for 6 rounds"]
    earlier = await checkpoints.one_run(4, texts, store, "directory", "chat")
    stale = replace(run, last=earlier.last)
    assert checkpoints.problems(stale, "chat") == [
        "the last checkpoint holds round 4 and 2 sources (expected 6, 3)"
    ]
    damaged = replace(run, last=b"{")
    assert checkpoints.problems(damaged, "chat") == [
        "the last checkpoint does not read back: it is not JSON"
    ]
    assert checkpoints.problems(run, "another chat") == [
        "the last checkpoint does not read back: it belongs to another user or chat"
    ]
