"""The files users paste into Open WebUI: frontmatter, versions, sync, imports.

Fast checks on the checkout (no build, no new venv). The release build and the
clean-venv install are in test_release_artifacts.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tongyi_deepresearch_openwebui_pipeline
from tests.packaging_support import (
    DISTRIBUTION,
    LOAD_PROBE,
    PACKAGE,
    PIPE_FILE,
    REPLACED_IMPORT_PREFIXES,
    ROOT,
    ROOT_FILES,
    TOOL_FILES,
    TOOLS_DIR,
    editor_ids,
    load_script,
    openwebui_frontmatter,
    openwebui_replace_imports,
    project_version,
    run_probe,
)

# Loads every shipped file in fresh interpreters: out of the quick loop
# (`-m "not slow and …"`, see pyproject.toml); the full run has it.
pytestmark = pytest.mark.slow

# The release build's own rules for pasted files; they are tested on bad input
# in tests/test_release_scripts.py, and here on every file that ships.
BUILD_RELEASE = load_script("build_release")
REQUIRED_KEYS = BUILD_RELEASE.REQUIRED_KEYS

# Every source Open WebUI loads from text: the four root files and the package
# tool modules they are copied from.
PASTED_SOURCES = [ROOT / name for name in ROOT_FILES] + [
    TOOLS_DIR / name for name in TOOL_FILES
]


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _read(path: Path) -> str:
    if not path.is_file():
        pytest.fail(f"{_relative(path)} does not exist")
    return path.read_text(encoding="utf-8")


# --- the oracle parser behaves as Open WebUI documents it ---------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('"""\ntitle: A\nversion: 1.0\n"""\n', {"title": "A", "version": "1.0"}),
        ('"""Sentence first.\ntitle: A\n"""\n', {}),
        ('"""title: A\nversion: 1\n"""\n', {}),
        ('  """  \nTitle:   A b  \n"""\n', {"Title": "A b"}),
        ('"""\ndescription: >\n  folded text\n"""\n', {"description": ">"}),
        (
            '"""\ntitle: A\n  note: x\n  two words: y\n"""\n',
            {"title": "A", "note": "x"},
        ),
        ('"""\ntitle: A\nend"""\nversion: 2\n', {"title": "A"}),
        ('"""\ntitle: A\ntitle: B\n"""\n', {"title": "B"}),
        ("", {}),
    ],
)
def test_oracle_parser_follows_open_webui_rule(content, expected):
    assert openwebui_frontmatter(content) == expected
    # The release script's own parser must agree with the oracle.
    assert load_script("build_release").parse_frontmatter(content) == expected


# --- versions -----------------------------------------------------------------


def test_package_version_matches_pyproject():
    assert tongyi_deepresearch_openwebui_pipeline.__version__ == project_version()


@pytest.mark.parametrize("path", PASTED_SOURCES, ids=_relative)
def test_frontmatter_version_is_the_package_version(path):
    meta = openwebui_frontmatter(_read(path))
    assert meta.get("version") == project_version(), (
        f"{_relative(path)} frontmatter version {meta.get('version')!r}, "
        f"package version {project_version()!r}"
    )


def test_pipe_gives_open_webui_nothing_to_pip_install():
    # The file installs the release wheel itself (its _RELEASE_WHEEL, empty in
    # the checkout): a `requirements:` line would make Open WebUI 0.6 run pip at
    # every load, which fails offline even with the package installed.
    content = _read(ROOT / PIPE_FILE)
    assert "requirements" not in openwebui_frontmatter(content)
    assert BUILD_RELEASE.pipe_problems(content, project_version(), "") == []
    assert f'\n_VERSION = "{project_version()}"\n' in content
    assert '\n_RELEASE_WHEEL = ""\n' in content


def test_changelog_has_a_section_for_the_version():
    changelog = load_script("changelog_section")
    text = _read(ROOT / "CHANGELOG.md")
    assert changelog.changelog_section(text, project_version()).strip()


# --- frontmatter as Open WebUI reads it ---------------------------------------


@pytest.mark.parametrize("path", PASTED_SOURCES, ids=_relative)
def test_frontmatter_is_complete_and_single_line(path):
    content = _read(path)
    assert content.splitlines()[0] == '"""', "first line must be a bare triple quote"
    meta = openwebui_frontmatter(content)
    assert meta.keys() >= REQUIRED_KEYS, f"missing {REQUIRED_KEYS - meta.keys()}"
    # Anything but single-line `key: value` (a prose line, an indented
    # continuation, a YAML block) is dropped or misread by Open WebUI.
    assert BUILD_RELEASE.frontmatter_problems(content, project_version()) == []


