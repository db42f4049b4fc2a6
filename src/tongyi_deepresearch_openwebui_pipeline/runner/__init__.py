"""The headless runner: ``tongyi-deepresearch ask|batch`` outside Open WebUI.

A second front end next to the Open WebUI pipe (``pipes/``): it builds the
same `RunPlan` from the same settings (the pipe's valves, defined once in
``adapters/openwebui/valves.py``, read from flags, ``TDR_<NAME>``
environment variables or a TOML file; it never imports the pipe), runs it through
`engine.runs` with the same model client and the same tool modules (search
through SearXNG, scholar through its backends, visit with its built-in
fetcher), renders the events for a terminal (`render`, pure) and does the
I/O itself (`cli`). `batch` runs a JSONL file of ``{"question", "answer"}``
lines and writes the lab's records (inference/run_multi_react.py: one file,
or its ``iter{i}.jsonl`` per rollout), resumably, asking failed records
again. What the shared parts say about valves is said the runner's way
(`wording`).
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the command line (the ``tongyi-deepresearch`` console script)."""
    from .cli import main as cli_main  # noqa: PLC0415  (keep import light)

    return cli_main(argv)
