"""Installing the package's tools into Open WebUI's tool registry (AUTO_INSTALL_TOOLS).

The pipe can run its tools straight from the package, but installed tools
show up in Workspace → Tools, where the admin sets their valves (API keys,
SearXNG URL …) and users can attach them to other models. So on startup the
pipe installs the enabled tools from the package's own files — never from the
internet — doing what Open WebUI's REST "create tool" does on each version:
``replace_imports``, load the module, ``meta.manifest`` = frontmatter,
``meta.has_user_valves``, unwrapped specs, insert with the first admin as
owner and visible to every user, then cache the module.

Rows are identified by the frontmatter ``version`` line (the release build
keeps it equal to the package version):

- no row → created;
- an older version (or none) → updated (content, specs, meta; the admin's
  valves and visibility are kept);
- a newer version → left as is (logged once at INFO): replicas of mixed
  versions share one database during a rolling upgrade, and a process with
  the older package must not downgrade what a newer one installed;
- same version but different content, or a version line that cannot be
  ordered → the admin's edit is left alone (logged once at INFO);
- a row with this id that is not ours (its frontmatter ``id`` differs) is
  never touched.

Several Open WebUI workers may start at once: an insert that loses the race
fails on the primary key, and the row is simply re-read. The work runs once
per process in a background task (`schedule_auto_install`), so the model
listing that triggers it never waits; any failure is logged once and the pipe
keeps working from its package imports.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import logging
import re
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ... import __version__
from . import compat
from .toolbox import PACKAGE, TOOL_MODULES
from .tooldef import ToolModule

log = logging.getLogger(__name__)

CREATED = "created"
UPDATED = "updated"
CURRENT = "current"
KEPT = "kept"  # an admin's edit (same or unreadable version): left as is
NEWER = "newer"  # a newer release's row (a mixed-version rollout): left as is
FOREIGN = "foreign"  # a different tool already uses the id: left as is
FAILED = "failed"

#: Seconds between attempts while no admin exists yet or after an error.
RETRY_SECONDS = 30.0
#: Attempts that failed with an error before the process gives up.
MAX_FAILED_ATTEMPTS = 5


@dataclass(frozen=True)
class PackagedTool:
    """A tool file shipped inside the package."""

    spec: ToolModule
    content: str
    frontmatter: dict[str, str]

    @property
    def tool_id(self) -> str:
        """The registry id (``deepresearch_search`` …)."""
        return self.spec.registry_id

    @property
    def version(self) -> str:
        """The file's frontmatter version (the package version if absent)."""
        return self.frontmatter.get("version") or __version__

    @property
    def title(self) -> str:
        """The name shown in Workspace → Tools."""
        return self.frontmatter.get("title") or self.tool_id


@dataclass
class InstallReport:
    """What one `ensure_tools_installed` run did, per registry id."""

    statuses: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    #: Why nothing was attempted (no Open WebUI, no admin yet), if so.
    skipped: str | None = None
    #: Whether trying again later may help (no admin yet, transient errors).
    retry_later: bool = False

    def ids_with(self, *statuses: str) -> set[str]:
        """Registry ids that ended in one of ``statuses``."""
        return {tool_id for tool_id, s in self.statuses.items() if s in statuses}


# -- package files ---------------------------------------------------------------------


def packaged_tool(spec: ToolModule) -> PackagedTool | None:
    """Read a tool's source from the installed package (None if not shipped)."""
    try:
        resource = importlib.resources.files(f"{PACKAGE}.tools") / f"{spec.module}.py"
        content = resource.read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError, OSError):
        return None
    return PackagedTool(spec, content, compat.extract_frontmatter(content))


def tool_specs_for(names: Iterable[str] | None) -> list[ToolModule]:
    """The `ToolModule` of each tool name or registry id (None: all tools)."""
    if names is None:
        return list(TOOL_MODULES.values())
    by_key = {spec.name: spec for spec in TOOL_MODULES.values()}
    by_key |= {spec.registry_id: spec for spec in TOOL_MODULES.values()}
    found: dict[str, ToolModule] = {}
    for name in names:
        spec = by_key.get(name)
        if spec is not None:
            found[spec.registry_id] = spec
    return list(found.values())


# -- logging once ----------------------------------------------------------------------


_LOGGED: set[str] = set()


def _log_once(key: str, level: int, message: str, *args: Any) -> None:
    """Log ``message`` the first time ``key`` is seen in this process."""
    if key in _LOGGED:
        return
    _LOGGED.add(key)
    log.log(level, message, *args)


