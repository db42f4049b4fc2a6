"""The pure parts of consolidation: request, reply, restarted conversation."""

from __future__ import annotations

from tongyi_deepresearch_openwebui_pipeline.core.budget import messages_tokens
from tongyi_deepresearch_openwebui_pipeline.core.consolidation import (
    OMITTED_RESULT,
    SUMMARY_MAX_TOKENS,
    SUMMARY_MIN_TOKENS,
    fit_summary_request,
    pages_note,
    restarted_conversation,
    state_from_reply,
    summary_request,
)
from tongyi_deepresearch_openwebui_pipeline.core.prompts import (
    CONSOLIDATION_REQUEST,
    PAGES_READ_HEADING,
    resumption_message,
)
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import wrap_response

# The lab's ReSum restart, as WebAgent/WebResummer/src/react_agent.py builds it:
#   "Question: " + question + "\nBelow is a summary ... question.\n"
#   + "Summary: " + summary_response + "\n"
# where summary_response is "<summary>" + text + "</summary>" (summary_utils.py).
LAB_MIDDLE = (
    "\nBelow is a summary of the previous conversation. This summary condenses key "
    "information from earlier steps, so please consider it carefully. Assess whether "
    "the summary provides enough information to answer the question and use it as "
    "the basis for further reasoning and information gathering to answer the "
    "question.\n"
)


def test_the_resumption_message_is_the_labs_byte_for_byte():
    question, text = "Who built it?", "\n- Essential Information: X.\n"
    expected = (
        "Question: " + question + LAB_MIDDLE + "Summary: "
        "<summary>" + text + "</summary>" + "\n"
    )
    assert resumption_message(question, text) == expected


def test_the_request_is_the_conversation_then_one_user_message():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
    ]
    request = summary_request(messages)
    assert request[:2] == messages
    assert request[2] == {"role": "user", "content": CONSOLIDATION_REQUEST}
    assert len(messages) == 2  # the conversation itself is untouched


def _conversation(results: int, size: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    for k in range(results):
        messages.append({"role": "assistant", "content": f"<tool_call>{k}</tool_call>"})
        messages.append({"role": "user", "content": wrap_response(f"r{k} " * size)})
    return summary_request(messages)


def test_a_request_that_fits_is_sent_whole_with_the_full_reply():
    request = _conversation(3, 100)
    fitted, reply = fit_summary_request(request, 100_000)
    assert fitted == request
    assert reply == SUMMARY_MAX_TOKENS


def test_oldest_tool_results_are_left_out_until_the_summary_fits():
    request = _conversation(4, 1500)  # each result about 1,900 tokens
    hard = messages_tokens(request) + 500  # room for 500, not for the summary
    fitted, reply = fit_summary_request(request, hard)
    omitted = wrap_response(OMITTED_RESULT)
    contents = [m["content"] for m in fitted]
    assert contents[3] == omitted  # the oldest result went first
    assert contents[-2] == request[-2]["content"]  # the latest result stays
    assert all(
        m["role"] == "assistant" for m in fitted if "<tool_call>" in m["content"]
    )
    assert reply >= SUMMARY_MIN_TOKENS
    assert messages_tokens(fitted) + reply <= hard
    assert request[3]["content"] != omitted  # the caller's request is unchanged


def test_a_request_that_cannot_fit_says_so_with_a_small_reply():
    request = _conversation(1, 4000)
    _, reply = fit_summary_request(request, messages_tokens(request) + 100)
    assert reply < SUMMARY_MIN_TOKENS


def test_the_state_is_the_text_in_summary_tags_without_reasoning():
    reply = "<think>plan: keep the URLs</think>\n<summary>\nA is 3 (https://a.org)\n</summary>"
    assert state_from_reply(reply) == "A is 3 (https://a.org)"


def test_a_template_opened_think_is_dropped_too():
    reply = "plan the summary</think>\n\n<summary>The bridge opened in 1932.</summary>"
    assert state_from_reply(reply) == "The bridge opened in 1932."


def test_an_untagged_reply_is_the_state_without_calls():
    reply = 'The bridge opened in 1932.\n<tool_call>{"name": "search"}</tool_call>'
    assert state_from_reply(reply) == "The bridge opened in 1932."


def test_a_cut_off_summary_keeps_what_was_written():
    assert state_from_reply("<summary>The bridge opened in 1932 and") == (
        "The bridge opened in 1932 and"
    )


def test_nothing_usable_is_empty():
    assert state_from_reply("") == ""
    assert state_from_reply("<think>only thinking</think>") == ""
    assert state_from_reply('<tool_call>{"name": "search"}</tool_call>') == ""
    assert state_from_reply("<summary>ok</summary>") == ""  # too short to be a state


def test_the_reasoning_channel_counts_only_with_tags():
    thought = "I should list the findings about the bridge."
    assert state_from_reply(thought, tagged_only=True) == ""
    tagged = "Thinking. <summary>The bridge opened in 1932.</summary>"
    assert state_from_reply(tagged, tagged_only=True) == "The bridge opened in 1932."


def test_pages_are_listed_newest_first_within_the_budget():
    pages = [(f"https://site.org/{k}", f"Page {k}") for k in range(1, 201)]
    note = pages_note(pages, max_tokens=300)
    lines = note.splitlines()
    assert lines[0] == PAGES_READ_HEADING
    assert lines[1] == "- Page 200: https://site.org/200"
    assert 3 < len(lines) < 200
    assert messages_tokens([{"content": note}]) <= 300 + 5
    assert pages_note([], 300) == ""


def test_the_restarted_conversation_holds_system_question_state_and_pages():
    system = [{"role": "system", "content": "prompt"}]
    restarted = restarted_conversation(
        system, "Q?", "Established: X.", "Pages read so far (cite them by their URLs):"
    )
    assert restarted[0] == system[0]
    assert restarted[1]["role"] == "user"
    content = restarted[1]["content"]
    assert content.startswith("Question: Q?\nBelow is a summary")
    assert "<summary>\nEstablished: X.\n\nPages read so far" in content