@pytest.mark.parametrize("path", PASTED_SOURCES, ids=_relative)
def test_frontmatter_id_is_what_the_editor_derives_from_the_title(path):
    meta = openwebui_frontmatter(_read(path))
    function_id = meta["id"]
    assert function_id.isidentifier()
    assert function_id == function_id.lower()
    assert editor_ids(meta["title"]) == {function_id}


def test_pipe_frontmatter_values():
    meta = openwebui_frontmatter(_read(ROOT / PIPE_FILE))
    assert meta == {
        "id": "tongyi_deepresearch",
        "title": "Tongyi DeepResearch",
        "author": "tongyi-deepresearch-openwebui-pipeline contributors",
        "author_url": "https://github.com/tongyi-deepresearch-openwebui/"
        "tongyi-deepresearch-openwebui-pipeline",
        "version": project_version(),
        "license": "MIT",
        "description": "Deep research with Alibaba's Tongyi DeepResearch model: it "
        "searches, reads pages and thinks round after round, then writes a "
        "sourced answer.",
        "required_open_webui_version": "0.6.0",
    }


def test_tool_ids_are_the_ones_the_pipe_looks_up():
    toolbox = pytest.importorskip(f"{PACKAGE}.adapters.openwebui.toolbox")
    expected = {
        spec.module + ".py": spec.registry_id for spec in toolbox.TOOL_MODULES.values()
    }
    assert set(expected) == set(TOOL_FILES)
    for name, registry_id in expected.items():
        assert openwebui_frontmatter(_read(ROOT / name))["id"] == registry_id


# --- Open WebUI's replace_imports must not change a thing ---------------------


@pytest.mark.parametrize("path", PASTED_SOURCES, ids=_relative)
def test_no_substring_that_open_webui_rewrites(path):
    content = _read(path)
    found = [prefix for prefix in REPLACED_IMPORT_PREFIXES if prefix in content]
    assert not found, f"{_relative(path)} contains {found}"
    assert openwebui_replace_imports(content) == content


def test_replace_imports_emulation_rewrites_prefixes():
    # Guard the guard: the emulation does rewrite what Open WebUI rewrites.
    assert openwebui_replace_imports("from configparser import X") == (
        "from open_webui.configparser import X"
    )


# --- root tool files are copies of the package modules ------------------------


def test_root_tool_files_are_in_sync():
    completed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sync_root_files.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    for name in TOOL_FILES:
        assert (ROOT / name).read_bytes() == (TOOLS_DIR / name).read_bytes()


def _fake_tree(tmp_path: Path) -> Path:
    tools = tmp_path / "src" / PACKAGE / "tools"
    tools.mkdir(parents=True)
    for name in TOOL_FILES:
        (tools / name).write_text(f'"""\ntitle: {name}\n"""\n\nclass Tools: ...\n')
    return tmp_path


def _sync(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "sync_root_files.py"),
            "--root",
            str(root),
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )


def test_sync_script_writes_then_check_passes(tmp_path):
    root = _fake_tree(tmp_path)
    assert _sync(root, "--check").returncode == 1  # copies missing
    written = _sync(root)
    assert written.returncode == 0, written.stdout
    for name in TOOL_FILES:
        assert (root / name).read_bytes() == (
            root / "src" / PACKAGE / "tools" / name
        ).read_bytes()
    assert _sync(root, "--check").returncode == 0


