"""Hostile chat text costs linear work in `core.history` (issue #25).

`remove_injected_context` and `split_conversation` run on the event loop over
text any user controls: the messages, the system prompt, what a web page or a
model wrote into them, and the admin's RAG template. Regular expressions with
``.*?``, a greedy group and backreferences rescanned that text from every
candidate position (two seconds for a 10 kB system prompt, minutes for 40 kB).
Each hostile test states the outcome exactly and then counts the characters
the searches looked at and the copies made, through the ``count_work`` seam:
the old code needs hours for these inputs (the timeout stops it), the new one
a bounded multiple of the input's length. The property tests hold the new
matching to what the old regular expressions gave on ordinary input.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tongyi_deepresearch_openwebui_pipeline.core.history import (
    ContextSource,
    context_sources,
    injection_patterns,
    remove_injected_context,
    split_conversation,
    split_injected_question,
    split_injected_system,
    strip_details,
)

# The old code needs hours for each hostile input below; the new one well under
# a second. The timeout is not an assertion: it only stops the old code.
pytestmark = pytest.mark.timeout(20)

MB = 1_000_000

ADMIN_TEMPLATE = (
    "Date: {{CURRENT_DATE}}\nQ: {{QUERY}}\nDocs:\n{{CONTEXT}}\n-- end of docs --"
)


T = TypeVar("T")


def counted(call: Callable[[Callable[[int], object]], T]) -> tuple[T, int]:
    """``call``'s result and the work it reported to its ``count_work``."""
    tally: list[int] = []
    result = call(tally.append)
    return result, sum(tally)


# -- the RAG template, in the system prompt and in the question -----------------


@pytest.mark.parametrize(
    "system",
    [
        "\n### Task:\n<context>\n" * 50_000,
        "\n### Task:\n" * 100_000 + "<context>\n</context>",
    ],
    ids=["no-end", "no-room-for-a-context"],
)
def test_many_task_heads_in_a_system_prompt_cost_linear_work(system):
    """RAG_SYSTEM_CONTEXT mode: every head was tried, each rescanning the rest."""
    patterns = injection_patterns([ADMIN_TEMPLATE])
    assert split_injected_system(system, patterns) == (system, None)
    _, work = counted(lambda count: split_injected_system(system, patterns, count))
    assert work <= 8 * len(system)


def test_many_task_heads_in_a_system_message_are_left_as_they_are():
    messages = [
        {"role": "system", "content": "### Task:\n<context>\n\n" * 40_000},
        {"role": "user", "content": "Q"},
    ]
    assert remove_injected_context(messages, [ADMIN_TEMPLATE]) == (messages, [])
    _, work = counted(
        lambda count: remove_injected_context(messages, [ADMIN_TEMPLATE], None, count)
    )
    assert work <= 8 * len(messages[0]["content"])


@pytest.mark.parametrize(
    "text",
    [
        "### Task:\n" + "<context>\n" * 100_000 + "Q",
        "### Task:\n" + "<context>\n\n</context>" * 50_000 + "Q",
        "Date: " + "\nQ: \nDocs:\n" * 80_000 + "Q",
        "Date: \nQ: " + "\nDocs:\n-- end of docs --Q" * 40_000,
    ],
    ids=[
        "open-contexts",
        "contexts-closed-without-a-newline",
        "admin-heads",
        "admin-ends-without-a-newline",
    ],
)
def test_repeated_template_pieces_in_a_question_cost_linear_work(text):
    """Each piece was a candidate for every variable before it."""
    patterns = injection_patterns([ADMIN_TEMPLATE])
    assert split_injected_question(text, patterns) == (text, None)
    _, work = counted(
        lambda count: split_injected_question(text, patterns, None, count)
    )
    assert work <= 8 * len(text)


def test_variables_between_one_repeated_character_cost_linear_work():
    """Every way to share the commas among the variables was tried (5 took 18 s)."""
    template = "{{V}}," * 10 + "{{CONTEXT}}"
    messages = [{"role": "user", "content": "," * 100_000 + "Q"}]
    assert remove_injected_context(messages, [template]) == (messages, [])
    _, work = counted(
        lambda count: remove_injected_context(messages, [template], None, count)
    )
    assert work <= 8 * len(messages[0]["content"])


