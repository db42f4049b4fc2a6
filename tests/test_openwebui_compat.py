"""The Open WebUI version seam: each function against each version shape.

The fakes (tests/fakes/openwebui_shapes.py) copy the interfaces of the real
0.6.43, 0.8.12, 0.11.4 and 0.12.4 releases: sync classes and
``request.app.state.config`` for 0.6/0.8, async classes and ``Config.get`` for
0.11/0.12, 2- or 3-tuple loaders, ``access_control`` vs ``access_grants``.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import types
from collections.abc import Iterator

import pytest

from tests.fakes.openwebui_shapes import SHAPES, SYNC_SHAPES, VERSIONS, FakeOpenWebUI
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui import compat

TOOL_SOURCE = '''"""
id: demo_tool
title: Demo Tool
version: 1.2.3
description: A demo.
requirements: httpx
"""

class Tools:
    class UserValves:
        pass

    async def add(self, a: int, b: int, __user__: dict | None = None) -> str:
        """Add two numbers."""
        return str(a + b)
'''


@pytest.fixture
def no_openwebui(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make sure no real or fake open_webui is importable."""
    for name in list(sys.modules):
        if name == "open_webui" or name.startswith("open_webui."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "open_webui", None)  # type: ignore[arg-type]


@pytest.fixture(params=SHAPES)
def owui(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeOpenWebUI]:
    """A fake Open WebUI of every version shape."""
    fake = FakeOpenWebUI(request.param).install(monkeypatch)
    yield fake
    fake.cleanup()


def make_fake(monkeypatch: pytest.MonkeyPatch, shape: str) -> FakeOpenWebUI:
    """One fake of ``shape`` (for tests that need a specific version)."""
    return FakeOpenWebUI(shape).install(monkeypatch)


# -- without Open WebUI ----------------------------------------------------------------


@pytest.mark.usefixtures("no_openwebui")
async def test_everything_is_empty_without_openwebui() -> None:
    request = types.SimpleNamespace(
        app=types.SimpleNamespace(state=types.SimpleNamespace())
    )
    assert compat.openwebui_available() is False
    assert compat.openwebui_version() is None
    assert compat.running_app() is None
    assert (
        await compat.get_config(request, "web.search.engine", "WEB_SEARCH_ENGINE", "d")
        == "d"
    )
    assert await compat.get_config(None, "x.y", "X_Y") is None
    assert await compat.get_admin_user_id() is None
    assert await compat.get_tool_by_id("deepresearch_search") is None
    assert await compat.insert_new_tool("u", object(), []) is None
    assert await compat.update_tool_by_id("x", {}) is None
    assert await compat.get_tool_valves_by_id("x") == {}
    assert await compat.load_tool_module_by_id("x", content="") is None
    assert compat.get_tool_specs(object()) == []
    assert compat.build_tool_form("x", "X", "", {}) is None
    assert compat.cache_tool_module(None, "x", "", compat.LoadedTool(object())) is False
    assert await compat.get_file_by_id("f1") is None
    assert await compat.execute_code_jupyter("http://127.0.0.1:1", "print(1)") is None
    assert compat.code_interpreter_blocked_modules() == []
    assert (
        await compat.user_has_permission(None, {"id": "u", "role": "user"}, "p")
        is False
    )


@pytest.mark.usefixtures("no_openwebui")
async def test_admins_pass_permission_checks_without_asking() -> None:
    assert (
        await compat.user_has_permission(None, {"id": "a", "role": "admin"}, "p")
        is True
    )
    assert await compat.user_has_permission(None, None, "p") is False


@pytest.mark.usefixtures("no_openwebui")
def test_own_frontmatter_rules_match_open_webui() -> None:
    assert compat.extract_frontmatter(TOOL_SOURCE) == {
        "id": "demo_tool",
        "title": "Demo Tool",
        "version": "1.2.3",
        "description": "A demo.",
        "requirements": "httpx",
    }
    # The first line must be a bare triple quote, values are single lines.
    assert compat.extract_frontmatter('"""title: X\n"""') == {}
    assert compat.extract_frontmatter('"""\ndescription: >\n  long text\n"""') == {
        "description": ">"
    }
    assert compat.extract_frontmatter("") == {}


