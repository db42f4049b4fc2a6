"""Where checkpoints live: a directory for the runner, a database table for Open WebUI.

A store keeps at most one checkpoint per (user, chat): the run in progress
there. It holds bytes (`core.checkpoint` writes and reads them) and answers
four calls, all off the event loop: `load`, `save`, `remove` and `expire`;
and `save_blocking`, the same save for a caller already in a worker thread
(the run engine encodes a record and saves it in one).

- `DirectoryStore` (the runner): one file per key, written to a temporary
  file in the same directory, flushed to disk, then renamed over the old one,
  so a crash or a SIGKILL mid-write leaves the previous checkpoint whole.
- `DatabaseStore` (Open WebUI): a table of its own in Open WebUI's database
  (SQLite or PostgreSQL), reached through Open WebUI's SQLAlchemy engine, so
  every replica sees the same rows. One transaction replaces a row: a crash
  mid-write leaves the previous one.

A store never judges what it holds: `core.checkpoint.decode` refuses what is
not a checkpoint for that user and chat.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.checkpoint import MAX_BYTES, BlockingSave, CheckpointStore

__all__ = ["BlockingSave", "CheckpointStore", "DatabaseStore", "DirectoryStore"]

#: The table's name in Open WebUI's database (prefixed: it is not Open WebUI's).
TABLE_NAME = "tongyi_deepresearch_checkpoint"


def _file_name(owner: str, chat: str) -> str:
    # Ids come from requests and batch files: never part of a path as written.
    digest = hashlib.sha256(f"{owner}\0{chat}".encode("utf-8", "replace"))
    return f"{digest.hexdigest()[:40]}.checkpoint.json"


class DirectoryStore:
    """Checkpoints as files in one directory (the runner's, next to its output)."""

    def __init__(self, directory: Path, max_bytes: int = MAX_BYTES) -> None:
        """Keep files in ``directory`` (created on the first save)."""
        self.directory = directory
        self.max_bytes = max_bytes

    async def load(self, owner: str, chat: str) -> bytes | None:
        """The file's bytes, at most ``max_bytes`` + 1 of them (None: no file)."""
        return await asyncio.to_thread(
            self._load, self.directory / _file_name(owner, chat)
        )

    def _load(self, path: Path) -> bytes | None:
        try:
            with path.open("rb") as handle:
                # One byte over the cap is enough for decode to refuse it.
                return handle.read(self.max_bytes + 1)
        except FileNotFoundError:
            return None

    async def save(self, owner: str, chat: str, data: bytes) -> None:
        """Write ``data`` beside the old file, flush it, then rename it over."""
        await asyncio.to_thread(self.save_blocking, owner, chat, data)

    def save_blocking(self, owner: str, chat: str, data: bytes) -> None:
        """`save`, in the calling thread (a worker's, never the event loop's)."""
        name = _file_name(owner, chat)
        self.directory.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(
            dir=self.directory, prefix=".", suffix=".partial"
        )
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.directory / name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        _sync_directory(self.directory)

    async def remove(self, owner: str, chat: str) -> None:
        """Delete the chat's file, if any."""
        path = self.directory / _file_name(owner, chat)
        await asyncio.to_thread(_unlink, path)

    async def expire(self, older_than: float) -> int:
        """Delete checkpoint files last written before ``older_than``."""
        return await asyncio.to_thread(self._expire, older_than)

    def _expire(self, older_than: float) -> int:
        removed = 0
        for path in self.directory.glob("*.checkpoint.json"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < older_than:
                    path.unlink()
                    removed += 1
        return removed


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _sync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX; a no-op where it cannot be)."""
    with contextlib.suppress(OSError):
        handle = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


def ensure_table(table: Any, engine: Any) -> None:
    """Create ``table`` (a SQLAlchemy ``Table``) in ``engine`` unless it exists.

    Replicas started together may both try: PostgreSQL refuses the second
    CREATE, and a table that exists afterwards is what was wanted.
    """
    import sqlalchemy as sa  # noqa: PLC0415  (Open WebUI's, not a dependency)
    import sqlalchemy.exc  # noqa: PLC0415

    try:
        table.create(engine, checkfirst=True)
    except sqlalchemy.exc.SQLAlchemyError:
        if not sa.inspect(engine).has_table(table.name):
            raise


class DatabaseStore:
    """Checkpoints as rows of a table in a SQLAlchemy database.

    Built on Open WebUI's own engine (`open_webui.internal.db.engine`, a
    synchronous engine on every version from 0.6 to 0.12), so the rows live
    where Open WebUI keeps its chats: SQLite by default, PostgreSQL when
    replicas share one. The table is created on first use.
    """

    def __init__(
        self,
        engine: Any,
        *,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Use ``engine`` (a SQLAlchemy ``Engine``)."""
        import sqlalchemy as sa  # noqa: PLC0415  (Open WebUI's, not a dependency)
        import sqlalchemy.exc  # noqa: PLC0415

        self._sa = sa
        self._integrity_error: type[Exception] = sqlalchemy.exc.IntegrityError
        self._engine = engine
        self.max_bytes = max_bytes
        self._clock = clock
        self._table = sa.Table(
            TABLE_NAME,
            sa.MetaData(),
            sa.Column("owner", sa.String(255), primary_key=True),
            sa.Column("chat", sa.String(255), primary_key=True),
            sa.Column("saved_at", sa.Float, nullable=False, index=True),
            sa.Column("data", sa.LargeBinary, nullable=False),
        )
        self._created = False

    def _ensure_table(self) -> None:
        if not self._created:
            ensure_table(self._table, self._engine)
            self._created = True

    async def load(self, owner: str, chat: str) -> bytes | None:
        """The row's bytes, at most ``max_bytes`` + 1 of them (None: no row)."""
        return await asyncio.to_thread(self._load, owner, chat)

    def _load(self, owner: str, chat: str) -> bytes | None:
        self._ensure_table()
        table, sa = self._table, self._sa
        # A row over the cap (written by anything else) is read as cap + 1
        # bytes: enough for decode to refuse it, and no more held in memory.
        data = sa.func.substr(table.c.data, 1, self.max_bytes + 1)
        query = sa.select(data).where(table.c.owner == owner, table.c.chat == chat)
        with self._engine.connect() as connection:
            row = connection.execute(query).first()
        return None if row is None else bytes(row[0])

    async def save(self, owner: str, chat: str, data: bytes) -> None:
        """Replace the row in one transaction."""
        await asyncio.to_thread(self.save_blocking, owner, chat, data)

    def save_blocking(self, owner: str, chat: str, data: bytes) -> None:
        """`save`, in the calling thread (a worker's, never the event loop's)."""
        self._ensure_table()
        try:
            self._replace(owner, chat, data)
        except self._integrity_error:
            # Another process inserted the same key between our delete and
            # insert (PostgreSQL): the newest save wins, as it would in turn.
            self._replace(owner, chat, data)

    def _replace(self, owner: str, chat: str, data: bytes) -> None:
        table = self._table
        with self._engine.begin() as connection:
            connection.execute(
                table.delete().where(table.c.owner == owner, table.c.chat == chat)
            )
            connection.execute(
                table.insert().values(
                    owner=owner, chat=chat, saved_at=self._clock(), data=data
                )
            )

    async def remove(self, owner: str, chat: str) -> None:
        """Delete the chat's row, if any."""
        await asyncio.to_thread(self._remove, owner, chat)

    def _remove(self, owner: str, chat: str) -> None:
        self._ensure_table()
        table = self._table
        with self._engine.begin() as connection:
            connection.execute(
                table.delete().where(table.c.owner == owner, table.c.chat == chat)
            )

    async def expire(self, older_than: float) -> int:
        """Delete rows saved before ``older_than``."""
        return await asyncio.to_thread(self._expire, older_than)

    def _expire(self, older_than: float) -> int:
        self._ensure_table()
        table = self._table
        with self._engine.begin() as connection:
            result = connection.execute(
                table.delete().where(table.c.saved_at < older_than)
            )
        return int(result.rowcount or 0)
