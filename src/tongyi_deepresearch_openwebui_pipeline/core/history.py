"""Turning an Open WebUI conversation into the model's message list.

Earlier turns go back to the model cleanly: the UI markup this pipe wrote
(reasoning blocks, tool cards, the research summary — all ``<details>``
blocks — and inline ``<think>``) is removed, the earlier answers and their
source lists are kept, and list/multimodal content becomes text because the
chat template renders non-string content as nothing. System messages that Open
WebUI injects (the model's system prompt, file context) are not lost: they are
placed before the reference system prompt, where the preamble goes.
Chat-template control tokens (``<|im_start|>``…) in any earlier message are
defused with the same neutraliser as tool output: earlier answers, pasted
text and the file context Open WebUI injects all go back into the request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from .toolcalls import neutralise_control_tokens

IMAGE_OMITTED = "[An image was attached here; this model reads text only.]"
#: Ends a cut-off answer when the model's reply is retried. Everything before
#: it in the same message was a false start and is not sent back to the model.
RESTART_NOTE = "> ⚠️ The connection to the model broke; its reply starts again below."

_THINK = re.compile(
    r"<(think|thinking|reason|reasoning|thought)>.*?(</\1>|$)",
    re.DOTALL | re.IGNORECASE,
)


def strip_details(text: str) -> str:
    """Remove every ``<details …>…</details>`` block, nesting included."""
    out: list[str] = []
    depth = 0
    position = 0
    pattern = re.compile(r"<details\b[^>]*>|</details>", re.IGNORECASE)
    for match in pattern.finditer(text):
        if match.group(0).lower().startswith("<details"):
            if depth == 0:
                out.append(text[position : match.start()])
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                position = match.end()
    if depth == 0:
        out.append(text[position:])
    return "".join(out)


def clean_assistant_text(text: str) -> str:
    """An earlier assistant message without UI markup or thinking."""
    text = text.rpartition(RESTART_NOTE)[2]
    text = strip_details(text)
    text = _THINK.sub("", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def content_text(content: Any) -> str:
    """Message content as plain text (OpenAI parts joined, images noted)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces: list[str] = []
        for part in content:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, Mapping):
                if part.get("type") == "text":
                    pieces.append(str(part.get("text", "")))
                elif "image" in str(part.get("type", "")):
                    pieces.append(IMAGE_OMITTED)
        return "\n\n".join(piece for piece in pieces if piece)
    return str(content)


def split_conversation(
    messages: Iterable[Mapping[str, Any]],
) -> tuple[str, list[dict[str, str]]]:
    """(system text from Open WebUI, the user/assistant turns for the model)."""
    system: list[str] = []
    turns: list[dict[str, str]] = []
    for message in messages:
        role = message.get("role")
        text = neutralise_control_tokens(content_text(message.get("content")))
        if role == "system":
            if text.strip():
                system.append(text.strip())
        elif role == "assistant":
            cleaned = clean_assistant_text(text)
            if cleaned:
                turns.append({"role": "assistant", "content": cleaned})
        elif role in ("user", "tool"):
            turns.append({"role": "user", "content": text})
    return "\n\n".join(system), _merge_same_role(turns)


def _merge_same_role(turns: list[dict[str, str]]) -> list[dict[str, str]]:
    """Join consecutive messages of one role (e.g. after an empty reply)."""
    merged: list[dict[str, str]] = []
    for turn in turns:
        if merged and merged[-1]["role"] == turn["role"]:
            merged[-1] = {
                "role": turn["role"],
                "content": f"{merged[-1]['content']}\n\n{turn['content']}",
            }
        else:
            merged.append(turn)
    return merged