# -- loading modules one at a time -----------------------------------------------------

_LOAD_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _load_lock() -> asyncio.Lock:
    """One tool-module load at a time in this process.

    Open WebUI 0.6 – 0.11 execute a tool under the fixed module name
    ``tool_<id>`` in ``sys.modules``; two loads of one tool at once would see
    each other's half-executed module (pydantic then fails to build Valves).
    """
    loop = asyncio.get_running_loop()
    lock = _LOAD_LOCKS.get(loop)
    if lock is None:
        lock = _LOAD_LOCKS[loop] = asyncio.Lock()
    return lock


# -- one tool --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prepared:
    """What REST create computes before writing: content, meta, specs."""

    content: str
    meta: dict[str, Any]
    specs: list[dict[str, Any]]
    loaded: compat.LoadedTool


async def _prepare(packaged: PackagedTool) -> _Prepared:
    """Rewrite imports, load the module and derive meta and specs."""
    content = compat.replace_imports(packaged.content)
    async with _load_lock():
        loaded = await compat.load_tool_module_by_id(packaged.tool_id, content=content)
    if loaded is None:
        raise RuntimeError("Open WebUI's tool loader is not available")
    frontmatter = loaded.frontmatter or compat.extract_frontmatter(content)
    meta = {
        "description": frontmatter.get("description", ""),
        "manifest": frontmatter,
        "has_user_valves": hasattr(loaded.instance, "UserValves"),
    }
    specs = compat.get_tool_specs(loaded.instance)
    if not specs:
        raise RuntimeError("the tool module exposes no tool functions")
    return _Prepared(content, meta, specs, loaded)


def _is_ours(row: Any, packaged: PackagedTool) -> bool:
    """Whether a stored row is this tool (its frontmatter id matches)."""
    stored = compat.extract_frontmatter(str(compat.field_of(row, "content", "") or ""))
    return stored.get("id", packaged.tool_id) == packaged.tool_id


def _stored_version(row: Any) -> str | None:
    """The version line of a stored row's content (or of its manifest)."""
    content = str(compat.field_of(row, "content", "") or "")
    version = compat.extract_frontmatter(content).get("version")
    if version:
        return version
    manifest = compat.field_of(compat.field_of(row, "meta"), "manifest") or {}
    version = compat.field_of(manifest, "version")
    return str(version) if version else None


#: A version's release numbers and what follows them ("0.2.0rc1": (0, 2), "rc1").
_RELEASE = re.compile(r"\s*v?(\d+(?:\.\d+)*)(.*)", re.IGNORECASE | re.DOTALL)


def compare_versions(a: str, b: str) -> int | None:
    """-1, 0 or 1 as version ``a`` is older than, the same as or newer than ``b``.

    PEP 440 ordering through ``packaging`` (in every Open WebUI environment:
    transformers, huggingface_hub and langchain-core need it); without it, the
    release numbers alone. None when the two cannot be ordered safely.
    """
    try:
        from packaging.version import InvalidVersion, Version  # noqa: PLC0415
    except ImportError:
        return _compare_release_numbers(a, b)
    try:
        first, second = Version(a), Version(b)
    except InvalidVersion:
        return None
    return (first > second) - (first < second)


def _compare_release_numbers(a: str, b: str) -> int | None:
    """`compare_versions` by the leading numbers ("1.2.10" > "1.2.9").

    Equal numbers with any other text after them ("1.2.0rc1" and "1.2.0")
    cannot be ordered without PEP 440, so they give None.
    """
    if a.strip() == b.strip():
        return 0
    first, second = _RELEASE.fullmatch(a), _RELEASE.fullmatch(b)
    if first is None or second is None:
        return None
    numbers = [
        tuple(int(part) for part in match.group(1).split("."))
        for match in (first, second)
    ]
    # Trailing zeros do not count: "1.2" == "1.2.0".
    x, y = (_without_trailing_zeros(n) for n in numbers)
    if x != y:
        return (x > y) - (x < y)
    return 0 if first.group(2).strip() == second.group(2).strip() else None


def _without_trailing_zeros(numbers: tuple[int, ...]) -> tuple[int, ...]:
    while numbers and numbers[-1] == 0:
        numbers = numbers[:-1]
    return numbers


