"""What makes a chat's research durable inside Open WebUI.

- `database_store()`: the checkpoint store on Open WebUI's own database
  (`open_webui.internal.db.engine`: a synchronous SQLAlchemy engine on every
  version from 0.6 to 0.12), one per process. SQLite by default; with
  replicas it is their shared PostgreSQL, so a run saved by one replica is
  found by another.
- `lease_table()`: on the same database, which process runs which chat's
  research (`adapters.run_leases`): a run left by a dead process is taken
  up by one other.
- `shutting_down()`: whether this process was asked to stop (SIGTERM or
  SIGINT, as an upgrade or a container redeploy sends). A run cancelled then
  keeps its checkpoint to go on after the restart; a run cancelled otherwise
  was stopped by its user (Stop), and stays stopped.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType, SimpleNamespace
from typing import Any

from ..checkpoint_store import DatabaseStore
from ..run_leases import LeaseTable
from . import compat
from .continuation import Continuer

log = logging.getLogger(__name__)

_STORE: list[DatabaseStore] = []
_LEASES: list[LeaseTable] = []
_STORE_LOCK = threading.Lock()
_SHUTDOWN = threading.Event()
_WATCHED: set[int] = set()
#: Where the process's continuer is kept outside Open WebUI (tests).
_LOCAL = SimpleNamespace()
_CONTINUER_KEY = "tongyi_deepresearch_continuer"


def database_store() -> DatabaseStore | None:
    """The store on Open WebUI's database; None outside Open WebUI."""
    with _STORE_LOCK:
        if not _STORE:
            engine = _openwebui_engine()
            if engine is None:
                return None
            _STORE.append(DatabaseStore(engine))
            # Inside Open WebUI: a restart must not read as Stop.
            watch_shutdown()
        return _STORE[0]


def lease_table() -> LeaseTable | None:
    """The runs' leases on Open WebUI's database; None outside Open WebUI."""
    with _STORE_LOCK:
        if not _LEASES:
            engine = _openwebui_engine()
            if engine is None:
                return None
            _LEASES.append(LeaseTable(engine))
        return _LEASES[0]


def adopt_continuer(continuer: Continuer) -> None:
    """Make ``continuer`` the process's one, stopping an older one.

    Open WebUI loads the pipe anew when its code or valves change: the new
    load's continuer replaces the old (kept on the app's state, which
    outlives loads), so one process never scans twice.
    """
    app = compat.running_app()
    keeper = app.state if app is not None else _LOCAL
    previous = getattr(keeper, _CONTINUER_KEY, None)
    if isinstance(previous, Continuer) and previous is not continuer:
        with contextlib.suppress(RuntimeError):  # its event loop is gone
            previous.cancel()
    setattr(keeper, _CONTINUER_KEY, continuer)


def _openwebui_engine() -> Any:
    try:
        from open_webui.internal.db import engine  # noqa: PLC0415  (only in Open WebUI)
    except Exception as error:  # not inside Open WebUI, or it broke
        log.debug("no Open WebUI database: %s", type(error).__name__)
        return None
    return engine


def shutting_down() -> bool:
    """Whether this process received SIGTERM or SIGINT since `watch_shutdown`."""
    return _SHUTDOWN.is_set()


def watch_shutdown() -> None:
    """Note SIGTERM and SIGINT, then hand each to the handler it had.

    Called from the event loop's thread (the main one under uvicorn); where
    handlers cannot be set (another thread), it does nothing.
    """
    for number in (signal.SIGTERM, signal.SIGINT):
        if number in _WATCHED:
            continue
        try:
            previous = signal.getsignal(number)
            signal.signal(number, _noting(previous))
        except ValueError:  # not the main thread: nothing to chain to
            return
        _WATCHED.add(number)


def _noting(previous: Any) -> Callable[[int, FrameType | None], None]:
    def handler(number: int, frame: FrameType | None) -> None:
        _SHUTDOWN.set()
        if callable(previous):
            previous(number, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(number, signal.SIG_DFL)
            signal.raise_signal(number)

    return handler
