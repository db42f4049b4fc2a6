"""A sleep that waits for nothing: the seconds asked for are recorded instead.

Pass it where a component takes its sleep (`Pipe(sleep=...)`,
`OpenAIModelClient(..., sleep=...)`): retries then cost no real time, and a
test can say exactly which back-offs were taken (none, for a run that should
never have retried). ``Waits(hold=True)`` instead waits until it is cancelled:
a run that is certainly in its back-off, for as long as the test needs.
"""

from __future__ import annotations

import asyncio


class Waits(list[float]):
    """An awaitable sleep that records each wait and returns at once (or holds)."""

    def __init__(self, *, hold: bool = False) -> None:
        """Record waits; with ``hold``, also wait until cancelled."""
        super().__init__()
        self.hold = hold

    async def __call__(self, seconds: float) -> None:
        """Record ``seconds`` instead of waiting them (or hold, see the class)."""
        self.append(seconds)
        if self.hold:
            await asyncio.Event().wait()  # only cancelling the run ends it
