"""Turning ``<tool_call>`` blocks into validated calls, and results into replies.

Everything here is model-facing: when a call cannot run, the error text is
written for the model so it can correct itself on the next round, and it
starts with the reference agent's own wording where one exists.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .prompts import INVALID_TOOL_CALL

try:  # json5 accepts single quotes, trailing commas, comments, bare keys.
    import json5 as _json5
except ImportError:  # pragma: no cover - json5 is a declared dependency
    _json5 = None

PYTHON_TOOL = "PythonInterpreter"
PYTHON_FORMAT_ERROR = "[Python Interpreter Error]: Formatting error."

_CODE = re.compile(r"<code>(.*?)(?:</code>|$)", re.DOTALL)
_FENCE_OPENINGS = ("```json5", "```json", "```")


@dataclass(frozen=True)
class ToolCall:
    """A call the loop can dispatch."""

    name: str
    arguments: dict[str, Any]
    code: str | None = None


@dataclass(frozen=True)
class CallError:
    """A call that cannot run; ``message`` goes back to the model."""

    message: str
    name: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)


#: Longest call (or string-encoded ``arguments``) the lenient JSON5 parser may
#: read. json5 is pure Python and costs about 22 µs per character (measured:
#: 4,000 characters ≈ 90 ms of CPU), so it only ever sees calls this small, and
#: the loop runs it in a worker thread. Strict JSON (C speed) has no such limit.
LENIENT_MAX_CHARS = 4000


class _TooLongForLenientError(ValueError):
    """Not strict JSON, and too long to hand to the slow lenient parser."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def _json_span(text: str) -> str:
    """The JSON object inside a call: fences and surrounding prose removed.

    Plain string operations (linear): a regex for the fences backtracks
    quadratically over long runs of whitespace.
    """
    text = text.strip()
    for opening in _FENCE_OPENINGS:
        if text[: len(opening)].lower() == opening:
            text = text[len(opening) :]
            break
    text = text.removesuffix("```")
    start, end = text.find("{"), text.rfind("}")
    if start >= 0 and end > start:
        text = text[start : end + 1]
    return text.strip()


def _loads_strict(text: str) -> Any:
    """Strict JSON at C speed; raw newlines inside strings are tolerated."""
    return json.loads(text, strict=False)


def _loads_lenient(text: str) -> Any:
    text = _json_span(text)
    try:
        return _loads_strict(text)
    except ValueError:
        if _json5 is None:
            raise
    if len(text) > LENIENT_MAX_CHARS:
        raise _TooLongForLenientError(len(text))
    try:
        return _json5.loads(text)
    except ValueError:
        # Models sometimes put raw newlines inside JSON strings.
        return _json5.loads(text.replace("\r", "").replace("\n", "\\n"))


def needs_lenient_parse(raw: str) -> bool:
    """Whether `parse_tool_call` would fall back to the slow JSON5 parser.

    True when the call is not strict JSON but small enough for json5; the
    loop then parses it in a worker thread so the event loop never stalls.
    """
    code_match = _CODE.search(raw)
    head = _json_span(raw[: code_match.start()] if code_match else raw)
    try:
        payload = _loads_strict(head)
    except (ValueError, RecursionError):
        return len(head) <= LENIENT_MAX_CHARS
    arguments = payload.get("arguments") if isinstance(payload, dict) else None
    if not isinstance(arguments, str) or not arguments.strip():
        return False
    try:
        _loads_strict(_json_span(arguments))
    except (ValueError, RecursionError):
        return len(_json_span(arguments)) <= LENIENT_MAX_CHARS
    return False


def too_long_for_lenient(size: int) -> str:
    """Model-facing error for a long call that is not strict JSON."""
    return (
        f"Error: this tool call is {size:,} characters long and is not valid "
        f"strict JSON. A call longer than {LENIENT_MAX_CHARS:,} characters must "
        "be strict JSON: keys and strings in double quotes, no comments, no "
        "trailing commas. A valid call looks like: "
        '{"name": "visit", "arguments": {"url": ["https://example.org/page"], '
        '"goal": "what to find on the page"}}'
    )


