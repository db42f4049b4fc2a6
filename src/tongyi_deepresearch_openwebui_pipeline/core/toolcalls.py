"""Turning ``<tool_call>`` blocks into validated calls, and results into replies.

Everything here is model-facing: when a call cannot run, the error text is
written for the model so it can correct itself on the next round, and it
starts with the reference agent's own wording where one exists.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .prompts import INVALID_TOOL_CALL, tool_not_found

try:  # json5 accepts single quotes, trailing commas, comments, bare keys.
    import json5 as _json5
except ImportError:  # pragma: no cover - json5 is a declared dependency
    _json5 = None

PYTHON_TOOL = "PythonInterpreter"
PYTHON_FORMAT_ERROR = "[Python Interpreter Error]: Formatting error."

_FENCE = re.compile(r"^\s*```(?:json|json5)?\s*|\s*```\s*$", re.IGNORECASE)
_CODE = re.compile(r"<code>(.*?)(?:</code>|$)", re.DOTALL)


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


def _loads_lenient(text: str) -> Any:
    text = _FENCE.sub("", text.strip())
    start, end = text.find("{"), text.rfind("}")
    if start >= 0 and end > start:
        text = text[start : end + 1]
    try:
        return json.loads(text)
    except ValueError:
        if _json5 is None:
            raise
    try:
        return _json5.loads(text)
    except ValueError:
        # Models sometimes put raw newlines inside JSON strings.
        return _json5.loads(text.replace("\r", "").replace("\n", "\\n"))


def _is_python_tool(name: str) -> bool:
    return re.sub(r"[^a-z]", "", name.lower()) == "pythoninterpreter"


def parse_tool_call(raw: str) -> ToolCall | CallError:
    """Parse the inside of one ``<tool_call>`` block.

    The PythonInterpreter form is recognised by the tool *name* (never by the
    word "python" appearing somewhere in the call): its code sits in
    ``<code>…</code>`` after the JSON, or, as some models write it, in
    ``arguments.code``.
    """
    code_match = _CODE.search(raw)
    head = raw[: code_match.start()] if code_match else raw
    payload = _call_payload(head)
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
    """(name, arguments) from the JSON part of a call, or None if unusable."""
    try:
        payload = _loads_lenient(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = _loads_lenient(arguments) if arguments.strip() else {}
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
        return CallError(tool_not_found(call.name, offered), call.name, call.arguments)
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

_RESPONSE_TAG = re.compile(r"<(/?)tool_response>", re.IGNORECASE)
_SPECIAL_TOKEN = re.compile(r"<\|([a-zA-Z0-9_]+)\|>")


def neutralise(result: str) -> str:
    """Make tool output unable to break the ``<tool_response>`` wrapping.

    A page may contain ``</tool_response>`` or chat-template control tokens
    (``<|im_end|>``); servers that tokenise special tokens inside text would
    let such a page end the turn or forge a system message. Both are defused
    while staying readable.
    """
    result = _RESPONSE_TAG.sub(r"[\1tool_response]", result)
    return _SPECIAL_TOKEN.sub(r"<\1>", result)


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
