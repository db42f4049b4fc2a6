"""Which process runs which chat's research, so a run left behind is taken up once.

A run inside Open WebUI holds a *lease* on its (user, chat) row of a table in
Open WebUI's database, beside its checkpoint: the process holding it renews
it every third of its length while the run lives. A process that dies
(SIGKILL, the OOM killer, a replica taken away) stops renewing; one that is
asked to stop lets its leases lapse at once. Any process of the deployment
can then *claim* the row: one conditional UPDATE ("still lapsed? then mine"),
which one process alone wins on SQLite and on PostgreSQL alike, so a run is
continued by exactly one of the replicas.

The row also holds the *ticket*: what a process needs to continue the run
without the chat's request: the message to write into, the model picked, the
question, the tools chosen, the user's own settings. No key, URL or valve of
the admin's is in it (those are read from the pipe when the run goes on).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .checkpoint_store import ensure_table

#: The table's name in Open WebUI's database (prefixed: it is not Open WebUI's).
TABLE_NAME = "tongyi_deepresearch_run"

#: The most a ticket may hold, encoded: a question longer than this is not
#: continued by itself (it still resumes when the user asks again).
MAX_TICKET_BYTES = 256 * 1024


class TicketError(ValueError):
    """A ticket that cannot be read back (damaged, foreign, or too big)."""


@dataclass(frozen=True)
class Ticket:
    """What continuing a chat's research needs besides its checkpoint."""

    #: The assistant message the research writes into.
    message: str
    #: The model the chat picked ("<function id>.<model id>").
    model: str
    #: The question, as the run's checkpoint knows it.
    question: str
    #: The tools the chat chose (Open WebUI's tool ids), as the request gave them.
    tool_ids: tuple[str, ...] = ()
    #: The user's date (ISO) the research started on.
    today: str = ""
    #: The user, as Open WebUI gave it to the pipe (id, name, email, role).
    user: dict[str, str] = field(default_factory=dict)
    #: The user's own valves (their preferences; never a secret).
    user_valves: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> str:
        """The ticket as JSON text; `TicketError` when it would be too big."""
        fields = asdict(self)
        text = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            # A lone surrogate (a browser can send one) is no UTF-8: escaped,
            # the database takes it and `decode` gives it back as it was.
            text = json.dumps(fields, ensure_ascii=True, separators=(",", ":"))
            size = len(text)
        if size > MAX_TICKET_BYTES:
            raise TicketError("the question is too long to be continued by itself")
        return text

    @classmethod
    def decode(cls, text: str) -> Ticket:
        """A ticket from `encode`'s text; `TicketError` for anything else."""
        if len(text) > MAX_TICKET_BYTES:
            raise TicketError("too big")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as error:  # nested too deep: no ticket
            raise TicketError("not JSON") from error
        if not isinstance(data, dict):
            raise TicketError("not an object")
        strings = ("message", "model", "question", "today")
        if not all(isinstance(data.get(name), str) for name in strings):
            raise TicketError("a field is missing")
        tool_ids = data.get("tool_ids")
        user = data.get("user")
        user_valves = data.get("user_valves")
        if not (
            isinstance(tool_ids, list)
            and all(isinstance(tool, str) for tool in tool_ids)
            and isinstance(user, dict)
            and all(isinstance(v, str) for v in user.values())
            and isinstance(user_valves, dict)
        ):
            raise TicketError("a field has the wrong type")
        return cls(
            message=data["message"],
            model=data["model"],
            question=data["question"],
            tool_ids=tuple(tool_ids),
            today=data["today"],
            user={str(k): v for k, v in user.items()},
            user_valves={str(k): v for k, v in user_valves.items()},
        )


@dataclass(frozen=True)
class Claimed:
    """A lapsed run this process now holds: whose, where, and its ticket."""

    owner: str
    chat: str
    ticket: Ticket


