"""AUTO_INSTALL_TOOLS: installing the package's tools into Open WebUI's registry.

Unit tests run the real install code against fake registries of every version
shape (sync 0.6/0.8, async 0.11/0.12) that execute the package's real tool
files. The `e2e` test at the end runs the same code inside the real Open WebUI
0.12.4 (its own SQLite database in a temporary DATA_DIR).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.fakes.openwebui_shapes import (
    SHAPES,
    SYNC_SHAPES,
    DuplicateIdError,
    FakeOpenWebUI,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui import compat, registry
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.toolbox import (
    TOOL_MODULES,
    ToolModule,
)

NAMES = ["search", "visit"]
IDS = {"deepresearch_search", "deepresearch_visit"}
LOGGER = "tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.registry"


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    """Each test starts like a fresh process."""
    registry.reset_auto_install_state()
    yield
    registry.reset_auto_install_state()


def _install(monkeypatch: pytest.MonkeyPatch, shape: str) -> FakeOpenWebUI:
    fake = FakeOpenWebUI(shape).install(monkeypatch)
    fake.add_user("admin-1", "admin")
    return fake


@pytest.fixture(params=SHAPES)
def owui(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeOpenWebUI]:
    """A fake Open WebUI of every shape with one admin."""
    fake = _install(monkeypatch, request.param)
    yield fake
    fake.cleanup()


def packaged(name: str) -> registry.PackagedTool:
    tool = registry.packaged_tool(TOOL_MODULES[name])
    assert tool is not None
    return tool


def with_version(content: str, version: str) -> str:
    """The same source with another frontmatter version line."""
    lines = content.splitlines(keepends=True)
    return "".join(
        f"version: {version}\n" if line.startswith("version:") else line
        for line in lines
    )


# -- reading the package ---------------------------------------------------------------


def test_packaged_tools_carry_their_frontmatter() -> None:
    search = packaged("search")
    assert search.tool_id == "deepresearch_search"
    assert search.frontmatter["id"] == "deepresearch_search"
    assert search.version == search.frontmatter["version"]
    assert search.title == search.frontmatter["title"]
    missing = ToolModule("ghost", "no_such_tool", "ghost", "deepresearch_ghost")
    assert registry.packaged_tool(missing) is None


def test_names_and_ids_select_tools() -> None:
    assert {
        s.registry_id for s in registry.tool_specs_for(["search", "deepresearch_visit"])
    } == IDS
    assert registry.tool_specs_for(["nope"]) == []
    assert len(registry.tool_specs_for(None)) == len(TOOL_MODULES)


# -- first install ---------------------------------------------------------------------


async def test_first_install_creates_rows_like_rest_create(owui: FakeOpenWebUI) -> None:
    report = await registry.ensure_tools_installed(NAMES)
    assert report.statuses == dict.fromkeys(IDS, registry.CREATED)
    for name in NAMES:
        tool = packaged(name)
        row = owui.tools[tool.tool_id]
        assert row.content == compat.replace_imports(tool.content)
        assert row.name == tool.frontmatter["title"]
        assert row.user_id == "admin-1"
        assert row.meta["manifest"] == tool.frontmatter
        assert row.meta["description"] == tool.frontmatter["description"]
        assert ("has_user_valves" in row.meta) == (owui.shape in ("0.11", "0.12"))
        method = TOOL_MODULES[name].method
        assert [spec["name"] for spec in row.specs] == [method]
        assert owui.pip_requirements  # requirements handed to Open WebUI's loader
    assert owui.sync_calls_on_loop_thread == []


async def test_first_install_is_visible_to_every_user(owui: FakeOpenWebUI) -> None:
    await registry.ensure_tools_installed(NAMES)
    row = owui.tools["deepresearch_search"]
    if owui.shape == "0.6":
        assert row.access_control is None  # None = public on 0.6
    else:
        assert row.access_grants == [
            {"principal_type": "user", "principal_id": "*", "permission": "read"}
        ]


async def test_stored_specs_are_unwrapped_even_if_the_builder_wraps(
    owui: FakeOpenWebUI,
) -> None:
    owui.wrap_specs = True
    await registry.ensure_tools_installed(NAMES)
    for row in owui.tools.values():
        for spec in row.specs:
            assert set(spec) == {"name", "description", "parameters"}
            assert spec["parameters"]["type"] == "object"


async def test_installed_module_is_cached_like_rest_create(owui: FakeOpenWebUI) -> None:
    await registry.ensure_tools_installed(["search"])
    instance = owui.app.state.TOOLS["deepresearch_search"]
    assert type(instance).__name__ == "Tools"
    if owui.shape == "0.12":
        assert sys.modules["tool_deepresearch_search"].Tools is type(instance)


# -- later runs ------------------------------------------------------------------------


async def test_second_run_changes_nothing(owui: FakeOpenWebUI) -> None:
    await registry.ensure_tools_installed(NAMES)
    writes = {tool_id: row.writes for tool_id, row in owui.tools.items()}
    owui.calls.clear()
    report = await registry.ensure_tools_installed(NAMES)
    assert report.statuses == dict.fromkeys(IDS, registry.CURRENT)
    assert {tool_id: row.writes for tool_id, row in owui.tools.items()} == writes
    assert not any(call.startswith(("insert", "update")) for call in owui.calls)
    assert len(owui.tools) == 2


async def test_new_package_version_updates_content_specs_and_manifest(
    owui: FakeOpenWebUI,
) -> None:
    await registry.ensure_tools_installed(["search"])
    row = owui.tools["deepresearch_search"]
    old = with_version(row.content, "0.0.1")
    row.content = old
    row.meta = {"description": "old", "manifest": {"version": "0.0.1"}}
    row.specs = [{"name": "stale", "description": "", "parameters": {}}]
    row.valves = {"SEARXNG_URL": "http://127.0.0.1:1/search"}
    grants = list(row.access_grants)
    report = await registry.ensure_tools_installed(["search"])
    assert report.statuses == {"deepresearch_search": registry.UPDATED}
    row = owui.tools["deepresearch_search"]
    tool = packaged("search")
    assert row.content == compat.replace_imports(tool.content)
    assert row.meta["manifest"]["version"] == tool.version
    assert [spec["name"] for spec in row.specs] == ["search"]
    assert row.valves == {
        "SEARXNG_URL": "http://127.0.0.1:1/search"
    }  # admin's valves kept
    assert row.access_grants == grants  # visibility kept
    assert row.user_id == "admin-1"
    if owui.shape == "0.12":
        assert "update_by:admin-1" in owui.calls


async def test_same_version_admin_edit_is_left_alone_and_logged_once(
    owui: FakeOpenWebUI, caplog: pytest.LogCaptureFixture
) -> None:
    await registry.ensure_tools_installed(["search"])
    row = owui.tools["deepresearch_search"]
    edited = row.content + "\n# the admin's own tweak\n"
    row.content = edited
    caplog.set_level(logging.INFO, logger=LOGGER)
    first = await registry.ensure_tools_installed(["search"])
    second = await registry.ensure_tools_installed(["search"])
    assert first.statuses == second.statuses == {"deepresearch_search": registry.KEPT}
    assert owui.tools["deepresearch_search"].content == edited
    kept = [r for r in caplog.records if "left as is" in r.getMessage()]
    assert len(kept) == 1
    assert kept[0].levelno == logging.INFO


def _store_version(owui: FakeOpenWebUI, tool_id: str, version: str) -> str:
    """Make the stored row look written by release ``version``; its content."""
    row = owui.tools[tool_id]
    row.content = with_version(row.content, version)
    row.meta = {**row.meta, "manifest": {**row.meta["manifest"], "version": version}}
    return row.content


def _bump(version: str, by: int) -> str:
    """``version`` with its last number moved by ``by`` ("0.1.0", 1: "0.1.1")."""
    *head, last = version.split(".")
    return ".".join([*head, str(int(last) + by)])


async def test_a_newer_stored_version_is_never_downgraded(
    owui: FakeOpenWebUI, caplog: pytest.LogCaptureFixture
) -> None:
    """An old replica (re)started after a new one leaves the new row alone."""
    await registry.ensure_tools_installed(["search"])
    tool = packaged("search")
    # "0.1.10" > "0.1.9": a string comparison would get this one wrong.
    newer = _bump(tool.version, 10)
    content = _store_version(owui, "deepresearch_search", newer)
    writes = owui.tools["deepresearch_search"].writes
    owui.calls.clear()
    caplog.set_level(logging.INFO, logger=LOGGER)
    first = await registry.ensure_tools_installed(["search"])
    second = await registry.ensure_tools_installed(["search"])
    assert first.statuses == second.statuses == {"deepresearch_search": registry.NEWER}
    row = owui.tools["deepresearch_search"]
    assert (row.content, row.writes) == (content, writes)
    assert row.meta["manifest"]["version"] == newer
    assert not any(call.startswith(("insert", "update")) for call in owui.calls)
    lines = [r for r in caplog.records if "not downgrading" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].levelno == logging.INFO
    assert newer in lines[0].getMessage()
    assert tool.version in lines[0].getMessage()


async def test_an_older_stored_version_is_updated_once(owui: FakeOpenWebUI) -> None:
    await registry.ensure_tools_installed(["search"])
    tool = packaged("search")
    # "0.0.10" < "0.1.0" although it is the longer string.
    older = "0.0.10" if tool.version == "0.1.0" else "0.0.1"
    _store_version(owui, "deepresearch_search", older)
    writes = owui.tools["deepresearch_search"].writes
    first = await registry.ensure_tools_installed(["search"])
    second = await registry.ensure_tools_installed(["search"])
    assert first.statuses == {"deepresearch_search": registry.UPDATED}
    assert second.statuses == {"deepresearch_search": registry.CURRENT}
    row = owui.tools["deepresearch_search"]
    assert row.writes == writes + 1
    assert row.content == compat.replace_imports(tool.content)
    assert row.meta["manifest"]["version"] == tool.version


async def test_an_equal_version_is_untouched(owui: FakeOpenWebUI) -> None:
    """The same release written another way ("0.1" for "0.1.0") is not an update."""
    await registry.ensure_tools_installed(["search"])
    tool = packaged("search")
    same = tool.version.removesuffix(".0")
    assert same != tool.version
    content = _store_version(owui, "deepresearch_search", same)
    writes = owui.tools["deepresearch_search"].writes
    owui.calls.clear()
    report = await registry.ensure_tools_installed(["search"])
    # Its content differs from the package's by the version line: kept.
    assert report.statuses == {"deepresearch_search": registry.KEPT}
    row = owui.tools["deepresearch_search"]
    assert (row.content, row.writes) == (content, writes)
    assert not any(call.startswith(("insert", "update")) for call in owui.calls)


async def test_mixed_versions_rolling_upgrade_ends_on_the_newest(
    owui: FakeOpenWebUI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New replica, then an old one restarts, then the new one again: no flapping."""
    old = packaged("search")
    await registry.ensure_tools_installed(["search"])  # the old release installs
    new_version = _bump(old.version, 1)
    new = registry.PackagedTool(
        old.spec,
        with_version(old.content, new_version),
        {**old.frontmatter, "version": new_version},
    )

    def package_is(tool: registry.PackagedTool) -> None:
        monkeypatch.setattr(registry, "packaged_tool", lambda _spec: tool)

    package_is(new)
    assert (await registry.ensure_tools_installed(["search"])).statuses == {
        "deepresearch_search": registry.UPDATED
    }
    writes = owui.tools["deepresearch_search"].writes
    package_is(old)  # an old replica restarts
    assert (await registry.ensure_tools_installed(["search"])).statuses == {
        "deepresearch_search": registry.NEWER
    }
    package_is(new)
    assert (await registry.ensure_tools_installed(["search"])).statuses == {
        "deepresearch_search": registry.CURRENT
    }
    row = owui.tools["deepresearch_search"]
    assert row.writes == writes
    assert row.content == compat.replace_imports(new.content)


