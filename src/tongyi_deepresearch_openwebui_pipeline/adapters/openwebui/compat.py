"""The one module that knows how Open WebUI differs between 0.6 and 0.12.

Everything else in the package talks to Open WebUI through these small
functions. They detect features instead of comparing version numbers:

- 0.6 and 0.8 have synchronous database classes; 0.11 and 0.12 asynchronous
  ones. `call` awaits an async function and runs a sync one in a worker
  thread, so the event loop never blocks (and an async function is never
  handed to a thread, which would only produce an un-awaited coroutine).
- 0.6 – 0.8 keep settings on ``request.app.state.config.<ENV_NAME>``; 0.11+
  in ``open_webui.models.config.Config`` under dotted keys.
- ``load_tool_module_by_id`` returns two values before 0.12 and three after.
- Tool visibility is ``access_control`` (0.6, ``None`` = public) or
  ``access_grants`` (0.8+, a public read grant).

When Open WebUI cannot be imported (tests, a bare Python), every function
returns ``None`` or an empty value instead of raising.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.metadata
import inspect
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

log = logging.getLogger(__name__)

#: Open WebUI 0.8+: every signed-in user may read the resource.
PUBLIC_READ_GRANT: dict[str, str] = {
    "principal_type": "user",
    "principal_id": "*",
    "permission": "read",
}

_FRONTMATTER_LINE = re.compile(r"^\s*([a-z_]+):\s*(.*)\s*$", re.IGNORECASE)
# Open WebUI rewrites these prefixes with a plain str.replace (see replace_imports).
_IMPORT_REWRITES = ("utils", "apps", "main", "config")


# -- finding Open WebUI ----------------------------------------------------------------


def _import(name: str) -> ModuleType | None:
    """Import an Open WebUI module, or None when it is not there."""
    try:
        return importlib.import_module(name)
    except Exception as error:  # absent or broken: treat as absent
        log.debug("cannot import %s: %s", name, type(error).__name__)
        return None


def _attr(module_name: str, name: str) -> Any:
    """An attribute of an Open WebUI module, or None."""
    module = _import(module_name)
    return getattr(module, name, None) if module is not None else None


def openwebui_available() -> bool:
    """Whether the ``open_webui`` package can be imported."""
    return _import("open_webui") is not None


def openwebui_version() -> str | None:
    """The running Open WebUI version (``"0.12.4"``), or None."""
    if not openwebui_available():
        return None
    try:
        return importlib.metadata.version("open-webui")
    except importlib.metadata.PackageNotFoundError:
        version = getattr(sys.modules.get("open_webui.env"), "VERSION", None)
        return str(version) if version else None


def running_app() -> Any:
    """The FastAPI app of the running server, or None (never imports it)."""
    return getattr(sys.modules.get("open_webui.main"), "app", None)


@contextlib.asynccontextmanager
async def replicas_lock(
    app: Any, name: str, seconds: float = 60.0
) -> AsyncIterator[bool]:
    """Hold a lock every replica of this deployment sees; yields whether it does.

    Open WebUI keeps an asyncio Redis client on ``app.state.redis`` when
    ``REDIS_URL`` is set (the deployments that run several processes). Without
    one (a single process), or with a client whose lock is not asyncio, or
    when the lock cannot be had within ``seconds``, it yields False and the
    caller goes on unlocked: the lock saves duplicate work, it never blocks.
    """
    client = getattr(getattr(app, "state", None), "redis", None)
    make_lock = getattr(client, "lock", None)
    lock = None
    if make_lock is not None:
        prefix = getattr(sys.modules.get("open_webui.env"), "REDIS_KEY_PREFIX", None)
        key = f"{prefix or 'open-webui'}:tdr:{name}"
        with contextlib.suppress(Exception):
            candidate = make_lock(key, timeout=seconds, blocking_timeout=seconds)
            if inspect.iscoroutinefunction(getattr(candidate, "acquire", None)):
                lock = candidate
    acquired = False
    if lock is not None:
        with contextlib.suppress(Exception):
            acquired = bool(await lock.acquire())
    try:
        yield acquired
    finally:
        if acquired and lock is not None:
            with contextlib.suppress(Exception):
                await lock.release()


# -- how a streamed pipe reply ends ----------------------------------------------------

# 0.6 and 0.8 end a streamed pipe reply with the finish chunk and ``data: [DONE]``
# only when the pipe returned a str or a *sync* generator; an async generator's
# stream just stops (0.11+ end every stream). This is that guard's source text.
_SYNC_ONLY_STREAM_END = re.compile(
    r"isinstance\(res,\s*str\)\s*or\s*isinstance\(res,\s*Generator\)\s*:"
)
_STREAM_END_CHECKS: dict[str, bool] = {}


def _host_ends_async_streams_now() -> bool:
    """Read Open WebUI's pipe runner once (blocking: a source file read)."""
    module = _import("open_webui.functions")
    if module is None:
        return True  # no Open WebUI, nobody to compensate for
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return True  # unknown: never risk a doubled end
    return _SYNC_ONLY_STREAM_END.search(source) is None


