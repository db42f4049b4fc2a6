"""The scaled profile's socket session rebuilds streamed text however it was cut.

Pinned by the events a replica really sent in a failed run: Open WebUI put the
first five characters of the answer in a ``chat:completion`` snapshot and the
rest in three ``response:completion`` deltas, so a search of each event on its
own never found the sentence and the test waited for text it had received.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.owui import OpenWebUIServer
from tests.e2e_scaled.cluster import Replica, SocketWatch

SHOWN = "The bearings wear out because"


def _snapshot(*items: dict[str, Any]) -> dict[str, Any]:
    return {
        "chat_id": "c",
        "data": {"type": "chat:completion", "data": {"output": list(items)}},
    }


def _delta(item_id: str, text: str) -> dict[str, Any]:
    data = {"type": "response.output_text.delta", "item_id": item_id, "delta": text}
    return {"chat_id": "c", "data": {"type": "response:completion", "data": data}}


def _item(item_id: str, kind: str, text: str) -> dict[str, Any]:
    return {
        "type": kind,
        "id": item_id,
        "content": [{"type": "output_text", "text": text}],
    }


def _watch(events: list[dict[str, Any]]) -> SocketWatch:
    # Prepared, never started: the session is given the events instead.
    replica = Replica("B", OpenWebUIServer(Path("venv"), Path("work")))
    watch = SocketWatch(replica, token="t")
    watch.events.extend(events)
    return watch


RECORDED = [
    {"chat_id": "c", "data": {"type": "status", "data": {"description": "Round 1/8"}}},
    _snapshot(_item("r1", "reasoning", "\nThe bear")),
    _delta("r1", "ing studies should say.\n"),
    _snapshot(
        _item("r1", "reasoning", "The bearing studies should say."),
        _item("m1", "message", "The b"),
    ),
    _delta("m1", "earings "),
    _delta("m1", "wear out"),
    _delta("m1", " because"),
]


def test_text_cut_between_a_snapshot_and_deltas_is_seen() -> None:
    watch = _watch(RECORDED)
    assert watch.streamed_texts()["m1"] == SHOWN
    assert watch.shows(SHOWN)


def test_text_not_yet_streamed_is_not_seen() -> None:
    watch = _watch(RECORDED[:-1])
    assert not watch.shows(SHOWN)
    # Text of two different items does not join up into one.
    assert not watch.shows("should say.\nThe b")


def test_a_later_snapshot_replaces_the_text_before_it() -> None:
    watch = _watch([*RECORDED, _snapshot(_item("m1", "message", "Rewritten."))])
    assert watch.streamed_texts()["m1"] == "Rewritten."
    # The reasoning rebuilt from its snapshot and delta is still there.
    assert watch.shows("The bearing studies should say.")


def test_other_events_are_searched_as_they_are() -> None:
    assert _watch(RECORDED).shows("Round 1/8")
