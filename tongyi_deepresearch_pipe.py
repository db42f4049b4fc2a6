"""
id: tongyi_deepresearch
title: Tongyi DeepResearch
author: tongyi-deepresearch-openwebui-pipeline contributors
author_url: https://github.com/tongyi-deepresearch-openwebui/tongyi-deepresearch-openwebui-pipeline
version: 0.1.0
license: MIT
description: Deep research with Alibaba's Tongyi DeepResearch model: it searches, reads pages and thinks round after round, then writes a sourced answer.
requirements: tongyi-deepresearch-openwebui-pipeline==0.1.0
required_open_webui_version: 0.6.0
"""

# ruff: noqa: D205, D212, D415, E501
# The docstring above is Open WebUI's frontmatter: its parser needs a bare first
# line and reads single-line values only, hence the long lines.
#
# This file is what you paste into Open WebUI (Admin Panel > Functions). The pipe
# itself lives in the `tongyi-deepresearch-openwebui-pipeline` package, which
# Open WebUI installs from the `requirements` line above (or install it yourself
# into Open WebUI's Python environment for offline use).

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

_PACKAGE = "tongyi_deepresearch_openwebui_pipeline"
_INSTALL_HELP = (
    "The Tongyi DeepResearch pipe needs the Python package "
    "'tongyi-deepresearch-openwebui-pipeline' in Open WebUI's Python environment. "
    "Install it there, for example with "
    "`pip install tongyi_deepresearch_openwebui_pipeline-<version>-py3-none-any.whl` "
    "(the wheel attached to the GitHub release) or "
    "`pip install tongyi-deepresearch-openwebui-pipeline`, then restart Open WebUI; "
    "or let Open WebUI install it from this file's `requirements` line "
    "(ENABLE_PIP_INSTALL_FRONTMATTER_REQUIREMENTS on, OFFLINE_MODE off)."
)


def _checkout_source_dir() -> Path | None:
    """Return the `src` directory of a source checkout next to this file, if any.

    Inside Open WebUI this file is executed from a temporary copy, so there is
    never a checkout beside it and this returns None.
    """
    here = globals().get("__file__")
    if not here:
        return None
    source_dir = Path(here).resolve().parent / "src"
    if (source_dir / _PACKAGE / "__init__.py").is_file():
        return source_dir
    return None


def _pipe_from_checkout(source_dir: Path) -> type:
    """Import the Pipe class from the package sources of a checkout (not installed).

    The package is loaded from its directory without changing sys.path, so
    nothing else is shadowed.
    """
    # Drop what a failed import of an installed copy may have left behind.
    for name in [name for name in sys.modules if name.split(".")[0] == _PACKAGE]:
        del sys.modules[name]
    package_dir = source_dir / _PACKAGE
    spec = importlib.util.spec_from_file_location(
        _PACKAGE,
        package_dir / "__init__.py",
        submodule_search_locations=[str(package_dir)],
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {_PACKAGE} from {package_dir}")
    package = importlib.util.module_from_spec(spec)
    sys.modules[_PACKAGE] = package
    spec.loader.exec_module(package)
    return importlib.import_module(f"{_PACKAGE}.pipes.pipe").Pipe


try:
    from tongyi_deepresearch_openwebui_pipeline.pipes.pipe import Pipe
except ImportError as _installed_error:
    _source_dir = _checkout_source_dir()
    if _source_dir is None:
        raise ImportError(
            f"{_INSTALL_HELP} (import failed: {_installed_error})"
        ) from _installed_error
    Pipe = _pipe_from_checkout(_source_dir)

__all__ = ["Pipe"]