@pytest.mark.usefixtures("no_openwebui")
def test_own_replace_imports_rewrites_like_open_webui() -> None:
    source = "from utils.x import y\nfrom configparser import z\nfrom mainly import q\n"
    assert compat.replace_imports(source) == (
        "from open_webui.utils.x import y\n"
        "from open_webui.configparser import z\n"
        "from open_webui.mainly import q\n"
    )


# -- calling sync and async ------------------------------------------------------------


async def test_resolve_awaits_only_awaitables() -> None:
    async def seven() -> int:
        return 7

    assert await compat.resolve(seven()) == 7
    assert await compat.resolve(8) == 8


async def test_call_runs_sync_functions_off_the_loop_and_awaits_async_ones() -> None:
    loop_thread = threading.current_thread()
    seen: dict[str, threading.Thread] = {}

    def sync_function(value: int) -> int:
        seen["sync"] = threading.current_thread()
        return value + 1

    async def async_function(value: int) -> int:
        seen["async"] = threading.current_thread()
        return value + 2

    assert await compat.call(sync_function, 1) == 2
    assert await compat.call(async_function, 1) == 3
    assert seen["sync"] is not loop_thread
    assert seen["async"] is loop_thread


async def test_call_awaits_a_coroutine_returned_by_a_sync_wrapper() -> None:
    async def inner() -> str:
        return "inner"

    def wrapper() -> object:
        return inner()

    assert await compat.call(wrapper) == "inner"


async def test_call_awaits_async_bound_methods_and_callable_objects() -> None:
    class Table:
        async def get(self, key: str) -> str:
            return f"got {key}"

    class AsyncCallable:
        async def __call__(self) -> str:
            return "called"

    assert compat.is_async(Table().get)
    assert compat.is_async(AsyncCallable())
    assert await compat.call(Table().get, "k") == "got k"
    assert await compat.call(AsyncCallable()) == "called"


def test_accepts_reads_signatures() -> None:
    def narrow(a: int) -> None: ...

    def wide(a: int, **kwargs: object) -> None: ...

    assert compat.accepts(narrow, "a")
    assert not compat.accepts(narrow, "user_id")
    assert compat.accepts(wide, "user_id")


# -- version and config ----------------------------------------------------------------


def test_version_comes_from_the_running_open_webui(owui: FakeOpenWebUI) -> None:
    assert compat.openwebui_available()
    assert compat.openwebui_version() == VERSIONS[owui.shape]


async def test_get_config_reads_both_styles(owui: FakeOpenWebUI) -> None:
    if owui.is_sync:
        owui.config["CODE_INTERPRETER_ENGINE"] = "jupyter"
    else:
        owui.config["code_interpreter.engine"] = "jupyter"
    request = owui.request()
    value = await compat.get_config(
        request, "code_interpreter.engine", "CODE_INTERPRETER_ENGINE", "pyodide"
    )
    assert value == "jupyter"
    missing = await compat.get_config(request, "no.such.key", "NO_SUCH_KEY", "fallback")
    assert missing == "fallback"


async def test_new_config_style_needs_no_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = make_fake(monkeypatch, "0.12")
    fake.config["web.search.engine"] = "searxng"
    assert (
        await compat.get_config(None, "web.search.engine", "WEB_SEARCH_ENGINE")
        == "searxng"
    )
    assert "Config.get:web.search.engine" in fake.calls


async def test_legacy_config_wins_when_the_app_has_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = make_fake(monkeypatch, "0.6")
    fake.config["WEB_SEARCH_ENGINE"] = "duckduckgo"
    value = await compat.get_config(
        fake.request(), "web.search.engine", "WEB_SEARCH_ENGINE"
    )
    assert value == "duckduckgo"
    assert not any(call.startswith("Config.get") for call in fake.calls)


# -- users and permissions -------------------------------------------------------------


