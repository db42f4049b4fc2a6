"""Throwaway PostgreSQL and Redis servers on 127.0.0.1 for the scaled profile.

Both are the Debian packages' binaries (``scripts/prepare-e2e`` installs them
with apt-get when missing), each started on a free loopback port with its data
in a fresh temporary directory, and stopped (process group, SIGTERM) and
removed at the end. Nothing touches a system cluster or service.

PostgreSQL refuses to run as root: as root the cluster is owned by and run as
the ``postgres`` user the Debian package creates; otherwise as the current user.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.e2e.owui import free_port, log_tail, stop_process_group

PG_DATABASE = "openwebui"
PG_USER = "openwebui"
PG_PASSWORD = "scaled-e2e"  # a throwaway role of a throwaway cluster
_PG_PROGRAMS = ("initdb", "postgres", "pg_isready", "psql")


class ServiceError(RuntimeError):
    """A service did not start (the message ends with its log's tail)."""


# -- finding the binaries -----------------------------------------------------------


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path.parent.name) or ["0"])


def find_postgres_bindir() -> Path | None:
    """A directory holding initdb, postgres, pg_isready and psql.

    ``TDR_PG_BINDIR`` if set, else the newest ``/usr/lib/postgresql/*/bin``
    (Debian keeps the server programs off PATH), else PATH.
    """
    candidates: list[Path] = []
    explicit = os.environ.get("TDR_PG_BINDIR")
    if explicit:
        candidates.append(Path(explicit))
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key)
    candidates.extend(reversed(debian))
    on_path = shutil.which("postgres")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for bindir in candidates:
        if all(os.access(bindir / name, os.X_OK) for name in _PG_PROGRAMS):
            return bindir
    return None


def find_redis_server() -> str | None:
    """The redis-server program (``TDR_REDIS_SERVER`` if set, else PATH)."""
    explicit = os.environ.get("TDR_REDIS_SERVER")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("redis-server")


# -- processes ------------------------------------------------------------------------


def _stop_group(process: subprocess.Popen[bytes] | None, grace: float = 20.0) -> None:
    """Stop a started service's process group (nothing when it already ended)."""
    if process is None or process.poll() is not None:
        return
    stop_process_group(process, grace)


def _wait_until(ready: Any, alive: Any, what: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if not alive():
            raise ServiceError(f"{what} exited while starting\n{log_tail(log, 40)}")
        if time.monotonic() > deadline:
            raise ServiceError(
                f"{what} was not ready after {timeout:.0f} s\n{log_tail(log, 40)}"
            )
        time.sleep(0.1)


class PostgresServer:
    """A fresh PostgreSQL cluster with one database for Open WebUI."""

    def __init__(self, bindir: Path) -> None:
        """Prepare (not start) a cluster run by the programs in ``bindir``."""
        self.bindir = bindir
        self.port = free_port()
        # Not under pytest's 0700 temp folders: the postgres user must reach it.
        self.root = Path(tempfile.mkdtemp(prefix="tdr-pg-"))
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.process: subprocess.Popen[bytes] | None = None
        # As whom the server programs run (None: this process's user).
        self._user: int | None = None
        self._group: int | None = None
        self._extra_groups: list[int] | None = None
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                raise ServiceError(
                    "running as root, but there is no `postgres` user to run "
                    "PostgreSQL as (install the postgresql package)"
                ) from None
            os.chown(self.root, account.pw_uid, account.pw_gid)
            self._user, self._group = account.pw_uid, account.pw_gid
            self._extra_groups = []

    @property
    def url(self) -> str:
        """Open WebUI's ``DATABASE_URL`` (psycopg 3 driver)."""
        return (
            f"postgresql+psycopg://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{self.port}"
            f"/{PG_DATABASE}"
        )

    def _run(self, *args: str, timeout: float = 120.0) -> str:
        result = subprocess.run(
            args,
            cwd=self.root,
            env=self._env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            user=self._user,
            group=self._group,
            extra_groups=self._extra_groups,
        )
        if result.returncode != 0:
            raise ServiceError(
                f"{' '.join(args[:2])} failed ({result.returncode}): "
                f"{result.stderr.strip() or result.stdout.strip()}"
            )
        return result.stdout

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TZ")}
        return {**env, "LC_ALL": "C.UTF-8", "HOME": str(self.root)}

    def _ready(self) -> bool:
        port = str(self.port)
        where = ["-h", "127.0.0.1", "-p", port, "-d", "postgres", "-U", "postgres"]
        result = subprocess.run(
            [str(self.bindir / "pg_isready"), "-q", *where],
            env=self._env(),
            check=False,
            capture_output=True,
        )
        return result.returncode == 0

    def start(self, timeout: float = 120.0) -> PostgresServer:
        """initdb, start the server, create the role and the database."""
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
        )
        command = [str(self.bindir / "postgres"), "-D", str(self.data)]
        command += ["-p", str(self.port), "-k", str(self.root)]
        for setting in (
            "listen_addresses=127.0.0.1",
            "fsync=off",
            "synchronous_commit=off",
            "full_page_writes=off",
            "max_connections=200",
        ):
            command += ["-c", setting]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=self.root,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=self._user,
                group=self._group,
                extra_groups=self._extra_groups,
            )
        _wait_until(self._ready, self.running, "PostgreSQL", self.log_path, timeout)
        self.sql(
            f"CREATE ROLE {PG_USER} LOGIN PASSWORD '{PG_PASSWORD}'",
            database="postgres",
            user="postgres",
        )
        self.sql(
            f"CREATE DATABASE {PG_DATABASE} OWNER {PG_USER}",
            database="postgres",
            user="postgres",
        )
        return self

    def running(self) -> bool:
        """Whether the server process is alive."""
        return self.process is not None and self.process.poll() is None

    def sql(
        self, statement: str, database: str = PG_DATABASE, user: str = PG_USER
    ) -> list[list[str]]:
        """Run one statement with psql; its rows as lists of text fields."""
        out = self._run(
            str(self.bindir / "psql"),
            "-X",
            "-q",
            "-A",
            "-t",
            "-F",
            "\x1f",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            user,
            "-d",
            database,
            "-c",
            statement,
        )
        return [line.split("\x1f") for line in out.splitlines() if line]

    def stop(self) -> None:
        """Stop the server and remove its files."""
        _stop_group(self.process)
        shutil.rmtree(self.root, ignore_errors=True)


class RedisServer:
    """A redis-server without persistence on a free loopback port."""

    def __init__(self, program: str) -> None:
        """Prepare (not start) a server run by ``program``."""
        self.program = program
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tdr-redis-"))
        self.log_path = self.root / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Open WebUI's ``REDIS_URL``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self, *args: str) -> bytes:
        """Send one command (RESP) and return the raw first reply line."""
        parts = [f"*{len(args)}\r\n".encode()]
        for arg in args:
            data = arg.encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(b"".join(parts))
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
        return reply.strip()

    def _ready(self) -> bool:
        try:
            return self.command("PING") == b"+PONG"
        except OSError:
            return False

    def start(self, timeout: float = 60.0) -> RedisServer:
        """Start the server and wait until it answers PING."""
        command: Sequence[str] = [
            self.program,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.root),
            "--daemonize",
            "no",
        ]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_until(self._ready, self.running, "redis-server", self.log_path, timeout)
        return self

    def running(self) -> bool:
        """Whether the server process is alive."""
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Stop the server and remove its files."""
        _stop_group(self.process)
        shutil.rmtree(self.root, ignore_errors=True)
