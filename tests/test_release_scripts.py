"""Unit tests of the release helpers: changelog sections, the pipe file's wheel
URL, repository detection, workflow path check. Fast; nothing is built here."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.packaging_support import (
    DISTRIBUTION,
    PIPE_FILE,
    ROOT,
    load_script,
    project_version,
    wheel_name,
)

# Runs the release and CI scripts in subprocesses: out of the quick loop
# (`-m "not slow and …"`, see pyproject.toml); the full run has it.
pytestmark = pytest.mark.slow

changelog = load_script("changelog_section")
build_release = load_script("build_release")
lint_workflows = load_script("lint_workflows")

CHANGELOG = """\
# Changelog

Intro text.

## [Unreleased]

### Fixed

- Something pending.

## [1.2.0] - 2026-12-01

### Added

- Feature B.

## [1.1.0] - 2026-11-30

### Changed

- Thing A.

[Unreleased]: https://github.com/o/r/compare/v1.2.0...HEAD
[1.2.0]: https://github.com/o/r/compare/v1.1.0...v1.2.0
[1.1.0]: https://github.com/o/r/releases/tag/v1.1.0
"""


# --- changelog_section --------------------------------------------------------


def test_section_in_the_middle_stops_at_the_next_release():
    assert changelog.changelog_section(CHANGELOG, "1.2.0") == (
        "### Added\n\n- Feature B.\n"
    )


def test_last_section_drops_the_link_definitions():
    assert changelog.changelog_section(CHANGELOG, "1.1.0") == (
        "### Changed\n\n- Thing A.\n"
    )


def test_tag_prefix_is_ignored():
    assert changelog.changelog_section(CHANGELOG, "v1.2.0") == (
        changelog.changelog_section(CHANGELOG, "1.2.0")
    )


def test_unreleased_section_by_name():
    assert "Something pending" in changelog.changelog_section(CHANGELOG, "Unreleased")


def test_version_prefix_does_not_match_a_longer_version():
    with pytest.raises(changelog.ChangelogError, match=r"\[1\.2\]"):
        changelog.changelog_section(CHANGELOG, "1.2")


def test_empty_section_is_an_error():
    text = "## [Unreleased]\n\n## [0.1.0] - 2026-11-22\n\n[0.1.0]: https://x/y\n"
    with pytest.raises(changelog.ChangelogError, match="empty"):
        changelog.changelog_section(text, "0.1.0")


def _run_changelog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "changelog_section.py"), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_cli_prints_the_section_of_a_file(tmp_path):
    path = tmp_path / "CHANGELOG.md"
    path.write_text(CHANGELOG, encoding="utf-8")
    completed = _run_changelog("v1.1.0", "--changelog", str(path))
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "### Changed\n\n- Thing A.\n"


def test_cli_fails_for_a_missing_version(tmp_path):
    path = tmp_path / "CHANGELOG.md"
    path.write_text(CHANGELOG, encoding="utf-8")
    completed = _run_changelog("9.9.9", "--changelog", str(path))
    assert completed.returncode == 1
    assert completed.stdout == ""
    assert "## [9.9.9]" in completed.stderr


def test_cli_reads_the_repository_changelog_for_the_current_version():
    completed = _run_changelog(f"v{project_version()}")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip()
    assert "## [" not in completed.stdout


def test_repository_changelog_keeps_the_format():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "keepachangelog.com" in text
    assert "\n## [Unreleased]\n" in text
    assert f"\n## [{project_version()}] - " in text


# --- build_release helpers ----------------------------------------------------


def _project(url: str = "https://github.com/acme/thing"):
    return build_release.Project(
        root=ROOT,
        name=DISTRIBUTION,
        version="1.2.3",
        dependencies=(),
        repository_url=url,
    )


def test_repository_comes_from_github_repository_when_set(monkeypatch):
    monkeypatch.setenv("GITHUB_REPOSITORY", "fork-owner/fork-name")
    assert build_release.repository_slug(_project()) == "fork-owner/fork-name"


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/acme/thing",
        "https://github.com/acme/thing/",
        "https://github.com/acme/thing.git",
    ],
)
def test_repository_falls_back_to_pyproject_url(monkeypatch, url):
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    assert build_release.repository_slug(_project(url)) == "acme/thing"


def test_repository_of_this_project(monkeypatch):
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    project = build_release.read_project(ROOT)
    assert build_release.repository_slug(project) == (
        "tongyi-deepresearch-openwebui/tongyi-deepresearch-openwebui-pipeline"
    )


def test_repository_that_is_not_github_is_refused(monkeypatch):
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    with pytest.raises(build_release.ReleaseError, match="GITHUB_REPOSITORY"):
        build_release.repository_slug(_project("https://gitlab.com/acme/thing"))


def test_release_wheel_url_points_at_the_release_wheel():
    assert build_release.release_wheel_url(_project(), "acme/thing") == (
        f"https://github.com/acme/thing/releases/download/v1.2.3/{wheel_name('1.2.3')}"
    )


def test_with_release_wheel_changes_only_that_line():
    original = (ROOT / PIPE_FILE).read_text(encoding="utf-8")
    url = "https://github.com/acme/thing/releases/download/v1/x-1-py3-none-any.whl"
    rewritten = build_release.with_release_wheel(original, url)
    before = original.splitlines()
    after = rewritten.splitlines()
    assert len(before) == len(after)
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert len(changed) == 1
    assert before[changed[0]] == '_RELEASE_WHEEL = ""'
    assert after[changed[0]] == f'_RELEASE_WHEEL = "{url}"'
    assert build_release.pipe_constants(rewritten)["_RELEASE_WHEEL"] == [url]


def test_with_release_wheel_keeps_the_line_ending():
    text = '"""\r\ntitle: T\r\n"""\r\n_RELEASE_WHEEL = ""\r\nx = 1\r\n'
    assert build_release.with_release_wheel(text, "https://h/x.whl") == (
        '"""\r\ntitle: T\r\n"""\r\n_RELEASE_WHEEL = "https://h/x.whl"\r\nx = 1\r\n'
    )


@pytest.mark.parametrize(
    "text",
    [
        '"""\ntitle: T\n"""\n',
        '_RELEASE_WHEEL = ""\n_RELEASE_WHEEL = ""\n',
        '_RELEASE_WHEEL = "https://h/old.whl"\n',
    ],
    ids=["no-line", "two-lines", "already-set"],
)
def test_with_release_wheel_needs_exactly_one_empty_line(text):
    with pytest.raises(build_release.ReleaseError, match="exactly one"):
        build_release.with_release_wheel(text, "https://h/x.whl")


@pytest.mark.parametrize(
    "url", ["http://h/x.whl", 'https://h/x".whl', "https://h/x y.whl", "https://h/x"]
)
def test_with_release_wheel_refuses_what_is_not_a_plain_wheel_url(url):
    with pytest.raises(build_release.ReleaseError, match="not a wheel URL"):
        build_release.with_release_wheel('_RELEASE_WHEEL = ""\n', url)


_PIPE_HEAD = (
    '"""\nid: x\ntitle: X\nauthor: a\nauthor_url: u\nversion: 1.2.3\n'
    "license: MIT\ndescription: d\nrequired_open_webui_version: 0.6.0\n"
)


