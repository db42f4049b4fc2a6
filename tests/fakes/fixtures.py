"""Fixtures of the fake backends shared by the suite (a pytest plugin).

Registered for every test by ``tests/conftest.py``: a fixture starts only when
a test asks for it. Each server runs once per test module and is reset for
every test, so a test sees only its own scripts and requests.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .scholarly import FakeScholarly
from .searxng import FakeSearXNG


@pytest.fixture(scope="module")
def searxng_server() -> Iterator[FakeSearXNG]:
    """A fake SearXNG, one per test module (tests use `searxng`)."""
    with FakeSearXNG() as server:
        yield server


@pytest.fixture
def searxng(searxng_server: FakeSearXNG) -> FakeSearXNG:
    """The module's fake SearXNG, without the scripts and requests of earlier tests."""
    searxng_server.reset()
    return searxng_server


@pytest.fixture(scope="module")
def apis_server() -> Iterator[FakeScholarly]:
    """Fake OpenAlex, Semantic Scholar and arXiv, one per test module.

    Tests use `apis`.
    """
    with FakeScholarly() as fake:
        yield fake


@pytest.fixture
def apis(apis_server: FakeScholarly) -> FakeScholarly:
    """The module's fake scholarly APIs, without earlier tests' scripts and requests."""
    apis_server.reset()
    return apis_server
