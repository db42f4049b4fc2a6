"""Extract: the reference EXTRACTOR_PROMPT over a page, and reading the reply.

Like the reference agent: an unusable reply shrinks the page (70% three
times, then 25,000 characters) and asks again; a reply that is all thinking
gives the page start at once. Replies are read in linear time (strict JSON,
json5 only on small replies, then a field scraper). When no extractor can
run, the page's start is given, labelled as such.
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import functools
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..shared.safe_http import _SSL_CONTEXTS, _TlsContexts
from .convert import _Page
from .extractor_client import (
    Sleep,
    _call_extractor,
    _endpoint_secrets,
    _extractor_client,
    _ExtractorError,
    _openai_sdk,
    _redact,
    _Reply,
    _sleep,
)

if TYPE_CHECKING:
    from ..visit_tool import Tools

log = logging.getLogger(__name__)

# --- snippet ---

# The reference agent's extractor prompt, byte for byte (typos and the trailing
# space after "Webpage Content" included): the extractor was tuned on it.
EXTRACTOR_PROMPT = (
    "Please process the following webpage content and user goal to extract "
    "relevant information:\n"
    "\n"
    "## **Webpage Content** \n"
    "{webpage_content}\n"
    "\n"
    "## **User Goal**\n"
    "{goal}\n"
    "\n"
    "## **Task Guidelines**\n"
    "1. **Content Scanning for Rationale**: Locate the **specific sections/data** "
    "directly related to the user's goal within the webpage content\n"
    "2. **Key Extraction for Evidence**: Identify and extract the **most relevant "
    "information** from the content, you never miss any important information, "
    "output the **full original context** of the content as far as possible, it "
    "can be more than three paragraphs.\n"
    "3. **Summary Output for Summary**: Organize into a concise paragraph with "
    "logical flow, prioritizing clarity and judge the contribution of the "
    "information to the goal.\n"
    "\n"
    '**Final Output Format using JSON format has "rational", "evidence", '
    '"summary" feilds**\n'
)

# What the model reads for a URL that could not be read (the reference's words).
FAILURE_EVIDENCE = (
    "The provided webpage content could not be accessed. "
    "Please check the URL or file format."
)
FAILURE_SUMMARY = (
    "The webpage content could not be processed, "
    "and therefore, no information is available."
)
# The reference's last try: the page cut to this many characters.
_FINAL_CUT_CHARS = 25_000


@dataclass
class _Outcome:
    """What one URL produced: extracted, a raw excerpt, or a failure."""

    kind: Literal["extracted", "excerpt", "failed"]
    evidence: str = FAILURE_EVIDENCE
    summary: str = FAILURE_SUMMARY
    page: _Page | None = None
    reason: str = ""


# json5 is pure Python (10-20 µs a character, more when nested): above this size
# a reply that is not strict JSON goes to the linear field scraper instead.
_JSON5_MAX_CHARS = 1_000
# Nested lists in a reply are flattened this deep, no deeper.
_MAX_RENDER_DEPTH = 8
# Where an answer object starts: `{` then one of the extractor's keys.
_ANSWER_START = re.compile(r"\{\s*[\"']?(?:rationale?|evidence|summary)\b", re.I)
# Objects tried, from the end of a thought, before giving up on it.
_MAX_ANSWER_STARTS = 8
_BUDGET_SPENT = "the extractor spent its whole reply budget thinking"
_NO_JSON = "the extractor replied without JSON, with thinking only"


def _render(value: Any, depth: int = 0) -> str:
    """Evidence/summary as text: lists line by line, objects as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        if depth >= _MAX_RENDER_DEPTH:
            return ""
        return "\n".join(filter(None, (_render(item, depth + 1) for item in value)))
    if isinstance(value, dict):
        return _json_text(value)
    return str(value)


