"""Fake ``open_webui`` packages, one per version shape, installed into sys.modules.

Each shape copies the *interface* of a real release (read from the 0.6.43,
0.8.12, 0.11.4 and 0.12.4 wheels) over a small in-memory database:

- "0.6": sync classes; ``ToolForm.access_control``; ToolMeta without
  ``has_user_valves``; insert returns None on a duplicate id; 2-tuple loader;
  settings on ``request.app.state.config``; ``app.state.TOOLS``.
- "0.8": as 0.6 but ``ToolForm.access_grants``.
- "0.11": async classes; ``Config.get``; ``has_user_valves``; 2-tuple loader;
  ``get_tools_cache``.
- "0.12": async; insert *raises* on a duplicate id; update takes ``user_id``
  and pops ``access_grants``; 3-tuple loader; ``set_tool_module_in_cache``.

The loader really executes the tool source in a fresh module (as Open WebUI
does), so the registry code is tested with the package's real tool files.
Sync methods record whether they ran on the event-loop thread.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import sys
import threading
import types
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import ConfigDict, create_model

SHAPES = ("0.6", "0.8", "0.11", "0.12")
SYNC_SHAPES = ("0.6", "0.8")
VERSIONS = {"0.6": "0.6.43", "0.8": "0.8.12", "0.11": "0.11.4", "0.12": "0.12.4"}


class DuplicateIdError(Exception):
    """What 0.12's insert raises when the primary key exists (IntegrityError)."""


@dataclass
class ToolRow:
    """One stored tool."""

    id: str
    user_id: str
    name: str
    content: str
    specs: list[dict[str, Any]]
    meta: dict[str, Any]
    valves: dict[str, Any] | None = None
    access_control: Any = None
    access_grants: list[dict[str, Any]] = field(default_factory=list)
    writes: int = 1


@dataclass
class FileRecord:
    """One stored file."""

    id: str
    user_id: str
    filename: str
    data: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class UserRecord:
    """One user."""

    id: str
    role: str
    name: str = "user"


