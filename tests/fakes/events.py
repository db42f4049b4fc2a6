"""The suite's one event collector: an ``__event_emitter__`` that keeps every event.

Open WebUI hands a pipe or a tool an async callable that takes one event
(``{"type": "status" | "source" | "notification" | …, "data": {…}}``). `Events`
is that callable and the list of what it received, in order, with the views
tests read: the status lines, the sources, and how the run ended.
"""

from __future__ import annotations

from typing import Any


class Events(list[dict[str, Any]]):
    """An ``__event_emitter__`` that records the events it is given, in order."""

    async def __call__(self, event: dict[str, Any]) -> None:
        """Record one event (Open WebUI's emitter is awaited)."""
        self.append(event)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        """The ``data`` of every event of type ``kind``, in order."""
        return [event["data"] for event in self if event.get("type") == kind]

    def statuses(self) -> list[dict[str, Any]]:
        """The ``data`` of every status event, in order."""
        return self.of_type("status")

    def descriptions(self) -> list[str]:
        """Every status line's text, in order."""
        return [status.get("description", "") for status in self.statuses()]

    def sources(self) -> list[dict[str, Any]]:
        """The ``data`` of every source event (a page read), in order."""
        return self.of_type("source")

    def web_searches(self) -> list[dict[str, Any]]:
        """The status ``data`` of every search the tools reported."""
        return [s for s in self.statuses() if s.get("action") == "web_search"]

    @property
    def ending(self) -> str:
        """The run's closing status line: the text of the last event, a done status.

        Raises:
            AssertionError: The last event is no done status (the status line
                would spin on in Open WebUI).
        """
        assert self, "no event was emitted"
        last = self[-1]
        assert last.get("type") == "status", f"the last event is no status: {last}"
        assert last["data"].get("done") is True, f"the last status is not done: {last}"
        return last["data"]["description"]

    def done_too_early(self) -> list[str]:
        """Status lines before the last that were done (each stops the shimmer).

        A tool's search report (a status with an ``action``) is its own line and
        may be done.
        """
        return [
            status.get("description", "")
            for status in self.statuses()[:-1]
            if status.get("done") and not status.get("action")
        ]
