"""Read one URL of a call: the address check, the chat's cache, a loader, extraction.

Each URL gets one outcome, whatever happens to it: a failure is a reason for
the user and the reference's failure text for the model. A page is loaded
once per chat at a time (a heavy run's rollouts read the same pages) and kept
in the chat's cache.
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from ..shared.events import _send_event
from ..shared.safe_http import _SSL_CONTEXTS, _TlsContexts
from .convert import _MangledFileError, _Page, _PageError
from .converter_worker import _CONVERTER, _convert_page, _ConverterState
from .extract import _extract, _fallback_status, _Outcome
from .extractor_client import Sleep, _openai_sdk, _sleep
from .fetch import (
    _PAGE_CACHE,
    ClientFactory,
    LoaderFinder,
    _fetch_builtin,
    _http_client,
    _load_with_openwebui,
    _openwebui_content_loader,
    _PageCache,
    _wants_openwebui_loader,
)
from .format import _kept_note, _source_event, _status
from .safety import Resolver, _check_url, _RefusedError, _resolve, _Target

if TYPE_CHECKING:
    from ..visit_tool import Tools

log = logging.getLogger(__name__)

# --- snippet ---


# Pages being loaded, by cache key: a second read of the same page in the same
# chat (a heavy run's rollouts often read the same pages at the same time)
# waits for the first instead of fetching it again.
_LOADING: dict[tuple[str, str], "asyncio.Future[_Page]"] = {}


@dataclass(frozen=True)
class _Seams:
    """How a visit call reaches the world: the real parts unless others are given.

    `Tools(seams=...)` gives a tool other ones (tests give fakes). Each default
    is this module's own part, looked up when the seams are made (at the start
    of a call given none), not when the module is loaded.
    """

    # Resolves a host name (DNS).
    resolve: Resolver = field(default_factory=lambda: _resolve)
    # Finds Open WebUI's page loader.
    find_loader: LoaderFinder = field(default_factory=lambda: _openwebui_content_loader)
    # Makes the built-in fetcher's HTTP client.
    http_client: ClientFactory = field(default_factory=lambda: _http_client)
    # The TLS contexts to connect with.
    tls: _TlsContexts = field(default_factory=lambda: _SSL_CONTEXTS)
    # Converts pages: worker processes, or a thread when none can run.
    converter: _ConverterState = field(default_factory=lambda: _CONVERTER)
    # Waits between extractor retries.
    sleep: Sleep = field(default_factory=lambda: _sleep)
    # Imports the `openai` package the extractor is called through.
    openai_sdk: Callable[[], Awaitable[Any]] = field(
        default_factory=lambda: _openai_sdk
    )
    # Pages read, per chat; and the pages being loaded now.
    pages: _PageCache = field(default_factory=lambda: _PAGE_CACHE)
    loading: dict[tuple[str, str], "asyncio.Future[_Page]"] = field(
        default_factory=lambda: _LOADING
    )


@dataclass
class _CallContext:
    """Everything one `visit` call shares between its URLs (never on `self`)."""

    valves: "Tools.Valves"
    goal: str
    request: Any
    chat_id: str
    emitter: Callable[[dict], Awaitable[Any]] | None
    semaphore: asyncio.Semaphore
    seams: _Seams = field(default_factory=_Seams)


async def _visit_one(url: str, ctx: "_CallContext") -> _Outcome:
    """Read and extract one URL; every failure becomes a failed outcome."""
    reason = ""
    try:
        async with ctx.semaphore, asyncio.timeout(ctx.valves.URL_TIMEOUT_SECONDS):
            await _send_event(ctx.emitter, _status(f"Reading: {url}"))
            page = await _get_page(url, ctx)
            if kept := _kept_note(page):
                await _send_event(ctx.emitter, _status(f"Reading {url}: {kept}"))
            seams = ctx.seams
            outcome = await _extract(
                page,
                ctx.goal,
                ctx.valves,
                sleep=seams.sleep,
                openai_sdk=seams.openai_sdk,
                tls=seams.tls,
            )
        if outcome.kind == "excerpt":
            await _send_event(ctx.emitter, _status(_fallback_status(url, outcome)))
        if outcome.kind != "failed":
            await _send_event(ctx.emitter, _source_event(url, ctx.goal, outcome))
            return outcome
        reason = outcome.reason
    except _RefusedError as exc:
        reason = f"refused: {exc}"
    except _PageError as exc:
        reason = str(exc)
    except TimeoutError:
        reason = "timed out"
    except Exception as exc:  # one bad URL never fails the batch
        log.exception("visit failed for %s", url)
        reason = f"unexpected error ({type(exc).__name__})"
    log.info("visit: could not read %s: %s", url, reason)
    await _send_event(ctx.emitter, _status(f"Could not read {url}: {reason}"))
    return _Outcome("failed", reason=reason)


async def _get_page(url: str, ctx: "_CallContext") -> _Page:
    """Safety check first, then the chat's cache, then a loader."""
    valves = ctx.valves
    # One wall-clock budget for the page, the DNS lookup of the check included.
    deadline = asyncio.get_running_loop().time() + valves.PAGE_TIMEOUT_SECONDS
    async with asyncio.timeout_at(deadline):
        target = await _check_url(
            url, valves.ALLOW_PRIVATE_URLS, resolve=ctx.seams.resolve
        )
    key = (ctx.chat_id, target.url)
    use_cache = bool(ctx.chat_id) and valves.CACHE_TTL_SECONDS > 0
    pages = ctx.seams.pages
    cached = pages.get(key, valves.CACHE_TTL_SECONDS) if use_cache else None
    if cached is not None:
        return cached
    if not use_cache:
        async with asyncio.timeout_at(deadline):
            return await _load(target, ctx)
    async with asyncio.timeout_at(deadline):
        return await _load_once(key, target, ctx)


