"""An attached file, read by the model through the parse_file tool."""

from __future__ import annotations

import asyncio
import re

import pytest

from tests.fakes.openai_server import Reply, answer, tool_call

from .conftest import OwuiSession
from .owui import ScriptedModel, stream_chat, tool_responses

pytestmark = pytest.mark.e2e

FILE_TEXT = "The uploaded file says: kiwi-42.\n"

# tongyi-protocol.md §3 parse_file: str() of the reference's list of strings.
PARSE_FILE_RESULT = re.compile(
    r"^<tool_response>\n"
    r"\['File token number: \d+\\nFile content:\\n', "
    r"'# File: notes\.txt\\nThe uploaded file says: kiwi-42\.(\\n)?'\]"
    r"\n</tool_response>$"
)


async def test_attached_file_is_read_through_parse_file(
    owui: OwuiSession, model: ScriptedModel
) -> None:
    uploaded = await asyncio.to_thread(
        owui.api.upload_file, "notes.txt", FILE_TEXT.encode(), "text/plain"
    )
    model.conversation(
        "attached notes",
        Reply(
            reasoning="The user attached a file; I will read it.",
            content=tool_call("parse_file", {"files": ["notes.txt"]}),
        ),
        Reply(
            reasoning="The file names the code.", content=answer("The code is kiwi-42.")
        ),
    )

    stream = await stream_chat(
        owui.base_url,
        owui.token,
        "What do the attached notes say?",
        files=[{"type": "file", "id": uploaded["id"], "name": "notes.txt"}],
    )

    assert stream.done and not stream.errors
    assert 'name="parse_file"' in stream.content
    assert "The code is kiwi-42." in stream.content
    bodies = model.bodies("attached notes")
    assert len(bodies) == 2
    # The system prompt offers parse_file once files are attached.
    assert '"name": "parse_file"' in bodies[0]["messages"][0]["content"]
    [response] = tool_responses(bodies[1])
    assert PARSE_FILE_RESULT.match(response), response
