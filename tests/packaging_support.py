"""Shared helpers for the packaging and release tests.

The frontmatter parser here is the test oracle: an independent re-implementation
of Open WebUI's documented rule (`open_webui.utils.plugin.extract_frontmatter`,
identical from 0.6 to 0.12), not an import of the release script's parser, so a
mistake in one shows up as a disagreement with the other.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tongyi_deepresearch_openwebui_pipeline"
DISTRIBUTION = "tongyi-deepresearch-openwebui-pipeline"
PIPE_FILE = "tongyi_deepresearch_pipe.py"
# In the catalog's order (the order the release prints them).
TOOL_FILES = ("search_tool.py", "visit_tool.py", "scholar_tool.py")
ROOT_FILES = (PIPE_FILE, *TOOL_FILES)
TOOLS_DIR = ROOT / "src" / PACKAGE / "tools"
REPLACED_IMPORT_PREFIXES = ("from utils", "from apps", "from main", "from config")

_OPEN_WEBUI_LINE = re.compile(r"^\s*([a-z_]+):\s*(.*)\s*$", re.IGNORECASE)


def project_table() -> dict:
    """The `[project]` table of pyproject.toml."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"
    ]


def project_version() -> str:
    """The version in pyproject.toml."""
    return project_table()["version"]


def wheel_name(version: str) -> str:
    """The wheel file name for a version."""
    return f"{PACKAGE}-{version}-py3-none-any.whl"


def sdist_name(version: str) -> str:
    """The sdist file name for a version."""
    return f"{PACKAGE}-{version}.tar.gz"


def openwebui_frontmatter(content: str) -> dict[str, str]:
    """Parse frontmatter the way Open WebUI does.

    The first line must be a bare triple quote; the following lines, up to the
    first line containing a triple quote, are matched one by one against
    `^\\s*([a-z_]+):\\s*(.*)\\s*$` (case-insensitive); the value is the stripped
    rest of the line; a later duplicate key wins.
    """
    lines = content.splitlines()
    if not lines or lines[0].strip() != '"""':
        return {}
    result: dict[str, str] = {}
    for line in lines[1:]:
        if '"""' in line:
            break
        match = _OPEN_WEBUI_LINE.match(line)
        if match:
            key, value = match.groups()
            result[key.strip()] = value.strip()
    return result


def openwebui_replace_imports(content: str) -> str:
    """What Open WebUI's `replace_imports` does to a source before running it."""
    for prefix in REPLACED_IMPORT_PREFIXES:
        content = content.replace(prefix, "from open_webui." + prefix.split()[1])
    return content


def editor_ids(title: str) -> set[str]:
    """The ids Open WebUI's editor derives from a title (0.12 rule and 0.6 rule)."""
    return {
        re.sub(r"\W+", "_", title).strip("_").lower(),
        re.sub(r"\s+", "_", title).lower(),
    }


def load_script(name: str) -> ModuleType:
    """Import one of the scripts/*.py files as a module."""
    path = ROOT / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"tdr_script_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# Runs in a fresh interpreter (`python -I -c PROBE MODE FILE CLASS`) and prints
# one line "<class module>|<file defining the class>|<instance type>".
#   MODE "in-place": import FILE where it is (a checkout: its `src/` is beside it).
#   MODE "open-webui": as Open WebUI does: apply replace_imports, write the
#   source to a temporary file in an empty directory, exec it in a fresh module
#   named function_<id>_<hex> / tool_<id>_<hex>, then instantiate CLASS.
LOAD_PROBE = r"""
import inspect, os, pathlib, sys, tempfile, types, uuid
mode, path, class_name = sys.argv[1:4]
source = pathlib.Path(path).read_text(encoding="utf-8")
if mode == "in-place":
    import importlib.util
    spec = importlib.util.spec_from_file_location("pasted_" + uuid.uuid4().hex, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
else:
    for old in ("utils", "apps", "main", "config"):
        source = source.replace("from " + old, "from open_webui." + old)
    kind = "function" if class_name == "Pipe" else "tool"
    module = types.ModuleType(kind + "_probe_" + uuid.uuid4().hex)
    sys.modules[module.__name__] = module
    with tempfile.TemporaryDirectory() as empty_dir:
        temp_file = os.path.join(empty_dir, "content")
        pathlib.Path(temp_file).write_text(source, encoding="utf-8")
        module.__dict__["__file__"] = temp_file
        exec(compile(source, temp_file, "exec"), module.__dict__)
cls = getattr(module, class_name)
instance = cls()
print(cls.__module__ + "|" + inspect.getfile(cls) + "|" + type(instance).__name__)
"""


def run_probe(
    python: Path | str,
    mode: str,
    path: Path,
    class_name: str,
    cwd: Path,
    *,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Load one pasted file in a fresh isolated interpreter (see LOAD_PROBE).

    `env` replaces the environment (Open WebUI's, which the pipe file reads and
    hands to pip); by default the probe inherits this process's.
    """
    return subprocess.run(
        [str(python), "-I", "-c", LOAD_PROBE, mode, str(path), class_name],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=240,
        check=False,
    )
