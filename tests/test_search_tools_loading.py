"""How Open WebUI sees the search and scholar tool files.

- Frontmatter, imports and tool specs follow Open WebUI's rules.
- Each file loads and works in a fresh interpreter where neither this package
  nor Open WebUI can be imported (Open WebUI installs a single file).
- When the real Open WebUI 0.12.4 environment is present, the files are loaded
  with its own loader, their specs computed by its own `get_tool_specs`, and a
  search is run through its real `search_web` and config store against a fake
  SearXNG.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import pytest

from tongyi_deepresearch_openwebui_pipeline import __version__
from tongyi_deepresearch_openwebui_pipeline.tools import (
    scholar_tool,
    search_tool,
    visit_tool,
)

from .fakes.scholarly import FakeScholarly, openalex_work
from .fakes.searxng import FakeSearXNG, result

TOOLS_DIR = Path(search_tool.__file__).parent
SEARCH_FILE = TOOLS_DIR / "search_tool.py"
SCHOLAR_FILE = TOOLS_DIR / "scholar_tool.py"
SRC_DIR = TOOLS_DIR.parent.parent
OWUI_PYTHON = Path(
    os.environ.get(
        "OWUI_PYTHON",
        os.environ.get("TDR_OWUI_VENV", "/root/.cache/tdr-owui/owui-0.12.4")
        + "/bin/python",
    )
)
AUTHOR_URL = (
    "https://github.com/tongyi-deepresearch-openwebui/"
    "tongyi-deepresearch-openwebui-pipeline"
)


def frontmatter(content: str) -> dict[str, str]:
    """Open WebUI's frontmatter rules (utils.plugin.extract_frontmatter)."""
    lines = content.splitlines()
    if not lines or lines[0].strip() != '"""':
        return {}
    found = {}
    for line in lines[1:]:
        if '"""' in line:
            break
        match = re.match(r"^\s*([a-z_]+):\s*(.*)\s*$", line, re.IGNORECASE)
        if match:
            found[match.group(1).strip()] = match.group(2).strip()
    return found


@pytest.mark.parametrize(
    ("path", "tool_id", "title"),
    [
        (SEARCH_FILE, "deepresearch_search", "DeepResearch Search"),
        (SCHOLAR_FILE, "deepresearch_scholar", "DeepResearch Scholar"),
    ],
)
def test_frontmatter(path: Path, tool_id: str, title: str) -> None:
    meta = frontmatter(path.read_text(encoding="utf-8"))
    assert set(meta) == {
        "id",
        "title",
        "author",
        "author_url",
        "version",
        "license",
        "description",
        "requirements",
        "required_open_webui_version",
    }
    assert meta["id"] == tool_id
    assert meta["title"] == title
    assert meta["author"] == "tongyi-deepresearch-openwebui-pipeline contributors"
    assert meta["author_url"] == AUTHOR_URL
    assert meta["version"] == version("tongyi-deepresearch-openwebui-pipeline")
    assert meta["license"] == "MIT"
    # httpx ships with Open WebUI: nothing for it to pip-install.
    assert meta["requirements"] == ""
    assert meta["required_open_webui_version"] == "0.6.0"
    assert len(meta["description"]) > 40


@pytest.mark.parametrize("path", [SEARCH_FILE, SCHOLAR_FILE])
def test_source_survives_open_webui_import_rewriting(path: Path) -> None:
    content = path.read_text(encoding="utf-8")
    for fragment in ("from utils", "from apps", "from main", "from config"):
        assert fragment not in content


@pytest.mark.parametrize("path", [SEARCH_FILE, SCHOLAR_FILE])
def test_only_stdlib_pydantic_and_httpx_at_top_level(path: Path) -> None:
    content = path.read_text(encoding="utf-8")
    top_level = re.findall(r"^(?:from|import) ([\w.]+)", content, re.MULTILINE)
    allowed = set(sys.stdlib_module_names) | {"httpx", "pydantic"}
    assert {name.split(".")[0] for name in top_level} <= allowed


