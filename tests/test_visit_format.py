"""Output formats (golden), input handling, events, and loading the module the
way Open WebUI does (frontmatter, spec, a fresh interpreter without the package).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.pages import ARTICLE_HTML, VISIT_TOOL_PATH, PageSite, load_visit_tool
from tongyi_deepresearch_openwebui_pipeline import __version__

vt = load_visit_tool("visit_tool_format_tests")

OWUI_VENV = Path(os.environ.get("TDR_OWUI_VENV", "/root/.cache/tdr-owui/owui-0.12.4"))
OWUI_PYTHON = Path(os.environ.get("OWUI_PYTHON", str(OWUI_VENV / "bin" / "python")))


@pytest.fixture(scope="module")
def site() -> Any:
    with PageSite() as running:
        yield running


@pytest.fixture(scope="module")
def extractor() -> Any:
    with FakeOpenAI() as fake:
        fake.respond_with(
            lambda body: Reply(
                content=json.dumps(
                    {
                        "rational": "r",
                        "evidence": "Water boils at 100 C.",
                        "summary": "Boiling point.",
                    }
                )
            )
        )
        yield fake


@pytest.fixture(autouse=True)
def _empty_cache() -> Any:
    vt._PAGE_CACHE.clear()
    yield
    vt._PAGE_CACHE.clear()


def make_tool(extractor: Any, **valves: Any) -> Any:
    tool = vt.Tools()
    tool.valves = tool.Valves(
        ALLOW_PRIVATE_URLS=True, EXTRACTOR_BASE_URL=extractor.base_url, **valves
    )
    return tool


def success(url: str, goal: str) -> str:
    return (
        f"The useful information in {url} for user goal {goal} as follows: \n\n"
        "Evidence in page: \nWater boils at 100 C.\n\n"
        "Summary: \nBoiling point.\n\n"
    )


def failure(url: str, goal: str) -> str:
    return (
        f"The useful information in {url} for user goal {goal} as follows: \n\n"
        "Evidence in page: \n"
        "The provided webpage content could not be accessed. "
        "Please check the URL or file format.\n\n"
        "Summary: \n"
        "The webpage content could not be processed, "
        "and therefore, no information is available.\n\n"
    )


# -- golden formats ----------------------------------------------------------------


async def test_single_success_is_exact_and_stripped(site: Any, extractor: Any) -> None:
    url = site.url("/plain")
    result = await make_tool(extractor).visit(url=[url], goal="boiling point")
    assert result == success(url, "boiling point").strip()
    assert result.endswith("Summary: \nBoiling point.")


async def test_single_failure_is_exact_and_stripped(extractor: Any) -> None:
    url = "ftp://files.example/x"
    result = await make_tool(extractor).visit(url=[url], goal="g")
    assert result == failure(url, "g").strip()


async def test_several_urls_are_joined_in_input_order(
    site: Any, extractor: Any
) -> None:
    urls = [site.url("/track/first"), "ftp://files.example/x", site.url("/plain")]
    result = await make_tool(extractor).visit(url=urls, goal="G")
    expected = "\n=======\n".join(
        [success(urls[0], "G"), failure(urls[1], "G"), success(urls[2], "G")]
    ).strip()
    assert result == expected
    assert "Boiling point.\n\n\n=======\nThe useful information in ftp://" in result


async def test_a_crashing_url_does_not_fail_the_batch(
    site: Any, extractor: Any
) -> None:
    async def flaky(host: str) -> list[str]:
        """A resolver with a bug that shows for one name only."""
        if host == "crash.example":
            raise IndexError("boom")
        return ["127.0.0.1"]

    tool = vt.Tools(seams=vt._Seams(resolve=flaky))
    tool.valves = make_tool(extractor).valves
    crashing = site.url("/json").replace("127.0.0.1", "crash.example")
    fine = site.url("/plain").replace("127.0.0.1", "fine.example")
    events: list[dict] = []
    result = await tool.visit(
        url=[crashing, fine], goal="g", __event_emitter__=events.append
    )
    assert (
        result == (failure(crashing, "g") + "\n=======\n" + success(fine, "g")).strip()
    )
    assert {
        "description": f"Could not read {crashing}: unexpected error (IndexError)",
        "done": False,
    } in [e["data"] for e in events]


# -- input handling -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "goal"),
    [(None, "g"), ([], "g"), ("", "g"), ("   ", "g"), ([1, 2], "g"), ({"u": 1}, "g"),
     (["https://a.example/"], None), (["https://a.example/"], 5), (42, "g")],
)  # fmt: skip
async def test_invalid_requests_get_the_reference_message(url: Any, goal: Any) -> None:
    result = await vt.Tools().visit(url=url, goal=goal)
    assert result == (
        "[Visit] Invalid request format: Input must be a JSON object containing "
        "'url' and 'goal' fields"
    )


async def test_bare_string_and_json_array_string_urls(
    site: Any, extractor: Any
) -> None:
    url = site.url("/plain")
    tool = make_tool(extractor)
    assert await tool.visit(url=url, goal="g") == success(url, "g").strip()
    joined = await tool.visit(url=json.dumps([url, url]), goal="g")
    assert joined == (success(url, "g") + "\n=======\n" + success(url, "g")).strip()


async def test_url_cap_names_the_skipped_urls(site: Any, extractor: Any) -> None:
    urls = [site.url(f"/count/cap{n}") for n in range(4)]
    result = await make_tool(extractor, MAX_URLS_PER_CALL=2).visit(url=urls, goal="g")
    assert result.count("The useful information in ") == 2
    assert result.endswith(
        f"[Visit] Only 2 URLs are read per call; not read: {urls[2]}, {urls[3]}. "
        "Visit them in another call if still needed."
    )
    assert site.hits("/count/cap2") == 0
    assert site.hits("/count/cap3") == 0


# -- events -----------------------------------------------------------------------


async def test_events_status_source_and_failure(site: Any, extractor: Any) -> None:
    events: list[dict] = []

    async def emit(event: dict) -> None:
        events.append(event)

    good, bad = site.url("/redirect/1"), site.url("/status/404")
    await make_tool(extractor).visit(url=[good, bad], goal="G", __event_emitter__=emit)
    statuses = [e["data"] for e in events if e["type"] == "status"]
    assert {"description": f"Reading: {good}", "done": False} in statuses
    assert {"description": f"Reading: {bad}", "done": False} in statuses
    assert {
        "description": f"Could not read {bad}: the server answered HTTP 404",
        "done": False,
    } in statuses
    assert statuses[-1] == {"description": "Read 1 of 2 page(s)", "done": True}
    # The fixture is all article: it is read whole (main content saves nothing).
    whole = vt._html_to_text(ARTICLE_HTML, site.url("/article"), 10**6)[0]
    kept = f"whole page, {len(whole):,} characters"
    assert {"description": f"Reading {good}: {kept}", "done": False} in statuses
    sources = [e for e in events if e["type"] == "source"]
    assert sources == [
        {
            "type": "source",
            "data": {
                "source": {"name": "Solar Panels & Efficiency", "url": good},
                "document": [f"Water boils at 100 C.\n\n[Read: {kept}]"],
                "metadata": [
                    {
                        "source": good,
                        "name": "Solar Panels & Efficiency",
                        "url": good,
                        "final_url": site.url("/article"),
                        "redirects": [site.url("/article")],
                        "goal": "G",
                        "summary": "Boiling point.",
                        "kept": kept,
                    }
                ],
            },
        }
    ]


async def test_a_broken_emitter_never_breaks_the_tool(
    site: Any, extractor: Any
) -> None:
    calls: list[str] = []

    async def broken(event: dict) -> None:
        calls.append(event["type"])
        raise RuntimeError("socket gone")

    url = site.url("/plain")
    result = await make_tool(extractor).visit(
        url=url, goal="g", __event_emitter__=broken
    )
    assert result == success(url, "g").strip()
    assert "source" in calls


# -- module shape ------------------------------------------------------------------


def frontmatter(source: str) -> dict[str, str]:
    """Parse like Open WebUI: bare first line, `key: value` lines up to the close."""
    lines = source.splitlines()
    assert lines[0].strip() == '"""'
    found = {}
    for line in lines[1:]:
        if '"""' in line:
            break
        match = re.match(r"^\s*([a-z_]+):\s*(.*)\s*$", line, re.IGNORECASE)
        if match:
            found[match.group(1).lower()] = match.group(2).strip()
    return found


