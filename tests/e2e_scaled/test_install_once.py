"""Two replicas list models at once: the pipe's tools are installed exactly once."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.e2e.owui import HEAVY_MODEL_ID, PIPE_MODEL_ID, TOOL_IDS

from .cluster import Cluster

pytestmark = pytest.mark.scaled

CREATED = re.compile(r"installed tool (\S+) ")
# Tool id -> (function name the model calls, required parameters).
EXPECTED_SPECS = {
    "deepresearch_search": ("search", ["query"]),
    "deepresearch_scholar": ("google_scholar", ["query"]),
    "deepresearch_visit": ("visit", ["goal", "url"]),
}


def test_both_replicas_list_the_pipe_models_at_once(cluster: Cluster) -> None:
    for name, ids in cluster.first_listing.items():
        assert sorted(ids) == sorted([PIPE_MODEL_ID, HEAVY_MODEL_ID]), name


def test_the_tools_are_installed_exactly_once(cluster: Cluster) -> None:
    rows = cluster.postgres.sql("SELECT id, specs FROM tool ORDER BY id")

    assert [row[0] for row in rows] == sorted(TOOL_IDS)
    for tool_id, specs_text in rows:
        specs = json.loads(specs_text)
        name, required = EXPECTED_SPECS[tool_id]
        assert [spec["name"] for spec in specs] == [name], tool_id
        assert sorted(specs[0]["parameters"]["required"]) == required, tool_id
        assert specs[0]["description"].strip(), tool_id
    # Both replicas read the same registry.
    for replica in cluster.replicas:
        assert sorted(cluster.tools[replica.name]) == sorted(TOOL_IDS), replica.name
    history_table = cluster.postgres.sql(
        "SELECT count(*) FROM information_schema.tables"
        " WHERE table_name = 'tool_history'"
    )
    if history_table[0][0] != "0":
        history = cluster.postgres.sql(
            "SELECT tool_id, count(*) FROM tool_history GROUP BY tool_id ORDER BY 1"
        )
        assert history == [[tool_id, "1"] for tool_id in sorted(TOOL_IDS)]
    # One replica created each tool; the other found it there (each
    # replica's install runs in the background: wait for its log line).
    created = _creations(cluster)
    deadline = time.monotonic() + 120
    while set(created) != set(TOOL_IDS) and time.monotonic() < deadline:
        time.sleep(0.2)
        created = _creations(cluster)
    assert created == dict.fromkeys(TOOL_IDS, 1), created
    # Neither replica reported a failed install, or any error while starting.
    for replica in cluster.replicas:
        assert "could not install" not in replica.log_text(), replica.name
        until = cluster.setup_marks[replica.name]
        assert replica.error_lines(until=until) == [], replica.name


def _creations(cluster: Cluster) -> dict[str, int]:
    """How many times each tool was created, by the logs of both replicas."""
    found = [
        match.group(1)
        for replica in cluster.replicas
        for match in CREATED.finditer(replica.log_text())
    ]
    return {tool_id: found.count(tool_id) for tool_id in set(found)}