def test_sync_check_names_the_drifted_file_with_a_diff(tmp_path):
    root = _fake_tree(tmp_path)
    assert _sync(root).returncode == 0
    (root / "visit_tool.py").write_text('"""\ntitle: edited by hand\n"""\n')
    completed = _sync(root, "--check")
    assert completed.returncode == 1
    assert "out of sync: visit_tool.py" in completed.stdout
    assert "-title: edited by hand" in completed.stdout
    assert "search_tool.py" not in completed.stdout
    assert "python scripts/sync_root_files.py" in completed.stdout


def test_sync_check_reports_line_ending_only_drift(tmp_path):
    root = _fake_tree(tmp_path)
    assert _sync(root).returncode == 0
    copy = root / "search_tool.py"
    copy.write_bytes(copy.read_bytes().replace(b"\n", b"\r\n"))
    completed = _sync(root, "--check")
    assert completed.returncode == 1
    assert "out of sync: search_tool.py" in completed.stdout


def test_shared_code_is_generated_into_each_region_and_checked(tmp_path):
    root = _fake_tree(tmp_path)
    tools = root / "src" / PACKAGE / "tools"
    (tools / "shared").mkdir()
    shared = tools / "shared" / "greeting.py"
    shared.write_text('"""Doc."""\n\n# --- snippet ---\n\n\nHELLO = "hi"\n')
    region = (
        "# --- shared: greeting (made from tools/shared/greeting.py) ---\n"
        "HELLO = 'stale'\n"
        "# --- end shared: greeting ---\n"
    )
    search = tools / "search_tool.py"
    search.write_text(search.read_text() + "\n\n" + region)
    assert _sync(root).returncode == 0
    assert _sync(root, "--check").returncode == 0
    generated = search.read_text()
    assert 'HELLO = "hi"\n\n\n# --- end shared: greeting ---' in generated
    assert "stale" not in generated
    assert (root / "search_tool.py").read_text() == generated
    shared.write_text(shared.read_text().replace('"hi"', '"hello"'))
    completed = _sync(root, "--check")
    assert completed.returncode == 1
    assert "shared code in" in completed.stdout
    assert "search_tool.py" in completed.stdout


def test_every_tool_defines_tool_result_from_the_shared_file():
    for name in TOOL_FILES:
        text = (TOOLS_DIR / name).read_text()
        assert "# --- shared: tool_result (made from" in text, name


def test_a_tools_own_module_is_generated_into_its_region(tmp_path):
    root = _fake_tree(tmp_path)
    tools = root / "src" / PACKAGE / "tools"
    (tools / "visit").mkdir()
    part = tools / "visit" / "part.py"
    part.write_text('"""Doc."""\n\nimport os\n\n# --- snippet ---\n\nPART = 1\n')
    visit = tools / "visit_tool.py"
    visit.write_text(
        visit.read_text()
        + "\n\n# --- shared: part (made from tools/visit/part.py) ---\n"
        + "# --- end shared: part ---\n"
    )
    assert _sync(root).returncode == 0
    assert visit.read_text().endswith(
        "# --- shared: part (made from tools/visit/part.py) ---\n"
        "PART = 1\n\n\n# --- end shared: part ---\n"
    )
    assert _sync(root, "--check").returncode == 0


def test_a_source_region_holds_the_whole_module_as_a_string(tmp_path):
    root = _fake_tree(tmp_path)
    tools = root / "src" / PACKAGE / "tools"
    (tools / "visit").mkdir()
    program = tools / "visit" / "program.py"
    source = '"""A program."""\n\nimport sys\n\n# --- snippet ---\n\nprint(r"\\d")\n'
    program.write_text(source)
    region = (
        "# --- shared: program (made from tools/visit/program.py) ---\n"
        "# --- end shared: program ---\n"
        "# --- source: program (made from tools/visit/program.py) ---\n"
        "_PROGRAM_SOURCE = 'stale'\n"
        "# --- end source: program ---\n"
    )
    visit = tools / "visit_tool.py"
    visit.write_text(visit.read_text() + "\n\n" + region)
    assert _sync(root).returncode == 0
    assert _sync(root, "--check").returncode == 0
    namespace: dict = {}
    exec(visit.read_text(), namespace)  # noqa: S102  (the generated file)
    assert namespace["_PROGRAM_SOURCE"] == source
    program.write_text(source.replace("sys", "os"))
    completed = _sync(root, "--check")
    assert completed.returncode == 1
    assert (
        "out of date: shared code in "
        f"src/{PACKAGE}/tools/visit_tool.py differs from tools/visit/program.py\n"
    ) in completed.stdout