def _is_python_tool(name: str) -> bool:
    return re.sub(r"[^a-z]", "", name.lower()) == "pythoninterpreter"


def parse_tool_call(raw: str) -> ToolCall | CallError:
    """Parse the inside of one ``<tool_call>`` block.

    Strict JSON is tried first (C speed, any size up to the output limit);
    the lenient JSON5 parser only reads calls of at most `LENIENT_MAX_CHARS`
    (see `needs_lenient_parse`), and a longer call that is not strict JSON
    gets a model-facing error with an example.

    The PythonInterpreter form is recognised by the tool *name* (never by the
    word "python" appearing somewhere in the call): its code sits in
    ``<code>…</code>`` after the JSON, or, as some models write it, in
    ``arguments.code``.
    """
    code_match = _CODE.search(raw)
    head = raw[: code_match.start()] if code_match else raw
    try:
        payload = _call_payload(head)
    except _TooLongForLenientError as error:
        return CallError(too_long_for_lenient(error.size))
    if payload is None:
        return CallError(INVALID_TOOL_CALL)
    name, arguments = payload
    if _is_python_tool(name):
        code = code_match.group(1) if code_match else arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return CallError(PYTHON_FORMAT_ERROR, PYTHON_TOOL, arguments)
        return ToolCall(PYTHON_TOOL, {}, code.strip())
    return ToolCall(name, arguments)


def _call_payload(text: str) -> tuple[str, dict[str, Any]] | None:
    """(name, arguments) from the JSON part of a call, or None if unusable.

    Raises `_TooLongForLenientError` for a long call that is not strict JSON.
    """
    try:
        payload = _loads_lenient(text)
    except _TooLongForLenientError:
        raise
    except (ValueError, RecursionError):
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = _loads_lenient(arguments) if arguments.strip() else {}
        except _TooLongForLenientError:
            raise
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return payload["name"].strip(), arguments


# -- argument checks --

# name -> (argument, kind); kinds: "strings" (list of str; a bare str is accepted
# and wrapped, as the reference tools do) and "string".
_SCHEMAS: dict[str, tuple[tuple[str, str], ...]] = {
    "search": (("query", "strings"),),
    "google_scholar": (("query", "strings"),),
    "visit": (("url", "strings"), ("goal", "string")),
    "parse_file": (("files", "strings"),),
    PYTHON_TOOL: (),
}

_EXAMPLES: dict[str, str] = {
    "search": '{"name": "search", "arguments": {"query": ["first query", "second"]}}',
    "google_scholar": '{"name": "google_scholar", "arguments": {"query": ["topic"]}}',
    "visit": (
        '{"name": "visit", "arguments": {"url": ["https://example.org/page"], '
        '"goal": "what to find on the page"}}'
    ),
    "parse_file": '{"name": "parse_file", "arguments": {"files": ["report.pdf"]}}',
}


def tool_not_found(name: str) -> str:
    """The reference loop's text for a call to a tool it does not offer.

    Exactly the lab's words (inference/react_agent.py, custom_call_tool), with
    no list of the tools on offer: the system prompt already lists them, and
    the model was trained on this text.
    """
    return f"Error: Tool {name} not found"


def _argument_error(name: str, problem: str) -> str:
    example = _EXAMPLES.get(name)
    hint = f" A valid call looks like: {example}" if example else ""
    return f"Error: invalid arguments for {name}: {problem}.{hint}"


def _normalise_strings(value: Any) -> list[str] | None:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        return None
    items = [item.strip() for item in value if isinstance(item, str)]
    if len(items) != len(value) or not all(items):
        return None
    return items


