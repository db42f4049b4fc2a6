"""Incremental parsing of one assistant turn in Tongyi's native protocol.

The model writes ``<think>…</think>`` and then either
``<tool_call>{json}</tool_call>`` or ``<answer>…</answer>``. When streamed, a
tag can arrive split over several chunks (``<tool_`` + ``call>``), so
`TurnParser` is a small state machine with ``feed``/``flush`` in the style of
an incremental decoder: it holds back only the few characters that might
still become a tag and hands out typed fragments as soon as they are certain.

Rules (each pinned by a test):

- A ``<tool_call>`` written inside ``<think>`` is thinking, not a call.
- A generated ``<tool_response>`` ends the turn: everything after it is cut,
  as the reference agent does (its stop sequences normally prevent it).
- Reasoning may arrive in a separate channel (``reasoning_content`` or
  ``reasoning`` fields) instead of inline ``<think>``; both produce the same
  `Turn`, and `Turn.history_text` rebuilds the inline form the chat template
  expects, so the three server styles are indistinguishable downstream.
- Text after ``</tool_call>`` or outside any block is kept as ``text``.
- An ``<answer>`` that is never closed is still an answer at end of stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .toolcalls import neutralise_control_tokens

FragmentKind = Literal["think", "text", "answer"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
RESPONSE_OPEN = "<tool_response>"

_State = Literal["outside", "think", "call", "answer", "cut"]

# Tags that change the state, per state. A tag not listed for a state is text.
_TAGS: dict[str, tuple[str, ...]] = {
    "outside": (THINK_OPEN, THINK_CLOSE, CALL_OPEN, ANSWER_OPEN, RESPONSE_OPEN),
    "think": (THINK_CLOSE, RESPONSE_OPEN),
    "call": (CALL_CLOSE, RESPONSE_OPEN),
    "answer": (ANSWER_CLOSE, RESPONSE_OPEN),
    "cut": (),
}


@dataclass(frozen=True)
class Fragment:
    """A piece of the turn that is certain: thinking, answer or other text."""

    kind: FragmentKind
    text: str


@dataclass(frozen=True)
class Turn:
    """One finished assistant turn."""

    reasoning: str
    visible: str
    calls: tuple[str, ...]
    answer: str | None
    answer_closed: bool
    cut: bool

    @property
    def history_text(self) -> str:
        r"""The turn as the reference loop stores it in the conversation.

        ``<think>\\n{reasoning}\\n</think>\\n\\n{rest}``: the exact layout the
        chat template renders for assistant turns, whichever way the server
        delivered the reasoning. Chat-template control tokens the model wrote
        (``<|im_start|>system``) are defused: this text goes back into the next
        request, where a server could read them as real turn boundaries.
        """
        visible = neutralise_control_tokens(self.visible.strip())
        reasoning = neutralise_control_tokens(self.reasoning.strip())
        if not reasoning:
            return visible
        return f"<think>\n{reasoning}\n</think>\n\n{visible}".rstrip()

    @property
    def stray_text(self) -> str:
        """Visible text outside any call or answer block (usually blank)."""
        text = self.visible
        for call in self.calls:
            text = text.replace(f"{CALL_OPEN}{call}{CALL_CLOSE}", "", 1)
        if self.answer is not None:
            closing = ANSWER_CLOSE if self.answer_closed else ""
            text = text.replace(f"{ANSWER_OPEN}{self.answer}{closing}", "", 1)
        return text.strip()


def _partial_tag_suffix(buffer: str, tags: tuple[str, ...]) -> int:
    """Length of the longest buffer suffix that is a proper prefix of a tag.

    Every tag starts with ``<``, so only a ``<`` among the last few characters
    can begin one; the earliest such ``<`` that still fits a tag wins.
    """
    position = buffer.find("<", max(0, len(buffer) - _LONGEST_TAG + 1))
    while position >= 0:
        tail = buffer[position:]
        if any(len(tail) < len(tag) and tag.startswith(tail) for tag in tags):
            return len(tail)
        position = buffer.find("<", position + 1)
    return 0


_LONGEST_TAG = max(len(tag) for tags in _TAGS.values() for tag in tags)


@dataclass
class TurnParser:
    """Incremental decoder for one assistant turn (see the module docstring)."""

    _state: _State = "outside"
    _buffer: str = ""
    _reasoning: list[str] = field(default_factory=list)
    _visible: list[str] = field(default_factory=list)
    _calls: list[str] = field(default_factory=list)
    _call: list[str] = field(default_factory=list)
    _answer: list[str] | None = None
    _answer_closed: bool = False
    _cut: bool = False
    _reasoning_cut: bool = False
    _think_seen: bool = False

    # -- input --
    def feed(self, content: str) -> list[Fragment]:
        """Consume a chunk of ``content``; return the fragments now certain."""
        if self._state == "cut" or not content:
            return []
        self._buffer += content
        return self._drain(final=False)

    def feed_reasoning(self, text: str) -> list[Fragment]:
        """Consume a chunk from a separate reasoning channel."""
        if self._reasoning_cut or not text:
            return []
        position = text.find(RESPONSE_OPEN)
        if position >= 0:
            text, self._reasoning_cut = text[:position], True
        if not self._reasoning:
            text = text.lstrip()
            text = text.removeprefix(THINK_OPEN)
        self._reasoning.append(text)
        return [Fragment("think", text)] if text else []

    def flush(self) -> list[Fragment]:
        """End of stream: release whatever is held back."""
        return self._drain(final=True)

    def finish(self) -> Turn:
        """Flush (if not done) and return the finished turn."""
        self.flush()
        answer = "".join(self._answer) if self._answer is not None else None
        if self._state == "call":
            # An unclosed call is still reported so the model gets an error
            # instead of silence; it cannot be parsed as a complete block.
            self._calls.append("".join(self._call))
        return Turn(
            reasoning="".join(self._reasoning),
            visible="".join(self._visible),
            calls=tuple(self._calls),
            answer=answer,
            answer_closed=self._answer_closed,
            cut=self._cut,
        )

    # -- state machine --
    def _drain(self, *, final: bool) -> list[Fragment]:
        out: list[Fragment] = []
        while self._buffer and self._state != "cut":
            tags = _TAGS[self._state]
            position, tag = self._next_tag(tags)
            if tag is None:
                keep = 0 if final else _partial_tag_suffix(self._buffer, tags)
                text = self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(text) :]
                self._emit(text, out)
                break
            self._emit(self._buffer[:position], out)
            self._buffer = self._buffer[position + len(tag) :]
            self._enter(tag)
        if self._state == "cut":
            self._buffer = ""
        return out

    def _next_tag(self, tags: tuple[str, ...]) -> tuple[int, str | None]:
        best_position, best_tag = len(self._buffer), None
        for tag in tags:
            position = self._buffer.find(tag)
            if 0 <= position < best_position:
                best_position, best_tag = position, tag
        return best_position, best_tag

    def _emit(self, text: str, out: list[Fragment]) -> None:
        if not text:
            return
        state = self._state
        if state == "think":
            self._reasoning.append(text)
            out.append(Fragment("think", text))
        elif state == "call":
            self._call.append(text)
            self._visible.append(text)
        elif state == "answer":
            assert self._answer is not None  # noqa: S101 - set on entering the state
            self._answer.append(text)
            self._visible.append(text)
            out.append(Fragment("answer", text))
        else:
            self._visible.append(text)
            out.append(Fragment("text", text))

    def _enter(self, tag: str) -> None:
        if tag == RESPONSE_OPEN:
            self._state, self._cut = "cut", True
        elif tag == THINK_OPEN:
            self._state, self._think_seen = "think", True
        elif tag == THINK_CLOSE:
            if self._state == "outside":
                self._adopt_outside_text_as_reasoning()
            self._state = "outside"
        elif tag == CALL_OPEN:
            self._call = []
            self._visible.append(CALL_OPEN)
            self._state = "call"
        elif tag == CALL_CLOSE:
            self._calls.append("".join(self._call))
            self._visible.append(CALL_CLOSE)
            self._state = "outside"
        elif tag == ANSWER_OPEN:
            if self._answer is None:
                self._answer = []
                self._visible.append(ANSWER_OPEN)
                self._state = "answer"
            else:
                # A second answer block is ordinary text; the first one wins.
                self._emit(ANSWER_OPEN, [])
        elif tag == ANSWER_CLOSE:
            self._answer_closed = True
            self._visible.append(ANSWER_CLOSE)
            self._state = "outside"

    def _adopt_outside_text_as_reasoning(self) -> None:
        """Handle ``…</think>`` with no opening tag (a prefilled ``<think>``).

        Some templates put ``<think>`` in the prompt, so the stream starts inside
        the thought: the text seen so far was thinking after all.
        """
        if self._think_seen or self._calls or self._answer is not None:
            return
        self._think_seen = True
        self._reasoning.append("".join(self._visible))
        self._visible = []


def parse_turn(content: str, reasoning: str = "") -> Turn:
    """Parse a whole turn at once (same result as feeding it in pieces)."""
    parser = TurnParser()
    if reasoning:
        parser.feed_reasoning(reasoning)
    parser.feed(content)
    return parser.finish()
