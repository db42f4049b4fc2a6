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

All of it runs on the event loop over text that users, web pages and models
wrote, so the work is linear in that text: it is searched with ``str.find``
and with regular expressions that cannot backtrack, never with a pattern
that scans the rest of the text again from every place it might start.
"""

from __future__ import annotations

import html
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
# An opening tag's name ends at a word boundary; the tag runs to the next ">".
_DETAILS_TAG = re.compile(r"<details\b|</details>", re.IGNORECASE)

#: Counts work: called with the characters a search may look at or a copy makes.
WorkCounter = Callable[[int], object]


def _uncounted(chars: int) -> None:
    """The work counter when nobody is counting."""


class _Text:
    """A text searched in time linear in the span searched, the work counted.

    ``count_work`` is told, for every search, the characters from where it
    starts to where it stops, and for every copy its length: a seam that lets
    a test prove the work linear in the input without a clock. ``str.find``
    is linear in that span (CPython switches to the two-way algorithm), but
    ``str.rfind`` is quadratic for some long needles, so searching from the
    right runs ``str.find`` over the reversed text.
    """

    def __init__(self, text: str, count_work: WorkCounter) -> None:
        self.text = text
        self._count = count_work
        self._reversed: str | None = None

    def find(self, literal: str, start: int, end: int) -> int:
        """Where ``literal`` first lies wholly inside ``text[start:end]``, or -1."""
        found = self.text.find(literal, start, end)
        self._count((end if found < 0 else found + len(literal)) - start)
        return found

    def find_last(self, literal: str, start: int, end: int) -> int:
        """Where ``literal`` last lies wholly inside ``text[start:end]``, or -1."""
        if end - start < len(literal):
            return -1
        size = len(self.text)
        self._count(len(literal))  # reversing it
        found = self._backwards().find(literal[::-1], size - end, size - start)
        self._count(
            (size - start if found < 0 else found + len(literal)) - (size - end)
        )
        return -1 if found < 0 else size - found - len(literal)

    def search(self, pattern: re.Pattern[str], start: int, end: int) -> int:
        """Where ``pattern`` (one that never backtracks) first matches, or -1."""
        match = pattern.search(self.text, start, end)
        self._count((end if match is None else match.end()) - start)
        return -1 if match is None else match.start()

    def starts_with(self, literal: str, position: int) -> bool:
        """Whether ``literal`` is at ``position``."""
        self._count(len(literal))
        return self.text.startswith(literal, position)

    def repeats(self, start: int, end: int, position: int) -> bool:
        """Whether ``text[start:end]`` comes again at ``position``."""
        self._count(2 * (end - start))
        return self.text.startswith(self.text[start:end], position)

    def slice(self, start: int, end: int) -> str:
        """A copy of ``text[start:end]``."""
        self._count(end - start)
        return self.text[start:end]

    def _backwards(self) -> str:
        """The text reversed, made once."""
        if self._reversed is None:
            self._count(len(self.text))
            self._reversed = self.text[::-1]
        return self._reversed


def strip_details(text: str, count_work: WorkCounter = _uncounted) -> str:
    """Remove every ``<details …>…</details>`` block, nesting included."""
    out: list[str] = []
    depth = 0
    position = 0
    for start, end, opens in _details_tags(_Text(text, count_work)):
        if opens:
            if depth == 0:
                out.append(text[position:start])
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                position = end
    if depth == 0:
        out.append(text[position:])
    return "".join(out)


def _details_tags(text: _Text) -> Iterator[tuple[int, int, bool]]:
    r"""(start, end, opens) of each tag ``<details\b[^>]*>|</details>`` finds.

    In one pass: the regex went on from every later "<details" to the end of
    the text when one had no ">". Then no later tag, opening or closing,
    has a ">" either, so the scan ends there.
    """
    size = len(text.text)
    position = 0
    while (start := text.search(_DETAILS_TAG, position, size)) >= 0:
        if text.starts_with("</", start):
            position = start + len("</details>")
            yield start, position, False
            continue
        bracket = text.find(">", start + len("<details"), size)
        if bracket < 0:
            return
        position = bracket + 1
        yield start, position, True


def clean_assistant_text(text: str, count_work: WorkCounter = _uncounted) -> str:
    """An earlier assistant message without UI markup or thinking."""
    # As the renderer frames it, on its own lines: a quote of the words inside
    # a note (a check's reason, a page title) is not a restart.
    text = text.rpartition(f"\n\n{RESTART_NOTE}\n\n")[2]
    text = strip_details(text, count_work)
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
    count_work: WorkCounter = _uncounted,
) -> tuple[str, list[dict[str, str]]]:
    """(system text from Open WebUI, the user/assistant turns for the model).

    ``count_work`` hears the characters searched in assistant messages and
    copied when merging turns (a seam for tests).
    """
    system: list[str] = []
    turns: list[dict[str, str]] = []
    for message in messages:
        role = message.get("role")
        text = neutralise_control_tokens(content_text(message.get("content")))
        if role == "system":
            if text.strip():
                system.append(text.strip())
        elif role == "assistant":
            cleaned = clean_assistant_text(text, count_work)
            if cleaned:
                turns.append({"role": "assistant", "content": cleaned})
        elif role in ("user", "tool"):
            turns.append({"role": "user", "content": text})
    return "\n\n".join(system), _merge_same_role(turns, count_work)


def _merge_same_role(
    turns: list[dict[str, str]], count_work: WorkCounter
) -> list[dict[str, str]]:
    """Join consecutive messages of one role (e.g. after an empty reply).

    Each run is joined once: adding its messages one at a time copied the
    growing text again for every one of them.
    """
    merged: list[dict[str, str]] = []
    for role, run in itertools.groupby(turns, key=lambda turn: turn["role"]):
        content = "\n\n".join(turn["content"] for turn in run)
        count_work(len(content))
        merged.append({"role": role, "content": content})
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
#
# A template is matched as what it is, literal text between variables, by
# finding the literals (`_Text`): a regular expression with a lazy group per
# variable, a greedy context and backreferences took minutes on a 40 kB
# system prompt. Each variable still gets the text that expression gave it.

_CONTEXT_SLOTS = ("{{CONTEXT}}", "[context]")
_QUERY_SLOTS = ("{{QUERY}}", "[query]")
_SLOT = re.compile(r"\{\{[^{}]*\}\}|\[context\]|\[query\]")
#: A template with more variables is not used as a pattern (Open WebUI fills
#: about a dozen kinds): matching takes a step per variable for every message.
MAX_TEMPLATE_VARIABLES = 64
#: How often one match may go back on a variable's text for its next choice.
#: Only a variable used twice (``{{QUERY}}`` above and below the context) can
#: make a choice fail after the fact; past this many, the text is taken as not
#: injected. Far more than a template with text around its variables needs; one
#: that repeats a variable right after itself ("{{QUERY}}{{QUERY}}") may give
#: up where the regular expression, given hours, would still have matched.
MAX_BACKTRACKS = 32
_SOURCE_OPEN = re.compile(r"<source\b")
# `key="value"` pairs in one pass: a start inside a name fails at the
# lookbehind, the characters a name may not start with are skipped, and the
# possessive quantifiers never give back what they read. The same pairs as
# `([A-Za-z_][\w-]*)="([^"]*)"`, which read a name again from each of its
# characters.
_ATTRIBUTE = re.compile(r'(?<![\w-])(?:[^\WA-Za-z_]|-)*+([A-Za-z_][\w-]*+)="([^"]*+)"')
# A decimal character reference; int() refuses more than 4,300 digits.
_DECIMAL_REFERENCE = re.compile(r"&#0*([0-9]+)")
_MAX_CODE_POINT_DIGITS = len(str(0x10FFFF))


@dataclass(frozen=True)
class ContextSource:
    """One ``<source>`` Open WebUI put into the RAG context."""

    name: str
    text: str
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Variable:
    """A variable of a template and the text it may take.

    Attributes:
        name: "context", "query" or "words" (the user's own text after the
            template) for a text that is kept, None for any other variable.
        greedy: Takes the longest text that lets the rest match (the context:
            text after the last end of the template is the user's), else the
            shortest.
        repeat_of: Set on a second use of a variable: the same text again.
    """

    name: str | None = None
    greedy: bool = False
    repeat_of: str | None = None


@dataclass(frozen=True)
class TemplatePattern:
    """The text a RAG template renders: literals between variables.

    ``literals[0]``, ``variables[0]``, ``literals[1]``, …, ``literals[-1]``:
    one literal more than variables (empty between two variables). The
    default pattern has no variables and matches nothing.

    Attributes:
        literals: The template's text around its variables.
        variables: What fills each gap.
        newline_after: One newline may follow (the default templates' shape:
            some versions end with "</context>", some with "</context>" and
            a newline). Only for a last literal that does not end with a
            newline, so that at most one of the two can end a text.
    """

    literals: tuple[str, ...] = ("",)
    variables: tuple[_Variable, ...] = ()
    newline_after: bool = False

    @property
    def usable(self) -> bool:
        """Whether it has a context; without one it is not what Open WebUI injected."""
        return any(variable.name == "context" for variable in self.variables)


# The default template of 0.6 – 0.12 (and most edited ones): a "### Task:" head
# and the sources inside one <context> element at its end.
_DEFAULT_SHAPE = TemplatePattern(
    ("### Task:\n", "<context>\n", "\n</context>"),
    (_Variable(), _Variable("context", greedy=True)),
    newline_after=True,
)

_Spans = dict[str, tuple[int, int]]


def template_pattern(template: str) -> TemplatePattern:
    """The pattern of the text Open WebUI renders from ``template``.

    ``{{CONTEXT}}`` (``[context]``) becomes the context, greedy: text after
    the last end of the template is the user's; ``{{QUERY}}`` (``[query]``)
    the question and other variables (``{{CURRENT_DATE}}`` …) any text, the
    shortest that fits; a variable used again is the same text again. A
    template without a context, or with more than `MAX_TEMPLATE_VARIABLES`
    variables, gives the pattern that matches nothing.
    """
    literals: list[str] = []
    variables: list[_Variable] = []
    seen: set[str] = set()
    position = 0
    for match in _SLOT.finditer(template):
        if len(variables) == MAX_TEMPLATE_VARIABLES:
            return TemplatePattern()
        literals.append(template[position : match.start()])
        variables.append(_variable(match.group(0), seen))
        position = match.end()
    pattern = TemplatePattern((*literals, template[position:]), tuple(variables))
    return pattern if pattern.usable else TemplatePattern()


def _variable(slot: str, seen: set[str]) -> _Variable:
    """The variable a template's ``{{…}}``, ``[context]`` or ``[query]`` is."""
    name = (
        "context"
        if slot in _CONTEXT_SLOTS
        else "query"
        if slot in _QUERY_SLOTS
        else None
    )
    if name is None:
        return _Variable()
    if name in seen:
        return _Variable(repeat_of=name)
    seen.add(name)
    return _Variable(name, greedy=name == "context")


def injection_patterns(templates: Iterable[str]) -> list[TemplatePattern]:
    """Patterns for the admin's templates, then the default templates' shape."""
    patterns = [p for p in map(template_pattern, templates) if p.usable]
    return [*patterns, _DEFAULT_SHAPE]


def _latest_starts(pattern: TemplatePattern, text: _Text, end: int) -> list[int] | None:
    """Where each literal may start at the latest with room for the rest.

    Found from the right: the last literal ends the text at ``end``, each
    one before it ends by the next one's latest start, and the first one's
    entry is the latest start leaving room for it. A variable's second use
    counts as any text here (the match checks it). None when the pattern
    cannot fit at all.
    """
    literals = pattern.literals
    latest = [end - len(literals[-1])]
    if latest[0] < 0 or not text.starts_with(literals[-1], latest[0]):
        return None
    for literal in reversed(literals[1:-1]):
        found = text.find_last(literal, 0, latest[-1])
        if found < 0:
            return None
        latest.append(found)
    latest.append(latest[-1] - len(literals[0]))
    latest.reverse()
    return latest


class _Match:
    """One pattern against one text: the variables' texts as a regex picks them.

    Each variable takes its first candidate, in its order of preference,
    that lets the rest match. Without a repeated variable the first always
    does (``latest`` leaves room for the rest), so the match never goes
    back; a repeated one may make it, `MAX_BACKTRACKS` times in all.
    """

    def __init__(
        self, pattern: TemplatePattern, text: _Text, latest: list[int]
    ) -> None:
        self.pattern = pattern
        self.text = text
        self.latest = latest
        self.backtracks_left = MAX_BACKTRACKS

    def backtrack(self) -> bool:
        """Count going back on a choice; False when no tries are left."""
        self.backtracks_left -= 1
        return self.backtracks_left >= 0

    def fill(self, index: int, position: int, spans: _Spans) -> _Spans | None:
        """The spans of ``variables[index:]`` from ``position``, or None."""
        variables = self.pattern.variables
        if index == len(variables):
            return spans
        name = variables[index].name
        after = len(self.pattern.literals[index + 1])
        for stop in self._stops(index, position, spans):
            found = self.fill(
                index + 1,
                stop + after,
                spans if name is None else {**spans, name: (position, stop)},
            )
            if found is not None:
                return found
            if not self.backtrack():
                return None
        return None

    def _stops(self, index: int, position: int, spans: _Spans) -> Iterator[int]:
        """Where variable ``index`` may end (its literal start), preferred first.

        Greedy: the last place the literal lies by its latest start, then
        earlier ones; otherwise the first, then later ones; a second use:
        where the first use's text, repeated, ends. The last variable ends
        where the last literal ends the text.
        """
        variable = self.pattern.variables[index]
        literal = self.pattern.literals[index + 1]
        latest = self.latest[index + 1]
        last = index + 1 == len(self.pattern.variables)
        text = self.text
        if variable.repeat_of is not None:
            start, end = spans[variable.repeat_of]
            stop = position + end - start
            room = stop == latest if last else stop <= latest
            if (
                room
                and text.repeats(start, end, position)
                and text.starts_with(literal, stop)
            ):
                yield stop
        elif last:
            if position <= latest:
                yield latest
        elif variable.greedy:
            stop = latest
            while stop >= position:
                yield stop
                stop = text.find_last(literal, position, stop + len(literal) - 1)
        else:
            stop = text.find(literal, position, latest + len(literal))
            while stop >= 0:
                yield stop
                stop = text.find(literal, stop + 1, latest + len(literal))


def _question_spans(pattern: TemplatePattern, text: _Text) -> _Spans | None:
    """The context and the user's words of a message: template, newline, words."""
    if not pattern.usable:
        return None
    pattern = TemplatePattern(
        (*pattern.literals[:-1], pattern.literals[-1] + "\n", ""),
        (*pattern.variables, _Variable("words", greedy=True)),
        pattern.newline_after,
    )
    first = pattern.literals[0]
    latest = _latest_starts(pattern, text, len(text.text))
    if latest is None or latest[0] < 0 or not text.starts_with(first, 0):
        return None
    spans = _Match(pattern, text, latest).fill(0, len(first), {})
    if spans is not None and pattern.newline_after:
        start, end = spans["words"]
        if text.starts_with("\n", start):  # the optional newline, not the words
            spans["words"] = (start + 1, end)
    return spans


def _system_spans(
    pattern: TemplatePattern, text: _Text
) -> tuple[int, tuple[int, int]] | None:
    """(where the admin's text ends, the context) of a text ending in the template.

    The template starts the text or follows a newline; the first such place
    where it matches wins, with the admin's text before that newline.
    """
    if not pattern.usable:
        return None
    end = len(text.text)
    if pattern.newline_after and text.text.endswith("\n"):
        end -= 1  # only one of "…literal" and "…literal\n" can end the text
    latest = _latest_starts(pattern, text, end)
    if latest is None:
        return None
    first = pattern.literals[0]
    match = _Match(pattern, text, latest)
    for own_end, start in _template_starts(text, first, latest[0]):
        spans = match.fill(0, start + len(first), {})
        if spans is not None:
            return own_end, spans["context"]
        if not match.backtrack():
            return None
    return None


def _template_starts(text: _Text, first: str, latest: int) -> Iterator[tuple[int, int]]:
    """(end of the text before it, start) of each place a template may start.

    The start of the text, then after each newline, in order, where the
    template's first literal is; past ``latest`` the rest has no room.
    """
    if latest < 0:
        return
    if text.starts_with(first, 0):
        yield 0, 0
    bound = latest + len(first) + 1
    newline = text.find(f"\n{first}", 0, bound)
    while newline >= 0:
        yield newline, newline + 1
        newline = text.find(f"\n{first}", newline + 1, bound)


def split_injected_question(
    text: str,
    patterns: Sequence[TemplatePattern],
    prompt: str | None = None,
    count_work: WorkCounter = _uncounted,
) -> tuple[str, str | None]:
    """(the user's own words, the injected context or None) of a user message.

    Args:
        text: The user message as the pipe received it.
        patterns: From `injection_patterns`.
        prompt: The user's words as Open WebUI kept them before the rewrite
            (``__metadata__``), for the last message only.
        count_work: Told the characters searched and copied (a seam for tests).
    """
    searched = _Text(text, count_work)
    if prompt and text != prompt and text.endswith(f"\n{prompt}"):
        head_end = len(text) - len(prompt) - 1
        # A source says it is Open WebUI's context, not some other prefix (a filter's).
        if next(_source_spans(searched, 0, head_end), None) is not None:
            return prompt, _context_element(searched, head_end)
    for pattern in patterns:
        spans = _question_spans(pattern, searched)
        if spans is not None:
            return searched.slice(*spans["words"]), searched.slice(*spans["context"])
    return text, None


def _context_element(text: _Text, end: int) -> str:
    """What ``<context>…</context>`` holds in ``text[:end]``, else all of it.

    From the first "<context>" (and a newline after it) to the last
    "</context>".
    """
    opening = text.find("<context>", 0, end)
    if opening >= 0:
        inner = opening + len("<context>")
        closing = text.find_last("</context>", inner, end)
        if closing >= 0:
            if text.starts_with("\n", inner):
                inner += 1
            return text.slice(inner, closing)
    return text.slice(0, end)


def split_injected_system(
    text: str,
    patterns: Sequence[TemplatePattern],
    count_work: WorkCounter = _uncounted,
) -> tuple[str, str | None]:
    """(the system text, the injected context or None); RAG_SYSTEM_CONTEXT mode."""
    searched = _Text(text, count_work)
    for pattern in patterns:
        found = _system_spans(pattern, searched)
        if found is not None:
            own_end, (start, end) = found
            return searched.slice(0, own_end), searched.slice(start, end)
    return text, None


def _source_spans(text: _Text, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    r"""(attributes' start, ">", "</source>") of each source in ``text[start:end]``.

    What ``<source\b[^>]*>.*?</source>`` finds, in one pass: the regex went
    on from every later "<source" to the end again when one had no ">", or
    no "</source>" after it. Then no later one has either, so the scan ends.
    """
    position = start
    while (opening := text.search(_SOURCE_OPEN, position, end)) >= 0:
        attributes = opening + len("<source")
        bracket = text.find(">", attributes, end)
        if bracket < 0:
            return
        closing = text.find("</source>", bracket + 1, end)
        if closing < 0:
            return
        yield attributes, bracket, closing
        position = closing + len("</source>")


def context_sources(
    context: str, count_work: WorkCounter = _uncounted
) -> list[ContextSource]:
    """The ``<source>`` elements of an injected context, in order."""
    searched = _Text(context, count_work)
    sources = []
    for attributes_start, bracket, closing in _source_spans(searched, 0, len(context)):
        attributes = _attributes(searched.slice(attributes_start, bracket))
        name = attributes.get("name", "").strip()
        body = searched.slice(bracket + 1, closing).strip()
        sources.append(ContextSource(name, body, attributes))
    return sources


def _attributes(tag: str) -> dict[str, str]:
    """The ``key="value"`` pairs of a source's tag, values unescaped."""
    return {key: _unescape(value) for key, value in _ATTRIBUTE.findall(tag)}


def _unescape(value: str) -> str:
    """``html.unescape``, also for a decimal reference int() refuses to read.

    Leading zeros go, and a number longer than any code point becomes the
    first number past them: U+FFFD either way, as html.unescape gives.
    """
    if "&#" in value:
        value = _DECIMAL_REFERENCE.sub(_short_reference, value)
    return html.unescape(value)


def _short_reference(reference: re.Match[str]) -> str:
    """A decimal reference with the same meaning in at most 7 digits."""
    digits = reference.group(1)
    if len(digits) > _MAX_CODE_POINT_DIGITS:
        digits = str(0x10FFFF + 1)
    return f"&#{digits}"


def remove_injected_context(
    messages: Iterable[Mapping[str, Any]],
    templates: Iterable[str] = (),
    last_prompt: str | None = None,
    count_work: WorkCounter = _uncounted,
) -> tuple[list[dict[str, Any]], list[ContextSource]]:
    """Messages without Open WebUI's RAG template, and the sources it carried.

    Every user message is cleaned (earlier turns too), and the system message
    when the template went there. Content becomes plain text where it changes.
    ``count_work`` is told the characters searched and copied (a seam for
    tests).
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
            own, context = split_injected_question(text, patterns, prompt, count_work)
        else:
            own, context = split_injected_system(text, patterns, count_work)
        if context is None:
            cleaned.append(dict(message))
            continue
        sources.extend(context_sources(context, count_work))
        cleaned.append({**message, "content": own})
    return cleaned, sources