async def _create(packaged: PackagedTool, owner_id: str, app: Any) -> str:
    """Insert the row; a lost race with another worker counts as current."""
    prepared = await _prepare(packaged)
    form = compat.build_tool_form(
        packaged.tool_id, packaged.title, prepared.content, prepared.meta
    )
    reason = "no row returned"  # 0.6 – 0.11 log the error and return None
    try:
        row = await compat.insert_new_tool(owner_id, form, prepared.specs)
    except Exception as error:  # 0.12 raises, e.g. on a duplicate id
        reason, row = f"{type(error).__name__}: {error}", None
    if row is not None:
        compat.cache_tool_module(
            app, packaged.tool_id, prepared.content, prepared.loaded
        )
        log.info("installed tool %s %s", packaged.tool_id, packaged.version)
        return CREATED
    if await compat.get_tool_by_id(packaged.tool_id) is not None:
        return CURRENT  # another worker inserted it first
    raise RuntimeError(f"the registry did not accept the new tool ({reason})")


async def _update(
    packaged: PackagedTool, owner_id: str, app: Any, old: str | None
) -> str:
    """Replace content, specs and meta; valves and visibility stay as they are."""
    prepared = await _prepare(packaged)
    updated = {
        "content": prepared.content,
        "specs": prepared.specs,
        "meta": prepared.meta,
    }
    row = await compat.update_tool_by_id(packaged.tool_id, updated, user_id=owner_id)
    if row is None:
        raise RuntimeError("the registry did not accept the update")
    compat.cache_tool_module(app, packaged.tool_id, prepared.content, prepared.loaded)
    log.info("updated tool %s from %s to %s", packaged.tool_id, old, packaged.version)
    return UPDATED


def _not_updated(packaged: PackagedTool, stored: str | None, order: int | None) -> str:
    """A stored version that is newer (``order`` 1) or cannot be ordered (None)."""
    if order == 1:
        # A replica with a newer package got here first (a rolling upgrade,
        # or an old replica restarted after a new one): never downgrade.
        _log_once(
            f"newer:{packaged.tool_id}:{stored}",
            logging.INFO,
            "tool %s %s is newer than this package's %s; not downgrading it",
            packaged.tool_id,
            stored,
            packaged.version,
        )
        return NEWER
    _log_once(
        f"unordered:{packaged.tool_id}:{stored}",
        logging.INFO,
        "tool %s has version %r, which cannot be compared with %s; left as is",
        packaged.tool_id,
        stored,
        packaged.version,
    )
    return KEPT


async def _install_one(packaged: PackagedTool, owner_id: str, app: Any) -> str:
    """Bring one registry row to the packaged version; returns its status."""
    row = await compat.get_tool_by_id(packaged.tool_id)
    if row is None:
        return await _create(packaged, owner_id, app)
    if not _is_ours(row, packaged):
        _log_once(
            f"foreign:{packaged.tool_id}",
            logging.WARNING,
            "tool id %s is used by another tool; not installing over it",
            packaged.tool_id,
        )
        return FOREIGN
    stored = _stored_version(row)
    # No version line: written by no release of ours, which all write one.
    order = -1 if stored is None else compare_versions(stored, packaged.version)
    if order == -1:
        return await _update(packaged, owner_id, app, stored)
    if order != 0:
        return _not_updated(packaged, stored, order)
    if compat.field_of(row, "content") != compat.replace_imports(packaged.content):
        _log_once(
            f"kept:{packaged.tool_id}:{packaged.version}",
            logging.INFO,
            "tool %s %s was edited in Open WebUI; left as is",
            packaged.tool_id,
            packaged.version,
        )
        return KEPT
    # Said once per process: with several replicas, each one's verdict shows.
    _log_once(
        f"current:{packaged.tool_id}:{packaged.version}",
        logging.INFO,
        "tool %s %s is up to date",
        packaged.tool_id,
        packaged.version,
    )
    return CURRENT


# -- all tools -------------------------------------------------------------------------


async def ensure_tools_installed(
    names: Iterable[str] | None = None, *, app: Any = None
) -> InstallReport:
    """Install or update the given tools in Open WebUI's registry. Never raises.

    Args:
        names: Tool names (``search``) or registry ids; None for all tools.
        app: The running FastAPI app for the module cache (found automatically).

    Returns:
        What happened to each registry id.
    """
    report = InstallReport()
    if not compat.openwebui_available():
        report.skipped = "Open WebUI is not importable"
        return report
    try:
        owner_id = await compat.get_admin_user_id()
    except Exception as error:  # database not ready
        report.skipped = f"cannot read users ({type(error).__name__})"
        report.retry_later = True
        return report
    if owner_id is None:
        report.skipped = "no admin user yet"
        report.retry_later = True
        return report
    app = app if app is not None else compat.running_app()
    for spec in tool_specs_for(names):
        await _install_spec(spec, owner_id, app, report)
    return report


