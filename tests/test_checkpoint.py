"""A run's checkpoint: what is written, what is read back, what is refused."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tongyi_deepresearch_openwebui_pipeline.core.checkpoint import (
    Checkpoint,
    CheckpointError,
    Header,
    HeavyCheckpoint,
    MessagePieces,
    SavedReport,
    SingleDocument,
    SourcePieces,
    decode,
    decode_heavy,
    encode,
    read,
    state_record,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    Counters,
    ModelUsage,
    RunFinished,
    RunStats,
)
from tongyi_deepresearch_openwebui_pipeline.core.loop import RunState
from tongyi_deepresearch_openwebui_pipeline.core.parallelmuse import Step
from tongyi_deepresearch_openwebui_pipeline.core.sources import (
    MAX_PAPERS,
    PageRead,
    Paper,
    Source,
    SourceLedger,
)
from tongyi_deepresearch_openwebui_pipeline.engine.checkpoints import HeavyProgress

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


@pytest.mark.parametrize(
    ("counter", "value"), [("searches", None), ("tool_calls", 1.5), ("cost", "1")]
)
def test_a_counter_that_is_no_count_is_damage(counter, value):
    # The loop adds to its counters: None or a fraction there would break it.
    record = json.loads(encode(saved()))
    record["state"]["counters"][counter] = value
    with pytest.raises(CheckpointError) as refused:
        decode(json.dumps(record).encode(), owner="user-1", chat="chat-1", now=0.0)
    assert str(refused.value) == "it is damaged (TypeError)"


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


# -- taken on the event loop, written by a thread ----------------------------------


def document(state: RunState, pieces: MessagePieces) -> SingleDocument:
    """A single run's record of ``state`` as it is now (taken, not encoded)."""
    header = Header("user-1", "chat-1", "single", "Who built it?", 1.0, 2.0, 3)
    return SingleDocument(header, state_record(state, pieces), SourcePieces().of([]))


def test_a_record_taken_does_not_change_with_the_state_after_it():
    state = consolidated_state()
    before = copy.deepcopy(state)
    taken = document(state, MessagePieces())
    # What the loop may do while a thread encodes it: the reference wrap-up
    # writes over the last message, room is made by replacing a result, a
    # round adds its messages, counters and pages.
    state.messages[-1]["content"] = "overwritten"
    state.messages[2] = {"role": "assistant", "content": "replaced"}
    state.add({"role": "assistant", "content": "a later round"})
    state.counters.searches += 5
    state.pages.append(("https://c.example/", "C"))
    state.round = 9
    loaded = decode(taken.encode(), owner="user-1", chat="chat-1", now=0.0).state
    assert loaded.messages == before.messages
    assert loaded.trajectory == before.trajectory
    assert (loaded.round, loaded.counters, loaded.pages) == (
        3,
        before.counters,
        before.pages,
    )


def test_messages_unchanged_since_the_last_record_are_not_encoded_again():
    state = consolidated_state()
    pieces = MessagePieces()
    first = state_record(state, pieces)
    pieces.settle()
    document_of_first = SingleDocument(
        Header("user-1", "chat-1", "single", "q", 1.0, 2.0, 3), first, ()
    )
    document_of_first.encode()  # the thread encodes every piece once
    state.add({"role": "assistant", "content": "round 4"})
    state.messages[-2]["content"] = "written over in place"
    second = state_record(state, pieces)
    # The same pieces (their JSON kept) for the messages that did not change;
    # new ones for the message written over and the one added.
    unchanged = len(state.messages) - 2
    assert [a is b for a, b in zip(second.messages, first.messages, strict=False)] == [
        *([True] * unchanged),
        False,
    ]
    assert all(a is b for a, b in zip(second.head, first.head, strict=True))
    # And the record is whole: what encoding the state afresh writes.
    fresh = state_record(state, MessagePieces())
    header = Header("user-1", "chat-1", "single", "q", 1.0, 2.0, 3)
    assert (
        SingleDocument(header, second, ()).encode()
        == SingleDocument(header, fresh, ()).encode()
    )


def test_a_source_is_encoded_again_only_when_the_ledger_adds_to_it():
    ledger = SourceLedger()
    ledger.record(PageRead("https://a.example/x", "A", "short"), reader=1)
    ledger.record(PageRead("https://b.example/", "B", "b"), reader=1)
    pieces = SourcePieces()
    first = pieces.of(ledger.sources)
    # Read again by rollout 2, with richer evidence.
    ledger.record(PageRead("https://a.example/x", "A", "richer evidence"), reader=2)
    second = pieces.of(ledger.sources)
    assert (second[0] is first[0], second[1] is first[1]) == (False, True)
    assert json.loads(second[0].json()) == {
        "number": 1,
        "url": "https://a.example/x",
        "title": "A",
        "evidence": "richer evidence",
        "summary": "",
        "aliases": ["https://a.example/x"],
        "readers": [1, 2],
    }


# -- a heavy run's record ------------------------------------------------------------

HEAVY_ENDING = RunFinished(
    "answer",
    "Pharos of Alexandria.",
    RunStats(4, 2, 1, 3, 900, 100, 0.5, 12.0),
    lab_termination="answer",
)


