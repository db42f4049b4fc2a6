"""What the search tools share around the backends: Open WebUI, links, scores.

The event emitter, Open WebUI's settings and module lookups, result links
(only http(s), capped) and scores. Generated into search_tool.py and
scholar_tool.py by scripts/sync_root_files.py.
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import inspect
import logging
import math
import re
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

# --- snippet ---

Emitter = Callable[[dict], Awaitable[Any]]


SEPARATOR = "\n=======\n"


MAX_URL_CHARS = 2_000


TITLE_CHARS = 300


# Open WebUI raises e.g. "No SEARXNG_QUERY_URL found in environment variables"
# or "No search engine API key found ..." when the engine lacks its settings.
MISSING_CONFIG = re.compile(r"^No .*found", re.IGNORECASE)


_NOT_IN_URL = re.compile(r"[\s\x00-\x1f\x7f]")


def _link(value: Any) -> str:
    """An http(s) URL from a backend, or '' when it is not one a reader could open.

    Links are untrusted: anything else (a `javascript:` link, an unparsable
    host such as `http://[::1`, a line break that would forge a result line)
    would reach the model as a citation and the user's browser as a source.
    """
    url = value.strip() if isinstance(value, str) else ""
    if not url or len(url) > MAX_URL_CHARS or _NOT_IN_URL.search(url):
        return ""
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port  # both raise on malformed hosts
    except ValueError:
        return ""
    return url if parts.scheme.lower() in {"http", "https"} and host else ""


def _score(result: dict) -> float:
    """A SearXNG score as a number; anything but a finite number counts as 0."""
    value = result.get("score")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    try:
        number = float(value)
    except OverflowError:
        return 0.0
    return number if math.isfinite(number) else 0.0


async def _emit(emitter: Emitter | None, **data: Any) -> None:
    """Send a status event; a failing emitter never stops the search."""
    if emitter is None:
        return
    try:
        sent = emitter({"type": "status", "data": data})
        if inspect.isawaitable(sent):
            await sent
    except Exception as exc:  # the UI is optional
        log.debug("status event failed: %s", type(exc).__name__)


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