def check_call(call: ToolCall, available: Iterable[str]) -> ToolCall | CallError:
    """Check that the tool is offered and its arguments have the right shape."""
    offered = list(available)
    if call.name not in offered:
        return CallError(tool_not_found(call.name), call.name, call.arguments)
    schema = _SCHEMAS.get(call.name, ())
    arguments = dict(call.arguments)
    for key, kind in schema:
        value = arguments.get(key)
        if value is None:
            return CallError(
                _argument_error(call.name, f"missing '{key}'"), call.name, arguments
            )
        if kind == "strings":
            items = _normalise_strings(value)
            if items is None:
                problem = f"'{key}' must be a non-empty list of non-empty strings"
                return CallError(
                    _argument_error(call.name, problem), call.name, arguments
                )
            arguments[key] = items
        elif not isinstance(value, str) or not value.strip():
            problem = f"'{key}' must be a non-empty string"
            return CallError(_argument_error(call.name, problem), call.name, arguments)
    return ToolCall(call.name, arguments, call.code)


# -- results --

_SPECIAL_TOKEN = re.compile(r"<\|([a-zA-Z0-9_]+)\|>")

#: The tags of the model's protocol and of the prompts around it. Text from a
#: model or a page that goes back into a prompt may not open or close one:
#: Qwen's tokenizer reads ``<think>``, ``<tool_call>`` and ``<tool_response>``
#: as single tokens even inside a message, and ``<summary>`` frames the state
#: of a consolidated conversation.
PROMPT_TAGS = ("think", "thinking", "tool_call", "tool_response", "answer", "summary")


@functools.cache
def _tag_pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    """``<name>``, ``</name>`` and their variants (case, spaces, attributes).

    Possessive quantifiers and a scan that stops at the next ``<``, ``>`` or
    line break: every character is examined a bounded number of times.
    """
    alternatives = "|".join(re.escape(name) for name in names)
    return re.compile(
        rf"<[ \t]*+/?[ \t]*+(?:{alternatives})\b[^<>\n]*+>", re.IGNORECASE
    )


def neutralise_tags(text: str, names: tuple[str, ...] = PROMPT_TAGS) -> str:
    """Defuse the tags ``names`` (``</summary>`` → ``[/summary]``).

    Only the angle brackets change, so the text stays readable, and a
    replacement holds neither ``<`` nor ``>``: defusing never splices a new
    tag together from what surrounds it.
    """
    return _tag_pattern(names).sub(lambda tag: f"[{tag.group()[1:-1]}]", text)


def neutralise(result: str) -> str:
    """Make tool output unable to break the ``<tool_response>`` wrapping.

    A page may contain ``</tool_response>`` or chat-template control tokens
    (``<|im_end|>``); servers that tokenise special tokens inside text would
    let such a page end the turn or forge a system message. Both are defused
    while staying readable: the control tokens first, since a defused
    ``<|tool_response|>`` spells the tag.
    """
    return neutralise_tags(neutralise_control_tokens(result), ("tool_response",))


def neutralise_control_tokens(text: str) -> str:
    """Defuse chat-template control tokens (``<|im_start|>`` → ``<im_start>``).

    Used on every text that goes back into a request: tool output, the
    model's own turns and the earlier chat. A server that tokenises special
    tokens inside message text would otherwise let that text end the turn or
    open a forged system message.
    """
    return _SPECIAL_TOKEN.sub(r"<\1>", text)


def neutralise_prompt_text(text: str) -> str:
    """Text from a model or a page made inert before it re-enters a prompt.

    Control tokens are defused, then the `PROMPT_TAGS` (in this order: a
    defused ``<|summary|>`` spells ``<summary>``). Used where a research state,
    a page's title or URL, or a rollout's report goes into a prompt. Linear
    in the text.
    """
    return neutralise_tags(neutralise_control_tokens(text))


def wrap_response(result: str) -> str:
    """One tool result as the model expects it (reference wrapping)."""
    return f"<tool_response>\n{neutralise(result)}\n</tool_response>"


def wrap_responses(results: Iterable[str]) -> str:
    """Several results of one turn in one user message.

    Each keeps its own ``<tool_response>`` block, the layout the chat template
    uses for several tool calls; the message still starts with
    ``<tool_response>`` and ends with ``</tool_response>``, which the template
    relies on to recognise a tool result.
    """
    return "\n".join(wrap_response(result) for result in results)