async def test_a_stored_row_without_a_version_is_updated(owui: FakeOpenWebUI) -> None:
    await registry.ensure_tools_installed(["search"])
    row = owui.tools["deepresearch_search"]
    row.content = "".join(
        line
        for line in row.content.splitlines(keepends=True)
        if not line.startswith("version:")
    )
    row.meta = {"description": "old", "manifest": {}}
    report = await registry.ensure_tools_installed(["search"])
    assert report.statuses == {"deepresearch_search": registry.UPDATED}
    assert owui.tools["deepresearch_search"].meta["manifest"]["version"] == (
        packaged("search").version
    )


async def test_a_version_that_cannot_be_ordered_is_left_alone(
    owui: FakeOpenWebUI, caplog: pytest.LogCaptureFixture
) -> None:
    await registry.ensure_tools_installed(["search"])
    content = _store_version(owui, "deepresearch_search", "my-own-build")
    caplog.set_level(logging.INFO, logger=LOGGER)
    report = await registry.ensure_tools_installed(["search"])
    assert report.statuses == {"deepresearch_search": registry.KEPT}
    assert owui.tools["deepresearch_search"].content == content
    assert any("cannot be compared" in r.getMessage() for r in caplog.records)


VERSION_ORDER = [
    ("0.1.0", "0.1.0", 0),
    ("0.1", "0.1.0", 0),
    ("0.1.10", "0.1.9", 1),
    ("0.0.10", "0.1.0", -1),
    ("1.0.0", "0.99.99", 1),
    ("0.2.0rc1", "0.1.0", 1),
    ("v1.2.3", "1.2.3", 0),
]