def test_a_module_made_into_no_tool_file_fails_the_check(tmp_path):
    root = _fake_tree(tmp_path)
    assert _sync(root).returncode == 0
    (root / "src" / PACKAGE / "tools" / "visit").mkdir()
    (root / "src" / PACKAGE / "tools" / "visit" / "orphan.py").write_text("X = 1\n")
    completed = _sync(root, "--check")
    assert completed.returncode == 1
    assert completed.stdout.startswith(
        f"unused module: src/{PACKAGE}/tools/visit/orphan.py is made into no tool "
        "file (add a region for it or delete it)\n"
    )


def test_no_authored_tool_module_is_longer_than_a_thousand_lines():
    # The pasted files are long; what is written by hand is not: the modules
    # the regions are made from, and each tool file without its regions.
    sync = load_script("sync_root_files")
    authored = {
        path.relative_to(TOOLS_DIR): path.read_text(encoding="utf-8")
        for path in sync.authored_modules(ROOT)
    }
    for name in TOOL_FILES:
        text = (TOOLS_DIR / name).read_text(encoding="utf-8")
        authored[Path(name)] = sync.without_regions(text)
    lines = {str(path): len(text.splitlines()) for path, text in authored.items()}
    assert "visit/convert.py" in lines
    assert {path: n for path, n in lines.items() if n > 1_000} == {}


def test_the_converter_program_is_the_convert_module():
    source = (ROOT / "visit_tool.py").read_text(encoding="utf-8")
    code = compile(source, "<tool>", "exec", dont_inherit=True)  # no __future__
    namespace: dict = {"__name__": "visit_program_check"}
    exec(code, namespace)  # noqa: S102  (how Open WebUI runs a tool)
    convert = (TOOLS_DIR / "visit" / "convert.py").read_text(encoding="utf-8")
    assert namespace["_CONVERTER"].program == convert


# Loads the pasted visit file as Open WebUI does (from a temporary file it then
# deletes), with the package and Open WebUI impossible to import, and converts
# a page through the file's converter process.
VISIT_CHILD_PROBE = r"""
import asyncio, importlib.abc, json, os, sys, tempfile, types


BLOCKED = {"tongyi_deepresearch_openwebui_pipeline", "open_webui"}


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError("blocked: " + name)
        return None


sys.meta_path.insert(0, Block())
source = open(sys.argv[1], encoding="utf-8").read()
module = types.ModuleType("tool_probe_visit")
sys.modules[module.__name__] = module
with tempfile.TemporaryDirectory() as empty_dir:
    temp_file = os.path.join(empty_dir, "content")
    with open(temp_file, "w", encoding="utf-8") as handle:
        handle.write(source)
    module.__dict__["__file__"] = temp_file
    exec(compile(source, temp_file, "exec"), module.__dict__)
html = b"<html><head><title>Small</title></head><body><p>Hello, child.</p></body>"
raw = module._RawPage("https://s.example/small", html, "text/html")


async def convert():
    try:
        page = await module._convert_in_child(raw, 1000)
        pids = [worker.process.pid for worker in module._CONVERTER.idle]
    finally:
        await module._stop_idle_workers()
    return page, pids


page, pids = asyncio.run(convert())
leaked = sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED)
print(json.dumps({
    "title": page.title, "text": page.text, "reading": page.reading,
    "in_another_process": len(pids) == 1 and pids[0] != os.getpid(),
    "leaked": leaked,
}))
"""


def test_the_pasted_visit_file_converts_a_page_in_its_own_process(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-I", "-c", VISIT_CHILD_PROBE, str(ROOT / "visit_tool.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout) == {
        "title": "Small",
        "text": "Hello, child.",
        "reading": "whole",
        "in_another_process": True,
        "leaked": [],
    }


# --- the pipe shim ------------------------------------------------------------


