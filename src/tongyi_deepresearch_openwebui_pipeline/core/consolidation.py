"""Consolidation: ReSum, as published, lets a run outlive its context.

ReSum (arXiv 2509.13313; Alibaba-NLP/DeepResearch, ``WebAgent/WebResummer``)
summarises the conversation once it holds 0.9 x (its context - 1,000)
tokens, and restarts it as the system prompt plus one user message holding
the question and the summary. This module is the pure part, each
piece as the lab's code does it: when (`consolidation_point`), which
messages are summarised and how they are written (`summarised_history`,
`rendered_message`), the request (`summary_request`, the lab's prompts from
`prompts.summary_prompt`), how the reply is read (`state_from_reply`) and
the restarted conversation (`restarted_conversation`). The loop decides when
and makes the call.

What this project adds is hardening, never text of its own: the request is
fitted to the served context (oldest tool results left out, the reply
bounded), the reply is read in linear work within a cap, and the summary is
defused where it re-enters a prompt (control tokens and protocol tags).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .budget import MESSAGE_OVERHEAD_TOKENS, estimate_text_tokens, messages_tokens
from .history import content_text
from .prompts import SUMMARY_CLOSE, SUMMARY_OPEN, resumption_message, summary_prompt
from .toolcalls import neutralise_prompt_text, wrap_response

#: Most tokens the summary call may write (the lab's summary call: 4096).
SUMMARY_MAX_TOKENS = 4096
#: Fewest tokens worth asking a summary in; less, and tool results are left out.
SUMMARY_MIN_TOKENS = 1024
#: Share of the context the restarted conversation may fill at most: a
#: summary bigger than that would leave no room to go on researching.
MAX_RESTART_SHARE = 0.6
#: Shortest summary (without blanks around it) that counts as one.
MIN_SUMMARY_CHARS = 20
#: What stands in for a tool result left out of the summary request.
OMITTED_RESULT = "(This tool result was left out to fit the summary request.)"
#: Longest summary reply read, in characters (65,536). The call asks for at
#: most `SUMMARY_MAX_TOKENS` tokens, about 16K characters of prose at ~4 a
#: token: four times that holds any reply the server was asked for, and what
#: a server sends beyond it (ignoring max_tokens) is read as cut off there.
MAX_REPLY_CHARS = 16 * SUMMARY_MAX_TOKENS
#: ReSum summarises when the conversation reaches this share of its budget
#: (WebResummer ``react_agent.py``: ``token_count >= max_tokens * 0.9``) ...
RESUM_SHARE = 0.9
#: ... whose budget is ``MAX_CONTEXT * 1024 - 1000`` tokens.
RESUM_RESERVE_TOKENS = 1000

#: A substring search: ``find(text, needle, start)`` as `str.find` does it.
Find = Callable[[str, str, int], int]

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def consolidation_point(context_tokens: int) -> float:
    """The conversation size at which ReSum summarises, for a context of this size.

    The lab's ``0.9 * (MAX_CONTEXT * 1024 - 1000)``, where ``MAX_CONTEXT *
    1024`` is the context the run may fill: 28,591.2 tokens for 32K.
    """
    return RESUM_SHARE * (context_tokens - RESUM_RESERVE_TOKENS)


# -- the request ----------------------------------------------------------------------


def summarised_history(
    messages: list[dict[str, Any]], opening: int
) -> list[dict[str, Any]]:
    """The messages ReSum summarises: all but the system messages and the opening.

    The lab summarises ``messages[2:]``: everything after its system message
    and the message the conversation opened with (the question, or after a
    consolidation the restart message, which the last summary already
    holds). ``opening`` is that message's index (-1: none).
    """
    return [
        message
        for index, message in enumerate(messages)
        if index != opening and message.get("role") != "system"
    ]


def rendered_message(message: Mapping[str, Any]) -> str:
    """One message as the lab writes it into the history: ``str()`` of its dict.

    ``summary_utils.py`` joins ``str(msg)`` of each message, Python's own
    rendering of ``{'role': …, 'content': …}`` (quotes chosen and characters
    escaped as ``repr`` does it, one line per message). Content that is not
    text (an image part) is given as its text.
    """
    text = content_text(message.get("content"))
    return repr({"role": message.get("role"), "content": text})


def summary_request(
    question: str,
    history: list[dict[str, Any]],
    last_summary: str,
    hard_limit: int,
) -> tuple[list[dict[str, Any]], int]:
    """ReSum's summary request, and the reply tokens it may ask for.

    The request is one user message, no system message: the lab's prompt
    (the first or, with a ``last_summary``, the later one) holding the
    question and the history, each message on its line as the lab renders
    it. When it and a reply of `SUMMARY_MIN_TOKENS` do not fit
    ``hard_limit`` (the lab's summary model had a context of its own; here it
    is by default the research model, whose context the conversation has
    just filled), tool results are left out, oldest first, until they do;
    the latest result and every assistant turn stay. The reply may be
    `SUMMARY_MAX_TOKENS` long, less when the context holds less.

    Args:
        question: The user's question.
        history: The messages to summarise (`summarised_history`).
        last_summary: The last summary as the restart carried it, tags
            included; "" for the first summary.
        hard_limit: Tokens the summary model holds, prompt and reply.
    """
    lines = [rendered_message(message) for message in history]
    frame = summary_prompt(question, "", last_summary)
    # Per-line estimates, each rounded up and one more for its line break,
    # err high: leaving a result out then costs no new pass over the history.
    costs = [estimate_text_tokens(line) + 1 for line in lines]
    total = MESSAGE_OVERHEAD_TOKENS + estimate_text_tokens(frame) + sum(costs)
    results = [
        index for index, message in enumerate(history) if _is_tool_result(message)
    ]
    for index in results[:-1]:
        if hard_limit - total >= SUMMARY_MIN_TOKENS:
            break
        lines[index] = rendered_message(
            {
                "role": history[index].get("role"),
                "content": wrap_response(OMITTED_RESULT),
            }
        )
        cost = estimate_text_tokens(lines[index]) + 1
        total += cost - costs[index]
        costs[index] = cost
    request = [
        {
            "role": "user",
            "content": summary_prompt(question, "\n".join(lines), last_summary),
        }
    ]
    room = hard_limit - messages_tokens(request)
    return request, max(0, min(SUMMARY_MAX_TOKENS, room))


def _is_tool_result(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return (
        message.get("role") == "user"
        and isinstance(content, str)
        and content.startswith("<tool_response>")
    )


# -- the reply ------------------------------------------------------------------------


def state_from_reply(
    text: str, *, tagged_only: bool = False, find: Find = str.find
) -> str:
    """The summary a reply holds, as the lab reads it, or "" when it holds none.

    As ``summary_utils.py`` reads it: the ``<think>…</think>`` blocks are
    removed, the rest stripped, and the summary is what follows the first
    ``<summary>`` up to the next ``</summary>`` (or ``<summary>``, or the
    end), as written; a reply without ``<summary>`` is the summary whole.
    Beyond the lab: a ``</think>`` before any ``<think>`` ends a block the
    chat template opened (the reasoning before it goes too); ``<tool_call>``
    blocks of an untagged reply are left out (the research model, trained to
    call tools, may try one); a summary shorter than `MIN_SUMMARY_CHARS`
    counts as none (a restart from nothing would lose the research). The
    summary is returned as written: `restarted_conversation` defuses it.

    Linear: the first `MAX_REPLY_CHARS` of the reply are read with forward
    searches, none going back over text already passed (a regex for
    ``<think>…</think>`` blocks was quadratic on unclosed tags).

    Args:
        text: The reply's content, or its reasoning channel.
        tagged_only: Only a ``<summary>`` counts (the reasoning channel: a
            thought is no summary).
        find: The substring search (`str.find`); a test passes one that counts
            the characters examined.
    """
    text = _without_reasoning(text[:MAX_REPLY_CHARS], find).strip()
    opened = find(text, SUMMARY_OPEN, 0)
    if opened >= 0:
        state = _summary_body(text, opened + len(SUMMARY_OPEN), find)
    elif tagged_only:
        return ""
    else:
        state = _without_tool_calls(text, find).strip()
    return state if len(state.strip()) >= MIN_SUMMARY_CHARS else ""


def _without_reasoning(text: str, find: Find) -> str:
    """``text`` without its reasoning blocks, in one forward pass over its ``<``.

    Each ``<think>`` up to the next ``</think>`` goes (the lab's non-greedy
    ``<think>.*?</think>``; an unclosed one stays, as there). A ``</think>``
    before any ``<think>`` closes a block the chat template opened: the text
    up to it goes too.
    """
    kept: list[str] = []
    at, opened, seen_open = 0, -1, False
    tag = find(text, "<", 0)
    while tag >= 0:
        step = 1
        if text.startswith(_THINK_OPEN, tag):
            opened = tag if opened < 0 else opened
            seen_open, step = True, len(_THINK_OPEN)
        elif text.startswith(_THINK_CLOSE, tag):
            if opened >= 0:
                kept.append(text[at:opened])
                at, opened = tag + len(_THINK_CLOSE), -1
            elif not seen_open and not kept:
                at = tag + len(_THINK_CLOSE)
            seen_open, step = True, len(_THINK_CLOSE)
        tag = find(text, "<", tag + step)
    kept.append(text[at:])
    return "".join(kept)


def _summary_body(text: str, body: int, find: Find) -> str:
    """From ``body`` to the next ``</summary>`` or ``<summary>`` (or the end).

    ``split("<summary>")[1].split("</summary>")[0]`` in the lab's code: the
    text ends where either tag comes first.
    """
    tag = find(text, "<", body)
    while tag >= 0:
        if text.startswith(SUMMARY_CLOSE, tag) or text.startswith(SUMMARY_OPEN, tag):
            return text[body:tag]
        tag = find(text, "<", tag + 1)
    return text[body:]


def _without_tool_calls(text: str, find: Find) -> str:
    """``text`` without its ``<tool_call>`` blocks (an unclosed one runs to the end)."""
    kept: list[str] = []
    at = 0
    while (opened := find(text, "<tool_call>", at)) >= 0:
        kept.append(text[at:opened])
        closed = find(text, "</tool_call>", opened + len("<tool_call>"))
        if closed < 0:
            return "".join(kept)
        at = closed + len("</tool_call>")
    kept.append(text[at:])
    return "".join(kept)


# -- the restart ----------------------------------------------------------------------


def defused_summary(state: str) -> str:
    """The summary as it re-enters the prompt: no control token, no protocol tag.

    The summary is the summary model's text, and the model read pages: it
    may neither close nor open the ``<summary>`` block, nor carry a
    chat-template control token.
    """
    return neutralise_prompt_text(state)


def tagged_summary(state: str) -> str:
    """The summary as the lab passes it on: ``<summary>`` + text + ``</summary>``.

    What the restart message carries after ``Summary: ``, and what the next
    summary request gets as its last summary. ``state`` is already defused.
    """
    return SUMMARY_OPEN + state + SUMMARY_CLOSE


def restarted_conversation(
    system: Iterable[dict[str, Any]], question: str, state: str
) -> list[dict[str, Any]]:
    """The conversation after a consolidation: system prompt, question and summary.

    The lab's restart (``react_agent.py``), byte for byte: the system
    messages, then one user message of the question and the summary. The
    summary is defused here, where it enters the prompt; the question is the
    user's own, kept as asked.
    """
    return [
        *system,
        {
            "role": "user",
            "content": resumption_message(question, defused_summary(state)),
        },
    ]