@pytest.mark.parametrize(("a", "b", "order"), VERSION_ORDER)
@pytest.mark.parametrize("with_packaging", [True, False])
def test_versions_are_ordered_by_their_numbers(
    monkeypatch: pytest.MonkeyPatch, a: str, b: str, order: int, with_packaging: bool
) -> None:
    if not with_packaging:
        # Without `packaging`: the small numeric comparison.
        monkeypatch.setitem(sys.modules, "packaging.version", None)  # type: ignore[arg-type]
    assert registry.compare_versions(a, b) == order
    assert registry.compare_versions(b, a) == -order


@pytest.mark.parametrize("with_packaging", [True, False])
def test_versions_that_cannot_be_ordered_give_none(
    monkeypatch: pytest.MonkeyPatch, with_packaging: bool
) -> None:
    if not with_packaging:
        monkeypatch.setitem(sys.modules, "packaging.version", None)  # type: ignore[arg-type]
        # Without PEP 440 a pre-release of the same numbers is not ordered.
        assert registry.compare_versions("0.1.0rc1", "0.1.0") is None
    else:
        assert registry.compare_versions("0.1.0rc1", "0.1.0") == -1
    assert registry.compare_versions("my-own-build", "0.1.0") is None
    assert registry.compare_versions("0.1.0", "") is None


