"""A tiny real HTTP server on 127.0.0.1 for tests.

Every fake in this package (model server, search engine, web pages) is a
`LocalServer` running in a background thread, so tests talk to it over real
HTTP exactly as the product would talk to the real thing. Servers stop by
themselves when the context manager exits, and handlers that wait ("a server
that never answers") are released at that moment.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Request:
    """One request as the fake server saw it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body or b"null")


@dataclass
class Response:
    """What a route returns: status, headers and a body (bytes or chunks)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | Iterable[bytes] = b""

    @classmethod
    def json(cls, data: Any, status: int = 200, **headers: str) -> Response:
        """A JSON response."""
        return cls(
            status,
            {"Content-Type": "application/json", **headers},
            json.dumps(data).encode(),
        )

    @classmethod
    def text(
        cls, text: str, status: int = 200, content_type: str = "text/plain"
    ) -> Response:
        """A text response."""
        return cls(
            status, {"Content-Type": f"{content_type}; charset=utf-8"}, text.encode()
        )


Route = Callable[[Request], Response]


class _BackloggedServer(ThreadingHTTPServer):
    """A threaded server that queues as many connections as a real one.

    The standard library's listen backlog is 5: twenty chats connecting at
    once to a fake model server on a busy machine overflow it, and a dropped
    connection attempt is retried by the kernel after 1, 2, 4, 8 s ... up to
    the client's connect timeout. Real servers queue far more (uvicorn 2048).
    """

    request_queue_size = 128


class LocalServer:
    """A threaded HTTP/1.0 server on 127.0.0.1 with routes by path prefix."""

    def __init__(self, routes: dict[str, Route] | None = None) -> None:
        """Create the server (not started)."""
        self.routes: dict[str, Route] = dict(routes or {})
        self.requests: list[Request] = []
        self.stopping = threading.Event()
        self.open_connections = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                request = Request(
                    self.command,
                    parts.path,
                    parse_qs(parts.query),
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                )
                with server._lock:
                    server.requests.append(request)
                    server.open_connections += 1
                try:
                    route = server._route(parts.path)
                    response = (
                        route(request) if route else Response.text("not found", 404)
                    )
                    self.send_response(response.status)
                    for key, value in response.headers.items():
                        self.send_header(key, value)
                    if isinstance(response.body, bytes):
                        self.send_header("Content-Length", str(len(response.body)))
                    self.end_headers()
                    if isinstance(response.body, bytes):
                        self.wfile.write(response.body)
                    else:
                        for chunk in response.body:
                            if server.stopping.is_set():
                                break
                            self.wfile.write(chunk)
                            self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with server._lock:
                        server.open_connections -= 1

            do_GET = _handle
            do_POST = _handle
            do_HEAD = _handle

        self._httpd = _BackloggedServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # A short poll interval lets `stop()` return quickly.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            daemon=True,
        )

    def _route(self, path: str) -> Route | None:
        best = None
        for prefix, route in self.routes.items():
            if path.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
                best = (prefix, route)
        return best[1] if best else None

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>`."""
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        """An absolute URL on this server."""
        return self.base_url + path

    def wait_forever(self) -> None:
        """Block a handler until the server stops (a server that never answers)."""
        self.stopping.wait()

    def start(self) -> LocalServer:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release waiting handlers."""
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> LocalServer:
        """Start on entry."""
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop on exit."""
        self.stop()