def heavy_record(**changes: Any) -> dict[str, Any]:
    """A heavy run of 3 rollouts: 1 ended (with its steps), 2 branched, a report."""
    ended = consolidated_state()
    running = RunState(messages=copy.deepcopy(ended.messages[:4]), started=0.0)
    running.round, running.opening = 2, 1
    progress = HeavyProgress(3, 2, lambda: 30.0)
    steps = [
        # Before round 3: the first 4 messages of the saved conversation.
        Step(7.5, 3, tuple(dict(m) for m in ended.messages[:4]), ()),
        # Before round 1: consolidated away since (its own messages).
        Step(2.0, 1, (SYSTEM, QUESTION), ()),
        Step(1.1, 2, (SYSTEM, QUESTION), ()),  # not among the 2 most uncertain
    ]
    progress.keep(1, ended, steps=steps, ending=HEAVY_ENDING)
    progress.keep(2, running, branch=True, inherited_rounds=1)
    progress.keep_report(1, "Rollout 1 found the Pharos.", [ModelUsage(50, 10, 0.1)])
    header = Header("user-1", "chat-1", "heavy", "Who built it?", 1.0, 30.0, 3)
    data = progress.document(header, SourcePieces().of(sources()), False).encode()
    record = json.loads(data)
    record.update(changes)
    return record


def heavy(record: dict[str, Any]) -> HeavyCheckpoint:
    data = json.dumps(record).encode()
    return decode_heavy(data, owner="user-1", chat="chat-1", now=100.0)


def test_a_heavy_checkpoint_reads_back_as_the_run_it_was():
    loaded = heavy(heavy_record())
    assert (loaded.rollouts, loaded.elapsed, loaded.reads) == (3, 30.0, 3)
    ended, running = loaded.started
    assert (ended.number, ended.branch, ended.inherited_rounds) == (1, False, 0)
    assert ended.state.messages == consolidated_state().messages
    assert ended.ending == replace(
        HEAVY_ENDING, trajectory=tuple(consolidated_state().trajectory)
    )
    # The two most uncertain steps, in their order; the conversation of
    # the one still in the saved conversation is read from it.
    assert [(s.uncertainty, s.round) for s in ended.steps] == [(7.5, 3), (2.0, 1)]
    assert ended.steps[0].messages == tuple(consolidated_state().messages[:4])
    assert ended.steps[1].messages == (SYSTEM, QUESTION)
    record = heavy_record()
    assert record["started"][0]["steps"][0] == {
        "uncertainty": 7.5,
        "round": 3,
        "prefix": 4,
        "pages": 0,
    }
    assert (running.number, running.branch, running.inherited_rounds) == (2, True, 1)
    assert (running.state.round, running.ending, running.steps) == (2, None, ())
    # Every rollout's clock is the run's: 30 s taken before the save.
    assert ended.state.started == running.state.started == 100.0 - 30.0
    assert loaded.reports == (
        SavedReport(1, "Rollout 1 found the Pharos.", (ModelUsage(50, 10, 0.1),)),
    )
    assert loaded.sources == sources()


def test_the_steps_are_let_go_once_the_branches_start():
    progress = HeavyProgress(3, 2, lambda: 0.0)
    state = consolidated_state()
    progress.keep(1, state, steps=[Step(7.5, 3, (SYSTEM, QUESTION), ())])
    progress.branches_started()
    progress.keep(1, state, steps=[Step(7.5, 3, (SYSTEM, QUESTION), ())])
    header = Header("user-1", "chat-1", "heavy", "q", 1.0, 0.0, 0)
    record = json.loads(progress.document(header, (), False).encode())
    assert record["started"][0]["steps"] == []


def test_an_earlier_reader_refuses_a_heavy_record_by_its_version():
    with pytest.raises(CheckpointError) as refused:
        decode(
            json.dumps(heavy_record()).encode(), owner="user-1", chat="chat-1", now=0
        )
    assert str(refused.value) == "it is version 2; this version reads 1"
    # A reader of both tells them apart by their version.
    data = json.dumps(heavy_record()).encode()
    assert isinstance(
        read(data, owner="user-1", chat="chat-1", now=0.0), HeavyCheckpoint
    )
    single = read(encode(saved()), owner="user-1", chat="chat-1", now=0.0)
    assert isinstance(single, Checkpoint)
    with pytest.raises(CheckpointError) as refused:
        read(json.dumps(heavy_record(version=3)).encode(), owner="u", chat="c", now=0)
    assert str(refused.value) == "it is version 3; this version reads 1 and 2"