async def host_ends_async_streams(*, cache: dict[str, bool] | None = None) -> bool:
    """Whether Open WebUI itself ends a pipe's streamed async-generator reply.

    False on 0.6 and 0.8: there an API client streaming from the pipe gets
    neither a ``finish_reason`` nor ``data: [DONE]`` unless the pipe sends
    them. Detected from Open WebUI's own code, read once off the event loop.

    Args:
        cache: Where the answer is kept (default: the process's, since Open
            WebUI's code does not change while it runs; a test that swaps
            the code in passes a fresh one).
    """
    checks = _STREAM_END_CHECKS if cache is None else cache
    if "result" not in checks:
        checks["result"] = await asyncio.to_thread(_host_ends_async_streams_now)
    return checks["result"]


def stream_end(model: str) -> list[str]:
    """The lines Open WebUI 0.11+ itself sends after a streamed pipe reply.

    A finish chunk (``finish_reason: "stop"``) and ``data: [DONE]``, as raw
    ``data:`` lines: Open WebUI passes those through unchanged.
    """
    finish = {
        "id": f"{model}-{uuid.uuid4()}",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "logprobs": None, "finish_reason": "stop"}],
        "object": "chat.completion.chunk",
    }
    return [f"data: {json.dumps(finish)}", "data: [DONE]"]


# -- how reasoning reaches a chat in the browser ---------------------------------------

# 0.6's middleware makes a reasoning block of each ``<think>`` in a reply's text,
# but it cuts the text at the tag out of the whole message so far, not out of
# the text block it is in (``before_tag = content[: match.start()]``), and makes
# that the current text block: from the third reasoning block on, every tool
# card before the last one is copied again (a 40-round research showed 667
# cards for 39, 4 MB that the browser's session stopped receiving). Its
# ``reasoning_content`` deltas make the same blocks without that. 0.8+ cut the
# current block's own text (``item_text[: match.start()]``).
_THINK_CUT_FROM_WHOLE_TEXT = re.compile(
    r"before_tag\s*=\s*content\[\s*:\s*match\.start\(\)\s*\]"
)
#: What 0.6 needs in a request's metadata to read the reply into a saved chat
#: (a browser's turn); without them the stream goes to the API caller as it is.
_CHAT_TURN_KEYS = ("session_id", "chat_id", "message_id")
#: Per middleware module file: whether its ``<think>`` handling copies text.
_THINK_CUT_CHECKS: dict[str, bool] = {}