@pytest.mark.parametrize(
    ("module", "name"), [(search_tool, "search"), (scholar_tool, "google_scholar")]
)
def test_the_tool_is_the_only_public_callable(module: object, name: str) -> None:
    tool = module.Tools()  # type: ignore[attr-defined]
    public = [
        attr
        for attr in dir(tool)
        if not attr.startswith("_")
        and callable(getattr(tool, attr))
        and not inspect.isclass(getattr(tool, attr))
    ]
    assert public == [name]
    assert tool.citation is False
    signature = inspect.signature(getattr(tool, name))
    assert list(signature.parameters) == [
        "query",
        "__request__",
        "__user__",
        "__event_emitter__",
    ]
    assert ":param query: The list of search queries" in getattr(tool, name).__doc__


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (search_tool.Tools, "search"),
        (scholar_tool.Tools, "google_scholar"),
        (visit_tool.Tools, "visit"),
        # Given seams (as tests give them), still data, never a tool.
        (lambda: visit_tool.Tools(seams=visit_tool._Seams()), "visit"),
    ],
    ids=["search", "google_scholar", "visit", "visit with seams"],
)
def test_open_webui_06_sees_only_the_tool_method(
    make: Callable[[], object], name: str
) -> None:
    # Open WebUI 0.6.43 (utils.tools.get_functions_from_tool) offers every
    # callable attribute not starting with "__" and not a class as a tool, so
    # a private `_helper` method became a spec and made the install fail.
    tool = make()
    offered = [
        attr
        for attr in dir(tool)
        if callable(getattr(tool, attr))
        and not attr.startswith("__")
        and not inspect.isclass(getattr(tool, attr))
    ]
    assert offered == [name]


# --- a fresh interpreter without the package or Open WebUI ----------------------

FRESH = r"""
import asyncio, importlib.abc, importlib.util, json, sys

BLOCKED = {"tongyi_deepresearch_openwebui_pipeline", "open_webui", "defusedxml"}


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError("blocked: " + name)
        return None


sys.meta_path.insert(0, Block())
src = sys.argv[4]
sys.path = [p for p in sys.path if p.rstrip("/") != src.rstrip("/")]
spec = importlib.util.spec_from_file_location("tool_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["tool_under_test"] = module
spec.loader.exec_module(module)
tool = module.Tools()
tool.valves = tool.Valves(**json.loads(sys.argv[3]))
text = asyncio.run(getattr(tool, sys.argv[2])(["fresh"]))
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps({"text": text, "leaked": leaked}))
"""


def run_fresh(path: Path, method: str, valves: dict) -> dict:
    completed = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            FRESH,
            str(path),
            method,
            json.dumps(valves),
            str(SRC_DIR),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_search_file_works_alone() -> None:
    with FakeSearXNG() as searxng:
        searxng.script("fresh", results=[result("https://f.example", "Fresh", "snip")])
        out = run_fresh(SEARCH_FILE, "search", {"SEARXNG_URL": searxng.search_url})
    assert out == {
        "text": "A Google search for 'fresh' found 1 results:\n\n## Web Results\n"
        "1. [Fresh](https://f.example)\nSource: f.example\n\nsnip",
        "leaked": [],
    }


def test_scholar_file_works_alone() -> None:
    with FakeScholarly() as apis:
        apis.openalex["fresh"] = [openalex_work("Fresh Paper", year=2024, cited=2)]
        out = run_fresh(
            SCHOLAR_FILE, "google_scholar", {"OPENALEX_URL": apis.openalex_url}
        )
    assert out == {
        "text": "A Google scholar for 'fresh' found 1 results:\n\n## Scholar Results\n"
        "1. [Fresh Paper](no available link)\npublicationInfo: 2024"
        "\nDate published: 2024\ncitedBy: 2\n",
        "leaked": [],
    }


# --- the real Open WebUI 0.12.4 ---------------------------------------------------

REAL = r"""
import asyncio, json, sys, types
from starlette.datastructures import State


async def main():
    from open_webui.utils.plugin import load_tool_module_by_id
    from open_webui.utils.tools import get_tool_specs

    out = {}
    tools = {}
    for tool_id, path in (("deepresearch_search", sys.argv[1]),
                          ("deepresearch_scholar", sys.argv[2])):
        with open(path, encoding="utf-8") as handle:
            content = handle.read()
        instance, meta, _module = await load_tool_module_by_id(tool_id, content=content)
        tools[tool_id] = instance
        out[tool_id] = {"frontmatter": meta, "specs": get_tool_specs(instance)}
    request = types.SimpleNamespace(app=types.SimpleNamespace(state=State()))
    user = {"id": "u1", "email": "a@example.com", "name": "A", "role": "admin",
            "last_active_at": 0, "updated_at": 0, "created_at": 0}
    events = []

    async def emit(event):
        events.append(event)

    out["search"] = await tools["deepresearch_search"].search(
        ["real owui"], __request__=request, __user__=user, __event_emitter__=emit)
    scholar = tools["deepresearch_scholar"]
    scholar.valves = scholar.Valves(BACKEND="web")
    out["scholar"] = await scholar.google_scholar(
        ["real owui"], __request__=request, __user__=user)
    out["events"] = events
    print("RESULT=" + json.dumps(out))


asyncio.run(main())
"""