def test_a_template_with_thousands_of_variables_is_not_used_as_a_pattern():
    """Each variable was a lazy ``.*?``: too few commas meant trying every split."""
    template = "{{V}}," * 10_000 + "{{CONTEXT}}"
    assert injection_patterns([template]) == injection_patterns([])
    messages = [{"role": "user", "content": "," * 5_000 + "\nQ"}]
    assert remove_injected_context(messages, [template]) == (messages, [])


def test_a_template_is_used_up_to_64_variables():
    def split(variables: int) -> tuple[str, str | None]:
        template = "{{V}}," * (variables - 1) + "{{CONTEXT}}"
        text = "," * (variables - 1) + "ctx\nQ"
        return split_injected_question(text, injection_patterns([template]))

    assert split(64) == ("Q", "ctx")
    assert split(65) == ("," * 64 + "ctx\nQ", None)


def test_a_repeated_variable_is_given_up_after_a_bounded_number_of_tries():
    """A second {{QUERY}} must repeat the first: every pair of ends was tried."""
    template = "{{QUERY}}\n<context>\n{{CONTEXT}}\n</context>\n{{QUERY}}"
    text = "q" + "\n<context>\n" * 20_000 + "x\n</context>\n" * 40_000 + "z"
    patterns = injection_patterns([template])
    assert split_injected_question(text, patterns) == (text, None)
    _, work = counted(
        lambda count: split_injected_question(text, patterns, None, count)
    )
    assert work <= 8 * len(text)


@pytest.mark.parametrize(
    ("template", "question", "context"),
    [
        (
            "Q: {{QUERY}}\n<context>\n{{CONTEXT}}\n</context>\nAgain: {{QUERY}}",
            "two\nlines",
            '<source id="1">Again: two\nlines</source>',
        ),
        ("{{QUERY}}{{QUERY}}\n{{CONTEXT}}", "ab", "ctx"),
    ],
    ids=["query-above-and-below", "query-twice-in-a-row"],
)
def test_a_repeated_variable_still_recognises_the_template(template, question, context):
    text = (
        template.replace("{{QUERY}}", question).replace("{{CONTEXT}}", context)
        + f"\n{question}"
    )
    assert split_injected_question(text, injection_patterns([template])) == (
        question,
        context,
    )


# -- the prompt Open WebUI kept, and the <source>s of the context ----------------


def test_sources_without_a_closing_bracket_cost_linear_work():
    text = "<source " * 125_000 + "\nQ"
    assert split_injected_question(text, [], prompt="Q") == (text, None)
    _, work = counted(lambda count: split_injected_question(text, [], "Q", count))
    assert work <= 8 * len(text)


def test_open_contexts_before_a_source_cost_linear_work():
    head = "<context>" * 110_000 + '<source id="1">x</source>'
    text = f"{head}\nQ"
    assert split_injected_question(text, [], prompt="Q") == ("Q", head)
    _, work = counted(lambda count: split_injected_question(text, [], "Q", count))
    assert work <= 8 * len(text)


@pytest.mark.parametrize(
    "context",
    ["<source>" * 125_000, "<source " * 125_000],
    ids=["no-end-tag", "no-closing-bracket"],
)
def test_sources_without_an_end_cost_linear_work(context):
    assert context_sources(context) == []
    _, work = counted(lambda count: context_sources(context, count))
    assert work <= 8 * len(context)


@pytest.mark.parametrize(
    "tag",
    [
        " " + "a" * MB + ' name="n"',
        ' name="n" title="' + "x" * MB,
    ],
    ids=["long-word", "unclosed-value"],
)
def test_long_attribute_runs_are_read_once(tag):
    """A name was rescanned from each of its characters (possessive now)."""
    context = f"<source{tag}>body</source>"
    assert context_sources(context) == [ContextSource("n", "body", {"name": "n"})]