def _cuts_from_whole_text(module: ModuleType) -> bool:
    """Read Open WebUI's middleware once (blocking: a source file read)."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return False  # unknown: keep the text as every version renders it
    return _THINK_CUT_FROM_WHOLE_TEXT.search(source) is not None


async def reasoning_goes_apart(metadata: Mapping[str, Any] | None) -> bool:
    """Whether this reply's reasoning must reach Open WebUI as ``reasoning_content``.

    True for a browser's turn on 0.6, whose ``<think>`` handling copies the
    message's earlier text (see above); everywhere else the reasoning stays
    ``<think>`` text, which every version renders and API callers read.

    Args:
        metadata: The request's ``__metadata__``.
    """
    if not metadata or not all(metadata.get(key) for key in _CHAT_TURN_KEYS):
        return False
    module = _import("open_webui.utils.middleware")
    if module is None:
        return False
    key = str(getattr(module, "__file__", None) or module.__name__)
    if key not in _THINK_CUT_CHECKS:
        _THINK_CUT_CHECKS[key] = await asyncio.to_thread(_cuts_from_whole_text, module)
    return _THINK_CUT_CHECKS[key]


def reasoning_line(model: str, text: str) -> str:
    """``text`` as a streamed chunk's ``reasoning_content``, as a raw ``data:`` line.

    The chunk Open WebUI's own ``openai_chat_chunk_message_template`` writes
    for reasoning; a pipe's ``data:`` lines reach its middleware unchanged.
    """
    chunk = {
        "id": f"{model}-{uuid.uuid4()}",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "logprobs": None,
                "finish_reason": None,
                "delta": {"reasoning_content": text},
            }
        ],
        "object": "chat.completion.chunk",
    }
    return f"data: {json.dumps(chunk)}"


# -- calling sync and async alike ------------------------------------------------------


async def resolve(result: Any) -> Any:
    """Await ``result`` when it is awaitable, else return it."""
    if inspect.isawaitable(result):
        return await result
    return result


def is_async(function: Callable[..., Any]) -> bool:
    """Whether calling ``function`` returns a coroutine."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004 - async callable objects
    )


async def call(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Call an Open WebUI function without blocking the event loop.

    Async functions are awaited; sync ones (0.6/0.8 database calls, pip
    installs) run in a worker thread. A sync wrapper that still returns an
    awaitable is awaited too.
    """
    if is_async(function):
        return await function(*args, **kwargs)
    return await resolve(await asyncio.to_thread(function, *args, **kwargs))


def accepts(function: Callable[..., Any], name: str) -> bool:
    """Whether ``function`` takes a parameter called ``name`` (or ``**kwargs``)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)


def field_of(record: Any, name: str, default: Any = None) -> Any:
    """``record.name`` for models, ``record[name]`` for dicts."""
    if isinstance(record, Mapping):
        return record.get(name, default)
    return getattr(record, name, default)


def as_dict(value: Any) -> dict[str, Any]:
    """A pydantic model or mapping as a plain dict (anything else: empty)."""
    if isinstance(value, Mapping):
        return dict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        dumped = dump()
        if isinstance(dumped, Mapping):
            return dict(dumped)
    return {}


# -- configuration ---------------------------------------------------------------------


def _legacy_config(request: Any) -> Any:
    """``request.app.state.config`` (0.6 – 0.8), or None."""
    state = getattr(getattr(request, "app", None), "state", None)
    if state is None or not hasattr(state, "config"):
        return None
    return state.config


async def get_config(request: Any, key: str, env_name: str, default: Any = None) -> Any:
    """One Open WebUI setting, whichever way this version stores it.

    Args:
        request: The Starlette request (``__request__``); may be None on 0.11+.
        key: The dotted key of 0.11+ (``"code_interpreter.engine"``).
        env_name: The attribute/env name of 0.6 – 0.8 (``"CODE_INTERPRETER_ENGINE"``).
        default: Returned when the setting is missing or cannot be read.

    Returns:
        The stored value, or ``default``.
    """
    legacy = _legacy_config(request)
    if legacy is not None:
        try:
            return getattr(legacy, env_name)
        except Exception:  # unknown key on this version
            return default
    config = _attr("open_webui.models.config", "Config")
    getter = getattr(config, "get", None)
    if getter is None:
        return default
    try:
        value = await call(getter, key)
    except Exception as error:  # unreadable config: use the default
        log.debug("cannot read config %s: %s", key, type(error).__name__)
        return default
    return default if value is None else value