def _with(record: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    parent = record
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return record


@pytest.mark.parametrize(
    ("path", "value", "why"),
    [
        (
            ("rollouts",),
            10**12,
            "it is damaged: it counts 1000000000000 rollouts (at most 8)",
        ),
        (("rollouts",), 0, "it is damaged: it counts 0 rollouts (at most 8)"),
        (("rollouts",), "3", "it is damaged (TypeError)"),
        (("started", 1, "number"), 4, "it is damaged: it holds rollout 4 of 3"),
        (("started", 1, "number"), 1, "it is damaged: it holds a rollout twice"),
        (("started", 1, "number"), True, "it is damaged (TypeError)"),
        (
            ("reports", 0, "rollout"),
            2,
            "it is damaged: it holds a report on rollout 2, which did not answer",
        ),
        (
            ("reports", 0, "rollout"),
            7,
            "it is damaged: it holds a report on rollout 7, which did not answer",
        ),
        (("started", 1, "inherited_rounds"), 3, "it is damaged (ValueError)"),
        (("started", 0, "steps", 0, "prefix"), 10**9, "it is damaged (ValueError)"),
        (("started", 0, "steps", 0, "round"), 10**9, "it is damaged (ValueError)"),
        (("started", 0, "ending", "reason"), "error", "it is damaged (ValueError)"),
        (("started", 0, "ending", "stats", "rounds"), -1, "it is damaged (TypeError)"),
        (
            ("started", 0, "ending", "stats", "rounds"),
            None,
            "it is damaged (TypeError)",
        ),
        (("started", 0, "ending", "stats", "cost"), "0.5", "it is damaged (TypeError)"),
        (
            ("started", 1, "state", "counters", "searches"),
            None,
            "it is damaged (TypeError)",
        ),
        (("started", 0, "state", "opening"), 10**9, "it is damaged (ValueError)"),
        (("mode",), "single", "it is damaged (ValueError)"),
        (("started",), {"1": {}}, "it is damaged (TypeError)"),
    ],
)
def test_a_hostile_heavy_record_is_refused_with_a_reason(path, value, why):
    with pytest.raises(CheckpointError) as refused:
        heavy(_with(heavy_record(), path, value))
    assert str(refused.value) == why


def test_a_report_given_twice_is_refused():
    record = heavy_record()
    record["reports"].append(record["reports"][0])
    with pytest.raises(CheckpointError) as refused:
        heavy(record)
    assert str(refused.value) == "it is damaged: it holds a report twice"


@given(data=st.data())
def test_any_value_changed_anywhere_in_a_heavy_record_gives_a_run_or_a_reason(data):
    record = heavy_record()
    paths = [p for p in _paths(record) if p and p[0] not in ("owner", "chat")]
    path = data.draw(st.sampled_from(paths))
    _with(record, path, data.draw(JUNK))
    try:
        loaded = heavy(record)
    except CheckpointError:
        return
    # What loads is a run the engine can go on with.
    assert 1 <= loaded.rollouts <= 8
    numbers = [r.number for r in loaded.started]
    assert len(set(numbers)) == len(numbers)
    assert all(1 <= n <= loaded.rollouts for n in numbers)
    for rollout in loaded.started:
        assert all(isinstance(m, dict) for m in rollout.state.messages)
        assert type(rollout.state.round) is int and rollout.state.round >= 0
        assert 0 <= rollout.inherited_rounds <= rollout.state.round
    answered = {r.number for r in loaded.started if r.ending and r.ending.answer}
    assert {report.rollout for report in loaded.reports} <= answered
    for ending in (r.ending for r in loaded.started if r.ending):
        assert type(ending.stats.rounds) is int and ending.stats.rounds >= 0


PAPER = Paper(
    url="https://journals.example/strain",
    title="Strain in graphene",
    pdf="https://journals.example/strain.pdf",
    authors=("Zoë Łukasiewicz", "山田 太郎"),
    year="2021",
    venue="Physical Review B",
    doi="10.1103/PhysRevB.1.2",
)
#: PAPER as a record holds it.
PAPER_RECORD = {**vars(PAPER), "authors": list(PAPER.authors)}


def test_the_papers_a_run_found_read_back_for_its_exports():
    data = encode(saved(papers=(PAPER,)))
    loaded = decode(data, owner="user-1", chat="chat-1", now=0.0)
    assert json.loads(data)["papers"] == [PAPER_RECORD]
    assert loaded.papers == (PAPER,)


def test_a_record_written_before_papers_were_kept_reads_with_none():
    record = json.loads(encode(saved(papers=(PAPER,))))
    del record["papers"]
    loaded = decode(json.dumps(record).encode(), owner="user-1", chat="chat-1", now=0)
    assert loaded.papers == ()


@pytest.mark.parametrize(
    ("papers", "why"),
    [
        ([{"url": "https://a.example"}], "it is damaged (KeyError)"),
        ([{**PAPER_RECORD, "authors": "one author"}], "it is damaged (TypeError)"),
        ([{**PAPER_RECORD, "year": 2021}], "it is damaged (TypeError)"),
        ("no list", "it is damaged (TypeError)"),
        ([PAPER_RECORD] * (MAX_PAPERS + 1), "it is damaged (ValueError)"),
    ],
)
def test_hostile_papers_are_refused_with_a_reason(papers: Any, why: str):
    record = {**json.loads(encode(saved())), "papers": papers}
    with pytest.raises(CheckpointError) as refused:
        decode(json.dumps(record).encode(), owner="user-1", chat="chat-1", now=0)
    assert str(refused.value) == why
