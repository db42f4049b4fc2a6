"""What both end-to-end profiles (single process, scaled) do the same way.

The session's fake servers on 127.0.0.1 (fixtures, registered for the whole
suite by ``tests/conftest.py``: a fixture only starts when a test asks for
it), the pipe's valves pointing at the fake model server, and the rule for a
missing piece: skip the profile with the reason, except under CI (``CI``
set), where it is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.pages import PageSite
from tests.fakes.searxng import FakeSearXNG


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


@pytest.fixture(scope="session")
def fake_model() -> Iterator[FakeOpenAI]:
    """The OpenAI-compatible fake model server (one for the session)."""
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture(scope="session")
def fake_search() -> Iterator[FakeSearXNG]:
    """A fake SearXNG that Open WebUI's web search is pointed at."""
    with FakeSearXNG() as searxng:
        yield searxng


@pytest.fixture(scope="session")
def page_site() -> Iterator[PageSite]:
    """Local web pages (HTML and PDF) for the visit tool."""
    with PageSite() as site:
        yield site


def pipe_valves(fake_model: FakeOpenAI) -> dict[str, Any]:
    """Valves pointing the pipe at the fake model server, with short limits."""
    return fake_model_valves(
        fake_model, api_key="sk-e2e-test-key", request_timeout=60, tool_timeout=90
    )