# -- source handling -------------------------------------------------------------------


def _own_extract_frontmatter(content: str) -> dict[str, str]:
    """Open WebUI's frontmatter rules, for when it is not importable."""
    lines = content.splitlines()
    if not lines or lines[0].strip() != '"""':
        return {}
    found: dict[str, str] = {}
    for line in lines[1:]:
        if '"""' in line:
            break
        match = _FRONTMATTER_LINE.match(line)
        if match:
            found[match.group(1).strip()] = match.group(2).strip()
    return found


def extract_frontmatter(content: str) -> dict[str, str]:
    """The ``key: value`` header of a Tools/Function file, as Open WebUI reads it."""
    extractor = _attr("open_webui.utils.plugin", "extract_frontmatter")
    if callable(extractor):
        try:
            result = extractor(content)
        except Exception:  # fall back to the same rules
            result = None
        if isinstance(result, dict):
            return {str(k): str(v) for k, v in result.items()}
    return _own_extract_frontmatter(content)


def replace_imports(content: str) -> str:
    """Apply Open WebUI's import rewriting, exactly as its create/update does."""
    replacer = _attr("open_webui.utils.plugin", "replace_imports")
    if callable(replacer):
        try:
            result = replacer(content)
        except Exception:  # fall back to the same rules
            result = None
        if isinstance(result, str):
            return result
    for name in _IMPORT_REWRITES:
        content = content.replace(f"from {name}", f"from open_webui.{name}")
    return content


# -- users -----------------------------------------------------------------------------


async def get_admin_user_id() -> str | None:
    """The id of the first admin user, or None (no users yet, or no database)."""
    users = _attr("open_webui.models.users", "Users")
    if users is None:
        return None
    for method in ("get_super_admin_user", "get_first_user"):
        getter = getattr(users, method, None)
        if getter is None:
            continue
        user = await call(getter)
        if user is not None and field_of(user, "role") == "admin":
            return str(field_of(user, "id"))
    return None


async def user_has_permission(
    request: Any, user: Mapping[str, Any] | None, permission: str
) -> bool:
    """Whether ``user`` holds a workspace/feature permission (admins always do).

    Returns False when the check cannot be made, so a feature stays off rather
    than open when this Open WebUI version is not understood.
    """
    if not user:
        return False
    if user.get("role") == "admin":
        return True
    checker = _attr("open_webui.utils.access_control", "has_permission")
    if checker is None:
        return False
    defaults = await get_config(request, "user.permissions", "USER_PERMISSIONS", {})
    try:
        return bool(await call(checker, str(user.get("id", "")), permission, defaults))
    except Exception as error:  # deny when unsure
        log.info("permission check %s failed: %s", permission, type(error).__name__)
        return False


# -- the tool registry -----------------------------------------------------------------


def _tools_table() -> Any:
    return _attr("open_webui.models.tools", "Tools")


async def get_tool_by_id(tool_id: str) -> Any:
    """The registry row of ``tool_id`` (a ``ToolModel``), or None."""
    tools = _tools_table()
    if tools is None:
        return None
    return await call(tools.get_tool_by_id, tool_id)


def public_access_fields(form_class: Any) -> dict[str, Any]:
    """The ``ToolForm`` fields that make a tool visible to every user.

    0.6 has ``access_control`` (None = public); 0.8+ ``access_grants`` (no
    grant = owner only, so the public read grant is added).
    """
    fields = getattr(form_class, "model_fields", {}) or {}
    if "access_grants" in fields:
        return {"access_grants": [dict(PUBLIC_READ_GRANT)]}
    if "access_control" in fields:
        return {"access_control": None}
    return {}