def _json_text(value: dict) -> str:
    """An object as JSON text ("" when it is nested too deeply to write)."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return ""


def _loads(text: str) -> Any:
    """Strict JSON (raw newlines allowed), then json5 on small texts; else None."""
    try:
        return json.loads(text, strict=False)  # C speed, linear
    except (ValueError, RecursionError):
        pass
    if len(text) > _JSON5_MAX_CHARS:
        return None  # the caller's linear scraper takes over
    try:
        import json5  # type: ignore[import-untyped]  # noqa: PLC0415
    except ImportError:
        return None
    try:
        return json5.loads(text)
    except Exception:  # json5 raises ValueError, RecursionError and others
        return None


_FIELD = re.compile(
    r"[\"']?\b(rationale|rational|evidence|summary)\b[\"']?\s*:\s*", re.I
)


def _scrape_fields(text: str) -> dict[str, Any]:
    """Last resort for broken JSON (unescaped quotes, raw newlines): split on keys.

    Linear in the text: only the last occurrence of each key is read (it is the
    one that counts), so at most four values are parsed.
    """
    matches = list(_FIELD.finditer(text))
    last = {match.group(1).lower(): index for index, match in enumerate(matches)}
    fields: dict[str, Any] = {}
    for key, index in sorted(last.items(), key=lambda item: item[1]):
        match = matches[index]
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        value = text[match.end() : end].strip().rstrip("}").strip().rstrip(",").strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        parsed = _loads(value) if value.startswith("[") else None
        fields[key] = (
            parsed
            if parsed is not None
            else (value.replace("\\n", "\n").replace('\\"', '"'))
        )
    return fields


def _strip_fences(text: str) -> str:
    """Remove outer code fences only: a ``` inside the evidence is page content."""
    if text.startswith("```"):
        rest = text[3:]
        text = rest[len(rest) - len(rest.lstrip(_FENCE_LANGUAGE)) :].lstrip()
    if text.endswith("```"):
        text = text[:-3].rstrip()
    return text


_FENCE_LANGUAGE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _parse_extraction(reply: str) -> tuple[str, str] | None:
    """(evidence, summary) from the extractor reply, or None if unusable.

    Linear in the reply: strict JSON first, json5 only on small replies, then
    the field scraper; no regular expression here can backtrack.
    """
    text = _strip_fences(reply.strip())
    start, end = text.find("{"), text.rfind("}")
    candidate = text[start : end + 1] if start != -1 and end > start else text
    data = _loads(candidate)
    if not isinstance(data, dict):
        data = _scrape_fields(candidate)
    return _fields(data)


def _fields(data: dict) -> tuple[str, str] | None:
    """(evidence, summary) of a parsed reply, or None if it has neither."""
    data = {str(k).lower(): v for k, v in data.items()}
    evidence, summary = _render(data.get("evidence")), _render(data.get("summary"))
    if not evidence and not summary:
        return None
    return (
        evidence or "No verbatim evidence was quoted by the extractor.",
        summary or "The extractor gave no summary.",
    )


def _answer_ending(thought: str) -> tuple[str, str] | None:
    """The answer a thought ends with, if it ends with a well-formed JSON object.

    Used only when the content is empty: with thinking turned off, some
    reasoning parsers (vLLM's deepseek_r1) see no `</think>` and move the whole
    answer into the reasoning field. A thought is otherwise not an answer, so
    the object must close the text and parse as JSON: a draft in mid-thought, or
    broken JSON that only the lenient field scraper would read, is not taken.
    """
    text = _strip_fences(thought.strip())
    if not text.endswith("}"):
        return None
    starts = [match.start() for match in _ANSWER_START.finditer(text)]
    for start in reversed(starts[-_MAX_ANSWER_STARTS:]):
        data = _loads(text[start:])  # an object inside the answer is not closed
        if isinstance(data, dict):
            return _fields(data)
    return None


def _read_reply(reply: _Reply) -> tuple[tuple[str, str] | None, str]:
    """(evidence, summary), or why to stop trying ("" = shrink and retry).

    A reply cut at its token limit before any answer began, or one that is
    thinking only, comes back the same way if asked again: the page start is
    given at once instead of the reference's four shrinking retries.
    """
    answer = reply.answer.strip()
    # A cut reply is read only where an answer visibly began: without think
    # tags, text that does not start like JSON may be a thought the chat
    # template opened, and a draft in it must not pass for the answer.
    if reply.cut and not _strip_fences(answer).startswith("{"):
        answer = ""
    if answer:
        parsed = _parse_extraction(answer) if len(answer) >= 10 else None
        return parsed, ""  # without usable JSON: the reference's retries
    if reply.cut:
        return None, _BUDGET_SPENT
    if reply.thought.strip():
        return _answer_ending(reply.thought), _NO_JSON
    return None, ""  # nothing at all: the reference's retries


def _document(page: _Page) -> str:
    """The page as the extractor sees it (the reference used Jina Reader's layout)."""
    return (
        f"Title: {page.title}\n\nURL Source: {page.final_url}\n\n"
        f"Markdown Content:\n{page.text}"
    )


def _excerpt(
    page: _Page, note: str, valves: "Tools.Valves", reason: str = ""
) -> _Outcome:
    """Fallback when no extractor can run: the page's beginning, clearly labelled.

    `note` opens the model-facing summary; `reason` is the short cause the
    user sees in the status line (the note when not given).
    """
    text = page.text[: valves.RAW_EXCERPT_CHARS].rstrip()
    if len(page.text) > valves.RAW_EXCERPT_CHARS:
        text += "\n[…]"
    summary = (
        f"{note}, so the evidence above is the beginning of the page text, "
        "not a goal-focused extract."
    )
    return _Outcome("excerpt", text, summary, page, reason or note)