async def test_admin_user_is_found_or_none(owui: FakeOpenWebUI) -> None:
    assert await compat.get_admin_user_id() is None
    owui.add_user("p1", "pending")
    assert await compat.get_admin_user_id() is None
    owui.add_user("a1", "admin")
    assert await compat.get_admin_user_id() == "a1"
    assert owui.sync_calls_on_loop_thread == []


async def test_permissions_are_checked_for_non_admins(owui: FakeOpenWebUI) -> None:
    user = {"id": "u1", "role": "user"}
    assert not await compat.user_has_permission(
        owui.request(), user, "features.code_interpreter"
    )
    owui.permissions["u1"] = {"features.code_interpreter"}
    assert await compat.user_has_permission(
        owui.request(), user, "features.code_interpreter"
    )


# -- the tool registry -----------------------------------------------------------------


def test_public_access_follows_the_form_fields(owui: FakeOpenWebUI) -> None:
    form_class = sys.modules["open_webui.models.tools"].ToolForm
    fields = compat.public_access_fields(form_class)
    if owui.shape == "0.6":
        assert fields == {"access_control": None}
    else:
        assert fields == {
            "access_grants": [
                {"principal_type": "user", "principal_id": "*", "permission": "read"}
            ]
        }


def test_tool_form_keeps_only_meta_keys_the_version_knows(owui: FakeOpenWebUI) -> None:
    meta = {"description": "d", "manifest": {"version": "1"}, "has_user_valves": True}
    form = compat.build_tool_form("demo_tool", "Demo", "code", meta)
    dumped = form.model_dump()
    assert dumped["meta"]["manifest"] == {"version": "1"}
    assert ("has_user_valves" in dumped["meta"]) == (owui.shape in ("0.11", "0.12"))
    if owui.shape == "0.6":
        assert dumped["access_control"] is None
    else:
        assert dumped["access_grants"] == [compat.PUBLIC_READ_GRANT]


async def test_loader_results_are_normalised(owui: FakeOpenWebUI) -> None:
    loaded = await compat.load_tool_module_by_id("demo_tool", content=TOOL_SOURCE)
    assert loaded is not None
    assert type(loaded.instance).__name__ == "Tools"
    assert loaded.frontmatter["version"] == "1.2.3"
    assert (loaded.module is not None) == (owui.shape == "0.12")
    assert owui.pip_requirements == ["httpx"]
    assert owui.sync_calls_on_loop_thread == []


async def test_specs_are_unwrapped(owui: FakeOpenWebUI) -> None:
    owui.wrap_specs = True
    loaded = await compat.load_tool_module_by_id("demo_tool", content=TOOL_SOURCE)
    assert loaded is not None
    specs = compat.get_tool_specs(loaded.instance)
    assert [spec["name"] for spec in specs] == ["add"]
    assert "type" not in specs[0]
    assert specs[0]["parameters"]["required"] == ["a", "b"]


def test_unwrap_spec_leaves_unwrapped_specs_alone() -> None:
    inner = {"name": "f", "description": "d", "parameters": {"type": "object"}}
    assert compat.unwrap_spec({"type": "function", "function": inner}) == inner
    assert compat.unwrap_spec(inner) == inner


async def test_insert_read_update_round_trip(owui: FakeOpenWebUI) -> None:
    form = compat.build_tool_form("demo_tool", "Demo", "v1", {"description": "d"})
    row = await compat.insert_new_tool("a1", form, [{"name": "add"}])
    assert row is not None
    stored = await compat.get_tool_by_id("demo_tool")
    assert compat.field_of(stored, "content") == "v1"
    updated = await compat.update_tool_by_id(
        "demo_tool", {"content": "v2"}, user_id="a1"
    )
    assert compat.field_of(updated, "content") == "v2"
    # Only 0.12's update takes the author of the change.
    assert ("update_by:a1" in owui.calls) == (owui.shape == "0.12")
    assert owui.sync_calls_on_loop_thread == []