def build_tool_form(
    tool_id: str, name: str, content: str, meta: Mapping[str, Any]
) -> Any:
    """A ``ToolForm`` for this version (public read), or None."""
    form_class = _attr("open_webui.models.tools", "ToolForm")
    meta_class = _attr("open_webui.models.tools", "ToolMeta")
    if form_class is None or meta_class is None:
        return None
    # Older ToolMeta classes lack newer keys (has_user_valves, i18n): leave them out.
    known = getattr(meta_class, "model_fields", {}) or {}
    meta_object = meta_class(**{k: v for k, v in meta.items() if k in known})
    return form_class(
        id=tool_id,
        name=name,
        content=content,
        meta=meta_object,
        **public_access_fields(form_class),
    )


async def insert_new_tool(user_id: str, form: Any, specs: list[dict[str, Any]]) -> Any:
    """Insert a registry row; returns the row or None.

    0.6 – 0.11 return None on any database error (a duplicate id included);
    0.12 raises. Callers re-read the row either way.
    """
    tools = _tools_table()
    if tools is None or form is None:
        return None
    return await call(tools.insert_new_tool, user_id, form, specs)


async def update_tool_by_id(
    tool_id: str, updated: Mapping[str, Any], user_id: str | None = None
) -> Any:
    """Update a registry row (content, specs, meta …); returns the row or None.

    ``user_id`` (0.12: the author of the history entry) is passed only where
    the method takes it.
    """
    tools = _tools_table()
    if tools is None:
        return None
    method = tools.update_tool_by_id
    kwargs: dict[str, Any] = {}
    if user_id is not None and accepts(method, "user_id"):
        kwargs["user_id"] = user_id
    return await call(method, tool_id, dict(updated), **kwargs)


async def get_tool_valves_by_id(tool_id: str) -> dict[str, Any]:
    """The admin's stored valves of a registry tool (empty when none)."""
    tools = _tools_table()
    getter = getattr(tools, "get_tool_valves_by_id", None)
    if getter is None:
        return {}
    valves = await call(getter, tool_id)
    return dict(valves) if isinstance(valves, Mapping) else {}


@dataclass(frozen=True)
class LoadedTool:
    """A tool module Open WebUI loaded: its ``Tools()`` instance and header."""

    instance: Any
    frontmatter: dict[str, str] = field(default_factory=dict)
    #: The executed module (0.12 returns it; older versions do not).
    module: ModuleType | None = None


def _loaded(result: Any) -> LoadedTool:
    """Normalise the 2-tuple (0.6 – 0.11) and 3-tuple (0.12) loader results."""
    if not isinstance(result, tuple) or len(result) < 2:
        raise TypeError("unexpected load_tool_module_by_id result")
    module = (
        result[2] if len(result) > 2 and isinstance(result[2], ModuleType) else None
    )
    frontmatter = result[1] if isinstance(result[1], dict) else {}
    return LoadedTool(result[0], dict(frontmatter), module)


async def load_tool_module_by_id(
    tool_id: str, content: str | None = None
) -> LoadedTool | None:
    """Load a tool the way Open WebUI does (from ``content`` or from the database).

    With ``content``, Open WebUI also installs the file's ``requirements``
    (unless its settings turn that off). Returns None when Open WebUI is not
    importable; load errors propagate.
    """
    loader = _attr("open_webui.utils.plugin", "load_tool_module_by_id")
    if loader is None:
        return None
    return _loaded(await call(loader, tool_id, content=content))


def unwrap_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``{"type": "function", "function": {…}}`` → ``{…}`` (the stored form)."""
    inner = spec.get("function")
    if spec.get("type") == "function" and isinstance(inner, Mapping):
        return dict(inner)
    return dict(spec)


def get_tool_specs(instance: Any) -> list[dict[str, Any]]:
    """The registry specs of a ``Tools()`` instance.

    Always unwrapped ``{name, description, parameters}``, as Open WebUI stores
    and reads them.
    """
    builder = _attr("open_webui.utils.tools", "get_tool_specs")
    if builder is None:
        return []
    return [unwrap_spec(spec) for spec in builder(instance)]


def _request_for(app: Any) -> Any:
    """The smallest request-like object Open WebUI's cache helpers accept."""
    return SimpleNamespace(app=app)


