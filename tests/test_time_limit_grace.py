"""The time limit's wrap-up grace is a valve of both front ends, not a constant."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.valves import (
    Valves,
    research_limits,
)
from tongyi_deepresearch_openwebui_pipeline.runner.settings import (
    SettingsError,
    load_settings,
)


def test_the_grace_valve_reaches_the_run_limits() -> None:
    limits = research_limits(Valves(WRAP_UP_SECONDS=45, MAX_RESEARCH_MINUTES=2), 0)
    assert (limits.max_seconds, limits.wrap_up_seconds) == (120.0, 45.0)


def test_the_grace_default_is_the_documented_120_seconds() -> None:
    assert research_limits(Valves(), 0).wrap_up_seconds == 120.0


def test_no_grace_is_allowed_and_a_negative_one_is_refused() -> None:
    assert research_limits(Valves(WRAP_UP_SECONDS=0), 0).wrap_up_seconds == 0.0
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        Valves(WRAP_UP_SECONDS=-1)


def test_the_runner_takes_the_grace_from_its_environment() -> None:
    settings = load_settings({}, env={"TDR_WRAP_UP_SECONDS": "15"})
    assert research_limits(settings.valves, 0).wrap_up_seconds == 15.0


def test_the_runner_refuses_a_grace_past_an_hour() -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings({"WRAP_UP_SECONDS": 3601}, env={})
    assert str(refused.value) == (
        "setting WRAP_UP_SECONDS (from the command line): "
        "Input should be less than or equal to 3600"
    )