def test_frontmatter() -> None:
    meta = frontmatter(VISIT_TOOL_PATH.read_text(encoding="utf-8"))
    assert meta["id"] == "deepresearch_visit"
    assert meta["title"] == "DeepResearch Visit"
    assert meta["author"] == "tongyi-deepresearch-openwebui-pipeline contributors"
    assert meta["author_url"].startswith(
        "https://github.com/tongyi-deepresearch-openwebui/"
    )
    assert meta["version"] == __version__
    assert meta["license"] == "MIT"
    assert meta["description"]
    # httpx and pypdf ship with Open WebUI: nothing for it to pip-install.
    assert meta["requirements"] == ""
    assert meta["required_open_webui_version"] == "0.6.0"


def test_source_survives_open_webui_import_rewriting() -> None:
    source = VISIT_TOOL_PATH.read_text(encoding="utf-8")
    for needle in ("from utils", "from apps", "from main", "from config"):
        assert needle not in source


@pytest.mark.parametrize("seams", [None, vt._Seams()], ids=["real", "given seams"])
def test_only_visit_is_a_tool_and_valves_are_described(seams: Any) -> None:
    tool = vt.Tools(seams=seams)
    public = [
        name for name in dir(tool)
        if not name.startswith("__") and callable(getattr(tool, name))
        and not inspect.isclass(getattr(tool, name))
    ]  # fmt: skip
    assert public == ["visit"]  # what Open WebUI 0.6 offers as tools
    assert tool.citation is False
    assert inspect.iscoroutinefunction(tool.visit)
    params = list(inspect.signature(tool.visit).parameters)
    assert params == [
        "url",
        "goal",
        "__request__",
        "__user__",
        "__event_emitter__",
        "__chat_id__",
    ]
    for name, field in vt.Tools.Valves.model_fields.items():
        assert field.description, name
    assert vt.Tools.Valves().PAGE_LOADER == "auto"
    assert vt.Tools.Valves().ALLOW_PRIVATE_URLS is False
    assert vt.Tools.Valves().MAX_PAGE_TOKENS == 95_000