async def test_duplicate_insert_fails_per_version(owui: FakeOpenWebUI) -> None:
    form = compat.build_tool_form("demo_tool", "Demo", "v1", {})
    await compat.insert_new_tool("a1", form, [])
    if owui.shape == "0.12":
        with pytest.raises(Exception, match="demo_tool"):
            await compat.insert_new_tool("a1", form, [])
    else:
        assert await compat.insert_new_tool("a1", form, []) is None


async def test_valves_of_a_tool(owui: FakeOpenWebUI) -> None:
    form = compat.build_tool_form("demo_tool", "Demo", "v1", {})
    await compat.insert_new_tool("a1", form, [])
    assert await compat.get_tool_valves_by_id("demo_tool") == {}
    owui.tools["demo_tool"].valves = {"API_KEY": "k"}
    assert await compat.get_tool_valves_by_id("demo_tool") == {"API_KEY": "k"}
    assert await compat.get_tool_valves_by_id("missing") == {}


async def test_module_cache_is_filled_per_version(owui: FakeOpenWebUI) -> None:
    loaded = await compat.load_tool_module_by_id("demo_tool", content=TOOL_SOURCE)
    assert loaded is not None
    assert compat.cache_tool_module(owui.app, "demo_tool", TOOL_SOURCE, loaded)
    assert owui.app.state.TOOLS["demo_tool"] is loaded.instance
    if owui.shape == "0.12":
        assert sys.modules["tool_demo_tool"] is loaded.module
        assert owui.app.state.TOOL_CONTENTS["demo_tool"] == TOOL_SOURCE
    assert compat.running_app() is owui.app


# -- files and code --------------------------------------------------------------------


async def test_files_are_read_and_access_is_checked(owui: FakeOpenWebUI) -> None:
    owui.add_file("f1", "notes.txt", "kiwi", user_id="owner")
    record = await compat.get_file_by_id("f1")
    assert compat.field_of(record, "data")["content"] == "kiwi"
    assert await compat.get_file_by_id("nope") is None
    assert await compat.user_may_read_file(record, {"id": "owner", "role": "user"})
    assert await compat.user_may_read_file(record, {"id": "boss", "role": "admin"})
    assert not await compat.user_may_read_file(record, {"id": "other", "role": "user"})
    owui.shared_files["f1"] = {"other"}
    assert await compat.user_may_read_file(record, {"id": "other", "role": "user"})
    assert owui.sync_calls_on_loop_thread == []


async def test_jupyter_is_called_with_open_webui_arguments(owui: FakeOpenWebUI) -> None:
    owui.jupyter = lambda code: {"stdout": code.upper(), "stderr": "", "result": ""}
    result = await compat.execute_code_jupyter(
        "http://127.0.0.1:8888", "abc", "t", "", 5
    )
    assert result == {"stdout": "ABC", "stderr": "", "result": ""}
    assert owui.jupyter_calls == [
        {
            "base_url": "http://127.0.0.1:8888",
            "code": "abc",
            "token": "t",
            "password": "",
            "timeout": 5,
        }
    ]


def test_blocked_modules_come_from_the_loaded_config(owui: FakeOpenWebUI) -> None:
    owui.blocked_modules.extend(["os", " subprocess ", ""])
    assert compat.code_interpreter_blocked_modules() == ["os", "subprocess"]


@pytest.mark.parametrize("shape", SYNC_SHAPES)
async def test_sync_versions_never_block_the_loop(
    monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """While a sync database call runs, the event loop keeps serving other tasks."""
    fake = make_fake(monkeypatch, shape)
    fake.add_user("a1", "admin")
    release = threading.Event()
    users = sys.modules["open_webui.models.users"].Users
    original = users.get_super_admin_user

    def slow_admin() -> object:
        release.wait(timeout=20)
        return original()

    users.get_super_admin_user = slow_admin
    lookup = asyncio.create_task(compat.get_admin_user_id())
    await asyncio.sleep(0)
    # The loop is free: this coroutine runs while the DB call is still waiting.
    assert not lookup.done()
    release.set()
    assert await lookup == "a1"
