"""The documentation stays true to the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tongyi_deepresearch_openwebui_pipeline import __version__

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
AGENTS = (ROOT / "AGENTS.md").read_text(encoding="utf-8")
# The layout, every module with its one line, is in the architecture note.
LAYOUT = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")


def test_readme_valve_tables_match_the_code():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts/valves_doc.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_gives_the_two_commands_and_they_exist():
    assert "bash scripts/serve" in README
    assert "bash scripts/test" in README
    assert (ROOT / "scripts/serve").is_file()
    assert (ROOT / "scripts/test").is_file()
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8")
    assert "bash scripts/test" in ci


def test_layout_names_only_files_that_exist():
    package = ROOT / "src/tongyi_deepresearch_openwebui_pipeline"
    named = set(re.findall(r"([a-z_]+\.py)\s", LAYOUT))
    existing = (
        {p.name for p in package.rglob("*.py")}
        | {p.name for p in ROOT.glob("*.py")}
        | {p.name for p in (ROOT / "scripts").glob("*.py")}
    )
    assert named, "docs/architecture.md should describe the layout"
    assert named <= existing, f"the layout names missing files: {named - existing}"


def test_every_package_module_is_in_the_layout():
    package = ROOT / "src/tongyi_deepresearch_openwebui_pipeline"
    modules = {p.name for p in package.rglob("*.py")} - {"__init__.py"}
    missing = {name for name in modules if name not in LAYOUT}
    assert not missing, f"docs/architecture.md does not describe: {missing}"


def test_agents_md_links_only_notes_that_exist():
    linked = re.findall(r"\]\((docs/[^)]+\.md)\)", AGENTS)
    assert sorted(set(linked)) == sorted(
        f"docs/{note.name}" for note in (ROOT / "docs").glob("*.md")
    )


def test_changelog_has_a_section_for_this_version():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## [{__version__}]" in changelog


def test_the_dockerfile_installs_this_wheel_into_the_supported_image():
    dockerfile = (ROOT / "deploy/Dockerfile").read_text(encoding="utf-8")
    version = re.search(r"ARG OPEN_WEBUI_VERSION=(\S+)", dockerfile)
    assert version is not None
    # The image is the Open WebUI version the end-to-end suite runs by default.
    lib = (ROOT / "scripts/_lib.sh").read_text(encoding="utf-8")
    assert f"OPEN_WEBUI_VERSION:-{version.group(1)}" in lib
    assert "FROM ghcr.io/open-webui/open-webui:v${OPEN_WEBUI_VERSION}" in dockerfile
    assert "tongyi_deepresearch_openwebui_pipeline-*-py3-none-any.whl" in dockerfile
    assert "ENV ENABLE_PIP_INSTALL_FRONTMATTER_REQUIREMENTS=false" in dockerfile
    assert "deploy/Dockerfile" in README
