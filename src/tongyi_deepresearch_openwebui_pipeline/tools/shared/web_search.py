"""Web search for the search tools: Open WebUI's engine (0.6-0.12), or SearXNG.

Finds Open WebUI's `search_web` and its settings where each version keeps
them (0.6/0.8: `request.app.state.config`; 0.11+: the config table; 0.12
also takes the whole retrieval config as `config=`), checks that web search is
enabled and has an engine, and calls `search_web` the way the version defines
it (blocking before 0.11, off the event loop). A SEARXNG_URL valve names a
SearXNG instance to query directly instead. Generated into search_tool.py and
scholar_tool.py by scripts/sync_root_files.py (after backend_http.py, whose
names it uses).
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .backend_http import _Endpoint, _split_credentials

# --- snippet ---

WebSearch = Callable[[str, int], Awaitable[list]]


class _WebSearchOffError(Exception):
    """Open WebUI's web search cannot run: turned off, or no engine is set up."""

    def __init__(self, *, disabled: bool) -> None:
        """`disabled`: the admin turned web search off (else: not configured)."""
        super().__init__("web search is disabled" if disabled else "no engine")
        self.disabled = disabled


def _import_openwebui() -> SimpleNamespace | None:
    """Open WebUI's search pieces, or None outside Open WebUI (the test seam)."""
    try:
        from open_webui.routers import retrieval  # noqa: PLC0415
    except ImportError:
        return None
    try:
        from open_webui.models.config import Config  # noqa: PLC0415  (0.11+)
    except ImportError:
        Config = None  # noqa: N806
    try:
        from open_webui.models.users import UserModel  # noqa: PLC0415
    except ImportError:
        UserModel = None  # noqa: N806
    return SimpleNamespace(
        search_web=retrieval.search_web,
        config_store=Config,
        user_model=UserModel,
        config_keys=getattr(retrieval, "RETRIEVAL_CONFIG_KEYS", None),
    )


def _app_setting(app_config: Any, *names: str) -> Any:
    """A 0.6/0.8 `app.state.config` value (its AppConfig may raise KeyError)."""
    for name in names:
        try:
            return getattr(app_config, name)
        except (AttributeError, KeyError):
            continue
    return None


async def _openwebui_web_search(
    ow: SimpleNamespace, request: Any, user: dict | None, engine: str
) -> WebSearch:
    """A search function over Open WebUI's engine, for this version's API.

    Args:
        ow: Open WebUI's pieces (`_import_openwebui`).
        request: The request Open WebUI passed to the tool.
        user: The `__user__` dict (made Open WebUI's UserModel when it fits).
        engine: The engine to use; "" for the one the admin configured.

    Returns:
        `search(query, count)`: the engine's results (dicts or Open WebUI's
        SearchResult objects).

    Raises:
        _WebSearchOffError: Web search is turned off or has no engine.
    """
    state = getattr(getattr(request, "app", None), "state", None)
    app_config = getattr(state, "config", None)
    config: dict | None = None
    if app_config is not None:  # 0.6 / 0.8
        enabled = bool(
            _app_setting(app_config, "ENABLE_WEB_SEARCH", "ENABLE_RAG_WEB_SEARCH")
        )
        configured = _app_setting(
            app_config, "WEB_SEARCH_ENGINE", "RAG_WEB_SEARCH_ENGINE"
        )
    elif ow.config_store is not None:  # 0.11+
        # 0.12 takes the whole retrieval config as `config=`; 0.11 reads it itself.
        takes_config = bool(ow.config_keys) and (
            "config" in inspect.signature(ow.search_web).parameters
        )
        keys = {"web.search.enable", "web.search.engine"}
        if takes_config:
            keys |= set(ow.config_keys.values())
        values = ow.config_store.get_many(*sorted(keys))
        values = dict(await values if inspect.isawaitable(values) else values)
        enabled = bool(values.get("web.search.enable"))
        configured = values.get("web.search.engine")
        config = values if takes_config else None
    else:
        raise _WebSearchOffError(disabled=False)
    if not enabled:
        raise _WebSearchOffError(disabled=True)
    engine = engine or configured or ""
    if not engine:
        raise _WebSearchOffError(disabled=False)
    owui_user = _owui_user(ow, user)

    async def search(query: str, count: int) -> list:
        if config is not None:  # 0.12+: keyword-only config, the count in it
            options = {**config, "web.search.result_count": count}
            result = ow.search_web(request, engine, query, owui_user, config=options)
        elif inspect.iscoroutinefunction(ow.search_web):  # 0.11
            result = ow.search_web(request, engine, query, owui_user)
        else:  # 0.6 / 0.8: blocking, keep it off the event loop
            result = await asyncio.to_thread(
                ow.search_web, request, engine, query, owui_user
            )
        return list((await result if inspect.isawaitable(result) else result) or [])

    return search


def _owui_user(ow: SimpleNamespace, user: dict | None) -> Any:
    """Open WebUI's UserModel from the `__user__` dict (None if it does not fit)."""
    if not user or ow.user_model is None:
        return None
    try:
        return ow.user_model(**user)
    except Exception:  # engines that need no user still work
        return None


def _searxng_endpoint(url: str) -> _Endpoint | None:
    """A SearXNG search URL without query and credentials (None if invalid).

    A query written into it (the legacy '?q=<query>') is dropped: the tools
    send their own.
    """
    try:
        parts = urlsplit(url.strip())
        valid = parts.scheme in {"http", "https"} and bool(parts.hostname)
        _port = parts.port  # raises on a malformed port
    except ValueError:
        return None
    if not valid:
        return None
    host, auth = _split_credentials(parts)
    return _Endpoint(urlunsplit((parts.scheme, host, parts.path or "/", "", "")), auth)
