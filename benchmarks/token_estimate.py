"""Benchmark 8: the context budget's token estimate against Qwen's tokenizer.

The budget (`core/budget.estimate_text_tokens`) stands in for the model's
tokenizer when the server reports no usage. This prints, per kind of text the
loop carries, the estimate divided by the real count (want: a little above
1.0, never far below): English prose and search results / tool responses
and URL lists and JSON from the fixtures in ``../shared/fixtures``, and the
Chinese lines found there. It needs the real tokenizer: ``tiktoken`` plus the
Qwen vocabulary the ``dashscope`` package ships (``pip install tiktoken
dashscope``); without them, or without the fixtures, it says it skipped.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tongyi_deepresearch_openwebui_pipeline.core.budget import estimate_text_tokens

from .report import Row

FIXTURES = Path(
    os.environ.get(
        "TDR_FIXTURES", Path(__file__).resolve().parents[2] / "shared" / "fixtures"
    )
)
# Qwen's pre-tokenizer pattern, as its tokenizer files define it (an interface).
_QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
#: Acceptable mean estimate / real, per kind of text.
LOW, HIGH = 0.95, 1.30
_CJK = re.compile("[\u4e00-\u9fff]")


def _qwen_counter() -> Callable[[str], int] | None:
    spec = importlib.util.find_spec("dashscope")
    if spec is None or importlib.util.find_spec("tiktoken") is None:
        return None
    import tiktoken  # type: ignore[import-not-found]

    root = Path(next(iter(spec.submodule_search_locations or [])))
    ranks: dict[bytes, int] = {}
    for line in (root / "resources" / "qwen.tiktoken").read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    encoding = tiktoken.Encoding(
        "qwen", pat_str=_QWEN_PATTERN, mergeable_ranks=ranks, special_tokens={}
    )
    return lambda text: len(encoding.encode(text, disallowed_special=()))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _samples() -> dict[str, list[str]]:
    truth = json.loads((FIXTURES / "article_pages" / "ground-truth.json").read_text())
    lines = (FIXTURES / "webdancer" / "sample_traj.jsonl").read_text().splitlines()
    trajectories = [json.loads(line) for line in lines if line.strip()]
    texts = [t for traj in trajectories for t in _strings(traj) if len(t) > 200]
    urls = re.findall(r"https?://\S+", "\n".join(texts))
    chinese = [
        line
        for text in texts
        for line in text.splitlines()
        if len(_CJK.findall(line)) >= 10
    ]
    return {
        "English prose (article bodies)": [
            str(page["articleBody"]) for page in list(truth.values())[:40]
        ],
        "tool responses and turns": texts[:60],
        "URL lists": ["\n".join(urls[i : i + 20]) for i in range(0, 400, 20)],
        "JSON": [json.dumps(traj)[:20000] for traj in trajectories[:10]],
        "Chinese lines": chinese,
    }


async def run(quick: bool) -> list[Row]:
    """Estimate / real per kind of text (a correctness figure, not timing)."""
    count = _qwen_counter()
    if count is None or not (FIXTURES / "webdancer").is_dir():
        return [
            Row(
                "token estimate",
                "skipped",
                "needs tiktoken + dashscope and ../shared/fixtures",
                None,
                "-",
                None,
                timing=False,
            )
        ]
    rows = []
    for kind, found in _samples().items():
        texts = [t for t in found if t.strip()][: 10 if quick else None]
        if not texts:
            continue
        real = sum(count(t) for t in texts)
        estimated = sum(estimate_text_tokens(t) for t in texts)
        flat = sum(-(-len(t) * 2 // 7) for t in texts)  # the old 3.5 chars/token
        ratio = estimated / real
        rows.append(
            Row(
                f"{kind} ({len(texts)} texts)",
                f"est/real {ratio:.2f}",
                f"flat 3.5 chars/token: {flat / real:.2f}",
                ratio,
                f"{LOW:.2f}-{HIGH:.2f}",
                LOW <= ratio <= HIGH,
                timing=False,
            )
        )
    return rows