@pytest.mark.parametrize(
    ("reference", "character"),
    [
        ("&#" + "1" * 5_000 + ";", "\ufffd"),
        ("&#" + "0" * 5_000 + "65;", "A"),
        ("&#x" + "f" * 5_000 + ";", "\ufffd"),
        ("&#1114109;", "\U0010fffd"),
        ("&#1114112;", "\ufffd"),
    ],
    ids=["long-decimal", "zero-padded", "long-hex", "last-code-point", "one-past"],
)
def test_a_long_character_reference_is_a_character_not_a_crash(reference, character):
    """int() refuses more than 4,300 digits: html.unescape raised ValueError."""
    context = f'<source id="1" name="{reference}">body</source>'
    [source] = context_sources(context)
    assert source == ContextSource(character, "body", {"id": "1", "name": character})


# -- the rest of the conversation ---------------------------------------------------


def test_many_unclosed_details_tags_cost_linear_work():
    """An earlier answer full of "<details" without ">": each was rescanned."""
    text = "<details " * 450_000 + "The answer."
    assert strip_details(text) == text
    _, work = counted(lambda count: strip_details(text, count))
    assert work <= 8 * len(text)


def test_an_unclosed_details_tag_is_text():
    assert strip_details("a<details>b</details>c<details f") == "ac<details f"
    assert strip_details("x<details>y</details " + "<details" * 3) == "x"


def test_a_long_run_of_user_messages_is_joined_once():
    """Joining one message at a time copied the growing text for each of them."""
    messages = [{"role": "user", "content": "x" * 200}] * 200_000
    _, turns = split_conversation(messages)
    assert turns == [{"role": "user", "content": "\n\n".join(["x" * 200] * 200_000)}]
    _, copied = counted(lambda count: split_conversation(messages, count))
    assert copied == len(turns[0]["content"])


# -- the same results as the regular expressions on ordinary input --------------
#
# The old module's matching, verbatim: the reference the new one must agree with.

_SLOT = re.compile(r"\{\{[^{}]*\}\}|\[context\]|\[query\]")
_DEFAULT_SHAPE = r"### Task:\n.*?<context>\n(?P<context>.*)\n</context>\n?"
_SOURCE = re.compile(r"<source\b(?P<attrs>[^>]*)>(?P<body>.*?)</source>", re.DOTALL)
_ATTRIBUTE = re.compile(r'([A-Za-z_][\w-]*)="([^"]*)"')


def regex_pattern(template: str) -> str | None:
    if not any(slot in template for slot in ("{{CONTEXT}}", "[context]")):
        return None
    parts: list[str] = []
    position = 0
    seen: set[str] = set()
    for match in _SLOT.finditer(template):
        parts.append(re.escape(template[position : match.start()]))
        slot = match.group(0)
        group = (
            "context"
            if slot in ("{{CONTEXT}}", "[context]")
            else "query"
            if slot in ("{{QUERY}}", "[query]")
            else None
        )
        if group is None:
            parts.append(".*?")
        elif group in seen:
            parts.append(f"(?P={group})")
        else:
            seen.add(group)
            parts.append(f"(?P<{group}>.*)" if group == "context" else "(?P<query>.*?)")
        position = match.end()
    parts.append(re.escape(template[position:]))
    return "".join(parts)


def regex_patterns(templates: Iterable[str]) -> list[str]:
    return [*filter(None, map(regex_pattern, templates)), _DEFAULT_SHAPE]


def regex_question(
    text: str, patterns: Sequence[str], prompt: str | None
) -> tuple[str, str | None]:
    if prompt and text != prompt and text.endswith(f"\n{prompt}"):
        head = text[: -len(prompt) - 1]
        if _SOURCE.search(head):
            inner = re.search(r"<context>\n?(.*)\n?</context>", head, re.DOTALL)
            return prompt, inner.group(1) if inner else head
    for pattern in patterns:
        match = re.fullmatch(f"{pattern}\n(?P<words>.*)", text, re.DOTALL)
        if match:
            return match.group("words"), match.group("context")
    return text, None


