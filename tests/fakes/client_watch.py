"""Routes that hold a request while the client is connected, or reset it.

`LocalServer.wait_forever()` keeps a handler thread busy until the server
stops, so a test cannot tell "the client hung up" from "the server was shut
down". `ClientWatch` attaches to any `LocalServer` and gives its routes:

- `hold()`: block until the client closes its connection (or the server
  stops), recording which of the two ended the wait. A cancelled chat that
  really closes its sockets frees every handler *before* the server stops,
  which is what the cancellation tests check;
- `reset_route()`: a route that drops the connection with a TCP reset after
  reading the request (a web server that crashes mid-request).
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from .http import LocalServer, Request, Response

POLL_SECONDS = 0.02


def client_gone(connection: socket.socket) -> bool:
    """Whether the peer closed (or reset) this connection."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        if not readable:
            return False
        return connection.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # reset, or the socket is already closed
        return True


class ClientWatch:
    """Lets the routes of one `LocalServer` see their client's connection."""

    def __init__(self, server: LocalServer) -> None:
        """Wrap the server's request handler so each thread knows its socket.

        Works whether or not the server has started: the handler class is
        looked up for every new connection.
        """
        self.server = server
        self.arrived = threading.Event()
        self.holding = 0
        self.released_by: list[str] = []
        self._lock = threading.Lock()
        local = self._local = threading.local()
        # The handler class is built inside LocalServer; a subclass that records
        # the connection in a thread-local is the least intrusive way in.
        httpd: Any = server._httpd
        base: Any = httpd.RequestHandlerClass

        class WatchedHandler(base):
            def setup(self) -> None:
                super().setup()
                local.connection = self.connection

        httpd.RequestHandlerClass = WatchedHandler

    def connection_closed(self) -> bool:
        """Whether the client of the request this handler thread serves has left.

        Call it on the handler thread (from a route, or a `StreamGate` the route
        holds at).
        """
        return client_gone(self._local.connection)

    def hold(self) -> str:
        """Block this handler until its client leaves or the server stops.

        Returns (and records in `released_by`) ``"client left"`` or
        ``"server stopped"``.
        """
        connection: socket.socket = self._local.connection
        with self._lock:
            self.holding += 1
        self.arrived.set()
        try:
            while not self.server.stopping.wait(POLL_SECONDS):
                if client_gone(connection):
                    reason = "client left"
                    break
            else:
                reason = "server stopped"
        finally:
            with self._lock:
                self.holding -= 1
        with self._lock:
            self.released_by.append(reason)
        return reason

    def holding_route(
        self, response: Callable[[Request], Response] | None = None
    ) -> Callable[[Request], Response]:
        """A route that holds, then answers with `response` (or HTTP 503)."""

        def route(request: Request) -> Response:
            self.hold()
            if response is not None:
                return response(request)
            return Response.text("released", 503)

        return route

    def reset_route(self) -> Callable[[Request], Response]:
        """A route that answers nothing: the connection is reset (TCP RST)."""

        def route(_request: Request) -> Response:
            connection: socket.socket = self._local.connection
            # SO_LINGER with a zero timeout makes close() send RST, not FIN.
            connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            connection.close()
            # LocalServer treats this as "the client went away" and moves on.
            raise ConnectionResetError("connection reset by the test server")

        return route
