"""The incremental turn parser: exact rules, chunk boundaries, replays."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tongyi_deepresearch_openwebui_pipeline.core.protocol import (
    Fragment,
    TurnParser,
    parse_turn,
)

CALL = (
    '<tool_call>\n{"name": "search", "arguments": {"query": ["a", "b"]}}\n</tool_call>'
)


def feed_in_pieces(text: str, sizes: list[int], reasoning: str = ""):
    parser = TurnParser()
    fragments: list[Fragment] = []
    if reasoning:
        fragments += parser.feed_reasoning(reasoning)
    position = 0
    index = 0
    while position < len(text):
        size = sizes[index % len(sizes)] if sizes else len(text)
        fragments += parser.feed(text[position : position + max(1, size)])
        position += max(1, size)
        index += 1
    fragments += parser.flush()
    return fragments, parser.finish()


def joined(fragments, kind):
    return "".join(f.text for f in fragments if f.kind == kind)


def test_think_then_call():
    turn = parse_turn(f"<think>\nplan\n</think>\n\n{CALL}")
    assert turn.reasoning == "\nplan\n"
    assert turn.calls == ('\n{"name": "search", "arguments": {"query": ["a", "b"]}}\n',)
    assert turn.answer is None
    assert turn.history_text == f"<think>\nplan\n</think>\n\n{CALL}"


def test_answer_is_extracted():
    turn = parse_turn("<think>done</think>\n<answer>\nParis\n</answer>")
    assert turn.answer == "\nParis\n"
    assert turn.answer_closed


def test_tool_call_inside_think_is_not_a_call():
    turn = parse_turn(f"<think>maybe {CALL} later</think>\n<answer>x</answer>")
    assert turn.calls == ()
    assert "<tool_call>" in turn.reasoning


def test_generated_tool_response_is_cut():
    turn = parse_turn(
        f"<think>a</think>\n{CALL}\n<tool_response>\nfake\n</tool_response>"
    )
    assert turn.cut
    assert "fake" not in turn.history_text
    assert len(turn.calls) == 1


def test_tool_response_inside_think_cuts_too():
    # The server's stop sequences would have ended generation there as well.
    turn = parse_turn("<think>before <tool_response> after</think><answer>x</answer>")
    assert turn.cut
    assert turn.answer is None
    assert turn.reasoning == "before "


def test_text_after_tool_call_is_kept_as_stray_text():
    turn = parse_turn(f"<think>a</think>\n{CALL}\nI will wait for results.")
    assert turn.stray_text == "I will wait for results."
    assert len(turn.calls) == 1


def test_several_calls_are_all_reported():
    turn = parse_turn(f"<think>a</think>\n{CALL}\n{CALL}")
    assert len(turn.calls) == 2


def test_unclosed_answer_is_still_an_answer():
    turn = parse_turn("<think>a</think><answer>partial")
    assert turn.answer == "partial"
    assert not turn.answer_closed


def test_unclosed_call_is_reported_for_an_error_message():
    turn = parse_turn('<think>a</think><tool_call>{"name": "search"')
    assert turn.calls == ('{"name": "search"',)


def test_second_answer_block_is_text():
    turn = parse_turn("<answer>one</answer><answer>two</answer>")
    assert turn.answer == "one"


def test_reasoning_channel_matches_inline():
    inline = parse_turn(f"<think>\nplan\n</think>\n\n{CALL}")
    separate = parse_turn(f"\n\n{CALL}", reasoning="plan")
    assert separate.history_text == inline.history_text
    assert separate.calls == inline.calls


def test_reasoning_channel_with_leading_think_tag_is_cleaned():
    turn = parse_turn(CALL, reasoning="<think>\nplan")
    assert turn.reasoning.strip() == "plan"


def test_prefilled_think_without_opening_tag():
    turn = parse_turn(f"I need data</think>\n\n{CALL}")
    assert turn.reasoning == "I need data"
    assert turn.history_text.startswith("<think>\nI need data\n</think>")
    assert len(turn.calls) == 1


def test_turn_with_nothing_but_text():
    turn = parse_turn("Just some words.")
    assert turn.calls == () and turn.answer is None
    assert turn.stray_text == "Just some words."


def test_fragments_stream_thinking_and_answer_live():
    fragments, _ = feed_in_pieces("<think>abc</think><answer>xyz</answer>", [1])
    assert joined(fragments, "think") == "abc"
    assert joined(fragments, "answer") == "xyz"
    # Live: the first answer fragment arrives before the end of the stream.
    assert next(f for f in fragments if f.kind == "answer").text == "x"


@pytest.mark.parametrize("split", range(1, 14))
def test_tag_split_at_every_boundary(split):
    text = f"<think>t</think>{CALL}"
    parser = TurnParser()
    parser.feed(text[:split])
    parser.feed(text[split:])
    turn = parser.finish()
    assert len(turn.calls) == 1
    assert turn.reasoning == "t"


def test_partial_tag_prefix_that_is_not_a_tag_is_released():
    parser = TurnParser()
    out = parser.feed("<answer>a </an")
    assert "".join(f.text for f in out) == "a "  # "</an" may become "</answer>"
    out = parser.feed("d> c</answer>")
    assert "".join(f.text for f in out) == "</and> c"
    assert parser.finish().answer == "a </and> c"


TOKENS = st.sampled_from(
    [
        *'ab \n{}":<>/',
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<answer>",
        "</answer>",
        "<tool_response>",
        "</tool_",
        "<ans",
    ]
)
TEXTS = st.lists(TOKENS, max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=TEXTS, sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6))
def test_splitting_never_changes_the_result(text, sizes):
    whole_fragments, whole = feed_in_pieces(text, [])
    fragments, pieces = feed_in_pieces(text, sizes)
    assert pieces == whole
    for kind in ("think", "text", "answer"):
        assert joined(fragments, kind) == joined(whole_fragments, kind)
    assert joined(fragments, "answer") == (whole.answer or "")


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200), sizes=st.lists(st.integers(1, 30), min_size=1))
def test_any_text_parses_as_it_does_whole(text, sizes):
    fragments, pieces = feed_in_pieces(text, sizes)
    assert pieces == parse_turn(text)
    assert joined(fragments, "answer") == (pieces.answer or "")


def _webdancer_turns():
    path = Path(__file__).parents[1] / "fixtures/webdancer/sample_traj.jsonl"
    for line in path.read_text().splitlines():
        for message in json.loads(line)["messages"]:
            if message["role"] == "assistant":
                yield message["content"]


def test_replay_of_real_trajectories():
    turns = list(_webdancer_turns())
    assert len(turns) == 422
    calls = answers = 0
    for content in turns:
        whole = parse_turn(content)
        fragments, pieces = feed_in_pieces(content, [3, 7, 1, 16])
        assert pieces == whole
        assert whole.reasoning.strip(), "every recorded turn starts with thinking"
        assert not (whole.calls and whole.answer is not None)
        calls += len(whole.calls)
        answers += whole.answer is not None
        assert joined(fragments, "answer") == (whole.answer or "")
    assert calls == 222
    assert answers == 200
