"""The pipe's words for settings, said the runner's way (pure).

The model client and the tools are shared with the Open WebUI pipe, and their
messages name what an Open WebUI admin sets: "Check the API_KEY valve". A
runner user has no valves: the same setting is a flag or a ``TDR_<NAME>``
variable. `in_runner_words` rewrites such a message as it reaches the
runner's user (the live view, the answer's note, a batch record's
``error``); nothing model-facing passes here, so the model sees the tools'
words unchanged.

- "the NAME valve", "the A and B valves", "the A, B and sampling valves":
  each name of a runner setting gets its flag and variable
  (``the API_KEY setting (--api-key or TDR_API_KEY; …)``).
- The visit tool's refusal of a private or loopback address ("… is a private
  or reserved address (…)") names the flag that allows it.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TypeVar

from ..core.events import RolloutEvent, RunEvent, RunFinished
from .settings import ALL_NAMES, how_to_set

#: One name in a list of valves: a setting's name, or "sampling" (the model
#: client's shorthand for the sampling valves).
_NAME = r"(?:[A-Z][A-Z0-9_]*|sampling)"
#: "the NAME valve", "the A and B valves", "the A, B and C valves", and an
#: opening parenthesis right after it (its content is merged with ours).
_VALVES = re.compile(
    rf"\bthe ({_NAME}(?:(?:, | and ){_NAME})*) (valves?)\b( \()?",
)
#: The visit tool's refusal of an address it may not read by default.
_PRIVATE = re.compile(r"is a private or reserved address \([^()\n]*\)")
#: What the runner adds to that refusal.
PRIVATE_HINT = (
    "; --allow-private-urls (or TDR_ALLOW_PRIVATE_URLS=true) lets visit read it"
)
#: How the runner sets what the model client calls "the sampling valves".
SAMPLING = "sampling: --temperature, --set TOP_P=…, --set PRESENCE_PENALTY=…"


def _names(listed: str) -> list[str]:
    return re.split(r", | and ", listed)


def _settings_text(match: re.Match[str]) -> str:
    listed, noun, opening = match.group(1), match.group(2), match.group(3)
    names = _names(listed)
    if not all(name in ALL_NAMES or name == "sampling" for name in names):
        return match.group(0)  # not the runner's settings: leave the words
    ways = "; ".join(
        SAMPLING if name == "sampling" else how_to_set(name) for name in names
    )
    plural = "settings" if noun == "valves" else "setting"
    # "(…) (leave it empty …)" reads as one parenthesis: "(…; leave it empty …)".
    return f"the {listed} {plural} ({ways}" + ("; " if opening else ")")


def runner_text(text: str) -> str:
    """`text` with the pipe's valve names said as the runner's settings."""
    if "valve" in text:
        text = _VALVES.sub(_settings_text, text)
    if "private or reserved address" in text and "allow-private-urls" not in text:
        text = _PRIVATE.sub(lambda found: found.group(0) + PRIVATE_HINT, text)
    return text


E = TypeVar("E", bound=RunEvent)


def in_runner_words(event: E) -> E:
    """`event` with the error it ends with (if any) in the runner's words."""
    if isinstance(event, RunFinished) and event.error:
        return replace(event, error=runner_text(event.error))
    if isinstance(event, RolloutEvent) and isinstance(event.event, RunFinished):
        return replace(event, event=in_runner_words(event.event))
    return event
