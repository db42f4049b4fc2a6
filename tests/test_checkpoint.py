"""A run's checkpoint: what is written, what is read back, what is refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tongyi_deepresearch_openwebui_pipeline.core.checkpoint import (
    Checkpoint,
    CheckpointError,
    decode,
    encode,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import Counters
from tongyi_deepresearch_openwebui_pipeline.core.loop import RunState
from tongyi_deepresearch_openwebui_pipeline.core.sources import (
    PageRead,
    Source,
    SourceLedger,
)

SYSTEM = {"role": "system", "content": "You are a deep research assistant."}
QUESTION = {"role": "user", "content": "Who built the first lighthouse?"}


def consolidated_state() -> RunState:
    """A run three rounds in, one consolidation behind it."""
    state = RunState(messages=[SYSTEM, QUESTION], started=100.0)
    state.add({"role": "assistant", "content": "<think>\nr1\n</think>\n\nsearch"})
    state.add({"role": "user", "content": "<tool_response>\nr\n</tool_response>"})
    restart = {"role": "user", "content": "Question: … Summary: <summary>s</summary>"}
    state.messages = [SYSTEM, restart]
    state.trajectory.append(restart)
    state.add({"role": "assistant", "content": "<think>\nr2\n</think>\n\nvisit"})
    state.add({"role": "user", "content": "<tool_response>\np\n</tool_response>"})
    state.round = 3
    state.stalls = 1
    state.counters = Counters(
        searches=2, pages_requested=1, cost=0.25, consolidations=1
    )
    state.measured_tokens = 1234
    state.measured_upto = 3
    state.peak_context_tokens = 5000
    state.served_context_tokens = 32768
    state.pages = [("https://a.example/x", "A")]
    state.opening = 1
    state.question = "Who built the first lighthouse?"
    state.last_summary = "s"
    state.context_cap = 30000
    state.refused_for_length = True
    return state


def sources() -> tuple[Source, ...]:
    return (
        Source(1, "https://a.example/x", "A", "evidence A", "summary A",
               {"https://a.example/x", "https://a.example/y"}, {1, 2}),
        Source(2, "https://b.example/", "B", "evidence B"),
    )  # fmt: skip


def saved(state: RunState | None = None, **fields: object) -> Checkpoint:
    values: dict[str, object] = {
        "owner": "user-1",
        "chat": "chat-1",
        "mode": "single",
        "question": "Who built the first lighthouse?",
        "state": state or consolidated_state(),
        "sources": sources(),
        "reads": 3,
        "elapsed": 95.5,
        "saved_at": 1_700_000_000.0,
    }
    values.update(fields)
    return Checkpoint(**values)  # type: ignore[arg-type]


def test_a_checkpoint_reads_back_as_the_run_it_was():
    original = saved()
    loaded = decode(encode(original), owner="user-1", chat="chat-1", now=1000.0)

    state, before = loaded.state, original.state
    assert state.messages == before.messages
    assert state.trajectory == before.trajectory
    assert (state.round, state.stalls, state.counters) == (3, 1, before.counters)
    assert (state.measured_tokens, state.measured_upto) == (1234, 3)
    assert (state.peak_context_tokens, state.served_context_tokens) == (5000, 32768)
    assert state.pages == [("https://a.example/x", "A")]
    assert (state.opening, state.question) == (1, "Who built the first lighthouse?")
    assert (state.last_summary, state.context_cap, state.refused_for_length) == (
        "s",
        30000,
        True,
    )
    # The clock restarts: the resumed run has already taken 95.5 s.
    assert state.started == 1000.0 - 95.5
    assert loaded.sources == original.sources
    assert (loaded.reads, loaded.trajectory_dropped) == (3, False)


def test_the_conversation_ends_the_trajectory_as_the_same_messages():
    # The reference wrap-up overwrites the last message in place, and the
    # trajectory must see it overwritten, as before the save.
    state = decode(encode(saved()), owner="user-1", chat="chat-1", now=0.0).state
    assert state.trajectory[-1] is state.messages[-1]
    assert state.trajectory[-3] is state.messages[-3]
    # ... and the conversation after the restart is written once.
    record = json.loads(encode(saved()))
    assert record["state"]["trajectory_shared"] == 3
    assert [m["content"] for m in record["state"]["trajectory_head"]] == [
        SYSTEM["content"],
        QUESTION["content"],
        "<think>\nr1\n</think>\n\nsearch",
        "<tool_response>\nr\n</tool_response>",
    ]


def test_the_ledger_keeps_numbers_titles_and_redirects():
    loaded = decode(encode(saved()), owner="user-1", chat="chat-1", now=0.0)
    ledger = SourceLedger()
    ledger.restore(loaded.sources, loaded.reads)
    assert [s.number for s in ledger.sources] == [1, 2]
    assert ledger.reads == 3
    alias = ledger.match("https://a.example/y")
    assert alias is not None and alias.number == 1
    # A page read after the resume gets the next number.
    new = ledger.record(PageRead("https://c.example/", "C", "c"))
    assert (new.new, new.source.number, new.source.title) == (True, 3, "C")


def test_an_oversized_history_is_left_out_before_the_conversation():
    state = consolidated_state()
    state.trajectory[2]["content"] = "x" * 5000  # before the restart
    record = json.loads(encode(saved(state), max_bytes=4000))
    assert record["trajectory_dropped"] is True
    assert record["state"]["trajectory_head"] == []
    loaded = decode(json.dumps(record).encode(), owner="user-1", chat="chat-1", now=0.0)
    assert loaded.state.trajectory == loaded.state.messages


def test_a_conversation_over_the_limit_is_not_written():
    state = consolidated_state()
    state.messages[-1]["content"] = "y" * 5000
    with pytest.raises(CheckpointError) as refused:
        encode(saved(state), max_bytes=4000)
    assert str(refused.value).endswith("over the 4,000-byte limit")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"owner": "user-2"}, "it belongs to another user or chat"),
        ({"chat": "chat-2"}, "it belongs to another user or chat"),
        ({"version": 2}, "it is version 2; this version reads 1"),
        ({"format": "something-else"}, "it is not a research checkpoint"),
    ],
)
def test_a_foreign_checkpoint_is_refused(change, why):
    record = {**json.loads(encode(saved())), **change}
    with pytest.raises(CheckpointError) as refused:
        decode(json.dumps(record).encode(), owner="user-1", chat="chat-1", now=0.0)
    assert str(refused.value) == why


def test_an_oversized_record_is_not_read():
    data = encode(saved())
    with pytest.raises(CheckpointError) as refused:
        decode(data, owner="user-1", chat="chat-1", now=0.0, max_bytes=len(data) - 1)
    assert str(refused.value) == f"it is over {len(data) - 1:,} bytes"


def test_a_cut_file_is_not_json():
    data = encode(saved())
    with pytest.raises(CheckpointError) as refused:
        decode(data[: len(data) // 2], owner="user-1", chat="chat-1", now=0.0)
    assert str(refused.value) == "it is not JSON"


def test_renumbered_sources_are_damage():
    record = json.loads(encode(saved()))
    record["sources"][1]["number"] = 7
    with pytest.raises(CheckpointError) as refused:
        decode(json.dumps(record).encode(), owner="user-1", chat="chat-1", now=0.0)
    assert str(refused.value) == "it is damaged (ValueError)"


def test_a_lone_surrogate_in_a_message_is_written_and_read_back():
    state = consolidated_state()
    state.messages[-1]["content"] = "half \ud83d of a pair"
    loaded = decode(encode(saved(state)), owner="user-1", chat="chat-1", now=0.0)
    assert loaded.state.messages[-1]["content"] == "half \ud83d of a pair"


def _paths(value: object, path: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [path] + [p for k, v in value.items() for p in _paths(v, (*path, k))]
    if isinstance(value, list):
        return [path] + [p for i, v in enumerate(value) for p in _paths(v, (*path, i))]
    return [path]


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@given(data=st.data())
def test_any_value_changed_anywhere_gives_a_checkpoint_or_a_reason(data):
    record = json.loads(encode(saved()))
    paths = [p for p in _paths(record) if p and p[0] not in ("owner", "chat")]
    path = data.draw(st.sampled_from(paths))
    parent = record
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = data.draw(JUNK)
    try:
        loaded = decode(
            json.dumps(record).encode(), owner="user-1", chat="chat-1", now=0.0
        )
    except CheckpointError:
        return
    # What loads is a run the loop can go on with.
    assert all(isinstance(m, dict) for m in loaded.state.messages)
    assert type(loaded.state.round) is int and loaded.state.round >= 0
    assert all(type(s.number) is int for s in loaded.sources)
