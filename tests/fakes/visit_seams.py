"""Parts to pass as the visit tool's seams in tests, each recording what it saw.

The visit tool reaches the world through its seams (`_Seams`: a resolver,
Open WebUI's loader, an HTTP client, TLS contexts, a converter, a sleep):
tests give it these instead of patching its private names.

- `ConverterWatch` makes converters (`_ConverterState`) that start real
  worker processes and convert in real threads, recording each.
- `CountingTransport` forwards requests over real HTTP and counts the body
  bytes the tool took from the wire.
- `HeldTransport` forwards requests only once the test releases them.
- `Sleeps` records the waits instead of waiting; `Clock` is moved by hand.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import httpx


class Sleeps(list):
    """A sleep that records how long it was asked to wait, and returns at once."""

    async def __call__(self, seconds: float) -> None:
        """Record the wait."""
        self.append(seconds)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        """Start at 0."""
        self.now = 0.0

    def __call__(self) -> float:
        """The time now."""
        return self.now


class ConverterWatch:
    """Converters of a visit tool module that record what they did.

    `spawned` holds every worker process a converter started (the real
    `_spawn_worker`'s), `threaded` the final URL of every page it converted
    in a thread (the real `_convert_in_thread`).
    """

    def __init__(self, module: ModuleType) -> None:
        """Watch converters of `module` (a loaded visit tool)."""
        self.module = module
        self.spawned: list[subprocess.Popen] = []
        self.threaded: list[str] = []

    def spawn(self) -> subprocess.Popen | None:
        """Start a worker process as the tool does, and record it."""
        process = self.module._spawn_worker()
        if process is not None:
            self.spawned.append(process)
        return process

    async def in_thread(self, raw: Any, max_tokens: int) -> Any:
        """Convert in a thread as the tool does, and record the page."""
        self.threaded.append(raw.final_url)
        return await self.module._convert_in_thread(raw, max_tokens)

    def converter(self, program: str | None = None, **fields: Any) -> Any:
        """A fresh converter that records through this watch.

        Args:
            program: The worker's program (default: the tool's own).
            **fields: Other fields of `_ConverterState` (limits, clock).

        Returns:
            The converter, with no worker started yet.
        """
        if program is None:
            program = self.module._CONVERTER.program
        return self.module._ConverterState(
            program, spawn=self.spawn, in_thread=self.in_thread, **fields
        )

    def pids(self) -> list[int]:
        """The process ids of the workers started, in order."""
        return [process.pid for process in self.spawned]


def _real_transport() -> httpx.AsyncHTTPTransport:
    """Real HTTP that keeps no connection open between requests (as the tool)."""
    return httpx.AsyncHTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))


class _CountedStream(httpx.AsyncByteStream):
    """A response body that counts the bytes read from it."""

    def __init__(self, inner: httpx.AsyncByteStream, owner: CountingTransport):
        self._inner = inner
        self._owner = owner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._owner.received += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class CountingTransport(httpx.AsyncBaseTransport):
    """Real HTTP; `received` counts the body bytes the client took from the wire."""

    def __init__(self) -> None:
        """Forward to a real transport."""
        self.received = 0
        self._inner = _real_transport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Forward the request; its body is counted as it is read."""
        response = await self._inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_CountedStream(response.stream, self),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        """Close the real transport."""
        await self._inner.aclose()


class HeldTransport(httpx.AsyncBaseTransport):
    """Real HTTP, each request held until `release` is set; `sent` records them."""

    def __init__(self) -> None:
        """Hold every request until released."""
        self.release = asyncio.Event()
        self.sent: list[str] = []
        self._inner = _real_transport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Record the request, wait for the release, then send it."""
        self.sent.append(str(request.url))
        await self.release.wait()
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        """Close the real transport."""
        await self._inner.aclose()


def client_over(transport: httpx.AsyncBaseTransport) -> Any:
    """An HTTP client factory (the `http_client` seam) sending through `transport`.

    The client is made as the tool makes its own (no redirects followed, no
    environment proxies); the transport is shared by every client it makes.
    """

    def make(verify: Any, timeout: float) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=_Unclosed(transport),
            timeout=timeout,
            follow_redirects=False,
            trust_env=False,
        )

    return make


class _Unclosed(httpx.AsyncBaseTransport):
    """`transport`, left open when a client closes (the test reads it after)."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._transport.handle_async_request(request)

    async def aclose(self) -> None:
        return None