def test_pipe_problems_accept_the_checkout_and_the_release_contract():
    body = '"""\n_VERSION = "1.2.3"\n_RELEASE_WHEEL = ""\n'
    assert build_release.pipe_problems(_PIPE_HEAD + body, "1.2.3", "") == []
    empty = _PIPE_HEAD + "requirements:\n" + body
    assert build_release.pipe_problems(empty, "1.2.3", "") == []
    released = body.replace('""\n', '"https://h/x.whl"\n')
    assert (
        build_release.pipe_problems(_PIPE_HEAD + released, "1.2.3", "https://h/x.whl")
        == []
    )


def test_pipe_problems_flag_requirements_and_wrong_constants():
    text = (
        _PIPE_HEAD
        + 'requirements: pkg @ https://h/x.whl\n"""\n'
        + '_VERSION = "1.2.2"\n_RELEASE_WHEEL = "https://h/y.whl"\n'
        + '_RELEASE_WHEEL = "https://h/y.whl"\n'
    )
    assert build_release.pipe_problems(text, "1.2.3", "https://h/x.whl") == [
        "frontmatter requirements is 'pkg @ https://h/x.whl': Open WebUI would "
        "pip-install it at every load (the file installs its wheel itself)",
        "_VERSION is '1.2.2', not '1.2.3'",
        'needs exactly one `_RELEASE_WHEEL = "..."` line (found 2)',
        "_VERSION '1.2.2' is not the frontmatter version '1.2.3'",
    ]
    assert build_release.pipe_problems(_PIPE_HEAD + '"""\n', "1.2.3", "") == [
        'needs exactly one `_VERSION = "..."` line (found 0)',
        'needs exactly one `_RELEASE_WHEEL = "..."` line (found 0)',
    ]


