"""The prompts are the model's interface: byte-for-byte checks."""

import datetime as dt
import itertools
import json
from pathlib import Path

import pytest

from tongyi_deepresearch_openwebui_pipeline.core import prompts

GOLDEN = json.loads(
    (Path(__file__).parents[1] / "fixtures/reference_agent/prompts.json").read_text()
)
DAY = dt.date(2025, 9, 17)


def test_full_prompt_is_the_reference_bytes_plus_date():
    built = prompts.build_system_prompt(prompts.ALL_TOOLS, DAY)
    assert built == GOLDEN["SYSTEM_PROMPT"] + "2025-09-17"


def test_extractor_prompt_is_the_reference_bytes():
    assert GOLDEN["EXTRACTOR_PROMPT"] == prompts.EXTRACTOR_PROMPT


def test_tool_order_does_not_depend_on_input_order():
    a = prompts.build_system_prompt(["visit", "search"], DAY)
    b = prompts.build_system_prompt(["search", "visit"], DAY)
    assert a == b
    assert a.index('"name": "search"') < a.index('"name": "visit"')


def test_disabled_tools_are_left_out_and_nothing_else_changes():
    built = prompts.build_system_prompt(["search", "visit"], DAY)
    expected = GOLDEN["SYSTEM_PROMPT"]
    for name in ("PythonInterpreter", "google_scholar", "parse_file"):
        expected = expected.replace(prompts.TOOL_LINES[name] + "\n", "")
    assert built == expected + "2025-09-17"
    assert "PythonInterpreter" not in built
    assert "parse_file" not in built


def test_unknown_tool_names_are_ignored():
    built = prompts.build_system_prompt(["search", "fetch_url"], DAY)
    assert "fetch_url" not in built


def test_no_tools_keeps_the_frame():
    built = prompts.build_system_prompt([], DAY)
    assert "<tools>\n</tools>" in built
    assert built.endswith("Current date: 2025-09-17")


def test_preamble_goes_first_and_prompt_still_ends_with_date():
    built = prompts.build_system_prompt(["search"], DAY, "  Answer in French.  ")
    assert built.startswith("Answer in French.\n\nYou are a deep research assistant.")
    assert built.endswith("Current date: 2025-09-17")


def test_blank_preamble_adds_nothing():
    assert prompts.build_system_prompt(
        ["search"], DAY, "   "
    ) == prompts.build_system_prompt(["search"], DAY)


def test_wrap_up_message_matches_reference_text():
    assert prompts.WRAP_UP_MESSAGE == (
        "You have now reached the maximum context length you can handle. You should "
        "stop making tool calls and, based on all the information above, think again "
        "and provide what you consider the most likely answer in the following "
        "format:<think>your final thinking</think>\n<answer>your answer</answer>"
    )


@pytest.mark.parametrize(
    "subset",
    [
        subset
        for size in range(len(prompts.ALL_TOOLS) + 1)
        for subset in itertools.combinations(prompts.ALL_TOOLS, size)
    ],
    ids=lambda subset: "+".join(subset) or "none",
)
def test_every_subset_of_tools_is_the_reference_prompt_without_the_others(subset):
    # Reversed: the order a chat selects them in does not matter.
    built = prompts.build_system_prompt(list(reversed(subset)), DAY)
    expected = GOLDEN["SYSTEM_PROMPT"]
    for name in set(prompts.ALL_TOOLS) - set(subset):
        expected = expected.replace(prompts.TOOL_LINES[name] + "\n", "")
    assert built == expected + "2025-09-17"
