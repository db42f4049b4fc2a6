"""Background tasks whose output Open WebUI keeps get one plain model call.

``context_compaction`` (0.11+) stores the reply as the chat's summary,
``memory_review`` parses JSON operations from it (first ``{`` to last ``}``),
``moa_response_generation`` shows it. All three arrive with ``stream: false``
and Open WebUI's own prompt in ``messages``.
"""

from __future__ import annotations

import json

import pytest

from tests.fakes.chat import drive, make_pipe
from tests.fakes.openai_server import FakeOpenAI, Reply, Style

COMPACTION_PROMPT = (
    "### Task:\nSummarize the conversation history.\n\n"
    "### Messages Being Compacted:\nUSER: find kiwi facts\nASSISTANT: Kiwis are birds."
)
MEMORY = [
    {"role": "system", "content": "Return only valid JSON."},
    {"role": "user", "content": "Review: the user says they are vegetarian."},
]
OPERATIONS = {
    "operations": [{"action": "add", "type": "user", "content": "Vegetarian"}]
}


@pytest.mark.parametrize("style", ["inline", "reasoning_content", "reasoning"])
async def test_compaction_gets_the_models_summary_without_reasoning(style: Style):
    with FakeOpenAI() as fake:
        fake.script(
            Reply(
                content="The user researched kiwis; kiwis are birds.",
                reasoning="Let me summarise.",
                style=style,
            )
        )
        text, chunks, events = await drive(
            make_pipe(fake),
            [{"role": "user", "content": COMPACTION_PROMPT}],
            __task__="context_compaction",
        )
        bodies = fake.bodies
    assert text == "The user researched kiwis; kiwis are birds."
    assert len(chunks) == 1
    assert len(bodies) == 1  # one call, no research loop
    assert bodies[0]["messages"] == [{"role": "user", "content": COMPACTION_PROMPT}]
    assert "tools" not in bodies[0]
    assert events == []


async def test_memory_review_gets_parseable_json():
    reply = f"<think>\nWhat to keep?\n</think>\n\n{json.dumps(OPERATIONS)}"
    with FakeOpenAI() as fake:
        fake.script(Reply(content=reply))
        text, _, _ = await drive(make_pipe(fake), MEMORY, __task__="memory_review")
        sent = fake.bodies[0]["messages"]
    assert sent == MEMORY  # Open WebUI's own prompt, untouched
    assert json.loads(text[text.find("{") : text.rfind("}") + 1]) == OPERATIONS


async def test_reasoning_left_open_by_the_template_is_dropped():
    # Chat templates that open <think> themselves stream only its end.
    with FakeOpenAI() as fake:
        fake.script(Reply(content='thinking about it {"x": 1}\n</think>\n\nSummary.'))
        text, _, _ = await drive(
            make_pipe(fake),
            [{"role": "user", "content": "Merge these answers."}],
            __task__="moa_response_generation",
        )
    assert text == "Summary."


async def test_a_failing_model_gives_an_empty_reply_not_an_error():
    with FakeOpenAI() as fake:
        fake.script(Reply(status=401, error="bad key"))
        text, _, _ = await drive(
            make_pipe(fake),
            [{"role": "user", "content": COMPACTION_PROMPT}],
            __task__="context_compaction",
        )
    assert text == ""


@pytest.mark.parametrize(
    "task", ["title_generation", "tags_generation", "follow_up_generation"]
)
async def test_cheap_tasks_still_make_no_model_call(task: str):
    with FakeOpenAI() as fake:
        text, _, _ = await drive(
            make_pipe(fake),
            [{"role": "user", "content": "### Task:\nUSER: kiwi"}],
            __task__=task,
        )
        assert fake.bodies == []
    assert text.startswith("{")
