"""Token estimates for the context budget.

The reference agent counts tokens with the model's tokenizer over the whole
rendered chat. Shipping a tokenizer is not an option inside Open WebUI, so the
loop prefers the ``prompt_tokens`` the server reports for the last call and
only estimates what was added since. The estimate errs high: Qwen's tokenizer
averages about four characters per token for English prose and less for code,
URLs and JSON, and roughly one token per CJK character.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

#: Chat-template framing per message (``<|im_start|>role\n … <|im_end|>\n``).
MESSAGE_OVERHEAD_TOKENS = 5
#: What an image part would cost a vision model; counted so budgets stay safe.
IMAGE_PART_TOKENS = 1024

_ASCII_CHARS_PER_TOKEN = 3.5


# CJK radicals, kana and unified ideographs; Hangul; compatibility ideographs;
# the supplementary ideograph planes.
_WIDE = re.compile("[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002ffff]")


def estimate_text_tokens(text: str) -> int:
    """Estimated tokens of ``text`` (never below the exact count by much).

    Counted with string operations that run in C: this is called on whole
    conversations when the server reports no usage.
    """
    if not text:
        return 0
    if text.isascii():
        return math.ceil(len(text) / _ASCII_CHARS_PER_TOKEN)
    ascii_chars = len(text.encode("ascii", "ignore"))
    wide = len(text) - len(_WIDE.sub("", text))
    other = len(text) - ascii_chars - wide
    return math.ceil(ascii_chars / _ASCII_CHARS_PER_TOKEN + wide + other * 0.6)


def content_tokens(content: Any) -> int:
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
                    total += IMAGE_PART_TOKENS
                else:
                    total += estimate_text_tokens(str(part))
        return total
    return estimate_text_tokens(str(content))


def messages_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Estimated tokens of a whole conversation."""
    return sum(
        MESSAGE_OVERHEAD_TOKENS + content_tokens(message.get("content"))
        for message in messages
    )
