"""Token estimates for the context budget.

The reference agent counts tokens with the model's tokenizer over the whole
rendered chat. Shipping a tokenizer is not an option inside Open WebUI, so the
loop prefers the ``prompt_tokens`` the server reports for the last call and
only estimates what was added since.

The estimate weighs each character class by what it costs in Qwen's
tokenizer (the model's): English words run about four letters to a token,
digits are split one by one, punctuation and URL syntax cost about two
tokens in three characters, Chinese about two characters in three tokens.
The weights were fitted against the real tokenizer on prose, search results,
URL lists, JSON and Chinese text, then rounded up so the estimate errs about
10% high (`python -m benchmarks.run --only token-estimate` prints the ratios).
A flat 3.5 characters per token, used before, counted URL lists at 0.7 of
their real size and Chinese at 1.5 times it.
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterable, Mapping
from typing import Any

#: Chat-template framing per message (``<|im_start|>role\n … <|im_end|>\n``).
MESSAGE_OVERHEAD_TOKENS = 5
#: What an image part would cost a vision model; counted so budgets stay safe.
IMAGE_PART_TOKENS = 1024


def _byte_set(ranges: Iterable[tuple[int, int]]) -> bytes:
    return bytes(b for low, high in ranges for b in range(low, high + 1))


# Character classes by their bytes in UTF-8 (one pass of C code each). A
# non-ASCII character is classed by its lead byte: 2-byte leads are Latin
# accents, Greek, Cyrillic, Hebrew, Arabic; 3-byte leads E3-ED are CJK, kana
# and Hangul (U+3000-U+DFFF); the other 3-byte leads are symbols and
# punctuation (curly quotes, dashes, fullwidth forms); 4-byte leads are emoji
# and rare ideographs. Continuation bytes (80-BF) are in no class.
_CLASSES: tuple[tuple[bytes, float], ...] = (
    (string.ascii_letters.encode(), 0.25),
    (string.digits.encode(), 1.2),
    (string.whitespace.encode(), 0.08),
    # What is left of ASCII: punctuation, symbols, control characters.
    (bytes(range(0x80)), 0.65),
    (_byte_set([(0xC2, 0xDF)]), 0.5),
    (_byte_set([(0xE3, 0xED)]), 0.68),
    (_byte_set([(0xE0, 0xE2), (0xEE, 0xEF)]), 1.0),
    (_byte_set([(0xF0, 0xF4)]), 1.5),
)


def estimate_text_tokens(text: str) -> int:
    """Estimated tokens of ``text`` in Qwen's tokenizer (errs about 10% high).

    Counted with ``bytes.translate`` passes that run in C: this is called on
    whole conversations when the server reports no usage.
    """
    if not text:
        return 0
    rest = text.encode("utf-8", "surrogatepass")
    total = 0.0
    for members, weight in _CLASSES:
        kept = rest.translate(None, members)
        total += (len(rest) - len(kept)) * weight
        rest = kept
    return math.ceil(total)


def content_tokens(content: Any, image_tokens: int = IMAGE_PART_TOKENS) -> int:
    """Tokens of a message ``content``: a string or OpenAI-style parts."""
    if content is None:
        return 0
    if isinstance(content, str):
        return estimate_text_tokens(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, str):
                total += estimate_text_tokens(part)
            elif isinstance(part, Mapping):
                if part.get("type") == "text":
                    total += estimate_text_tokens(str(part.get("text", "")))
                elif part.get("type") in ("image_url", "input_image", "image"):
                    total += image_tokens
                else:
                    total += estimate_text_tokens(str(part))
        return total
    return estimate_text_tokens(str(content))


def messages_tokens(
    messages: Iterable[Mapping[str, Any]], image_tokens: int = IMAGE_PART_TOKENS
) -> int:
    """Estimated tokens of a whole conversation.

    ``image_tokens`` is what an image counts for: the budget counts the most a
    vision model could spend, a lower bound counts none.
    """
    return sum(
        MESSAGE_OVERHEAD_TOKENS + content_tokens(message.get("content"), image_tokens)
        for message in messages
    )