def _fallback_status(url: str, outcome: _Outcome) -> str:
    """What the user is told when a page is given as its start, not extracted."""
    return (
        f"Could not extract from {url} ({outcome.reason}); gave the page start instead"
    )


async def _extract(
    page: _Page,
    goal: str,
    valves: "Tools.Valves",
    *,
    sleep: Sleep = _sleep,
    openai_sdk: Callable[[], Awaitable[Any]] = _openai_sdk,
    tls: _TlsContexts = _SSL_CONTEXTS,
) -> _Outcome:
    """Run the extractor like the reference: shrink 70% ×3, then 25,000 chars.

    Args:
        page: The page read.
        goal: The model's goal for it.
        valves: The call's settings.
        sleep: Waits between retries (`_sleep`).
        openai_sdk: Imports the `openai` package (`_openai_sdk`).
        tls: The TLS contexts to connect with (the process's).

    Returns:
        The extract; the page start when no extractor can run.
    """
    if not valves.EXTRACTOR_BASE_URL.strip():
        return _excerpt(
            page,
            "No extractor model is configured (EXTRACTOR_BASE_URL valve)",
            valves,
            "no extractor model is configured",
        )
    try:
        openai = await openai_sdk()
        async with _extractor_client(openai, valves, tls) as client:
            ask = functools.partial(
                _call_extractor, openai, client, valves=valves, sleep=sleep
            )
            return await _extract_with_retries(page, goal, valves, ask)
    except _ExtractorError as exc:
        # The one exit of extractor errors: redacted before anyone sees them.
        reason = _redact(str(exc), _endpoint_secrets(valves))
        return _excerpt(page, f"Extraction failed: {reason}", valves, reason)


async def _extract_with_retries(
    page: _Page,
    goal: str,
    valves: "Tools.Valves",
    ask: Callable[[str], Awaitable[_Reply]],
) -> _Outcome:
    """The reference's attempts: an unusable reply shrinks the page and retries.

    Args:
        page: The page read.
        goal: The model's goal for it.
        valves: The call's settings.
        ask: Sends a prompt to the extractor (`_call_extractor`).

    Returns:
        The extract, the page start after a reply that was all thinking, or
        a failure when no reply was usable.
    """
    # The prompt must be encodable: see `_well_formed`.
    content, goal = _well_formed(_document(page)), _well_formed(goal)
    for attempt in range(5):
        prompt = EXTRACTOR_PROMPT.format(webpage_content=content, goal=goal)
        reply = await ask(prompt)
        parsed, stop = _read_reply(reply)
        if parsed:
            return _Outcome("extracted", parsed[0], parsed[1], page)
        log.info(
            "extractor reply unusable (attempt %d, %d chars, %s)",
            attempt + 1,
            len(reply.answer) + len(reply.thought),
            stop or "retrying",
        )
        if stop:
            return _thinking_excerpt(page, stop, valves)
        # Like the reference: 70% of the content three times, then 25,000 chars.
        if attempt < 3:
            content = content[: int(len(content) * 0.7)]
        else:
            content = content[:_FINAL_CUT_CHARS]
    return _Outcome("failed", page=page, reason="the extractor gave no usable answer")


# Surrogate code points: half of a UTF-16 pair, never a character of their own.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _well_formed(text: str) -> str:
    r"""`text` with every surrogate code point replaced by U+FFFD.

    A Python string can hold lone surrogates that no UTF-8 encoder accepts:
    json.loads makes one of the `"\ud83d"` a model may write in its tool
    call's goal, and a page's text may hold them too. Sent as they are, they
    make the extractor request fail to encode (UnicodeEncodeError), and every
    attempt with it.
    """
    # Checked in C first (isascii reads a flag; encoding a page takes about a
    # millisecond): the regex pass, several milliseconds a page on the event
    # loop, runs only when a surrogate is there.
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def _thinking_excerpt(page: _Page, reason: str, valves: "Tools.Valves") -> _Outcome:
    """The page start after a reply that was all thinking, with what to change."""
    if reason == _BUDGET_SPENT:
        hint = "EXTRACTOR_MAX_TOKENS is its reply budget"
    else:
        hint = "EXTRACTOR_DISABLE_THINKING asks the server to skip thinking"
    return _excerpt(page, f"Extraction failed: {reason} ({hint})", valves, reason)
