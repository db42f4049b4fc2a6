"""One run session opens every run, for the pipe and the runner alike.

The two front ends keep only what is theirs (a chat's messages and tools'
context; a terminal's questions); the plan, the clients, the budgets and the
checkpointer come from `session.run_session`. The proof is what reaches the
model server: the same question under the same settings gives the same
request from either front end.
"""

from __future__ import annotations

import ast
import datetime as dt
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.chat import drive, make_pipe
from tests.fakes.openai_server import FakeOpenAI, Reply, answer
from tongyi_deepresearch_openwebui_pipeline.adapters.checkpoint_store import (
    DirectoryStore,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.catalog import (
    prompt_lines,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.valves import Valves
from tongyi_deepresearch_openwebui_pipeline.core.prompts import system_prompt_with
from tongyi_deepresearch_openwebui_pipeline.engine.runs import HeavySettings
from tongyi_deepresearch_openwebui_pipeline.runner.research import open_researcher
from tongyi_deepresearch_openwebui_pipeline.runner.settings import load_settings
from tongyi_deepresearch_openwebui_pipeline.session.run_session import RunSession

PACKAGE = (
    Path(__file__).resolve().parents[1] / "src/tongyi_deepresearch_openwebui_pipeline"
)
QUESTION = "Which river runs through Ljubljana?"
TODAY = dt.date(2026, 11, 22)
#: What a front end would build itself if it did not open its run through
#: the session: the engine's entry points and the run's parts.
ASSEMBLY = {
    "research",
    "single_run",
    "RunPlan",
    "HeavySettings",
    "Checkpointer",
    "RunKey",
    "research_limits",
    "served_context_tokens",
    "summary_settings",
    "system_prompt_with",
}


def _called_names(path: Path) -> set[str]:
    """The names a module calls, but the methods it calls on a run session."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name):
            names.add(func.id)
        elif isinstance(func, ast.Attribute) and _receiver(func.value) != "session":
            names.add(func.attr)
    return names


def _receiver(value: ast.expr) -> str:
    """``session`` for ``session.x(...)`` and ``self.session.x(...)``."""
    if isinstance(value, ast.Name):
        return value.id
    if isinstance(value, ast.Attribute):
        return value.attr
    return ""


@pytest.mark.parametrize("front_end", ["pipes/pipe.py", "runner/research.py"])
def test_a_front_end_assembles_no_run_of_its_own(front_end: str) -> None:
    assert _called_names(PACKAGE / front_end) & ASSEMBLY == set()


async def test_the_pipe_and_the_runner_send_the_same_request(tmp_path: Path) -> None:
    with FakeOpenAI() as fake:
        fake.script(
            Reply(answer("The Ljubljanica.")), Reply(answer("The Ljubljanica."))
        )
        off: dict[str, Any] = {"PYTHON_ENABLED": False, "SCHOLAR_ENABLED": False}
        pipe = make_pipe(fake, PARSE_FILE_ENABLED=False, **off)
        await drive(pipe, [{"role": "user", "content": QUESTION}])
        settings = load_settings(
            {
                "API_BASE_URL": fake.base_url,
                "MODEL_ID": fake.model,
                "SEARXNG_URL": "http://127.0.0.1:9/search",
                **off,
            },
            env={"XDG_CONFIG_HOME": str(tmp_path)},
        )
        async with open_researcher(settings, TODAY) as researcher:
            outcome = await researcher.run(QUESTION)
        from_pipe, from_runner = fake.bodies
    assert outcome.finished.answer == "The Ljubljanica."
    assert from_runner == from_pipe
    system = system_prompt_with(prompt_lines(["search", "visit"]), TODAY)
    assert from_pipe["messages"] == [
        {"role": "system", "content": system},
        {"role": "user", "content": QUESTION},
    ]


def _session(tmp_path: Path, **valves: Any) -> RunSession:
    return RunSession(
        Valves(**valves),
        httpx.AsyncClient(),
        api_key="",
        served_context=32_768,
        today=TODAY,
        checkpoints=DirectoryStore(tmp_path),
    )


def test_a_heavy_plan_takes_its_shape_from_the_valves(tmp_path: Path) -> None:
    session = _session(
        tmp_path,
        HEAVY_CONCURRENT_ROLLOUTS=2,
        HEAVY_PARTIAL_ROLLOUTS=False,
        HEAVY_BRANCH_STEPS=3,
    )
    conversation = [{"role": "user", "content": QUESTION}]
    assert session.plan(conversation, ["visit"], heavy_rollouts=1).heavy is None
    assert session.plan(conversation, ["visit"], heavy_rollouts=4).heavy == (
        HeavySettings(4, 2, partial_rollouts=False, branch_steps=3)
    )


def test_the_chat_s_own_system_text_follows_the_valve_s_preamble(
    tmp_path: Path,
) -> None:
    session = _session(tmp_path, SYSTEM_PROMPT_PREAMBLE="  Answer in Slovene.  ")
    plan = session.plan(
        [{"role": "user", "content": QUESTION}], [], extra_preamble="Be brief."
    )
    expected = system_prompt_with([], TODAY, "Answer in Slovene.\n\nBe brief.")
    assert plan.messages[0] == {"role": "system", "content": expected}
    assert plan.limits == session.limits


@pytest.mark.parametrize(
    ("owner", "run_id", "valve", "kept"),
    [
        ("u1", "chat-1", True, True),
        ("", "chat-1", True, False),
        ("u1", "", True, False),
        ("u1", "chat-1", False, False),
    ],
)
def test_a_run_is_checkpointed_only_when_it_can_be_found_again(
    tmp_path: Path, owner: str, run_id: str, valve: bool, kept: bool
) -> None:
    session = _session(tmp_path, RESUME_INTERRUPTED_RUNS=valve)
    keeper = session.checkpointer(owner, run_id, QUESTION)
    assert (keeper is not None) == kept


def test_a_heavy_run_s_checkpoint_is_kept_apart_from_a_single_run_s(
    tmp_path: Path,
) -> None:
    session = _session(tmp_path, CHECKPOINT_MAX_AGE_HOURS=2)
    single = session.checkpointer("u1", "chat-1", QUESTION)
    heavy = session.checkpointer("u1", "chat-1", QUESTION, heavy=True)
    assert single is not None and heavy is not None
    assert (single.key.mode, heavy.key.mode) == ("single", "heavy")
    assert single.max_age_seconds == 7200