def regex_system(text: str, patterns: Sequence[str]) -> tuple[str, str | None]:
    for pattern in patterns:
        match = re.fullmatch(f"(?P<own>.*?)(?:\\A|\n)(?:{pattern})", text, re.DOTALL)
        if match:
            return match.group("own"), match.group("context")
    return text, None


def regex_sources(context: str) -> list[ContextSource]:
    sources = []
    for match in _SOURCE.finditer(context):
        attributes = {
            key: html.unescape(value)
            for key, value in _ATTRIBUTE.findall(match.group("attrs"))
        }
        name = attributes.get("name", "").strip()
        sources.append(ContextSource(name, match.group("body").strip(), attributes))
    return sources


def regex_strip_details(text: str) -> str:
    out: list[str] = []
    depth = 0
    position = 0
    pattern = re.compile(r"<details\b[^>]*>|</details>", re.IGNORECASE)
    for match in pattern.finditer(text):
        if match.group(0).lower().startswith("<details"):
            if depth == 0:
                out.append(text[position : match.start()])
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                position = match.end()
    if depth == 0:
        out.append(text[position:])
    return "".join(out)


TEMPLATES = [
    "### Task:\nAnswer.\n\n<context>\n{{CONTEXT}}\n</context>\n",
    "### Task:\nAnswer.\n\n<context>\n{{CONTEXT}}\n</context>",
    ADMIN_TEMPLATE,
    "{{CONTEXT}}\n[query]",
    "<context>{{CONTEXT}}</context>{{USER_NAME}}{{CURRENT_DATE}}:",
    # A repeated variable with few places to end: the tries stay far below
    # MAX_BACKTRACKS for these texts, so the answer is the regular expression's.
    "Q: {{QUERY}}\n<context>\n[context]\n</context>\nQ: {{QUERY}}",
    "No context here: {{QUERY}}",
]
PIECES = [
    "### Task:\n",
    "<context>\n",
    "<context>",
    "\n</context>",
    "\n</context>\n",
    "</context>",
    "\n",
    "\n\n",
    "Q: ",
    "Date: ",
    "\nQ: ",
    "\nDocs:\n",
    "\n-- end of docs --",
    ":",
    "x",
    "ab",
    '<source id="1" name="a&amp;b">',
    "<source>",
    "<sources>",
    "</source>",
]
texts = st.lists(st.sampled_from(PIECES), max_size=7).map("".join)


@given(texts, st.sampled_from(TEMPLATES), st.sampled_from([None, "x", "ab", "Q: "]))
def test_questions_split_as_the_regular_expressions_split_them(text, template, prompt):
    expected = regex_question(text, regex_patterns([template]), prompt)
    assert split_injected_question(text, injection_patterns([template]), prompt) == (
        expected
    )


@given(texts, st.sampled_from(TEMPLATES))
def test_system_prompts_split_as_the_regular_expressions_split_them(text, template):
    expected = regex_system(text, regex_patterns([template]))
    assert split_injected_system(text, injection_patterns([template])) == expected


@given(
    st.lists(
        st.sampled_from(
            [*PIECES, ' a="1"', "9b=", '"', "-c", ' é_d="2"', "=", " ", ">", "&#65;"]
        ),
        max_size=12,
    ).map("".join)
)
def test_sources_are_read_as_the_regular_expressions_read_them(context):
    assert context_sources(context) == regex_sources(context)


@given(
    st.lists(
        st.sampled_from(
            [
                "<details",
                "<DETAILS>",
                "</details>",
                "</Details>",
                ">",
                " x",
                "<detailsy>",
            ]
        ),
        max_size=10,
    ).map("".join)
)
def test_details_are_stripped_as_the_regular_expression_stripped_them(text):
    assert strip_details(text) == regex_strip_details(text)


def test_merging_keeps_each_run_of_one_role_in_order():
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c"},
        {"role": "tool", "content": "d"},
        {"role": "user", "content": "e"},
    ]
    assert split_conversation(messages) == (
        "",
        [
            {"role": "user", "content": "a\n\nb"},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d\n\ne"},
        ],
    )