FRESH_SCRIPT = textwrap.dedent(
    """
    import asyncio, importlib.util, json, sys
    # No package, no Open WebUI, no optional parsers: the tool must still work.
    blocked = ("tongyi_deepresearch_openwebui_pipeline", "open_webui", "json5", "pypdf")
    for name in blocked:
        sys.modules[name] = None
    spec = importlib.util.spec_from_file_location("deepresearch_visit", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tool = module.Tools()
    invalid = asyncio.run(tool.visit(url=[], goal="g"))
    refused = asyncio.run(tool.visit(url="http://127.0.0.1/", goal="g"))
    parsed = module._parse_extraction("{'evidence': 'E', 'summary': 'S',}")
    text = module._html_to_text("<h1>T</h1><p>x</p>", "https://a/", 1000)
    loaded = sorted(
        m for m, mod in sys.modules.items()
        if mod is not None and m.startswith(("tongyi", "open_webui"))
    )
    print(json.dumps({"invalid": invalid, "refused": refused, "parsed": parsed,
                      "text": text, "loaded": loaded,
                      "loader": module._openwebui_content_loader() is None}))
    """
)


def test_loads_and_works_in_a_fresh_interpreter_without_the_package() -> None:
    completed = subprocess.run(
        [sys.executable, "-I", "-c", FRESH_SCRIPT, str(VISIT_TOOL_PATH)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    data = json.loads(completed.stdout)
    assert data["invalid"].startswith("[Visit] Invalid request format")
    assert data["refused"].startswith("The useful information in http://127.0.0.1/")
    assert vt.FAILURE_EVIDENCE in data["refused"]
    assert data["parsed"] == ["E", "S"]
    assert data["text"] == ["# T\n\nx", "T"]
    assert data["loaded"] == []
    assert data["loader"] is True


OWUI_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from open_webui.utils.plugin import extract_frontmatter, replace_imports
    from open_webui.utils.tools import get_tool_specs
    import importlib.util
    source = open(sys.argv[1], encoding="utf-8").read()
    name = "tool_deepresearch_visit"
    spec = importlib.util.spec_from_file_location(name, sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print("RESULT" + json.dumps({
        "frontmatter": extract_frontmatter(source),
        "unchanged": replace_imports(source) == source,
        "specs": get_tool_specs(module.Tools()),
    }))
    """
)


@pytest.mark.e2e
@pytest.mark.skipif(
    not OWUI_PYTHON.exists(), reason="Open WebUI 0.12.4 venv not installed"
)
def test_open_webui_builds_the_expected_spec(tmp_path: Path) -> None:
    lib = OWUI_PYTHON.parent.parent / "lib"
    package = next(lib.glob("python3*/site-packages")) / "open_webui"
    (tmp_path / "data").mkdir()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "DATA_DIR": str(tmp_path / "data"),
        "STATIC_DIR": str(tmp_path / "static"),
        "FRONTEND_BUILD_DIR": str(package / "frontend"),
        "WEBUI_SECRET_KEY": "test",
        "OFFLINE_MODE": "true",
        "ENABLE_VERSION_UPDATE_CHECK": "false",
        "ENABLE_OLLAMA_API": "false",
        "ENABLE_OPENAI_API": "false",
        "RAG_EMBEDDING_ENGINE": "openai",
    }
    completed = subprocess.run(
        [str(OWUI_PYTHON), "-c", OWUI_SCRIPT, str(VISIT_TOOL_PATH)],
        capture_output=True, text=True, timeout=280, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = next(ln for ln in completed.stdout.splitlines() if ln.startswith("RESULT"))
    data = json.loads(line[len("RESULT") :])
    assert data["unchanged"] is True
    assert data["frontmatter"]["id"] == "deepresearch_visit"
    # httpx and pypdf ship with Open WebUI: nothing for it to pip-install.
    assert data["frontmatter"]["requirements"] == ""
    (spec,) = data["specs"]
    assert spec["name"] == "visit"
    assert (
        spec["description"].strip()
        == "Visit webpage(s) and return the summary of the content."
    )
    parameters = spec["parameters"]
    assert parameters["type"] == "object"
    assert sorted(parameters["required"]) == ["goal", "url"]
    assert set(parameters["properties"]) == {"url", "goal"}
    url, goal = parameters["properties"]["url"], parameters["properties"]["goal"]
    assert url["type"] == "array"
    assert url["items"] == {"type": "string"}
    assert url["description"].startswith("The URL(s) of the webpage(s) to visit")
    assert goal["type"] == "string"
    assert goal["description"] == "The goal of the visit for webpage(s)."
