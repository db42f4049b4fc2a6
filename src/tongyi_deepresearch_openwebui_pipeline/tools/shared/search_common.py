"""What the search tools share around the backends: queries, links, scores, text.

Queries as the model sends them, the per-call query limit, status lines,
result links (only http(s), capped), scores and cut text. Generated into
search_tool.py and scholar_tool.py by scripts/sync_root_files.py (after
events.py, whose names it uses).
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import math
import re
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from .events import Emitter, _send_event

# --- snippet ---

Made = TypeVar("Made")


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
    await _send_event(emitter, {"type": "status", "data": data})


def _ranked(results: list) -> list[dict]:
    """The results that are objects, best SearXNG score first (as Open WebUI)."""
    return sorted((r for r in results if isinstance(r, dict)), key=_score, reverse=True)


def _normalise_queries(query: Any) -> list[str] | None:
    """Distinct, stripped queries in input order; None when the input is invalid."""
    if isinstance(query, str):
        query = [query]
    if not isinstance(query, list) or not all(isinstance(q, str) for q in query):
        return None
    return list(dict.fromkeys(q.strip() for q in query if q.strip())) or None


def _skipped_note(skipped: list[str], limit: int) -> str:
    """Model-facing note naming the queries that were over the per-call limit."""
    names = ", ".join(f"'{q}'" for q in skipped)
    return (
        f"\n\nNote: only the first {limit} queries of this call were searched "
        f"(limit per call). Not searched: {names}. "
        "Call the tool again with these queries if you still need them."
    )


def _positive(value: Any, default: int, ceiling: int | None = None) -> int:
    """A valve limit as an int from 1 (to `ceiling`); non-numbers give the default."""
    try:
        number = max(int(value), 1)
    except (TypeError, ValueError):
        return default
    return number if ceiling is None else min(number, ceiling)


def _cut(text: str, limit: int) -> str:
    """Text of at most about `limit` characters, cut at a word."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " …"


def _field(item: Any, name: str) -> Any:
    """Read a field from a dict or an object (Open WebUI's SearchResult)."""
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _first_made(
    items: list, count: int, make: Callable[[Any], Made | None]
) -> list[Made]:
    """The first `count` items `make` turns into a result (None: not one).

    An item `make` cannot read (an odd result object) is skipped.
    """
    made: list[Made] = []
    for item in items:
        if len(made) >= count:
            break
        try:
            result = make(item)
        except Exception:  # noqa: S112  (an odd result object)
            continue
        if result:
            made.append(result)
    return made