@pytest.fixture
def owui_env(tmp_path: Path) -> dict[str, str]:
    package = next((OWUI_PYTHON.parent.parent / "lib").glob("python3*/site-packages"))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "DATA_DIR": str(tmp_path / "data"),
        "WEBUI_SECRET_KEY": "test-secret",
        "OFFLINE_MODE": "true",
        "FRONTEND_BUILD_DIR": str(package / "open_webui" / "frontend"),
        "ENABLE_OLLAMA_API": "false",
        "ENABLE_OPENAI_API": "false",
        "RAG_EMBEDDING_ENGINE": "openai",
        "RAG_OPENAI_API_BASE_URL": "http://127.0.0.1:9/v1",
        "ENABLE_WEB_SEARCH": "true",
        "WEB_SEARCH_ENGINE": "searxng",
        "WEB_SEARCH_RESULT_COUNT": "3",
    }
    (tmp_path / "data").mkdir()
    return env


@pytest.mark.e2e
@pytest.mark.skipif(not OWUI_PYTHON.exists(), reason="Open WebUI 0.12.4 not installed")
def test_real_open_webui_loads_specs_and_searches(owui_env: dict[str, str]) -> None:
    with FakeSearXNG() as searxng:
        searxng.default.results = [
            result(f"https://r{i}.example", f"R{i}", f"s{i}", score=20 - i)
            for i in range(5)
        ]
        owui_env["SEARXNG_QUERY_URL"] = searxng.search_url
        completed = subprocess.run(
            [str(OWUI_PYTHON), "-c", REAL, str(SEARCH_FILE), str(SCHOLAR_FILE)],
            capture_output=True,
            text=True,
            timeout=240,
            env=owui_env,
            cwd=owui_env["HOME"],
            check=False,
        )
        queries = searxng.queries()
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = next(x for x in completed.stdout.splitlines() if x.startswith("RESULT="))
    out = json.loads(line.removeprefix("RESULT="))

    assert out["deepresearch_search"]["frontmatter"]["id"] == "deepresearch_search"
    assert (
        out["deepresearch_scholar"]["frontmatter"]["version"] == __version__
    )  # the release the package is
    assert out["deepresearch_search"]["specs"] == [
        {
            "name": "search",
            "description": "Perform Google web searches then returns a string of the "
            "top search results.\n\nAccepts multiple queries.",
            "parameters": {
                "properties": {
                    "query": {
                        "description": "The list of search queries.",
                        "items": {"type": "string"},
                        "type": "array",
                    }
                },
                "required": ["query"],
                "type": "object",
            },
        }
    ]
    assert out["deepresearch_scholar"]["specs"] == [
        {
            "name": "google_scholar",
            "description": "Leverage Google Scholar to retrieve relevant information "
            "from academic publications.\n\nAccepts multiple queries.",
            "parameters": {
                "properties": {
                    "query": {
                        "description": "The list of search queries for Google Scholar.",
                        "items": {"type": "string"},
                        "type": "array",
                    }
                },
                "required": ["query"],
                "type": "object",
            },
        }
    ]
    # Open WebUI's own searxng engine, asked for RESULTS_PER_QUERY (10) results.
    assert queries == ["real owui", "academic research: real owui"]
    assert out["search"] == (
        "A Google search for 'real owui' found 5 results:\n\n## Web Results\n"
        + "\n\n".join(
            f"{i + 1}. [R{i}](https://r{i}.example)\n\ns{i}" for i in range(5)
        )
    )
    assert out["scholar"].startswith(
        "A Google scholar for 'real owui' found 5 results:\n\n## Scholar Results\n"
        "1. [R0](no available link)\npublicationInfo: https://r0.example\n\ns0"
    )
    assert out["events"][-1]["data"]["urls"] == [
        f"https://r{i}.example" for i in range(5)
    ]
