"""What both end-to-end profiles (single process, scaled) do the same way.

The pipe's valves pointing at the fake model server, and the rule for a
missing piece: skip the profile with the reason, except under CI (``CI``
set), where it is a failure.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

import pytest

from tests.fakes.openai_server import FakeOpenAI


def unavailable(reason: str, profile: str = "the end-to-end tests") -> NoReturn:
    """Skip (or, under CI, fail) because something ``profile`` needs is missing."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} — CI must run {profile}", pytrace=False)
    pytest.skip(reason)


def fake_model_valves(
    fake_model: FakeOpenAI,
    *,
    api_key: str,
    request_timeout: int,
    tool_timeout: int,
) -> dict[str, Any]:
    """Valves pointing the pipe at the fake model server, with short limits."""
    return {
        "API_BASE_URL": fake_model.base_url,
        "API_KEY": api_key,
        "MODEL_ID": fake_model.model,
        "MAX_RETRIES": 1,
        "REQUEST_TIMEOUT_SECONDS": request_timeout,
        "TOOL_TIMEOUT_SECONDS": tool_timeout,
        "MAX_TOOL_ROUNDS": 8,
    }