async def test_a_foreign_tool_with_the_same_id_is_never_touched(
    owui: FakeOpenWebUI, caplog: pytest.LogCaptureFixture
) -> None:
    form = compat.build_tool_form(
        "deepresearch_search", "Mine", '"""\nid: my_search\nversion: 9\n"""\n', {}
    )
    await compat.insert_new_tool("admin-1", form, [])
    report = await registry.ensure_tools_installed(["search"])
    assert report.statuses == {"deepresearch_search": registry.FOREIGN}
    assert owui.tools["deepresearch_search"].name == "Mine"
    assert any("another tool" in r.getMessage() for r in caplog.records)


# -- concurrency -----------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["0.6", "0.12"])
async def test_concurrent_workers_create_exactly_one_row_per_tool(
    monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """Four "workers" read the registry at the same moment; all try to insert."""
    fake = _install(monkeypatch, shape)
    workers = 4
    fake.hold_first_reads(workers)
    try:
        reports = await asyncio.gather(
            *(registry.ensure_tools_installed(NAMES) for _ in range(workers))
        )
    finally:
        fake.cleanup()
    assert sorted(fake.tools) == sorted(IDS)
    for tool_id in IDS:
        statuses = sorted(report.statuses[tool_id] for report in reports)
        assert statuses == [registry.CREATED] + [registry.CURRENT] * (workers - 1)
    assert all(not report.errors for report in reports)


async def test_an_insert_that_loses_the_race_reads_the_row_as_installed(
    owui: FakeOpenWebUI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another replica inserts between our read and our insert, on every shape.

    The barrier test above cannot show this on the async shapes (the fake's
    reads and loads never suspend, so the last worker through the barrier
    creates the row before the others read): here the other replica's insert
    lands first, always. 0.12 raises on the duplicate primary key (its
    IntegrityError), 0.6 – 0.11 return None; either way the row is re-read,
    counted as installed, and nothing is written twice.
    """
    insert = compat.insert_new_tool
    ours: list[str] = []

    async def other_replica_first(user_id: str, form: Any, specs: list[Any]) -> Any:
        await insert("admin-other", form, specs)  # the other replica's insert wins
        try:
            row = await insert(user_id, form, specs)
        except DuplicateIdError as error:
            ours.append(type(error).__name__)
            raise
        ours.append(repr(row))
        return row

    monkeypatch.setattr(compat, "insert_new_tool", other_replica_first)
    report = await registry.ensure_tools_installed(NAMES)
    assert report.statuses == dict.fromkeys(IDS, registry.CURRENT)
    assert report.errors == {}
    expected = "DuplicateIdError" if owui.shape == "0.12" else "None"
    assert ours == [expected] * len(IDS)
    assert sorted(owui.tools) == sorted(IDS)
    for row in owui.tools.values():
        assert (row.user_id, row.writes) == ("admin-other", 1)


# -- failures --------------------------------------------------------------------------


async def test_without_open_webui_nothing_is_attempted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(sys.modules):
        if name == "open_webui" or name.startswith("open_webui."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "open_webui", None)  # type: ignore[arg-type]
    report = await registry.ensure_tools_installed(NAMES)
    assert report.skipped == "Open WebUI is not importable"
    assert not report.retry_later
    assert report.statuses == {}


async def test_waits_for_the_first_admin(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeOpenWebUI("0.12").install(monkeypatch)
    try:
        report = await registry.ensure_tools_installed(NAMES)
        assert report.skipped == "no admin user yet"
        assert report.retry_later
        assert fake.tools == {}
        fake.add_user("admin-9", "admin")
        report = await registry.ensure_tools_installed(NAMES)
        assert report.ids_with(registry.CREATED) == IDS
        assert {row.user_id for row in fake.tools.values()} == {"admin-9"}
    finally:
        fake.cleanup()


async def test_a_missing_tool_file_is_reported(
    owui: FakeOpenWebUI, monkeypatch: pytest.MonkeyPatch
) -> None:
    ghost = ToolModule("ghost", "no_such_tool", "ghost", "deepresearch_ghost")
    monkeypatch.setitem(TOOL_MODULES, "ghost", ghost)
    report = await registry.ensure_tools_installed(["ghost", "search"])
    assert report.statuses == {
        "deepresearch_ghost": registry.FAILED,
        "deepresearch_search": registry.CREATED,
    }
    assert "not in the package" in report.errors["deepresearch_ghost"]
    assert "deepresearch_ghost" not in owui.tools


@pytest.mark.parametrize("shape", SHAPES)
async def test_registry_errors_never_raise_and_are_logged_once(
    monkeypatch: pytest.MonkeyPatch, shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake = _install(monkeypatch, shape)
    fake.insert_error = RuntimeError("database is locked")
    caplog.set_level(logging.INFO, logger=LOGGER)
    try:
        for _ in range(3):
            assert registry.schedule_auto_install(["search"])
            task = registry._STATE.task
            assert task is not None
            await task
            registry._STATE.not_before = 0.0  # skip the retry pause
    finally:
        fake.cleanup()
    assert fake.tools == {}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "database is locked" in warnings[0].getMessage()


async def test_gives_up_after_repeated_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _install(monkeypatch, "0.12")
    fake.insert_error = RuntimeError("read-only database")
    try:
        for _ in range(registry.MAX_FAILED_ATTEMPTS):
            registry._STATE.not_before = 0.0
            assert registry.schedule_auto_install(["search"])
            assert registry._STATE.task is not None
            await registry._STATE.task
        registry._STATE.not_before = 0.0
        assert not registry.schedule_auto_install(["search"])
    finally:
        fake.cleanup()


# -- scheduling ------------------------------------------------------------------------


def test_schedule_without_a_running_loop_defers() -> None:
    assert registry.schedule_auto_install(NAMES) is False
    assert registry._STATE.task is None


async def test_schedule_starts_once_per_process(owui: FakeOpenWebUI) -> None:
    assert registry.schedule_auto_install(NAMES) is True
    assert registry.schedule_auto_install(NAMES) is False  # already running
    task = registry._STATE.task
    assert task is not None
    await task
    assert set(owui.tools) == IDS
    owui.calls.clear()
    assert registry.schedule_auto_install(NAMES) is False  # finished
    assert owui.calls == []


async def test_schedule_picks_up_newly_enabled_tools(owui: FakeOpenWebUI) -> None:
    assert registry.schedule_auto_install(["search"])
    assert registry._STATE.task is not None
    await registry._STATE.task
    assert registry.schedule_auto_install(["search", "visit"])
    assert registry._STATE.task is not None
    await registry._STATE.task
    assert set(owui.tools) == IDS


async def test_schedule_retries_after_the_pause_when_no_admin_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeOpenWebUI("0.6").install(monkeypatch)
    try:
        assert registry.schedule_auto_install(["search"])
        assert registry._STATE.task is not None
        await registry._STATE.task
        assert registry.schedule_auto_install(["search"]) is False  # pausing
        fake.add_user("admin-2", "admin")
        registry._STATE.not_before = 0.0
        assert registry.schedule_auto_install(["search"])
        assert registry._STATE.task is not None
        await registry._STATE.task
        assert set(fake.tools) == {"deepresearch_search"}
    finally:
        fake.cleanup()


async def test_schedule_outside_open_webui_gives_up_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "open_webui", None)  # type: ignore[arg-type]
    assert registry.schedule_auto_install(NAMES)
    assert registry._STATE.task is not None
    await registry._STATE.task
    registry._STATE.not_before = 0.0
    assert registry.schedule_auto_install(NAMES) is False


# -- the resolver strategy and valves --------------------------------------------------


async def test_registry_valves_are_the_admins(owui: FakeOpenWebUI) -> None:
    spec = TOOL_MODULES["search"]
    assert await registry.registry_tool_valves(spec) == {}
    await registry.ensure_tools_installed(["search"])
    owui.tools["deepresearch_search"].valves = {"RESULTS_PER_QUERY": 3}
    assert await registry.registry_tool_valves(spec) == {"RESULTS_PER_QUERY": 3}


@pytest.mark.parametrize("shape", SYNC_SHAPES)
async def test_sync_registries_run_in_worker_threads(
    monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    fake = _install(monkeypatch, shape)
    try:
        await registry.ensure_tools_installed(NAMES)
        await registry.registry_tool_valves(TOOL_MODULES["visit"])
    finally:
        fake.cleanup()
    assert fake.calls  # the registry was used …
    assert fake.sync_calls_on_loop_thread == []  # … never on the event loop


# -- the real Open WebUI 0.12.4 --------------------------------------------------------

OWUI_VENV = Path(os.environ.get("TDR_OWUI_VENV", "/root/.cache/tdr-owui/owui-0.12.4"))
PROBE = Path(__file__).parent / "fakes" / "owui_registry_probe.py"


def _hermetic_env(data_dir: Path) -> dict[str, str]:
    """Open WebUI settings that keep it offline and inside ``data_dir``."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(data_dir),
        "FROM_INIT_PY": "true",  # use the packaged frontend/static files
        "DATA_DIR": str(data_dir),
        "WEBUI_SECRET_KEY": "registry-test",
        "OFFLINE_MODE": "true",
        "ENABLE_VERSION_UPDATE_CHECK": "false",
        "ENABLE_OLLAMA_API": "false",
        "ENABLE_OPENAI_API": "false",
        "RAG_EMBEDDING_ENGINE": "openai",
        "RAG_OPENAI_API_BASE_URL": "http://127.0.0.1:9/v1",
    }


@pytest.mark.e2e
def test_real_open_webui_registry(tmp_path: Path) -> None:
    python = OWUI_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no Open WebUI venv at {OWUI_VENV}")
    check = subprocess.run(
        [str(python), "-c", "import tongyi_deepresearch_openwebui_pipeline"],
        capture_output=True,
        check=False,
        timeout=60,
    )
    if check.returncode != 0:
        pytest.skip("this package is not installed in the Open WebUI venv")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    completed = subprocess.run(
        [str(python), "-P", str(PROBE)],  # -P: keep tests/fakes off sys.path
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
        cwd=tmp_path,
        env=_hermetic_env(data_dir),
    )
    lines = [
        line for line in completed.stdout.splitlines() if line.startswith("PROBE ")
    ]
    assert completed.returncode == 0 and lines, completed.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("PROBE "))
    assert result["version"] == "0.12.4"
    assert result["before_admin"] == {"skipped": "no admin user yet", "rows": 0}
    assert result["first"] == dict.fromkeys(result["ids"], "created")
    assert result["second"] == dict.fromkeys(result["ids"], "current")
    assert result["edited"] == "kept"
    assert result["edit_preserved"] is True
    assert result["upgraded"] == "updated"
    assert result["upgraded_version"] == result["package_version"]
    for tool_id in result["ids"]:
        row = result["rows"][tool_id]
        assert row["user_id"] == "admin-e2e"
        assert row["public_read"] is True
        assert row["user_valves_match"] is True
        assert row["manifest_id"] == tool_id
        assert row["spec_keys"] == [["description", "name", "parameters"]]
    # A plain user gets working callables from Open WebUI's own get_tools().
    assert sorted(result["user_tools"]) == sorted(
        TOOL_MODULES[name].method for name in result["names"]
    )
    assert result["valves"] == {"RESULTS_PER_QUERY": 3}
    # The other compat seams on the real models: config, file store, permissions.
    assert result["engine"] == "pyodide"  # Open WebUI's default
    assert result["python_offered"] is False
    assert result["may_use_code"] is True  # default user permissions allow it
    assert result["parse_owner"] == (
        "['File token number: 8\\nFile content:\\n', "
        "'# File: notes.txt\\nThe uploaded file says: kiwi-42.\\n']"
    )
    assert result["parse_stranger"].endswith(
        "'# Error processing notes.txt: you do not have access to this file']"
    )