def cache_tool_module(app: Any, tool_id: str, content: str, loaded: LoadedTool) -> bool:
    """Put a freshly loaded tool into Open WebUI's module cache, as REST create does.

    Returns whether it was cached (needs the running app).
    """
    if app is None or getattr(app, "state", None) is None:
        return False
    setter = _attr("open_webui.utils.plugin", "set_tool_module_in_cache")
    if setter is not None and loaded.module is not None:
        setter(_request_for(app), tool_id, content, loaded.instance, loaded.module)
        return True
    cache_getter = _attr("open_webui.utils.plugin", "get_tools_cache")
    if cache_getter is not None:
        cache_getter(_request_for(app))[tool_id] = loaded.instance
        return True
    cache = getattr(app.state, "TOOLS", None)
    if isinstance(cache, dict):
        cache[tool_id] = loaded.instance
        return True
    return False


# -- files -----------------------------------------------------------------------------


async def get_file_by_id(file_id: str) -> Any:
    """A ``FileModel`` from Open WebUI's file store, or None."""
    files = _attr("open_webui.models.files", "Files")
    if files is None:
        return None
    try:
        return await call(files.get_file_by_id, file_id)
    except Exception as error:  # unreadable: same as missing
        log.info("cannot read file %s: %s", file_id, type(error).__name__)
        return None


def _file_access_checker() -> Callable[..., Any] | None:
    """``has_access_to_file`` (0.8+: utils.access_control.files; 0.6: routers.files)."""
    for module_name in (
        "open_webui.utils.access_control.files",
        "open_webui.routers.files",
    ):
        checker = _attr(module_name, "has_access_to_file")
        if callable(checker):
            return checker
    return None


async def user_may_read_file(file: Any, user: Mapping[str, Any]) -> bool:
    """Whether ``user`` may read ``file`` (owner, admin, or shared with them)."""
    user_id = str(user.get("id", ""))
    if user.get("role") == "admin" or (
        user_id and field_of(file, "user_id") == user_id
    ):
        return True
    checker = _file_access_checker()
    if checker is None:
        return False
    who = SimpleNamespace(id=user_id, role=user.get("role"))
    try:
        return bool(await call(checker, field_of(file, "id"), "read", who))
    except Exception as error:  # deny when unsure
        log.info("file access check failed: %s", type(error).__name__)
        return False


# -- code execution --------------------------------------------------------------------


async def execute_code_jupyter(
    base_url: str,
    code: str,
    token: str = "",
    password: str = "",
    timeout: int = 60,  # noqa: ASYNC109 - Open WebUI's own signature
) -> dict[str, Any] | None:
    """Run ``code`` on the admin's Jupyter server; None when Open WebUI lacks it.

    Returns Open WebUI's result dict (``stdout``, ``stderr``, ``result``).
    """
    runner = _attr("open_webui.utils.code_interpreter", "execute_code_jupyter")
    if runner is None:
        return None
    result = await call(runner, base_url, code, token, password, timeout)
    return as_dict(result)


def code_interpreter_blocked_modules() -> list[str]:
    """The modules listed in CODE_INTERPRETER_BLOCKED_MODULES (none by default).

    Read only from an already-loaded ``open_webui.config``: importing it runs
    database migrations.
    """
    config = sys.modules.get("open_webui.config")
    blocked = getattr(config, "CODE_INTERPRETER_BLOCKED_MODULES", None)
    if not isinstance(blocked, list | tuple):
        return []
    return [str(name).strip() for name in blocked if str(name).strip()]
