"""The words both front ends use for a run's figures and endings (pure).

The chat (`adapters/openwebui/render.py`) and the terminal (`runner/render.py`,
`runner/results.py`) lay a run out differently, but they say its token counts,
its duration, its round and the notes under an answer that did not end as
asked in the same words. Those words are written here once; what each front
end puts around them (Markdown, emoji, prefixes, line ends) stays with it.
How a tool call is described is the tool's own business: its `ToolDef` in
`adapters/openwebui/catalog.py`.
"""

from __future__ import annotations

from .events import TERMINATION_TEXT

#: Under an answer the model wrote without ``<answer>`` tags.
UNMARKED_ANSWER_NOTE = "*(The model did not mark this as its final answer.)*"


def tokens_text(prompt: int, completion: int, cost: float | None = None) -> str:
    """``1,234 tokens in / 56 out``, then `` · $0.0123`` when the cost is known."""
    text = f"{prompt:,} tokens in / {completion:,} out"
    return text + (f" · ${cost:.4f}" if cost is not None else "")


def duration_text(seconds: float) -> str:
    """``4 s`` or ``2 min 5 s`` (whole seconds)."""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def round_label(number: int, max_rounds: int) -> str:
    """``Round 3/100``: the round under way, of the most the run may take."""
    return f"Round {number}/{max_rounds}"


def stopped_note(error: str) -> str:
    """The note under a run that an error stopped (Markdown)."""
    return f"**The research stopped:** {error}"


def no_answer_note(reason: str) -> str:
    """The note under a run that ended without an answer, saying why."""
    ending = TERMINATION_TEXT.get(reason, reason)
    return f"The model ended without a final answer ({ending})."


def resumed_text(rounds: int, pages: int) -> str:
    """What a resumed run says first: where it goes on from, what it kept."""
    kept = f"{rounds} round{'s' * (rounds != 1)} and {pages} page{'s' * (pages != 1)}"
    return (
        f"Resuming the research from round {rounds + 1}: {kept} read before "
        "the interruption are kept."
    )