def test_shim_body_imports_the_installed_package_first():
    content = _read(ROOT / PIPE_FILE)
    assert f"from {PACKAGE}.pipes.pipe import Pipe" in content
    assert '__all__ = ["Pipe"]' in content
    assert "sys.path.append" not in content
    assert "sys.path.insert" not in content


def test_shim_without_package_or_checkout_explains_how_to_install(tmp_path):
    # Where Open WebUI runs it: a copy with nothing beside it, no package (-S:
    # no site-packages at all). The error must say how to install the package.
    shutil.copy(ROOT / PIPE_FILE, tmp_path / PIPE_FILE)
    completed = subprocess.run(
        [sys.executable, "-I", "-S", "-c", LOAD_PROBE, "in-place", PIPE_FILE, "Pipe"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert completed.returncode != 0
    last_line = completed.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ImportError:")
    assert "pip install" in last_line
    assert DISTRIBUTION in last_line
    assert "py3-none-any.whl" in last_line
    assert "No module named 'tongyi_deepresearch_openwebui_pipeline'" in last_line


def test_shim_does_not_use_a_checkout_in_the_working_directory(tmp_path):
    # The fallback looks beside the file, never at the current directory.
    shutil.copy(ROOT / PIPE_FILE, tmp_path / PIPE_FILE)
    completed = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            LOAD_PROBE,
            "in-place",
            str(tmp_path / PIPE_FILE),
            "Pipe",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert completed.returncode != 0
    assert "ImportError:" in completed.stderr


def test_shim_loads_like_open_webui_with_the_package_installed(tmp_path):
    # The dev venv has the package installed (editable): the shim, exec'd from a
    # temporary file as Open WebUI does, must hand out the package's Pipe.
    completed = run_probe(
        sys.executable, "open-webui", ROOT / PIPE_FILE, "Pipe", tmp_path
    )
    assert completed.returncode == 0, completed.stderr
    module, defined_in, instance = completed.stdout.strip().split("|")
    assert module == f"{PACKAGE}.pipes.pipe"
    assert Path(defined_in) == ROOT / "src" / PACKAGE / "pipes" / "pipe.py"
    assert instance == "Pipe"


@pytest.mark.parametrize("name", TOOL_FILES)
def test_root_tool_file_loads_like_open_webui(name, tmp_path):
    completed = run_probe(sys.executable, "open-webui", ROOT / name, "Tools", tmp_path)
    assert completed.returncode == 0, completed.stderr
    module, _, instance = completed.stdout.strip().split("|")
    assert module.startswith("tool_probe_")  # defined by the pasted file itself
    assert instance == "Tools"


# --- cross-check with the real Open WebUI -------------------------------------


@pytest.mark.e2e
def test_real_open_webui_reads_the_same_frontmatter(tmp_path):
    venv = os.environ.get("TDR_OWUI_VENV")
    if not venv:
        pytest.skip("TDR_OWUI_VENV is not set (bash scripts/test sets it up)")
    script = (
        "import json, sys\n"
        "from open_webui.utils.plugin import extract_frontmatter, replace_imports\n"
        "out = {}\n"
        "for path in sys.argv[1:]:\n"
        "    text = open(path, encoding='utf-8').read()\n"
        "    out[path] = [extract_frontmatter(text), replace_imports(text) == text]\n"
        "print(json.dumps(out))\n"
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "DATA_DIR": str(tmp_path / "data"),
        "WEBUI_SECRET_KEY": "packaging-test",
        "OFFLINE_MODE": "true",
        "ENABLE_VERSION_UPDATE_CHECK": "false",
    }
    paths = [str(ROOT / name) for name in ROOT_FILES]
    completed = subprocess.run(
        [str(Path(venv) / "bin" / "python"), "-I", "-c", script, *paths],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    results = json.loads(completed.stdout.strip().splitlines()[-1])
    for path in paths:
        frontmatter, unchanged = results[path]
        assert frontmatter == openwebui_frontmatter(
            Path(path).read_text(encoding="utf-8")
        )
        assert frontmatter["version"] == project_version()
        assert unchanged, f"Open WebUI's replace_imports changes {path}"
