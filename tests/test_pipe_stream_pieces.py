"""The end of a reasoning block reaches Open WebUI in a piece of its own.

Open WebUI 0.6 to 0.11 strip both ends of the text that comes in the same
piece as ``</think>``: an answer whose first piece ended in a space ("on "
before a link the citations hold back) was saved as "on[page 1](…)" (seen
end to end in tests/e2e/test_durable.py on 0.8.12).
"""

from __future__ import annotations

from tests.fakes.chat import QUESTION, drive
from tests.fakes.scripted_model import ScriptedModel
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.render import (
    stream_pieces,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import ModelDelta, ModelFinish
from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe

#: Nothing listens here: the served-context probe finds no server, at once.
NO_SERVER = "http://127.0.0.1:9/v1"


async def test_the_answer_after_the_reasoning_is_streamed_apart_from_its_end():
    model = ScriptedModel(
        [
            ModelDelta(content="<think>\nI know.\n</think>\n\n<answer>\nIt is on "),
            ModelDelta(content="[the page](https://example.org/p).\n</answer>"),
            ModelFinish("stop"),
        ]
    )
    pipe = Pipe(model_client=model.client)
    pipe.valves = pipe.Valves(API_BASE_URL=NO_SERVER, MODEL_ID="research-model")

    turn = await drive(pipe, QUESTION)

    # Before: one piece, "\n</think>\n\nIt is on ".
    assert "\n</think>\n\n" in turn.chunks, turn.chunks
    end = turn.chunks.index("\n</think>\n\n")
    assert turn.chunks[end + 1] == "It is on "
    assert turn.answer.startswith("It is on [the page](https://example.org/p)")


def test_a_piece_is_split_after_the_end_of_a_reasoning_block_only():
    assert stream_pieces("I know.\n</think>\n\nIt is on ") == (
        "I know.\n</think>\n\n",
        "It is on ",
    )
    assert stream_pieces("\n</think>\n\n") == ("\n</think>\n\n",)
    assert stream_pieces("It is on ") == ("It is on ",)
    assert stream_pieces("") == ("",)
