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
import string
from collections.abc import Callable, Iterable
from typing import Any

from .budget import estimate_text_tokens, messages_tokens
from .prompts import CONSOLIDATION_REQUEST, PAGES_READ_HEADING, resumption_message
from .toolcalls import neutralise_prompt_text, wrap_response

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
#: Longest summary reply read, in characters (65,536). The call asks for at
#: most `SUMMARY_MAX_TOKENS` tokens, about 16K characters of prose at ~4 a
#: token: four times that holds any reply the server was asked for, and what
#: a server sends beyond it (ignoring max_tokens) is read as cut off there.
MAX_REPLY_CHARS = 16 * SUMMARY_MAX_TOKENS
#: Characters of a page's title in the list of pages read: a longer one is
#: cut, so that one page cannot crowd the others out of the list.
MAX_TITLE_CHARS = 300

#: A substring search: ``find(text, needle, start)`` as `str.find` does it.
Find = Callable[[str, str, int], int]

#: Tags are matched in any ASCII case; this lowers only A-Z, so the lowered
#: text keeps the length (and the indices) of the original.
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
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


def state_from_reply(
    text: str, *, tagged_only: bool = False, find: Find = str.find
) -> str:
    """The state a summary reply holds, or "" when it holds none.

    The reasoning goes (everything up to the last ``</think>``, which also
    ends a template-opened block); the text inside ``<summary>`` is the
    state, else (unless ``tagged_only``: the reasoning channel counts only
    with tags) the reply without tool calls and tags. The state is returned
    as written: `restarted_conversation` defuses it where it enters the prompt.

    Linear: the first `MAX_REPLY_CHARS` of the reply are read with a few
    forward searches, none of them going back over text already passed (a
    regex for ``<think>…</think>`` blocks was quadratic on unclosed tags).

    Args:
        text: The reply's content, or its reasoning channel.
        tagged_only: Only a ``<summary>`` counts as a state.
        find: The substring search (`str.find`); a test passes one that counts
            the characters examined.
    """
    text = text[:MAX_REPLY_CHARS]
    lowered = text.translate(_ASCII_LOWER)
    start = _after_reasoning(lowered, find)
    text, lowered = text[start:], lowered[start:]
    opened = find(lowered, "<summary>", 0)
    if opened >= 0:
        state = _summary_body(text, lowered, opened + len("<summary>"), find)
    elif tagged_only:
        return ""
    else:
        state = _without_tool_calls(text, lowered, find)
    state = _TAGS.sub("", state).strip()
    return state if len(state) >= MIN_SUMMARY_CHARS else ""


def _after_reasoning(lowered: str, find: Find) -> int:
    """Where the text after the last ``</think>`` or ``</thinking>`` starts (0: none).

    Earlier reasoning blocks end before it too, so nothing else needs removing.
    """
    after, at = 0, find(lowered, "</think", 0)
    while at >= 0:
        tail = at + len("</think")
        if lowered.startswith(">", tail):
            after = tail + len(">")
        elif lowered.startswith("ing>", tail):
            after = tail + len("ing>")
        at = find(lowered, "</think", tail)
    return after


def _summary_body(text: str, lowered: str, body: int, find: Find) -> str:
    """The text from ``body`` to the next ``</summary>`` (or the end: a cut-off one)."""
    closed = find(lowered, "</summary>", body)
    return text[body:] if closed < 0 else text[body:closed]


def _without_tool_calls(text: str, lowered: str, find: Find) -> str:
    """``text`` without its ``<tool_call>`` blocks (an unclosed one runs to the end)."""
    kept: list[str] = []
    at = 0
    while (opened := find(lowered, "<tool_call>", at)) >= 0:
        kept.append(text[at:opened])
        closed = find(lowered, "</tool_call>", opened + len("<tool_call>"))
        if closed < 0:
            return "".join(kept)
        at = closed + len("</tool_call>")
    kept.append(text[at:])
    return "".join(kept)


def pages_note(pages: Iterable[tuple[str, str]], max_tokens: int) -> str:
    """The pages read so far, newest first, within ``max_tokens``.

    Added to the state so that a page read before a consolidation can still
    be cited after it, whatever the summary kept of its URL. A page's title
    and URL are its own: each line is one line, and neither can hold a control
    token or a tag (a title holding ``</summary>`` would end the state early).
    """
    lines: list[str] = []
    used = estimate_text_tokens(PAGES_READ_HEADING)
    for url, title in reversed(list(pages)):
        line = neutralise_prompt_text(_page_line(url, title))
        used += estimate_text_tokens(line) + 1
        if used > max_tokens:
            break
        lines.append(line)
    if not lines:
        return ""
    return PAGES_READ_HEADING + "\n" + "\n".join(lines)


def _page_line(url: str, title: str) -> str:
    """``- title: url``, each on one line (the URL when there is no title).

    A title is read up to twice `MAX_TITLE_CHARS` and cut to it.
    """
    url = " ".join(url.split())
    title = " ".join(title[: 2 * MAX_TITLE_CHARS].split())
    if len(title) > MAX_TITLE_CHARS:
        title = title[:MAX_TITLE_CHARS].rstrip() + " …"
    return f"- {title or url}: {url}"


def restarted_conversation(
    system: list[dict[str, Any]], question: str, state: str, pages: str
) -> list[dict[str, Any]]:
    """The conversation after a consolidation: system prompt, question and state.

    The state and the list of pages come from the model and from pages: they
    are defused here, where they enter the prompt, so neither can close or
    open the ``<summary>`` block or carry a control token. The question is
    the user's own, kept as asked.
    """
    summary = f"{state}\n\n{pages}" if pages else state
    summary = neutralise_prompt_text(summary)
    return [
        *system,
        {"role": "user", "content": resumption_message(question, f"\n{summary}\n")},
    ]
