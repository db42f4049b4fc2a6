"""Consolidation: the research state that lets a run outlive its context.

When the conversation fills the usable context, one model call condenses it
into a state (what was established with its URLs, what is still open, what
failed) and the conversation restarts as the system prompt plus one user
message holding the question and that state (ReSum, arXiv 2509.13313). This
module is the pure part: the request, reading the reply, the restarted
conversation. The loop decides when and makes the call.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from .budget import estimate_text_tokens, messages_tokens
from .prompts import CONSOLIDATION_REQUEST, PAGES_READ_HEADING, resumption_message
from .toolcalls import wrap_response

#: Most tokens the summary call may write (the lab's summary call: 4096).
SUMMARY_MAX_TOKENS = 4096
#: Fewest tokens worth asking a summary in; less, and tool results are left out.
SUMMARY_MIN_TOKENS = 1024
#: Share of the usable context the restarted conversation may fill at most:
#: a state bigger than that would leave no room to go on researching.
MAX_RESTART_SHARE = 0.6
#: Shortest reply that counts as a state.
MIN_SUMMARY_CHARS = 20
#: What stands in for a tool result left out of the summary request.
OMITTED_RESULT = "(This tool result was left out to fit the summary request.)"

_THINK_END = re.compile(r"</think(?:ing)?>", re.IGNORECASE)
_THINK_BLOCK = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.IGNORECASE | re.S)
_SUMMARY = re.compile(r"<summary>(.*?)(?:</summary>|\Z)", re.IGNORECASE | re.S)
_TOOL_CALL = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.IGNORECASE | re.S)
_TAGS = re.compile(r"</?(?:answer|summary|tool_response)>", re.IGNORECASE)


def summary_request(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation, then the request for its state (a plain user message)."""
    return [*messages, {"role": "user", "content": CONSOLIDATION_REQUEST}]


def fit_summary_request(
    request: list[dict[str, Any]], hard_limit: int
) -> tuple[list[dict[str, Any]], int]:
    """``request`` cut to fit ``hard_limit`` with room for the summary.

    Returns the request and the reply tokens it may ask for. Tool results are
    left out, oldest first, until `SUMMARY_MIN_TOKENS` fit; the latest result
    and every assistant turn stay (the turns say what was looked for). The
    request is a copy; ``request`` is unchanged.
    """
    fitted = [dict(message) for message in request]
    results = [
        index for index, message in enumerate(fitted[:-1]) if _is_tool_result(message)
    ]
    omitted = wrap_response(OMITTED_RESULT)
    for index in [None, *results[:-1]]:
        if index is not None:
            fitted[index]["content"] = omitted
        room = hard_limit - messages_tokens(fitted)
        if room >= SUMMARY_MIN_TOKENS:
            return fitted, min(SUMMARY_MAX_TOKENS, room)
    return fitted, max(0, min(SUMMARY_MAX_TOKENS, hard_limit - messages_tokens(fitted)))


def _is_tool_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return (
        message.get("role") == "user"
        and isinstance(content, str)
        and content.startswith("<tool_response>")
    )


def state_from_reply(text: str, *, tagged_only: bool = False) -> str:
    """The state a summary reply holds, or "" when it holds none.

    The reasoning goes (a closed ``<think>`` block, or everything before the
    last ``</think>`` when the template opened it); the text inside
    ``<summary>`` is the state, else (unless ``tagged_only``: the reasoning
    channel counts only with tags) the reply without tool calls and tags.
    """
    ends = list(_THINK_END.finditer(text))
    if ends:
        text = text[ends[-1].end() :]
    text = _THINK_BLOCK.sub("", text)
    found = _SUMMARY.search(text)
    if found is None and tagged_only:
        return ""
    state = found.group(1) if found else _TOOL_CALL.sub("", text)
    state = _TAGS.sub("", state).strip()
    return state if len(state) >= MIN_SUMMARY_CHARS else ""


def pages_note(pages: Iterable[tuple[str, str]], max_tokens: int) -> str:
    """The pages read so far, newest first, within ``max_tokens``.

    Added to the state so that a page read before a consolidation can still
    be cited after it, whatever the summary kept of its URL.
    """
    lines: list[str] = []
    used = estimate_text_tokens(PAGES_READ_HEADING)
    for url, title in reversed(list(pages)):
        line = f"- {' '.join(title.split()) or url}: {url}"
        used += estimate_text_tokens(line) + 1
        if used > max_tokens:
            break
        lines.append(line)
    if not lines:
        return ""
    return PAGES_READ_HEADING + "\n" + "\n".join(lines)


def restarted_conversation(
    system: list[dict[str, Any]], question: str, state: str, pages: str
) -> list[dict[str, Any]]:
    """The conversation after a consolidation: system prompt, question and state."""
    summary = f"{state}\n\n{pages}" if pages else state
    return [
        *system,
        {"role": "user", "content": resumption_message(question, f"\n{summary}\n")},
    ]
