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

import html
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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


# -- context Open WebUI injected into the question ------------------------------------
#
# With files, knowledge or Open WebUI's own web search, Open WebUI renders its RAG
# template ("### Task: Respond to the user query using the provided context …
# <context><source id="1">…</source></context>") and puts it IN FRONT of the last
# user message (``f"{template}\n{question}"``), or at the end of the system
# message when the admin set RAG_SYSTEM_CONTEXT (0.8+). That text contradicts the
# model's protocol (it must answer in <answer>, cite what it read) and repeats
# files the model reads with parse_file, so it is taken out again here. The
# user's own words are found, most reliable first: the prompt Open WebUI kept
# in ``__metadata__`` before the rewrite (0.8+), the admin's template turned
# into a pattern, and the shape every version's default template has.

_CONTEXT_SLOTS = ("{{CONTEXT}}", "[context]")
_QUERY_SLOTS = ("{{QUERY}}", "[query]")
_SLOT = re.compile(r"\{\{[^{}]*\}\}|\[context\]|\[query\]")
# The default template of 0.6 – 0.12 (and most edited ones): a "### Task:" head
# and the sources inside one <context> element at its end.
_DEFAULT_SHAPE = r"### Task:\n.*?<context>\n(?P<context>.*)\n</context>\n?"
_SOURCE = re.compile(r"<source\b(?P<attrs>[^>]*)>(?P<body>.*?)</source>", re.DOTALL)
_ATTRIBUTE = re.compile(r'([A-Za-z_][\w-]*)="([^"]*)"')


@dataclass(frozen=True)
class ContextSource:
    """One ``<source>`` Open WebUI put into the RAG context."""

    name: str
    text: str
    attributes: Mapping[str, str] = field(default_factory=dict)


def template_pattern(template: str) -> str | None:
    """A regular expression matching ``template`` once Open WebUI filled it in.

    ``{{CONTEXT}}`` becomes the ``context`` group (greedy: text after the last
    end of the template is the user's), ``{{QUERY}}`` the question, and other
    variables (``{{CURRENT_DATE}}`` …) anything. None when the template has no
    context slot (then it cannot be what Open WebUI injected).
    """
    if not any(slot in template for slot in _CONTEXT_SLOTS):
        return None
    parts: list[str] = []
    position = 0
    seen: set[str] = set()
    for match in _SLOT.finditer(template):
        parts.append(re.escape(template[position : match.start()]))
        slot = match.group(0)
        group = (
            "context"
            if slot in _CONTEXT_SLOTS
            else "query"
            if slot in _QUERY_SLOTS
            else None
        )
        if group is None:
            parts.append(".*?")
        elif group in seen:
            parts.append(f"(?P={group})")
        else:
            seen.add(group)
            parts.append(f"(?P<{group}>.*)" if group == "context" else "(?P<query>.*?)")
        position = match.end()
    parts.append(re.escape(template[position:]))
    return "".join(parts)


def injection_patterns(templates: Iterable[str]) -> list[str]:
    """Patterns for the admin's templates, then the default templates' shape."""
    patterns = [p for p in map(template_pattern, templates) if p and p.strip()]
    return [*patterns, _DEFAULT_SHAPE]


def split_injected_question(
    text: str, patterns: Sequence[str], prompt: str | None = None
) -> tuple[str, str | None]:
    """(the user's own words, the injected context or None) of a user message.

    Args:
        text: The user message as the pipe received it.
        patterns: From `injection_patterns`.
        prompt: The user's words as Open WebUI kept them before the rewrite
            (``__metadata__``), for the last message only.
    """
    if prompt and text != prompt and text.endswith(f"\n{prompt}"):
        head = text[: -len(prompt) - 1]
        if _SOURCE.search(head):  # not some other prefix (a filter's, say)
            inner = re.search(r"<context>\n?(.*)\n?</context>", head, re.DOTALL)
            return prompt, inner.group(1) if inner else head
    for pattern in patterns:
        match = re.fullmatch(f"{pattern}\n(?P<words>.*)", text, re.DOTALL)
        if match:
            return match.group("words"), match.group("context")
    return text, None


def split_injected_system(text: str, patterns: Sequence[str]) -> tuple[str, str | None]:
    """(the system text, the injected context or None); RAG_SYSTEM_CONTEXT mode."""
    for pattern in patterns:
        match = re.fullmatch(f"(?P<own>.*?)(?:\\A|\n)(?:{pattern})", text, re.DOTALL)
        if match:
            return match.group("own"), match.group("context")
    return text, None


def context_sources(context: str) -> list[ContextSource]:
    """The ``<source>`` elements of an injected context, in order."""
    sources = []
    for match in _SOURCE.finditer(context):
        attributes = {
            key: html.unescape(value)
            for key, value in _ATTRIBUTE.findall(match.group("attrs"))
        }
        name = attributes.get("name", "").strip()
        sources.append(ContextSource(name, match.group("body").strip(), attributes))
    return sources


def remove_injected_context(
    messages: Iterable[Mapping[str, Any]],
    templates: Iterable[str] = (),
    last_prompt: str | None = None,
) -> tuple[list[dict[str, Any]], list[ContextSource]]:
    """Messages without Open WebUI's RAG template, and the sources it carried.

    Every user message is cleaned (earlier turns too), and the system message
    when the template went there. Content becomes plain text where it changes.
    """
    patterns = injection_patterns(templates)
    listed = list(messages)
    last_user = max(
        (i for i, m in enumerate(listed) if m.get("role") == "user"), default=-1
    )
    cleaned: list[dict[str, Any]] = []
    sources: list[ContextSource] = []
    for index, message in enumerate(listed):
        role = message.get("role")
        if role not in ("user", "system"):
            cleaned.append(dict(message))
            continue
        text = content_text(message.get("content"))
        if role == "user":
            prompt = last_prompt if index == last_user else None
            own, context = split_injected_question(text, patterns, prompt)
        else:
            own, context = split_injected_system(text, patterns)
        if context is None:
            cleaned.append(dict(message))
            continue
        sources.extend(context_sources(context))
        cleaned.append({**message, "content": own})
    return cleaned, sources
