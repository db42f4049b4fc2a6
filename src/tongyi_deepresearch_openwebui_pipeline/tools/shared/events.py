"""Events to Open WebUI: a tool's status lines and sources, never its failure.

Generated into all three tools by scripts/sync_root_files.py.
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

# --- snippet ---

Emitter = Callable[[dict], Awaitable[Any]]


async def _send_event(emitter: Emitter | None, event: dict) -> None:
    """Send an event; a broken emitter never breaks the tool (the UI is optional)."""
    if emitter is None:
        return
    try:
        sent = emitter(event)
        if inspect.isawaitable(sent):
            await sent
    except Exception as exc:
        log.debug("event emitter failed: %s", type(exc).__name__)
