"""
id: tongyi_deepresearch
title: Tongyi DeepResearch
author: tongyi-deepresearch-openwebui-pipeline contributors
author_url: https://github.com/tongyi-deepresearch-openwebui/tongyi-deepresearch-openwebui-pipeline
version: 0.2.0
license: MIT
description: Deep research with Alibaba's Tongyi DeepResearch model: it searches, reads pages and thinks round after round, then writes a sourced answer.
required_open_webui_version: 0.6.0
"""

# ruff: noqa: D205, D212, D415, E501
# The docstring above is Open WebUI's frontmatter: its parser needs a bare first
# line and reads single-line values only, hence the long lines.
#
# This file is what you paste into Open WebUI (Admin Panel > Functions). The pipe
# itself lives in the `tongyi-deepresearch-openwebui-pipeline` package. The
# frontmatter has no `requirements:` line on purpose: Open WebUI 0.6 runs pip on
# it at every load with no way to skip it, and pip downloads a wheel URL again
# even when that very version is installed, so an offline server could not even
# create the function. Instead this file, when it is loaded:
#   1. reads the installed package's version;
#   2. when the package is missing or older than _VERSION, pip-installs
#      _RELEASE_WHEEL (the release build writes this release's wheel URL there;
#      in a checkout it is empty and nothing is installed), the way Open WebUI
#      runs pip for requirements (PIP_OPTIONS, PIP_PACKAGE_INDEX_OPTIONS), unless
#      OFFLINE_MODE=true or ENABLE_PIP_INSTALL_FRONTMATTER_REQUIREMENTS=false
#      (then, or when pip fails, loading stops with the install help below);
#   3. forgets a copy of the package loaded before whose version is not the
#      installed one, so a newer file pasted into a running Open WebUI runs the
#      newer code without a restart;
#   4. imports the Pipe (in a source checkout, from `src/` beside this file).
# Offline, install the wheel into Open WebUI's Python environment first.

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

_VERSION = "0.2.0"
_RELEASE_WHEEL = ""

_PACKAGE = "tongyi_deepresearch_openwebui_pipeline"
_DISTRIBUTION = "tongyi-deepresearch-openwebui-pipeline"
_INSTALL_HELP = (
    f"The Tongyi DeepResearch pipe needs the Python package '{_DISTRIBUTION}' "
    f"{_VERSION} or newer in Open WebUI's Python environment. "
    "The file attached to a GitHub release installs that release's wheel there by "
    "itself when the server can download it and Open WebUI allows pip installs "
    "(OFFLINE_MODE not true, "
    "ENABLE_PIP_INSTALL_FRONTMATTER_REQUIREMENTS unset or true). "
    "Offline, or to install it yourself: download the wheel attached to the GitHub "
    "release, install it with the pip of the Python that runs Open WebUI, e.g. "
    f"`pip install tongyi_deepresearch_openwebui_pipeline-{_VERSION}-py3-none-any.whl` "
    "(in Docker: `docker exec <container> pip install /path/to/the.whl`), "
    "then paste this file again (no restart needed)."
)

_log = logging.getLogger("tongyi_deepresearch_pipe")


def _installed_version() -> str | None:
    """Return the installed distribution's version, or None when it is not installed."""
    try:
        return importlib.metadata.version(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    """Return a version's release numbers without trailing zeros ("0.2.0rc1" -> (0, 2))."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    numbers = [int(part) for part in match.group().split(".")] if match else []
    while numbers and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def _refresh_import_caches() -> None:
    """Make the import system and importlib.metadata see what pip changed on disk.

    Python 3.11's importlib.invalidate_caches() leaves importlib.metadata's
    directory cache alone (it is keyed by the directory's mtime only); its
    invalidate_caches is called on an instance, as 3.11 lacks the classmethod.
    """
    importlib.invalidate_caches()
    importlib.metadata.MetadataPathFinder().invalidate_caches()


def _install_switched_off() -> str | None:
    """Return which Open WebUI setting forbids pip installs, if one does.

    Read from the environment exactly as Open WebUI's env.py reads them.
    """
    if os.environ.get("OFFLINE_MODE", "false").lower() == "true":
        return "OFFLINE_MODE is true"
    if (
        os.environ.get("ENABLE_PIP_INSTALL_FRONTMATTER_REQUIREMENTS", "True").lower()
        != "true"
    ):
        return "ENABLE_PIP_INSTALL_FRONTMATTER_REQUIREMENTS is not true"
    return None


def _shown(url: str) -> str:
    """Return a URL fit for messages: without a user name or password."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _install_release_wheel() -> str | None:
    """Pip-install _RELEASE_WHEEL as Open WebUI installs a requirement.

    Returns:
        None when pip succeeded, else why it did not. pip's output is not
        shown or logged: PIP_OPTIONS and PIP_PACKAGE_INDEX_OPTIONS may hold an
        index URL with a password.
    """
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        *os.environ.get("PIP_OPTIONS", "").split(),
        _RELEASE_WHEEL,
        *os.environ.get("PIP_PACKAGE_INDEX_OPTIONS", "").split(),
    ]
    _log.info("Tongyi DeepResearch: installing %s", _shown(_RELEASE_WHEEL))
    try:
        completed = subprocess.run(  # noqa: S603  (our interpreter's pip, Open WebUI's options)
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    except OSError as error:
        return f"could not run pip to install {_shown(_RELEASE_WHEEL)}: {type(error).__name__}"
    _refresh_import_caches()
    if completed.returncode != 0:
        return (
            f"`pip install {_shown(_RELEASE_WHEEL)}` failed with exit status "
            f"{completed.returncode}"
        )
    return None


def _ensure_installed() -> str | None:
    """Install the release wheel when the package is missing or older than _VERSION.

    Returns:
        None when the installed package will do (or this file installs
        nothing), else why it will not.
    """
    installed = _installed_version()
    if not _RELEASE_WHEEL or (
        installed is not None and _release(installed) >= _release(_VERSION)
    ):
        return None
    found = "it is not installed" if installed is None else f"{installed} is installed"
    switched_off = _install_switched_off()
    if switched_off is not None:
        return f"{found}, and installing it is switched off: {switched_off}"
    failure = _install_release_wheel()
    if failure is not None:
        return failure
    installed = _installed_version()
    if installed is None or _release(installed) < _release(_VERSION):
        return f"pip installed {_shown(_RELEASE_WHEEL)}, yet {installed or 'nothing'} is installed"
    return None


def _forget_stale_package() -> None:
    """Drop a loaded copy of the package whose version is not the installed one.

    A newer file pasted into a running Open WebUI would otherwise import the
    modules loaded before (sys.modules) and run the old code until a restart.
    """
    loaded = sys.modules.get(_PACKAGE)
    installed = _installed_version()
    if (
        loaded is None
        or installed is None
        or getattr(loaded, "__version__", None) == installed
    ):
        return
    for name in [name for name in sys.modules if name.split(".")[0] == _PACKAGE]:
        del sys.modules[name]
    _refresh_import_caches()


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


_not_installed = _ensure_installed()
if _not_installed is not None:
    raise ImportError(f"{_INSTALL_HELP} ({_not_installed})")
_forget_stale_package()

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