def test_frontmatter_problems_flags_what_open_webui_would_misread():
    text = (
        '"""\nid: x\ntitle: X\nauthor: a\nauthor_url: u\nversion: 0.0.1\n'
        "license: MIT\ndescription: >\n  folded\nrequired_open_webui_version: 0.6.0\n"
        'Usage: call it\n"""\n'
    )
    problems = "\n".join(build_release.frontmatter_problems(text, "0.0.2"))
    assert "'  folded'" in problems
    assert "'Usage: call it'" in problems
    assert "version 0.0.1 is not 0.0.2" in problems
    assert "block scalar" in problems


def test_frontmatter_problems_allow_only_requirements_to_be_empty():
    head = (
        '"""\nid: x\ntitle: X\nauthor: a\nauthor_url: u\nversion: 0.0.1\n'
        "license: MIT\ndescription: d\nrequired_open_webui_version: 0.6.0\n"
    )
    assert (
        build_release.frontmatter_problems(head + 'requirements:\n"""\n', "0.0.1") == []
    )
    problems = "\n".join(
        build_release.frontmatter_problems(
            head + 'funding_url:\nnickname: n\nid: y\n"""\n', "0.0.1"
        )
    )
    assert "'funding_url:'" in problems
    assert "unknown frontmatter key 'nickname'" in problems
    assert "duplicate frontmatter key 'id'" in problems


def test_build_refuses_a_tag_that_is_not_the_version(tmp_path):
    completed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "build_release.py"),
            "--out-dir",
            str(tmp_path),
            "--tag",
            "v9.9.9",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 1
    assert f"expected v{project_version()}" in completed.stderr
    assert not any(tmp_path.iterdir())  # failed before building anything


# --- workflow path check ------------------------------------------------------


def test_workflow_path_check_finds_missing_scripts(tmp_path):
    workflow = tmp_path / "wf.yml"
    workflow.write_text(
        "jobs:\n  a:\n    steps:\n"
        "      - run: bash scripts/test\n"
        "      - run: python scripts/no_such_script.py --x\n"
        "      - run: ./.ci/nothing-here && echo my-scripts/ignored\n",
        encoding="utf-8",
    )
    problems = lint_workflows.missing_paths(workflow, ROOT)
    assert len(problems) == 2
    assert "wf.yml:5: refers to scripts/no_such_script.py" in problems[0]
    assert "wf.yml:6: refers to .ci/nothing-here" in problems[1]


def test_repository_workflows_only_refer_to_existing_scripts():
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert {path.name for path in workflows} >= {"ci.yml", "release.yml"}
    for workflow in workflows:
        assert lint_workflows.missing_paths(workflow, ROOT) == []
        assert lint_workflows.referenced_paths(workflow.read_text(encoding="utf-8"))


def test_ci_workflow_runs_the_readme_test_command():
    text = (ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8")
    assert "run: bash scripts/test\n" in text
    release = (ROOT / ".github" / "workflows" / "release.yml").read_text(
        encoding="utf-8"
    )
    assert "scripts/build_release.py" in release
    assert "scripts/changelog_section.py" in release


def test_lint_workflows_rejects_a_broken_workflow(tmp_path):
    # All three checkers run, and each reports its own finding.
    workflow = tmp_path / "broken.yml"
    workflow.write_text(
        "name: broken\non: push\njobs:\n  a:\n    steps:\n"
        "      - uses: actions/checkout@v4\n"
        "      - run: echo ${{ steps.nope.outputs.x }}\n"
        "      - run: bash scripts/no_such_script\n",
        encoding="utf-8",
    )
    completed = subprocess.run(
        ["bash", str(ROOT / "scripts" / "lint-workflows"), str(workflow)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 1, output
    assert '"runs-on" section is missing' in output  # actionlint
    assert "'runs-on' is a required property" in output  # JSON schema
    assert "refers to scripts/no_such_script" in output  # path check