async def _load_once(
    key: tuple[str, str], target: _Target, ctx: "_CallContext"
) -> _Page:
    """`_load`, once per page and chat at a time; the page is cached."""
    in_flight = ctx.seams.loading
    loading = in_flight.get(key)
    if loading is not None and loading.get_loop() is asyncio.get_running_loop():
        try:
            return await asyncio.shield(loading)
        except asyncio.CancelledError:
            if not loading.cancelled():
                raise  # this read itself was cancelled
            # The first reader was stopped (its chat's run was): read it here.
    future: asyncio.Future[_Page] = asyncio.get_running_loop().create_future()
    in_flight[key] = future
    try:
        page = await _load(target, ctx)
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError):
            future.cancel()
        else:
            future.set_exception(exc)
            future.exception()  # retrieved: no warning when nobody waits
        raise
    else:
        future.set_result(page)
        ctx.seams.pages.put(key, page)
        return page
    finally:
        if in_flight.get(key) is future:
            del in_flight[key]


async def _load(target: _Target, ctx: "_CallContext") -> _Page:
    """The built-in fetcher, or Open WebUI's loader when it is the one to use."""
    valves, seams = ctx.valves, ctx.seams
    if await _wants_openwebui_loader(valves.PAGE_LOADER, ctx.request):
        try:
            page = await _load_with_openwebui(
                ctx.request,
                target.url,
                valves,
                find_loader=seams.find_loader,
                converter=seams.converter,
            )
        except _MangledFileError:
            # A file (a PDF) the loader decoded as text, in either mode: only
            # its exact bytes hold its text, and a browser adds nothing to it.
            log.info("Open WebUI's loader mangled a file; downloading it")
        else:
            if page is not None:
                return page
            if valves.PAGE_LOADER == "openwebui":
                raise _PageError("Open WebUI's page loader returned nothing")
        # auto: a browser/service engine that gave nothing. The built-in fetcher
        # is the stricter path, so a page cannot weaken the checks this way.
    try:
        raw = await _fetch_builtin(
            target,
            valves,
            resolve=seams.resolve,
            http_client=seams.http_client,
            tls=seams.tls,
        )
    except httpx.TimeoutException as exc:
        raise _PageError("timed out") from exc
    except httpx.HTTPError as exc:
        raise _PageError(f"network error ({type(exc).__name__})") from exc
    return await _convert_page(raw, valves.MAX_PAGE_TOKENS, seams.converter)


def _task_outcome(task: "asyncio.Task[_Outcome]") -> _Outcome:
    """A finished task's outcome; a crashed task counts as a failure."""
    if task.cancelled() or task.exception() is not None:
        return _Outcome("failed", reason="internal error")
    return task.result()