class _Barrier:
    """Holds the first ``n`` reads of each tool id until all ``n`` arrived."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.counts: dict[str, int] = {}
        self.thread_barriers: dict[str, threading.Barrier] = {}
        self.async_barriers: dict[str, asyncio.Barrier] = {}
        self.lock = threading.Lock()

    def _claim(self, tool_id: str) -> bool:
        with self.lock:
            count = self.counts.get(tool_id, 0)
            self.counts[tool_id] = count + 1
            if count < self.n:
                self.thread_barriers.setdefault(tool_id, threading.Barrier(self.n))
                return True
            return False

    def wait_sync(self, tool_id: str) -> None:
        if self._claim(tool_id):
            self.thread_barriers[tool_id].wait(timeout=20)

    async def wait_async(self, tool_id: str) -> None:
        if self._claim(tool_id):
            barrier = self.async_barriers.setdefault(tool_id, asyncio.Barrier(self.n))
            async with asyncio.timeout(20):
                await barrier.wait()


class FakeOpenWebUI:
    """The in-memory state behind one fake Open WebUI install."""

    def __init__(self, shape: str) -> None:
        """Create an empty install of ``shape`` ("0.6", "0.8", "0.11", "0.12")."""
        assert shape in SHAPES
        self.shape = shape
        self.is_sync = shape in SYNC_SHAPES
        self.tools: dict[str, ToolRow] = {}
        self.users: list[UserRecord] = []
        self.files: dict[str, FileRecord] = {}
        self.config: dict[str, Any] = {}  # dotted keys (0.11+) and ENV names (0.6/0.8)
        self.permissions: dict[str, set[str]] = {}  # user id -> granted keys
        self.shared_files: dict[str, set[str]] = {}  # file id -> user ids
        self.blocked_modules: list[str] = []
        self.lock = threading.Lock()
        self.calls: list[str] = []
        self.sync_calls_on_loop_thread: list[str] = []
        self.pip_requirements: list[str] = []
        self.loaded_module_names: list[str] = []
        self.jupyter_calls: list[dict[str, Any]] = []
        self.jupyter: Callable[..., Any] | None = None
        self.insert_error: Exception | None = None
        self.wrap_specs = False
        self.barrier: _Barrier | None = None
        self.app = types.SimpleNamespace(state=types.SimpleNamespace())
        if self.is_sync:
            self.app.state.config = _LegacyConfig(self.config)
            self.app.state.TOOLS = {}
            self.app.state.TOOL_CONTENTS = {}

    # -- helpers for tests -------------------------------------------------------------
    def add_user(self, user_id: str, role: str) -> None:
        """Add a user (the first admin owns installed tools)."""
        self.users.append(UserRecord(user_id, role))

    def add_file(self, file_id: str, name: str, content: Any, **extra: Any) -> None:
        """Store an uploaded file whose extracted text is ``content``."""
        owner = extra.pop("user_id", "u1")
        data = {"content": content, **extra} if content is not None else dict(extra)
        self.files[file_id] = FileRecord(file_id, owner, name, data, {"name": name})

    def hold_first_reads(self, n: int) -> None:
        """Make the first ``n`` reads of each tool id wait for each other."""
        self.barrier = _Barrier(n)

    def request(self) -> Any:
        """A request-like object whose app holds this install's state."""
        return types.SimpleNamespace(app=self.app)

    def _record(self, name: str) -> None:
        self.calls.append(name)
        if self.is_sync and threading.current_thread() is threading.main_thread():
            self.sync_calls_on_loop_thread.append(name)

    # -- installing --------------------------------------------------------------------
    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeOpenWebUI:
        """Put the fake modules into sys.modules (undone by ``monkeypatch``)."""
        for name, module in self._modules().items():
            monkeypatch.setitem(sys.modules, name, module)
        return self

    def cleanup(self) -> None:
        """Remove the ``tool_<id>`` modules the fake loader registered."""
        for name in self.loaded_module_names:
            sys.modules.pop(name, None)

    def _modules(self) -> dict[str, types.ModuleType]:
        modules = {
            "open_webui": _module("open_webui"),
            "open_webui.env": _module("open_webui.env", VERSION=VERSIONS[self.shape]),
            "open_webui.config": _module(
                "open_webui.config",
                CODE_INTERPRETER_BLOCKED_MODULES=self.blocked_modules,
            ),
            "open_webui.main": _module("open_webui.main", app=self.app),
            "open_webui.models.tools": self._tools_module(),
            "open_webui.models.users": _module(
                "open_webui.models.users", Users=_Facade(self, _UsersImpl(self))
            ),
            "open_webui.models.files": _module(
                "open_webui.models.files", Files=_Facade(self, _FilesImpl(self))
            ),
            "open_webui.utils.plugin": self._plugin_module(),
            "open_webui.utils.tools": _module(
                "open_webui.utils.tools", get_tool_specs=self._get_tool_specs
            ),
            "open_webui.utils.code_interpreter": _module(
                "open_webui.utils.code_interpreter",
                execute_code_jupyter=self._execute_code_jupyter,
            ),
            "open_webui.utils.access_control": _module(
                "open_webui.utils.access_control",
                has_permission=self._wrap(self._has_permission),
            ),
        }
        checker = self._wrap(self._has_access_to_file)
        if self.shape == "0.6":
            modules["open_webui.routers.files"] = _module(
                "open_webui.routers.files", has_access_to_file=checker
            )
        else:
            modules["open_webui.utils.access_control.files"] = _module(
                "open_webui.utils.access_control.files", has_access_to_file=checker
            )
        if not self.is_sync:
            modules["open_webui.models.config"] = _module(
                "open_webui.models.config", Config=_ConfigClass(self)
            )
        return modules

    def _wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` as this shape exposes it: sync, or async."""
        if self.is_sync:

            @functools.wraps(function)
            def sync_call(*args: Any, **kwargs: Any) -> Any:
                self._record(function.__name__)
                return function(*args, **kwargs)

            return sync_call

        @functools.wraps(function)
        async def async_call(*args: Any, **kwargs: Any) -> Any:
            self._record(function.__name__)
            return function(*args, **kwargs)

        return async_call

    # -- models.tools ------------------------------------------------------------------
    def _tools_module(self) -> types.ModuleType:
        meta_fields: dict[str, Any] = {
            "description": (str | None, None),
            "manifest": (dict | None, {}),
        }
        if self.shape in ("0.11", "0.12"):
            meta_fields["has_user_valves"] = (bool, False)
        extra = "allow" if self.shape == "0.12" else "ignore"
        tool_meta = create_model(
            "ToolMeta", __config__=ConfigDict(extra=extra), **meta_fields
        )
        form_fields: dict[str, Any] = {
            "id": (str, ...),
            "name": (str, ...),
            "content": (str, ...),
            "meta": (tool_meta, ...),
        }
        if self.shape == "0.6":
            form_fields["access_control"] = (dict | None, None)
        else:
            form_fields["access_grants"] = (list[dict] | None, None)
        tool_form = create_model("ToolForm", **form_fields)
        return _module(
            "open_webui.models.tools",
            ToolMeta=tool_meta,
            ToolForm=tool_form,
            Tools=_ToolsTable(self),
        )

    # -- utils.plugin ------------------------------------------------------------------
    def _plugin_module(self) -> types.ModuleType:
        fake = self

        def load_sync(tool_id: str, content: str | None = None) -> Any:
            fake._record("load_tool_module_by_id")
            return fake._load(tool_id, content)

        async def load_async(tool_id: str, content: str | None = None) -> Any:
            fake._record("load_tool_module_by_id")
            return fake._load(tool_id, content)

        attrs: dict[str, Any] = {
            "load_tool_module_by_id": load_sync if self.is_sync else load_async,
            "extract_frontmatter": _frontmatter,
            "replace_imports": _replace_imports,
        }
        if self.shape == "0.11":
            attrs["get_tools_cache"] = self._tools_cache
        if self.shape == "0.12":
            attrs["set_tool_module_in_cache"] = self._set_in_cache
        attrs["get_tool_module_from_cache"] = self._wrap(self._get_from_cache)
        return _module("open_webui.utils.plugin", **attrs)

    def _load(self, tool_id: str, content: str | None) -> tuple[Any, ...]:
        if content is None:
            row = self.tools.get(tool_id)
            if row is None:
                raise RuntimeError(f"Toolkit not found: {tool_id}")
            content = row.content
            frontmatter: dict[str, str] = {}
        else:
            frontmatter = _frontmatter(content)
            self.pip_requirements.append(frontmatter.get("requirements", ""))
        kept = self.shape != "0.12"
        name = f"tool_{tool_id}" if kept else f"tool_{tool_id}_{uuid.uuid4().hex}"
        module = types.ModuleType(name)
        sys.modules[name] = module
        self.loaded_module_names.append(name)
        try:
            exec(compile(content, f"<{name}>", "exec"), module.__dict__)  # noqa: S102
        finally:
            if not kept:
                sys.modules.pop(name, None)
        frontmatter = frontmatter or _frontmatter(content)
        instance = module.Tools()
        if self.shape == "0.12":
            return instance, frontmatter, module
        return instance, frontmatter

    def _tools_cache(self, request: Any) -> dict[str, Any]:
        state = request.app.state
        if not hasattr(state, "TOOLS"):
            state.TOOLS = {}
        return state.TOOLS

    def _set_in_cache(
        self, request: Any, tool_id: str, content: str, instance: Any, module: Any
    ) -> None:
        sys.modules[f"tool_{tool_id}"] = module
        self.loaded_module_names.append(f"tool_{tool_id}")
        self._tools_cache(request)[tool_id] = instance
        state = request.app.state
        if not hasattr(state, "TOOL_CONTENTS"):
            state.TOOL_CONTENTS = {}
        state.TOOL_CONTENTS[tool_id] = content

    def _get_from_cache(self, request: Any, tool_id: str) -> tuple[Any, Any]:
        cache = self._tools_cache(request)
        if tool_id in cache:
            return cache[tool_id], None
        loaded = self._load(tool_id, None)
        cache[tool_id] = loaded[0]
        return loaded[0], loaded[1]

    # -- utils.tools -------------------------------------------------------------------
    def _get_tool_specs(self, instance: Any) -> list[dict[str, Any]]:
        specs = []
        for name in dir(instance):
            attribute = getattr(instance, name)
            if (
                name.startswith("_")
                or isinstance(attribute, type)
                or not callable(attribute)
            ):
                continue
            parameters = [
                p
                for p in inspect.signature(attribute).parameters
                if not p.startswith("__")
            ]
            spec = {
                "name": name,
                "description": (attribute.__doc__ or name).strip().splitlines()[0],
                "parameters": {
                    "type": "object",
                    "properties": {p: {"type": "string"} for p in parameters},
                    "required": parameters,
                },
            }
            specs.append(
                {"type": "function", "function": spec} if self.wrap_specs else spec
            )
        return specs

    # -- access control / code ---------------------------------------------------------
    def _has_permission(self, user_id: str, key: str, defaults: Any) -> bool:
        del defaults
        return key in self.permissions.get(user_id, set())

    def _has_access_to_file(self, file_id: str, access_type: str, user: Any) -> bool:
        return access_type == "read" and user.id in self.shared_files.get(
            file_id, set()
        )

    async def _execute_code_jupyter(
        self,
        base_url: str,
        code: str,
        token: str = "",
        password: str = "",
        timeout: int = 60,
    ) -> dict[str, Any]:
        self.jupyter_calls.append(
            {
                "base_url": base_url,
                "code": code,
                "token": token,
                "password": password,
                "timeout": timeout,
            }
        )
        if self.jupyter is None:
            return {"stdout": "", "stderr": "", "result": ""}
        result = self.jupyter(code)
        return await result if inspect.isawaitable(result) else result


# -- the tables ------------------------------------------------------------------------


class _Facade:
    """Exposes an implementation's public methods sync or async, per shape."""

    def __init__(self, fake: FakeOpenWebUI, impl: Any) -> None:
        for name in dir(impl):
            if not name.startswith("_"):
                setattr(self, name, fake._wrap(getattr(impl, name)))


class _UsersImpl:
    def __init__(self, fake: FakeOpenWebUI) -> None:
        self.fake = fake

    def get_super_admin_user(self) -> Any:
        return next((u for u in self.fake.users if u.role == "admin"), None)

    def get_first_user(self) -> Any:
        return self.fake.users[0] if self.fake.users else None


class _FilesImpl:
    def __init__(self, fake: FakeOpenWebUI) -> None:
        self.fake = fake

    def get_file_by_id(self, id: str) -> Any:
        record = self.fake.files.get(id)
        return copy.deepcopy(record)


def _ToolsTable(fake: FakeOpenWebUI) -> Any:  # noqa: N802 - reads like the class
    """The ``Tools`` singleton of this shape."""
    impl = _ToolsImpl(fake)
    table = _Facade(fake, impl)
    if fake.shape == "0.12":
        table.update_tool_by_id = fake._wrap(impl.update_tool_by_id_012)  # type: ignore[attr-defined]
    table.get_tool_by_id = _barrier_get(fake, impl)  # type: ignore[attr-defined]
    return table


def _barrier_get(fake: FakeOpenWebUI, impl: _ToolsImpl) -> Callable[..., Any]:
    """``get_tool_by_id`` that honours `FakeOpenWebUI.hold_first_reads`."""
    if fake.is_sync:

        def get_tool_by_id(id: str) -> Any:
            fake._record("get_tool_by_id")
            if fake.barrier is not None:
                fake.barrier.wait_sync(id)
            return impl.get_tool_by_id(id)

        return get_tool_by_id

    async def get_tool_by_id_async(id: str, db: Any = None) -> Any:
        del db
        fake._record("get_tool_by_id")
        if fake.barrier is not None:
            await fake.barrier.wait_async(id)
        return impl.get_tool_by_id(id)

    return get_tool_by_id_async


class _ToolsImpl:
    def __init__(self, fake: FakeOpenWebUI) -> None:
        self.fake = fake

    def get_tool_by_id(self, id: str) -> Any:
        with self.fake.lock:
            row = self.fake.tools.get(id)
            return copy.deepcopy(row)

    def insert_new_tool(self, user_id: str, form_data: Any, specs: list[dict]) -> Any:
        fake = self.fake
        if fake.insert_error is not None:
            raise fake.insert_error
        form = form_data.model_dump()
        with fake.lock:
            if form["id"] in fake.tools:
                if fake.shape == "0.12":
                    raise DuplicateIdError(form["id"])
                return None  # older versions log and return None
            row = ToolRow(
                id=form["id"],
                user_id=user_id,
                name=form["name"],
                content=form["content"],
                specs=copy.deepcopy(specs),
                meta=form["meta"],
                access_control=form.get("access_control"),
                access_grants=list(form.get("access_grants") or []),
            )
            fake.tools[row.id] = row
            return copy.deepcopy(row)

    def update_tool_by_id(self, id: str, updated: dict) -> Any:
        with self.fake.lock:
            row = self.fake.tools.get(id)
            if row is None:
                return None
            updated = dict(updated)
            grants = updated.pop("access_grants", None)
            if grants is not None:
                row.access_grants = list(grants)
            self._apply(row, updated)
            return copy.deepcopy(row)

    def update_tool_by_id_012(
        self,
        id: str,
        updated: dict,
        db: Any = None,
        user_id: str | None = None,
    ) -> Any:
        del db
        with self.fake.lock:
            row = self.fake.tools.get(id)
            if row is None:
                raise ValueError("Tool not found")
            updated = dict(updated)
            updated.pop("access_grants", None)  # 0.12 changes grants elsewhere
            self._apply(row, updated)
            self.fake.calls.append(f"update_by:{user_id}")
            return copy.deepcopy(row)

    @staticmethod
    def _apply(row: ToolRow, updated: dict[str, Any]) -> None:
        for key, value in updated.items():
            setattr(row, key, copy.deepcopy(value))
        row.writes += 1

    def get_tool_valves_by_id(self, id: str) -> Any:
        row = self.fake.tools.get(id)
        return None if row is None else dict(row.valves or {})


# -- config ----------------------------------------------------------------------------


class _LegacyConfig:
    """``request.app.state.config`` of 0.6/0.8: attributes named like the env."""

    def __init__(self, values: dict[str, Any]) -> None:
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name not in values:
            raise AttributeError(f"Config key '{name}' not found")
        return values[name]


def _ConfigClass(fake: FakeOpenWebUI) -> Any:  # noqa: N802
    """``open_webui.models.config.Config`` of 0.11+: ``await Config.get(key)``."""

    async def get(key: str, default: Any = None) -> Any:
        fake.calls.append(f"Config.get:{key}")
        return fake.config.get(key, default)

    return types.SimpleNamespace(get=get)


# -- small pieces ----------------------------------------------------------------------


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def _frontmatter(content: str) -> dict[str, str]:
    """Open WebUI's frontmatter rules (bare first line, single-line values)."""
    lines = content.splitlines()
    if not lines or lines[0].strip() != '"""':
        return {}
    found: dict[str, str] = {}
    for line in lines[1:]:
        if '"""' in line:
            break
        key, sep, value = line.partition(":")
        if sep and key.strip().replace("_", "").isalpha():
            found[key.strip()] = value.strip()
    return found


def _replace_imports(content: str) -> str:
    for name in ("utils", "apps", "main", "config"):
        content = content.replace(f"from {name}", f"from open_webui.{name}")
    return content
