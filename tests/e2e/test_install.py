"""The pipe as installed from the release asset, and the tools it registers."""

from __future__ import annotations

import pytest

from .conftest import OwuiSession, pipe_valves
from .owui import (
    FUNCTION_ID,
    HEAVY_MODEL_ID,
    PIPE_FILE,
    PIPE_MODEL_ID,
    TOOL_IDS,
    installer,
)

pytestmark = pytest.mark.e2e

# Tool id -> (function name the model calls, parameter types, required parameters),
# as the model's own system prompt declares them.
EXPECTED_TOOL_SPECS = {
    "deepresearch_search": ("search", {"query": "array"}, ["query"]),
    "deepresearch_scholar": ("google_scholar", {"query": "array"}, ["query"]),
    "deepresearch_visit": (
        "visit",
        {"url": "array", "goal": "string"},
        ["goal", "url"],
    ),
}


def test_the_pipe_model_is_listed(owui: OwuiSession) -> None:
    models = {model["id"]: model for model in owui.api.models()}

    assert PIPE_MODEL_ID in models, sorted(models)
    entry = models[PIPE_MODEL_ID]
    assert entry["name"] == "Tongyi DeepResearch"
    assert entry["pipe"]["type"] == "pipe"
    assert models[HEAVY_MODEL_ID]["name"] == "Tongyi DeepResearch Heavy"
    # Model providers are off in the hermetic server: the pipe's are the only models.
    assert sorted(models) == sorted([PIPE_MODEL_ID, HEAVY_MODEL_ID])


def test_the_function_is_the_release_asset_unchanged(owui: OwuiSession) -> None:
    function = owui.api.get(f"/api/v1/functions/id/{FUNCTION_ID}")

    # Open WebUI rewrites some import lines on save; the asset must survive as is.
    assert function["content"] == PIPE_FILE.read_text(encoding="utf-8")
    assert function["type"] == "pipe"
    assert function["is_active"] is True
    manifest = function["meta"]["manifest"]
    assert manifest["title"] == "Tongyi DeepResearch"
    # Nothing for Open WebUI to pip-install: the file installs its wheel itself.
    assert "requirements" not in manifest
    assert function["meta"]["description"] == manifest["description"]


def test_valves_are_stored_as_set_with_the_key_encrypted(
    owui: OwuiSession, fake_model
) -> None:
    stored = owui.api.get(f"/api/v1/functions/id/{FUNCTION_ID}/valves")

    expected = pipe_valves(fake_model)
    key = expected.pop("API_KEY")
    assert {name: stored[name] for name in expected} == expected
    # The key is kept encrypted at rest (WEBUI_SECRET_KEY is set); the chat
    # tests show it still reaches the model server in clear.
    assert stored["API_KEY"].startswith("encrypted:")
    assert key not in str(stored)


def test_installing_again_updates_in_place(owui: OwuiSession, fake_model) -> None:
    client = owui.api.rest_client()
    content = PIPE_FILE.read_text(encoding="utf-8")
    changed = {**pipe_valves(fake_model), "MAX_TOOL_ROUNDS": 7}
    try:
        installer.install_pipe(client, content, changed)

        functions = [
            f for f in owui.api.get("/api/v1/functions/") if f["id"] == FUNCTION_ID
        ]
        stored = owui.api.get(f"/api/v1/functions/id/{FUNCTION_ID}/valves")
        model_ids = [model["id"] for model in owui.api.models()]
    finally:
        installer.install_pipe(client, content, pipe_valves(fake_model))

    assert len(functions) == 1
    assert functions[0]["is_active"] is True
    assert stored["MAX_TOOL_ROUNDS"] == 7
    assert model_ids.count(PIPE_MODEL_ID) == 1


def test_the_research_tools_are_registered_with_their_specs(owui: OwuiSession) -> None:
    tools = owui.api.wait_for_tools(timeout=5)

    assert sorted(tools) == sorted(TOOL_IDS), (
        "the pipe should install its three tools into Open WebUI's registry"
    )
    for tool_id, (name, types, required) in EXPECTED_TOOL_SPECS.items():
        specs = tools[tool_id]["specs"]
        assert [spec["name"] for spec in specs] == [name], tool_id
        spec = specs[0]
        assert spec["description"].strip(), tool_id
        parameters = spec["parameters"]
        assert parameters["type"] == "object"
        properties = parameters["properties"]
        assert {key: value["type"] for key, value in properties.items()} == types
        for key, kind in types.items():
            if kind == "array":
                assert properties[key]["items"]["type"] == "string", (tool_id, key)
        assert sorted(parameters["required"]) == required, tool_id