async def _install_spec(
    spec: ToolModule, owner_id: str, app: Any, report: InstallReport
) -> None:
    """Install one tool into ``report``, turning errors into a status."""
    packaged = packaged_tool(spec)
    if packaged is None:
        report.statuses[spec.registry_id] = FAILED
        report.errors[spec.registry_id] = "the tool file is not in the package"
        return
    try:
        # Replicas starting together would each update an older row: the one
        # holding the lock does, the others then find it current.
        async with compat.replicas_lock(app, f"tool-install:{spec.registry_id}"):
            status = await _install_one(packaged, owner_id, app)
        report.statuses[spec.registry_id] = status
    except asyncio.CancelledError:
        raise
    except Exception as error:  # report, never crash the pipe
        report.statuses[spec.registry_id] = FAILED
        report.errors[spec.registry_id] = f"{type(error).__name__}: {error}"[:300]
        report.retry_later = True


# -- once per process, in the background -----------------------------------------------


@dataclass
class _AutoInstallState:
    """Module-level progress of AUTO_INSTALL_TOOLS in this process."""

    finished: set[str] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    not_before: float = 0.0
    failed_attempts: int = 0


_STATE = _AutoInstallState()


def reset_auto_install_state() -> None:
    """Forget all progress (tests; a fresh process starts clean)."""
    global _STATE  # noqa: PLW0603 - one state per process by design
    _STATE = _AutoInstallState()
    _LOGGED.clear()


def _task_running(loop: asyncio.AbstractEventLoop) -> bool:
    task = _STATE.task
    return task is not None and not task.done() and task.get_loop() is loop


def schedule_auto_install(names: Iterable[str]) -> bool:
    """Start installing ``names`` in the background, once per process.

    Cheap enough for every ``pipes()`` call: it returns at once when the
    tools are done, a run is under way, the retry pause is not over, or no
    event loop is running (then a later call starts it).

    Returns:
        Whether a background run was started by this call.
    """
    wanted = {spec.registry_id for spec in tool_specs_for(names)} - _STATE.finished
    if not wanted or time.monotonic() < _STATE.not_before:
        return False
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False  # no loop yet: the next call from async code starts it
    if _task_running(loop):
        return False
    _STATE.task = loop.create_task(_auto_install(sorted(wanted)))
    return True


async def _auto_install(ids: list[str]) -> None:
    """The background run: install, then record what is finished."""
    state = _STATE
    try:
        report = await ensure_tools_installed(ids)
    except Exception:  # pragma: no cover - ensure_tools_installed never raises
        log.exception("tool auto-install failed")
        return
    state.finished |= report.ids_with(CREATED, UPDATED, CURRENT, KEPT, NEWER, FOREIGN)
    _record_outcome(state, ids, report)


def _record_outcome(
    state: _AutoInstallState, ids: list[str], report: InstallReport
) -> None:
    """Decide whether and when to try again, and log failures once."""
    if report.skipped and not report.retry_later:
        state.finished |= set(ids)  # e.g. not inside Open WebUI: never retry
        _log_once("skip", logging.INFO, "tool auto-install skipped: %s", report.skipped)
        return
    if report.skipped:
        state.not_before = time.monotonic() + RETRY_SECONDS
        _log_once(
            f"wait:{report.skipped}",
            logging.INFO,
            "tool auto-install waits: %s",
            report.skipped,
        )
        return
    for tool_id, error in report.errors.items():
        _log_once(
            f"error:{tool_id}",
            logging.WARNING,
            "could not install tool %s: %s",
            tool_id,
            error,
        )
    if report.errors:
        state.failed_attempts += 1
        state.not_before = time.monotonic() + RETRY_SECONDS
        if state.failed_attempts >= MAX_FAILED_ATTEMPTS:
            state.finished |= set(ids)  # give up; the package imports still work


async def registry_tool_valves(spec: ToolModule) -> dict[str, Any]:
    """The admin's stored valves for the installed tool (empty when none)."""
    try:
        return await compat.get_tool_valves_by_id(spec.registry_id)
    except Exception as error:  # valves are optional
        log.debug(
            "cannot read valves of %s: %s", spec.registry_id, type(error).__name__
        )
        return {}
