"""Settings shared by the whole suite."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# The end-to-end profiles' session fakes (fake model, SearXNG, pages), defined
# once for tests/e2e and tests/e2e_scaled; the fake backends' fixtures every
# other test shares (`searxng`, `apis`).
pytest_plugins = ["tests.e2e.shared", "tests.fakes.fixtures"]

# Property tests must not depend on how fast the machine is: no per-example
# deadline and no "data generation too slow" health check, which a busy machine
# (scripts/test-busy) trips while proving nothing about the code. In CI the
# examples are derandomized, so a run is repeatable: a new counterexample is
# searched for by developers' runs (random), never sprung on a submission.
settings.register_profile(
    "suite",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=os.environ.get("CI") == "true",
)
settings.load_profile("suite")
