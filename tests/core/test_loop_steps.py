"""What the run's state says between the loop's steps (what a checkpoint saves).

The run engine saves `RunState` when a consolidation is done (`Consolidated`)
and before each round; a run resumed from that save goes on from what it says.
"""

from __future__ import annotations

from tests.core.test_loop import make_loop
from tests.fakes.scripted_model import ScriptedModel
from tongyi_deepresearch_openwebui_pipeline.core.events import (
    Consolidated,
    ContextOverflowError,
    RunFinished,
)
from tongyi_deepresearch_openwebui_pipeline.core.loop import Limits


async def test_a_consolidation_after_a_refusal_leaves_no_refusal_in_the_state():
    # The first request is refused for its length (the server holds 32K); the
    # run consolidates, then asks the refused round again, which answers.
    model = ScriptedModel(
        ContextOverflowError("The conversation is too long.", 32 * 1024),
        "<summary>What was found so far.</summary>",
        "<answer>42</answer>",
    )
    loop = make_loop(model, limits=Limits(at_limit="consolidate"))
    refused_when_consolidated: list[bool] = []
    events = []
    async for event in loop.run():
        if isinstance(event, Consolidated):
            refused_when_consolidated.append(loop.state.refused_for_length)
        events.append(event)
    # Saved here, a refusal would make the resumed run consolidate again at
    # once, for a conversation the consolidation already made small.
    assert refused_when_consolidated == [False]
    end = events[-1]
    assert isinstance(end, RunFinished) and end.answer == "42"
    assert end.stats.consolidations == 1 and end.stats.rounds == 1