class LeaseTable:
    """Leases and tickets as rows of a table in a SQLAlchemy database.

    Synchronous: every call is a short transaction, made from a worker
    thread (`asyncio.to_thread`), never on the event loop.
    """

    def __init__(self, engine: Any, *, clock: Callable[[], float] = time.time) -> None:
        """Use ``engine`` (a SQLAlchemy ``Engine``: Open WebUI's own)."""
        import sqlalchemy as sa  # noqa: PLC0415  (Open WebUI's, not a dependency)

        self._sa = sa
        self._engine = engine
        self.clock = clock
        self._table = sa.Table(
            TABLE_NAME,
            sa.MetaData(),
            sa.Column("owner", sa.String(255), primary_key=True),
            sa.Column("chat", sa.String(255), primary_key=True),
            sa.Column("holder", sa.String(64), nullable=False),
            sa.Column("until", sa.Float, nullable=False, index=True),
            sa.Column("ticket", sa.Text, nullable=False),
        )
        self._created = False

    def _ensure_table(self) -> None:
        if not self._created:
            ensure_table(self._table, self._engine)
            self._created = True

    def _row(self, owner: str, chat: str) -> Any:
        table = self._table
        return (table.c.owner == owner) & (table.c.chat == chat)

    def take(
        self, owner: str, chat: str, holder: str, seconds: float, ticket: Ticket
    ) -> None:
        """Hold the chat's run for ``seconds``, whoever held it (a request wins)."""
        self._ensure_table()
        table = self._table
        values = {
            "owner": owner,
            "chat": chat,
            "holder": holder,
            "until": self.clock() + seconds,
            "ticket": ticket.encode(),
        }
        with self._engine.begin() as connection:
            connection.execute(table.delete().where(self._row(owner, chat)))
            connection.execute(table.insert().values(**values))

    def renew(self, owner: str, chat: str, holder: str, seconds: float) -> bool:
        """Hold it ``seconds`` more; False when another took it (or it is gone)."""
        self._ensure_table()
        table = self._table
        update = (
            table.update()
            .where(self._row(owner, chat), table.c.holder == holder)
            .values(until=self.clock() + seconds)
        )
        with self._engine.begin() as connection:
            return int(connection.execute(update).rowcount or 0) == 1

    def lapse(self, owner: str, chat: str, holder: str) -> None:
        """Let it go at once, for another process to go on (a restart)."""
        self._ensure_table()
        table = self._table
        update = (
            table.update()
            .where(self._row(owner, chat), table.c.holder == holder)
            .values(until=0.0)
        )
        with self._engine.begin() as connection:
            connection.execute(update)

    def release(self, owner: str, chat: str, holder: str) -> None:
        """Forget it: the run ended (answered, stopped, failed)."""
        self._ensure_table()
        table = self._table
        delete = table.delete().where(self._row(owner, chat), table.c.holder == holder)
        with self._engine.begin() as connection:
            connection.execute(delete)

    def lapsed(self, limit: int = 20) -> list[tuple[str, str]]:
        """The (user, chat) of runs nobody holds, the longest lapsed first."""
        self._ensure_table()
        table, sa = self._table, self._sa
        query = (
            sa.select(table.c.owner, table.c.chat)
            .where(table.c.until < self.clock())
            .order_by(table.c.until)
            .limit(limit)
        )
        with self._engine.connect() as connection:
            rows = connection.execute(query).all()
        return [(str(owner), str(chat)) for owner, chat in rows]

    def claim(
        self, owner: str, chat: str, holder: str, seconds: float
    ) -> Claimed | None:
        """Hold a lapsed run; None when another process claimed it first.

        A row whose ticket cannot be read is removed (nothing could go on
        from it) and None returned.
        """
        self._ensure_table()
        table, sa = self._table, self._sa
        now = self.clock()
        update = (
            table.update()
            .where(self._row(owner, chat), table.c.until < now)
            .values(holder=holder, until=now + seconds)
        )
        with self._engine.begin() as connection:
            if int(connection.execute(update).rowcount or 0) != 1:
                return None
            query = sa.select(table.c.ticket).where(self._row(owner, chat))
            text = connection.execute(query).scalar()
        try:
            return Claimed(owner, chat, Ticket.decode(str(text or "")))
        except TicketError:
            self.release(owner, chat, holder)
            return None
