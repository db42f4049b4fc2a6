"""Checkpoint stores: all or nothing, one per chat, bounded reads, expiry."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy  # Open WebUI's own database library (a dev dependency here)

from tongyi_deepresearch_openwebui_pipeline.adapters.checkpoint_store import (
    DatabaseStore,
    DirectoryStore,
)


async def test_a_directory_store_keeps_one_checkpoint_per_chat(tmp_path: Path):
    store = DirectoryStore(tmp_path / "checkpoints")
    assert await store.load("u1", "c1") is None
    await store.save("u1", "c1", b"first")
    await store.save("u1", "c1", b"second")
    await store.save("u1", "c2", b"other chat")
    await store.save("u2", "c1", b"other user")
    assert await store.load("u1", "c1") == b"second"
    assert await store.load("u1", "c2") == b"other chat"
    assert await store.load("u2", "c1") == b"other user"
    await store.remove("u1", "c1")
    assert await store.load("u1", "c1") is None
    # No temporary file is left behind, and no id became a path.
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert len(names) == 2 and all(n.endswith(".checkpoint.json") for n in names)


async def test_ids_that_look_like_paths_stay_inside_the_directory(tmp_path: Path):
    store = DirectoryStore(tmp_path / "inside")
    await store.save("../../etc", "/passwd", b"x")
    assert [p.parent for p in tmp_path.rglob("*.checkpoint.json")] == [
        tmp_path / "inside"
    ]


async def test_a_directory_store_reads_at_most_one_byte_over_its_cap(tmp_path: Path):
    store = DirectoryStore(tmp_path, max_bytes=10)
    await store.save("u", "c", b"y" * 1000)
    assert await store.load("u", "c") == b"y" * 11


async def test_expiry_removes_only_old_checkpoints(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    await store.save("u", "old", b"1")
    await store.save("u", "new", b"2")
    old = next(p for p in tmp_path.iterdir() if p.read_bytes() == b"1")
    os.utime(old, (1_000, 1_000))
    assert await store.expire(older_than=2_000) == 1
    assert await store.load("u", "old") is None
    assert await store.load("u", "new") == b"2"


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from tongyi_deepresearch_openwebui_pipeline.adapters.checkpoint_store import (
        DirectoryStore,
    )

    async def main():
        store = DirectoryStore(Path(sys.argv[1]))
        await store.save("u", "c", b"A" * 8_000_000)
        print("saved", flush=True)
        round = 0
        while True:
            round += 1
            await store.save("u", "c", bytes([66 + round % 2]) * 8_000_000)

    asyncio.run(main())
    """
)


async def test_a_writer_killed_at_any_moment_leaves_a_whole_checkpoint(tmp_path: Path):
    # Whenever SIGKILL lands (mid-write, mid-rename, between saves), what is
    # kept is one whole save: 8 MB of one byte, never a mix or a cut.
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE
    )
    assert writer.stdout is not None
    assert writer.stdout.readline() == b"saved\n"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    kept = await DirectoryStore(tmp_path).load("u", "c")
    assert kept is not None and len(kept) == 8_000_000
    assert len(set(kept)) == 1


@pytest.fixture
def database(tmp_path: Path):
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'webui.db'}")
    yield engine
    engine.dispose()


async def test_a_database_store_keeps_one_row_per_chat(database):
    store = DatabaseStore(database, clock=lambda: 5_000.0)
    assert await store.load("u1", "c1") is None
    await store.save("u1", "c1", b"first")
    await store.save("u1", "c1", b"second")
    await store.save("u2", "c1", b"other user")
    assert await store.load("u1", "c1") == b"second"
    assert await store.load("u2", "c1") == b"other user"
    await store.remove("u1", "c1")
    assert await store.load("u1", "c1") is None
    # Another store on the same database (another replica) sees the row.
    assert await DatabaseStore(database).load("u2", "c1") == b"other user"


async def test_a_database_store_reads_at_most_one_byte_over_its_cap(database):
    await DatabaseStore(database).save("u", "c", b"z" * 1000)
    assert await DatabaseStore(database, max_bytes=10).load("u", "c") == b"z" * 11


async def test_database_expiry_removes_only_old_rows(database):
    await DatabaseStore(database, clock=lambda: 1_000.0).save("u", "old", b"1")
    await DatabaseStore(database, clock=lambda: 3_000.0).save("u", "new", b"2")
    store = DatabaseStore(database)
    assert await store.expire(older_than=2_000.0) == 1
    assert await store.load("u", "old") is None
    assert await store.load("u", "new") == b"2"


async def test_both_stores_save_from_a_worker_thread_as_from_the_loop(
    tmp_path: Path, database
):
    # The run engine encodes a record and saves it in one worker thread.
    for store in (DirectoryStore(tmp_path / "files"), DatabaseStore(database)):
        await asyncio.to_thread(store.save_blocking, "u", "c", b"from a thread")
        assert await store.load("u", "c") == b"from a thread"
        await store.save("u", "c", b"from the loop")
        assert await store.load("u", "c") == b"from the loop"
