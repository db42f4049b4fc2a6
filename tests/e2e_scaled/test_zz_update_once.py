"""Tools installed by an older package are updated exactly once by two replicas.

The rows are made to look as an older release wrote them (the frontmatter
``version`` line of the stored content and ``meta.manifest.version``, which
the registry compares), then both replicas restart and list models at the
same moment, as after a deployment of a new version.

Named to run last in the profile: it restarts both replicas, whose logs then
start afresh (the previous logs are kept as artifacts). It leaves the cluster
running with the tools at the package version, as it found it.
"""

from __future__ import annotations

import base64
import re
import time
from collections import Counter

import pytest

from tests.e2e.owui import HEAVY_MODEL_ID, PIPE_MODEL_ID, TOOL_IDS
from tongyi_deepresearch_openwebui_pipeline import __version__

from .cluster import Cluster, list_models_at_once
from .services import PostgresServer

pytestmark = pytest.mark.scaled

OLD_VERSION = "0.0.1"
#: The registry's line for an update ("updated tool <id> from <old> to <new>").
UPDATED = re.compile(r"updated tool (\S+) from (\S+) to (\S+)")
#: Either verdict of a replica on a tool: it updated it, or found it current.
VERDICT = re.compile(r"updated tool (\S+) from |tool (\S+) \S+ is up to date")
#: Any other line of the registry that reports a row it did not bring up to date.
NOT_UPDATED = re.compile(
    r"installed tool |not downgrading|cannot be compared|was edited in Open WebUI"
    r"|not installing over it|could not install"
)
_DOWNGRADE = (
    "UPDATE tool SET"
    " content = regexp_replace(content, '^version:.*$', 'version: 0.0.1', 'n'),"
    " meta = jsonb_set(meta::jsonb, '{manifest,version}', '\"0.0.1\"')::%s"
    " WHERE id LIKE 'deepresearch\\_%%'"
)
#: The downgrade statement for each type the ``meta`` column may have.
DOWNGRADE = {kind: _DOWNGRADE % kind for kind in ("text", "json", "jsonb")}


def test_zz_an_older_install_is_updated_exactly_once(cluster: Cluster) -> None:
    pg = cluster.postgres
    packaged = _contents(pg)
    assert sorted(packaged) == sorted(TOOL_IDS)
    for tool_id, content in packaged.items():
        assert _version_line(content) == __version__, tool_id
    history_before = _history_counts(pg)
    # Open WebUI stores meta as JSON text (its JSONField) or, in some
    # versions, as json/jsonb: the statement casts back to the column's type.
    meta_type = pg.sql(
        "SELECT data_type FROM information_schema.columns"
        " WHERE table_name = 'tool' AND column_name = 'meta'"
    )[0][0]

    # As an older release (0.0.1) left them: both places the registry reads
    # a version from.
    pg.sql(DOWNGRADE[meta_type])
    for tool_id, content in _contents(pg).items():
        assert _version_line(content) == OLD_VERSION, tool_id
    assert _manifest_versions(pg) == dict.fromkeys(TOOL_IDS, OLD_VERSION)

    cluster.restart("before-update")
    listing = list_models_at_once(cluster.replicas)
    for name, ids in listing.items():
        assert sorted(ids) == sorted([PIPE_MODEL_ID, HEAVY_MODEL_ID]), name

    # The install runs in the background: wait until each replica has said,
    # for every tool, that it updated it or found it up to date (so a second
    # update could not still be on its way).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(
        _verdicts(replica.log_text()) >= set(TOOL_IDS) for replica in cluster.replicas
    ):
        time.sleep(0.2)
    for replica in cluster.replicas:
        assert _verdicts(replica.log_text()) >= set(TOOL_IDS), replica.name

    assert _manifest_versions(pg) == dict.fromkeys(TOOL_IDS, __version__)
    # The stored content is the packaged module again, byte for byte.
    assert _contents(pg) == packaged
    # One new history entry per tool: updated once, not twice.
    history_after = _history_counts(pg)
    assert {
        tool_id: history_after.get(tool_id, 0) - history_before.get(tool_id, 0)
        for tool_id in TOOL_IDS
    } == dict.fromkeys(TOOL_IDS, 1)
    # One "updated" line per tool across both replicas, from the old version.
    updates = _updates(cluster)
    assert Counter(tool_id for tool_id, _, _ in updates.values()) == Counter(
        dict.fromkeys(TOOL_IDS, 1)
    ), updates
    for tool_id, (_, old, new) in updates.items():
        assert (old, new) == (OLD_VERSION, __version__), tool_id
    for replica in cluster.replicas:
        text = replica.log_text()
        assert NOT_UPDATED.findall(text) == [], replica.name
        assert replica.error_lines() == [], replica.name
    # Both replicas list the tools, and serve the updated rows.
    for replica in cluster.replicas:
        tools = replica.api.wait_for_tools(timeout=30)
        assert sorted(tools) == sorted(TOOL_IDS), replica.name


def _verdicts(log: str) -> set[str]:
    """The tools a replica's log has a verdict on."""
    return {m.group(1) or m.group(2) for m in VERDICT.finditer(log)}


def _contents(pg: PostgresServer) -> dict[str, str]:
    """Each tool row's content (base64 in transit: psql output is line-based)."""
    rows = pg.sql(
        "SELECT id, translate(encode(convert_to(content, 'UTF8'), 'base64'),"
        " E'\\n', '') FROM tool WHERE id LIKE 'deepresearch\\_%' ORDER BY id"
    )
    return {tool_id: base64.b64decode(data).decode() for tool_id, data in rows}


def _version_line(content: str) -> str | None:
    match = re.search(r"^version:\s*(\S+)\s*$", content, re.MULTILINE)
    return match.group(1) if match else None


def _manifest_versions(pg: PostgresServer) -> dict[str, str]:
    """``meta.manifest.version`` and the content's version line, when they agree."""
    rows = pg.sql(
        "SELECT id, meta::jsonb #>> '{manifest,version}' FROM tool"
        " WHERE id LIKE 'deepresearch\\_%' ORDER BY id"
    )
    contents = _contents(pg)
    return {
        tool_id: version
        if _version_line(contents[tool_id]) == version
        else f"{version} / content {_version_line(contents[tool_id])}"
        for tool_id, version in rows
    }


def _history_counts(pg: PostgresServer) -> dict[str, int]:
    rows = pg.sql(
        "SELECT tool_id, count(*) FROM tool_history"
        " WHERE tool_id LIKE 'deepresearch\\_%' GROUP BY tool_id"
    )
    return {tool_id: int(count) for tool_id, count in rows}


def _updates(cluster: Cluster) -> dict[str, tuple[str, str, str]]:
    """Every "updated tool" line of both replicas' (new) logs, by where it is."""
    return {
        f"{replica.name}:{match.start()}": (
            match.group(1),
            match.group(2),
            match.group(3),
        )
        for replica in cluster.replicas
        for match in UPDATED.finditer(replica.log_text())
    }
