"""Run the registry install inside a real Open WebUI (see tests/test_registry.py).

Executed by the Open WebUI venv's Python with a temporary DATA_DIR: importing
``open_webui.config`` creates the SQLite database, then the probe installs the
tools, edits and downgrades rows the way an admin or an old release would, and
prints one ``PROBE {json}`` line with what it saw.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import types
from typing import Any

from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui import (
    code,
    compat,
    files,
    registry,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.toolbox import (
    TOOL_MODULES,
)
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import ToolCall

# Imported by name: only the Open WebUI venv has these (pyright runs elsewhere).
# Importing open_webui.config first runs Open WebUI's database migrations.
importlib.import_module("open_webui.config")
Tools = importlib.import_module("open_webui.models.tools").Tools
Users = importlib.import_module("open_webui.models.users").Users
get_tools = importlib.import_module("open_webui.utils.tools").get_tools
files_module = importlib.import_module("open_webui.models.files")


def _row_summary(row: Any, instance: Any) -> dict[str, Any]:
    public = any(
        g.principal_type == "user" and g.principal_id == "*" and g.permission == "read"
        for g in row.access_grants
    )
    return {
        "user_id": row.user_id,
        "public_read": public,
        "user_valves_match": row.meta.has_user_valves
        == hasattr(instance, "UserValves"),
        "manifest_id": (row.meta.manifest or {}).get("id"),
        "spec_keys": [sorted(spec) for spec in row.specs],
    }


def _with_version(content: str, version: str) -> str:
    lines = content.splitlines(keepends=True)
    return "".join(
        f"version: {version}\n" if line.startswith("version:") else line
        for line in lines
    )


async def _statuses(names: list[str]) -> dict[str, str]:
    report = await registry.ensure_tools_installed(names)
    if report.errors:
        raise RuntimeError(json.dumps(report.errors))
    return report.statuses


async def main() -> dict[str, Any]:
    """Install, re-run, edit, downgrade; return the observations."""
    names = [
        name
        for name in ("search", "google_scholar", "visit")
        if registry.packaged_tool(TOOL_MODULES[name]) is not None
    ]
    ids = [TOOL_MODULES[name].registry_id for name in names]
    first_tool = registry.packaged_tool(TOOL_MODULES[names[0]])
    assert first_tool is not None
    result: dict[str, Any] = {
        "version": compat.openwebui_version(),
        "names": names,
        "ids": ids,
        "package_version": first_tool.version,
    }

    before = await registry.ensure_tools_installed(names)
    stored = [await Tools.get_tool_by_id(tool_id) for tool_id in ids]
    result["before_admin"] = {
        "skipped": before.skipped,
        "rows": sum(row is not None for row in stored),
    }

    await Users.insert_new_user("admin-e2e", "Admin", "admin@example.com", role="admin")
    await Users.insert_new_user("user-e2e", "User", "user@example.com", role="user")
    result["first"] = await _statuses(names)
    result["second"] = await _statuses(names)

    rows: dict[str, Any] = {}
    for tool_id in ids:
        row = await Tools.get_tool_by_id(tool_id)
        loaded = await compat.load_tool_module_by_id(tool_id)
        assert loaded is not None
        rows[tool_id] = _row_summary(row, loaded.instance)
    result["rows"] = rows

    user = await Users.get_user_by_id("user-e2e")
    request = types.SimpleNamespace(
        app=types.SimpleNamespace(state=types.SimpleNamespace())
    )
    tools = await get_tools(request, ids, user, {"__user__": user.model_dump()})
    result["user_tools"] = sorted(tools)

    first_id, first_spec = ids[0], TOOL_MODULES[names[0]]
    await Tools.update_tool_valves_by_id(first_id, {"RESULTS_PER_QUERY": 3})
    result["valves"] = await registry.registry_tool_valves(first_spec)

    row = await Tools.get_tool_by_id(first_id)
    edited = row.content + "\n# an admin's own change\n"
    await Tools.update_tool_by_id(first_id, {"content": edited})
    result["edited"] = (await _statuses(names[:1]))[first_id]
    result["edit_preserved"] = (await Tools.get_tool_by_id(first_id)).content == edited

    await Tools.update_tool_by_id(first_id, {"content": _with_version(edited, "0.0.1")})
    result["upgraded"] = (await _statuses(names[:1]))[first_id]
    upgraded = await Tools.get_tool_by_id(first_id)
    result["upgraded_version"] = upgraded.meta.manifest.get("version")
    result |= await _other_seams()
    return result


async def _other_seams() -> dict[str, Any]:
    """Config, file store and permissions through compat, on the real models."""
    form = files_module.FileForm(
        id="file-e2e",
        filename="notes.txt",
        path="/nonexistent/notes.txt",
        data={"content": "The uploaded file says: kiwi-42.\n"},
        meta={"name": "notes.txt"},
    )
    await files_module.Files.insert_new_file("user-e2e", form)
    attached = [{"type": "file", "id": "file-e2e", "name": "notes.txt"}]
    owner = files.build_parse_file_handler(
        attached, None, {"id": "user-e2e", "role": "user"}
    )
    stranger = files.build_parse_file_handler(
        attached, None, {"id": "x", "role": "user"}
    )
    assert owner is not None and stranger is not None
    call = ToolCall("parse_file", {"files": ["notes.txt"]})
    request = types.SimpleNamespace(
        app=types.SimpleNamespace(state=types.SimpleNamespace())
    )
    user = {"id": "user-e2e", "role": "user"}
    return {
        "engine": await compat.get_config(
            None, "code_interpreter.engine", "CODE_INTERPRETER_ENGINE"
        ),
        "python_offered": await code.build_python_handler(request, user) is not None,
        "may_use_code": await compat.user_has_permission(
            request, user, "features.code_interpreter"
        ),
        "parse_owner": (await owner(call)).text,
        "parse_stranger": (await stranger(call)).text,
    }


if __name__ == "__main__":
    print("PROBE " + json.dumps(asyncio.run(main())), flush=True)
