"""The pure parts of consolidation: request, reply, restarted conversation.

What the lab's ReSum sends and reads is pinned against its published data in
``tests/test_lab_resum.py``; here, what this project adds around it: the
request fitted to the served context, and the readings the lab has no rule
for.
"""

from __future__ import annotations

from tongyi_deepresearch_openwebui_pipeline.core.budget import messages_tokens
from tongyi_deepresearch_openwebui_pipeline.core.consolidation import (
    OMITTED_RESULT,
    SUMMARY_MAX_TOKENS,
    SUMMARY_MIN_TOKENS,
    rendered_message,
    restarted_conversation,
    state_from_reply,
    summarised_history,
    summary_request,
)
from tongyi_deepresearch_openwebui_pipeline.core.prompts import (
    resumption_message,
    summary_prompt,
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


def test_the_summarised_history_leaves_out_system_messages_and_the_opening():
    messages = [
        {"role": "system", "content": "admin"},
        {"role": "system", "content": "prompt"},
        {"role": "user", "content": "earlier question"},
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": "turn"},
        {"role": "user", "content": "result"},
    ]
    assert summarised_history(messages, opening=4) == [
        messages[2],
        messages[3],
        messages[5],
        messages[6],
    ]


def _history(results: int, size: int) -> list[dict[str, str]]:
    history: list[dict[str, str]] = []
    for k in range(results):
        history.append({"role": "assistant", "content": f"<tool_call>{k}</tool_call>"})
        history.append({"role": "user", "content": wrap_response(f"r{k} " * size)})
    return history


def _rendered(history: list[dict[str, str]]) -> str:
    return "\n".join(rendered_message(m) for m in history)


def test_a_request_that_fits_is_sent_whole_with_the_full_reply():
    history = _history(3, 100)
    request, reply = summary_request("q", history, "", 100_000)
    assert request == [
        {"role": "user", "content": summary_prompt("q", _rendered(history))}
    ]
    assert reply == SUMMARY_MAX_TOKENS


def test_oldest_tool_results_are_left_out_until_the_summary_fits():
    history = _history(4, 1500)  # each result about 2,300 tokens
    whole, _ = summary_request("q", history, "", 1_000_000)
    # Leaving one result out gives room for about 800 tokens, two for 3,100.
    hard = messages_tokens(whole) - 1500
    request, reply = summary_request("q", history, "", hard)
    omitted = {"role": "user", "content": wrap_response(OMITTED_RESULT)}
    # The two oldest results went; the third and the latest stay, as do the turns.
    kept = [history[0], omitted, history[2], omitted, *history[4:]]
    assert request == [
        {"role": "user", "content": summary_prompt("q", _rendered(kept))}
    ]
    assert reply >= SUMMARY_MIN_TOKENS
    assert messages_tokens(request) + reply <= hard
    assert history[1]["content"] != omitted["content"]  # the caller's is unchanged


def test_a_request_that_cannot_fit_says_so_with_a_small_reply():
    history = _history(1, 4000)
    whole, _ = summary_request("q", history, "", 1_000_000)
    _, reply = summary_request("q", history, "", messages_tokens(whole) + 100)
    assert reply < SUMMARY_MIN_TOKENS


def test_the_state_is_the_text_in_summary_tags_without_reasoning():
    reply = "<think>plan: keep the URLs</think>\n<summary>\nA is 3 (https://a.org)\n</summary>"
    assert state_from_reply(reply) == "\nA is 3 (https://a.org)\n"


def test_a_template_opened_think_is_dropped_too():
    reply = "plan the summary</think>\n\n<summary>The bridge opened in 1932.</summary>"
    assert state_from_reply(reply) == "The bridge opened in 1932."
    untagged = "plan the summary</think>\n\nThe bridge opened in 1932."
    assert state_from_reply(untagged) == "The bridge opened in 1932."


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
    assert (
        state_from_reply("<summary>\n  ok  \n</summary>") == ""
    )  # blanks do not count


def test_the_reasoning_channel_counts_only_with_tags():
    thought = "I should list the findings about the bridge."
    assert state_from_reply(thought, tagged_only=True) == ""
    tagged = "Thinking. <summary>The bridge opened in 1932.</summary>"
    assert state_from_reply(tagged, tagged_only=True) == "The bridge opened in 1932."


def test_the_restarted_conversation_is_the_system_and_the_labs_restart():
    system = [{"role": "system", "content": "prompt"}]
    restarted = restarted_conversation(system, "Q?", "\n- Essential Information: X.\n")
    assert restarted == [
        system[0],
        {
            "role": "user",
            "content": resumption_message("Q?", "\n- Essential Information: X.\n"),
        },
    ]
