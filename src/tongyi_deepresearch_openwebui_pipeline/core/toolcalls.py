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
from typing import Any, Literal

from .prompts import INVALID_TOOL_CALL, TOOL_LINES

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
#
# A call's arguments are checked against the JSON schema inside its tool's
# line of the system prompt (`prompts.TOOL_LINES`): what the model reads is
# what is checked, and a tool's argument shapes are written nowhere else. Each
# line is read once, at import. The lines use a small part of JSON Schema, and
# this reads only that part: the parameters are an "object" with "properties"
# and "required"; a property is a "string", or an "array" whose "items" are
# strings, with an optional "minItems"; "description" goes to the model only.
# Anything else is refused when the line is read (`SchemaError`), so a line can
# never promise the model a check that is not made.
#
# On top of the schema, the reference tools' leniency and this project's
# rules: a bare string given for a list of strings is a list of one (the
# reference tools accept it); list items are stripped, and neither they nor
# the list may be empty; a string may not be blank; a required argument that
# is absent or null is missing.


class SchemaError(ValueError):
    """A prompt line's schema uses a part of JSON Schema not read here."""


@dataclass(frozen=True)
class Parameter:
    """One argument of a tool, as its prompt line's schema declares it."""

    name: str
    #: "string", or "strings" (an array of strings).
    kind: Literal["string", "strings"]
    required: bool
    #: The fewest items of a list of strings (at least 1).
    min_items: int = 1

    def problem(self) -> str:
        """What a value of the wrong shape is told (model-facing)."""
        if self.kind == "string":
            return f"'{self.name}' must be a non-empty string"
        if self.min_items > 1:
            return (
                f"'{self.name}' must be a list of at least {self.min_items} "
                "non-empty strings"
            )
        return f"'{self.name}' must be a non-empty list of non-empty strings"


@dataclass(frozen=True)
class ArgumentSchema:
    """What a call of one tool must carry, read from the tool's prompt line."""

    #: The tool's name, as its line gives it.
    tool: str
    parameters: tuple[Parameter, ...]
    #: A valid call, shown to the model with an argument error ("": none).
    example: str = ""


_PARAMETERS_KEYS = frozenset({"type", "properties", "required"})
_STRING_KEYS = frozenset({"type", "description"})
_ARRAY_KEYS = frozenset({"type", "items", "description", "minItems"})


def _only(spec: Any, keys: frozenset[str], where: str) -> Mapping[str, Any]:
    """``spec`` as a JSON object holding no key outside ``keys``."""
    if not isinstance(spec, dict):
        raise SchemaError(f"{where}: not a JSON object")
    unread = sorted(set(spec) - keys)
    if unread:
        raise SchemaError(f"{where}: {', '.join(unread)} not read by this checker")
    return spec


def _parameter(tool: str, name: str, spec: Any, required: bool) -> Parameter:
    where = f"{tool}.{name}"
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind == "string":
        _only(spec, _STRING_KEYS, where)
        return Parameter(name, "string", required)
    if kind != "array":
        raise SchemaError(f"{where}: type {kind!r} not read by this checker")
    _only(spec, _ARRAY_KEYS, where)
    items = _only(spec.get("items"), _STRING_KEYS, f"{where}.items")
    if items.get("type") != "string":
        raise SchemaError(f"{where}.items: only strings are read by this checker")
    min_items = spec.get("minItems", 1)
    if type(min_items) is not int or min_items < 0:
        raise SchemaError(f"{where}.minItems: not a whole number")
    return Parameter(name, "strings", required, max(1, min_items))


_NAME_MEMBER = '"name": '
_PARAMETERS_MEMBER = '"parameters": '
#: What follows the parameters in a line: the ends of the function and the spec.
_LINE_END = "}}"


def _function_spec(line: str) -> tuple[str, Any]:
    """(name, parameters) of a tool line.

    The lab's PythonInterpreter line is not JSON (its description quotes a
    call without escaping the quotes), and the model was trained on it as it
    is. A line that does not parse whole is read where its members stand:
    the first ``"name"`` (the function's, before its description) and the
    last ``"parameters"``, which must close the line.
    """
    try:
        function = json.loads(line, strict=False)["function"]
        return str(function["name"]), function.get("parameters")
    except (ValueError, TypeError, KeyError, AttributeError):
        pass
    decoder = json.JSONDecoder(strict=False)
    try:
        name_at = line.index(_NAME_MEMBER) + len(_NAME_MEMBER)
        name, _ = decoder.raw_decode(line, name_at)
        parameters_at = line.rindex(_PARAMETERS_MEMBER) + len(_PARAMETERS_MEMBER)
        parameters, end = decoder.raw_decode(line, parameters_at)
    except ValueError as error:
        raise SchemaError(f"not a function spec: {error}") from None
    if not isinstance(name, str) or line[end:] != _LINE_END:
        raise SchemaError(f"not a function spec: {line[:60]!r}…")
    return name, parameters


