"""Cheap replies to Open WebUI's background tasks.

Open WebUI sends its helper tasks (chat title, tags, follow-ups, search
queries …) to the chat's own model unless the admin set a task model. A deep
research run for a title would cost minutes, so each task gets an instant,
well-formed reply computed from the conversation instead. The formats are the
ones Open WebUI parses (JSON from the first ``{`` to the last ``}``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .history import content_text

_TITLE_WORDS = 5
_CHAT_USER_LINE = re.compile(r"^\s*USER:\s*(.+)$", re.MULTILINE)
_WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*", re.UNICODE)


def _question(messages: Sequence[Mapping[str, Any]]) -> str:
    """The user's question, from the task prompt's chat history if present."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        text = content_text(message.get("content"))
        quoted = _CHAT_USER_LINE.findall(text)
        return (quoted[0] if quoted else text).strip()
    return ""


def title_for(question: str) -> str:
    """A short plain title: the first few words of the question."""
    words = _WORD.findall(question)
    if not words:
        return "Deep research"
    title = " ".join(words[:_TITLE_WORDS])
    return title[:1].upper() + title[1:]


def task_reply(task: str, body: Mapping[str, Any]) -> str:
    """The reply for one background ``task`` (never starts research)."""
    messages = body.get("messages") or []
    question = _question(messages)
    replies: dict[str, Any] = {
        "title_generation": {"title": title_for(question)},
        "tags_generation": {"tags": ["Research"]},
        "follow_up_generation": {"follow_ups": []},
        "query_generation": {"queries": []},
        "autocomplete_generation": {"text": ""},
        "image_prompt_generation": {"prompt": ""},
        "function_calling": {"tool_calls": []},
    }
    if task == "emoji_generation":
        return "🔎"
    if task in replies:
        return json.dumps(replies[task], ensure_ascii=False)
    # Unknown or free-text tasks (moa_response_generation): a neutral reply.
    return ""