class _SharedLocks:
    """An asyncio Redis client's ``lock()``: one lock per name, as Redis keeps it."""

    def __init__(self) -> None:
        self.locks: dict[str, asyncio.Lock] = {}
        self.names: list[str] = []
        self.held: list[str] = []

    def lock(self, name: str, timeout: float, blocking_timeout: float) -> Any:
        shared = self.locks.setdefault(name, asyncio.Lock())
        registry_of = self

        class _Lock:
            async def acquire(self) -> bool:
                registry_of.names.append(name)
                await shared.acquire()
                registry_of.held.append(name)
                return True

            async def release(self) -> None:
                registry_of.held.remove(name)
                shared.release()

        return _Lock()


async def test_the_install_holds_a_lock_every_replica_sees():
    # With Redis (several replicas) each tool's install runs under a lock keyed
    # by its id, released afterwards; without Redis, nothing is locked.
    client = _SharedLocks()
    app = SimpleNamespace(state=SimpleNamespace(redis=client))
    async with compat.replicas_lock(app, "tool-install:x") as held:
        assert held
        assert client.held == ["open-webui:tdr:tool-install:x"]
    assert client.held == []
    async with compat.replicas_lock(
        SimpleNamespace(state=SimpleNamespace()), "x"
    ) as held:
        assert not held


