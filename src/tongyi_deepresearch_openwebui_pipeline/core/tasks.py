"""Cheap replies to Open WebUI's background tasks.

Open WebUI sends its helper tasks (chat title, tags, follow-ups, search
queries …) to the chat's own model unless the admin set a task model. A deep
research run for a title would cost minutes, so each task gets an instant,
well-formed reply computed from the conversation instead. The formats are the
ones Open WebUI parses (JSON from the first ``{`` to the last ``}``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .events import ModelDelta, ModelError, ModelPort, ModelRetry
from .history import RESTART_NOTE, clean_assistant_text, content_text

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


# -- tasks whose output Open WebUI keeps ---------------------------------------------
#
# A few tasks are not throw-away: ``context_compaction`` (0.11+) stores the reply
# as the summary that replaces older messages (an empty reply makes Open WebUI
# keep a crude cut of the raw messages instead), ``memory_review`` saves the
# JSON operations it returns as the user's memories, and
# ``moa_response_generation`` shows its text as the merged answer. Each gets
# one plain model call with Open WebUI's own prompt: no research, no tools.
# Open WebUI reads the content (JSON from the first ``{`` to the last ``}``
# where it wants JSON), so the model's reasoning is left out.

KEPT_TASKS = frozenset(
    {"context_compaction", "memory_review", "moa_response_generation"}
)
_THINK_END = re.compile(r"</(think|thinking|reason|reasoning|thought)>", re.IGNORECASE)

log = logging.getLogger(__name__)


def is_kept_task(task: str) -> bool:
    """Whether Open WebUI keeps this task's output (it needs a real reply)."""
    return task in KEPT_TASKS


def task_messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    """The task's own messages, as plain text, for one model call."""
    messages: list[dict[str, str]] = []
    for message in body.get("messages") or []:
        role = message.get("role")
        if role in ("system", "user", "assistant"):
            text = content_text(message.get("content"))
            messages.append({"role": role, "content": text})
    return messages


def without_reasoning(content: str) -> str:
    """The reply without inline reasoning (a ``<think>`` block, closed or not)."""
    ends = list(_THINK_END.finditer(content))
    if ends:  # the template may open <think> itself: only the tail is the reply
        content = content[ends[-1].end() :]
    return clean_assistant_text(content)


async def plain_model_reply(
    model: ModelPort, messages: list[dict[str, str]], task: str
) -> str:
    """One model call's content (reasoning dropped); empty when it fails."""
    content: list[str] = []
    try:
        async for chunk in model.stream(messages):
            if isinstance(chunk, ModelRetry):
                content.clear()  # the reply starts again from the beginning
            elif isinstance(chunk, ModelDelta):
                content.append(chunk.content)
    except ModelError as error:
        log.warning("the %s task got no reply: %s", task, error.message)
        return ""
    return without_reasoning("".join(content))


def final_reply_text(pieces: Sequence[str]) -> str:
    """A whole run's output as one reply, without a false start cut off mid-way."""
    return "".join(pieces).rpartition(f"\n\n{RESTART_NOTE}\n\n")[2].strip()