@functools.cache
def argument_schema(line: str, example: str = "") -> ArgumentSchema:
    """The argument schema of a tool, read from its line of the system prompt.

    Args:
        line: The tool's line inside ``<tools>`` (an OpenAI function spec in
            JSON; raw line breaks inside its strings are tolerated).
        example: A valid call of the tool, shown with an argument error.

    Raises:
        SchemaError: The line is no function spec, or its parameters use
            JSON Schema this checker does not read.
    """
    tool, parameters = _function_spec(line)
    parameters = _only(parameters, _PARAMETERS_KEYS, tool)
    properties = parameters.get("properties", {})
    required = parameters.get("required", [])
    if parameters.get("type") != "object" or not isinstance(properties, dict):
        raise SchemaError(f"{tool}: parameters are not an object with properties")
    if not isinstance(required, list) or any(
        not isinstance(name, str) or name not in properties for name in required
    ):
        raise SchemaError(f"{tool}: required is not a list of its properties")
    return ArgumentSchema(
        tool,
        tuple(
            _parameter(tool, name, spec, name in required)
            for name, spec in properties.items()
        ),
        example,
    )


#: A valid call of each of the model's own tools, shown with an argument error.
CALL_EXAMPLES: dict[str, str] = {
    "search": '{"name": "search", "arguments": {"query": ["first query", "second"]}}',
    "google_scholar": '{"name": "google_scholar", "arguments": {"query": ["topic"]}}',
    "visit": (
        '{"name": "visit", "arguments": {"url": ["https://example.org/page"], '
        '"goal": "what to find on the page"}}'
    ),
    "parse_file": '{"name": "parse_file", "arguments": {"files": ["report.pdf"]}}',
}

#: The argument schema of each of the model's own tools (read at import).
SCHEMAS: dict[str, ArgumentSchema] = {
    name: argument_schema(line, CALL_EXAMPLES.get(name, ""))
    for name, line in TOOL_LINES.items()
}


def tool_not_found(name: str) -> str:
    """The reference loop's text for a call to a tool it does not offer.

    Exactly the lab's words (inference/react_agent.py, custom_call_tool), with
    no list of the tools on offer: the system prompt already lists them, and
    the model was trained on this text.
    """
    return f"Error: Tool {name} not found"


def _argument_error(name: str, problem: str, example: str) -> str:
    hint = f" A valid call looks like: {example}" if example else ""
    return f"Error: invalid arguments for {name}: {problem}.{hint}"


def _normalise_strings(value: Any, min_items: int) -> list[str] | None:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or len(value) < min_items:
        return None
    items = [item.strip() for item in value if isinstance(item, str)]
    if len(items) != len(value) or not all(items):
        return None
    return items


def _checked_value(parameter: Parameter, value: Any) -> Any | None:
    """``value`` as the tool gets it, or None when it has the wrong shape."""
    if parameter.kind == "strings":
        return _normalise_strings(value, parameter.min_items)
    return value if isinstance(value, str) and value.strip() else None


def check_arguments(call: ToolCall, schema: ArgumentSchema) -> ToolCall | CallError:
    """Check ``call``'s arguments against ``schema``, in the schema's order.

    Returns:
        The call with its arguments normalised (lists of strings stripped, a
        bare string made a list), or the first problem as a model-facing
        `CallError`. Arguments the schema does not name are kept as given.
    """
    arguments = dict(call.arguments)
    for parameter in schema.parameters:
        value = arguments.get(parameter.name)
        if value is None:
            if not parameter.required:
                continue
            problem = f"missing '{parameter.name}'"
            message = _argument_error(call.name, problem, schema.example)
            return CallError(message, call.name, arguments)
        checked = _checked_value(parameter, value)
        if checked is None:
            message = _argument_error(call.name, parameter.problem(), schema.example)
            return CallError(message, call.name, arguments)
        arguments[parameter.name] = checked
    return ToolCall(call.name, arguments, call.code)


def check_call(
    call: ToolCall,
    available: Iterable[str],
    schemas: Mapping[str, ArgumentSchema] = SCHEMAS,
) -> ToolCall | CallError:
    """Check that the tool is offered and its arguments have the right shape.

    Args:
        call: The parsed call.
        available: The tools offered in this run.
        schemas: Argument schemas by tool name (default: the model's own
            tools'); a tool without one gets its arguments as given.
    """
    if call.name not in list(available):
        return CallError(tool_not_found(call.name), call.name, call.arguments)
    schema = schemas.get(call.name)
    if schema is None:
        return ToolCall(call.name, dict(call.arguments), call.code)
    return check_arguments(call, schema)


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
