"""What the model is asked with a file attached, and the reply to ``stream: false``.

With ``context: "full"`` (the UI's "Using Entire Document") every supported
version puts the file's text into the question through its RAG template
before the pipe is called; the model must see only the user's words and the
reference "Uploaded" note, and read the file with parse_file.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.fakes.openai_server import Reply, answer, tool_call

from .conftest import OwuiSession
from .owui import PIPE_MODEL_ID, ScriptedModel, question_of, stream_chat

pytestmark = pytest.mark.e2e

FILE_TEXT = "The uploaded file says: kiwi-42.\n"


async def test_the_model_gets_the_users_words_not_the_rag_template(
    owui: OwuiSession, model: ScriptedModel
) -> None:
    uploaded = await asyncio.to_thread(
        owui.api.upload_file, "notes.txt", FILE_TEXT.encode(), "text/plain"
    )
    model.conversation(
        "whole notes",
        Reply(content=tool_call("parse_file", {"files": ["notes.txt"]})),
        Reply(content=answer("The code is kiwi-42.")),
    )
    question = "What do the whole notes say?"

    stream = await stream_chat(
        owui.base_url,
        owui.token,
        question,
        files=[
            {
                "type": "file",
                "id": uploaded["id"],
                "name": "notes.txt",
                "context": "full",
            }
        ],
    )

    assert stream.done and not stream.errors
    assert "The code is kiwi-42." in stream.content
    first, second = model.bodies("whole notes")
    assert question_of(first) == f"(Uploaded 1 file: ['notes.txt'])\n\n{question}"
    sent = "\n".join(str(m.get("content")) for m in first["messages"])
    assert "kiwi-42" not in sent  # the file comes only through parse_file
    assert "### Task" not in sent and "<source" not in sent
    assert "kiwi-42" in second["messages"][-1]["content"]


async def test_stream_false_gets_the_whole_answer_in_one_reply(
    owui: OwuiSession, model: ScriptedModel
) -> None:
    model.conversation(
        "api caller", Reply(reasoning="Easy.", content=answer("Forty-two."))
    )

    reply = await asyncio.to_thread(
        owui.api.chat,
        {
            "model": PIPE_MODEL_ID,
            "messages": [
                {"role": "user", "content": "An api caller asks: the answer?"}
            ],
        },
    )

    content = reply["choices"][0]["message"]["content"]
    assert content.startswith("Forty-two.")
    assert "<think>" not in content and "<details" not in content
    assert "Easy." not in content