async def test_a_second_holder_waits_for_the_first():
    client = _SharedLocks()
    app = SimpleNamespace(state=SimpleNamespace(redis=client))
    order: list[str] = []
    first_in = asyncio.Event()
    release_first = asyncio.Event()

    async def first() -> None:
        async with compat.replicas_lock(app, "k"):
            order.append("first in")
            first_in.set()
            await release_first.wait()
            order.append("first out")

    async def second() -> None:
        await first_in.wait()
        async with compat.replicas_lock(app, "k"):
            order.append("second in")

    tasks = [asyncio.create_task(first()), asyncio.create_task(second())]
    await first_in.wait()
    while len(client.names) < 2:  # the second is waiting for the lock
        await asyncio.sleep(0)
    release_first.set()
    await asyncio.gather(*tasks)
    assert order == ["first in", "first out", "second in"]


async def test_a_sync_client_or_a_failing_lock_never_blocks():
    class SyncLock:
        def acquire(self) -> bool:
            raise AssertionError("a sync lock would block the event loop")

    sync_client = SimpleNamespace(lock=lambda *a, **k: SyncLock())
    app = SimpleNamespace(state=SimpleNamespace(redis=sync_client))
    async with compat.replicas_lock(app, "k") as held:
        assert not held

    class Broken:
        async def acquire(self) -> bool:
            raise ConnectionError("redis down")

        async def release(self) -> None:
            raise AssertionError("never acquired")

    broken = SimpleNamespace(lock=lambda *a, **k: Broken())
    app = SimpleNamespace(state=SimpleNamespace(redis=broken))
    async with compat.replicas_lock(app, "k") as held:
        assert not held
