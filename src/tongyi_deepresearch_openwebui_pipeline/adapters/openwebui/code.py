r"""The ``PythonInterpreter`` tool, run on the admin's Jupyter server.

Open WebUI's only server-side sandbox is the Jupyter code interpreter the
admin can configure (Admin Settings → Code Execution: engine "jupyter" with a
URL). When it is set up — and the user may use the code interpreter — the
model's code runs there; otherwise the tool is not offered at all (Pyodide
runs in the browser and cannot serve a server-side loop).

The result is written in the reference tool's format, which the model was
trained on: ``stdout:\n…`` and/or ``stderr:\n…`` joined by a newline, the
reference timeout line when the run timed out, and ``Finished execution.``
when there was no output at all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...core.events import ToolOutcome
from ...core.toolcalls import PYTHON_FORMAT_ERROR, ToolCall
from . import compat
from .tooldef import Handler

log = logging.getLogger(__name__)

TIMEOUT_TEXT = "[PythonInterpreter Error] TimeoutError: Execution timed out."
EMPTY_TEXT = "Finished execution."
#: Open WebUI's default Jupyter timeout (seconds).
DEFAULT_TIMEOUT = 60
#: Extra seconds for starting and deleting the kernel before the hard stop.
KERNEL_GRACE_SECONDS = 30
# What Open WebUI's Jupyter client appends to stderr when a message wait times out.
_JUPYTER_TIMEOUT_MARK = "Execution timed out."
_PERMISSION = "features.code_interpreter"


@dataclass(frozen=True)
class JupyterSettings:
    """Where and how to run code (from Open WebUI's code interpreter settings)."""

    url: str
    token: str = ""
    password: str = ""
    timeout: int = DEFAULT_TIMEOUT

    def redact(self, text: str) -> str:
        """``text`` with the token and password replaced by ``***``."""
        for secret in (self.token, self.password):
            if secret:
                text = text.replace(secret, "***")
        return text


async def _setting(request: Any, key: str, env_name: str, default: Any = None) -> Any:
    return await compat.get_config(
        request, f"code_interpreter.{key}", env_name, default
    )


def _timeout(value: Any) -> int:
    """A positive whole number of seconds (Open WebUI's default otherwise)."""
    try:
        seconds = int(value)
    except (TypeError, ValueError):
        return DEFAULT_TIMEOUT
    return seconds if seconds > 0 else DEFAULT_TIMEOUT


async def jupyter_settings(request: Any) -> JupyterSettings | None:
    """The admin's Jupyter settings, or None when code should not run there.

    Both config styles are read (0.6 – 0.8 ``request.app.state.config``, 0.11+
    ``Config``). The token is used only with auth ``token`` and the password
    only with auth ``password``, as Open WebUI itself does.
    """
    if not await _setting(request, "enable", "ENABLE_CODE_INTERPRETER", True):
        return None
    if await _setting(request, "engine", "CODE_INTERPRETER_ENGINE", "") != "jupyter":
        return None
    url = str(
        await _setting(request, "jupyter.url", "CODE_INTERPRETER_JUPYTER_URL", "") or ""
    )
    if not url.strip():
        return None
    auth = await _setting(request, "jupyter.auth", "CODE_INTERPRETER_JUPYTER_AUTH", "")
    token = password = ""
    if auth == "token":
        token = await _setting(
            request, "jupyter.auth_token", "CODE_INTERPRETER_JUPYTER_AUTH_TOKEN", ""
        )
    elif auth == "password":
        password = await _setting(
            request,
            "jupyter.auth_password",
            "CODE_INTERPRETER_JUPYTER_AUTH_PASSWORD",
            "",
        )
    timeout = await _setting(
        request, "jupyter.timeout", "CODE_INTERPRETER_JUPYTER_TIMEOUT"
    )
    return JupyterSettings(
        url.strip(), str(token or ""), str(password or ""), _timeout(timeout)
    )


# -- output ----------------------------------------------------------------------------


def _split_timeout(stderr: str) -> tuple[str, bool]:
    """Remove the Jupyter client's timeout line; report whether it was there."""
    text = stderr.rstrip()
    if not text.endswith(_JUPYTER_TIMEOUT_MARK):
        return stderr, False
    return text[: -len(_JUPYTER_TIMEOUT_MARK)].rstrip(), True


def format_python_output(stdout: str, stderr: str, timed_out: bool) -> str:
    """The reference PythonInterpreter text for one run."""
    parts: list[str] = []
    if stdout:
        parts.append(f"stdout:\n{stdout}")
    if stderr:
        parts.append(f"stderr:\n{stderr}")
    if timed_out:
        parts.append(TIMEOUT_TEXT)
    text = "\n".join(parts)
    return text if text.strip() else EMPTY_TEXT


def outcome_from_result(
    result: Mapping[str, Any], settings: JupyterSettings
) -> ToolOutcome:
    """Turn Open WebUI's ``{stdout, stderr, result}`` into the tool's outcome.

    Only stdout and stderr are reported, like the reference sandbox: the model
    is told to ``print()`` what it wants to see (and a ``result`` may be a
    base64 image).
    """
    stdout = str(result.get("stdout") or "")
    stderr, timed_out = _split_timeout(str(result.get("stderr") or ""))
    text = settings.redact(format_python_output(stdout, stderr, timed_out))
    return ToolOutcome(text, ok=not timed_out and not stderr.strip())


# -- running ---------------------------------------------------------------------------


def _guarded(code: str, blocked: list[str]) -> str:
    """Prefix ``code`` with an import guard for the admin's blocked modules."""
    if not blocked:
        return code
    guard = (
        "import builtins as _tdr_builtins\n"
        f"_tdr_blocked = {sorted(set(blocked))!r}\n"
        "_tdr_import = _tdr_builtins.__import__\n"
        "def _tdr_guard(name, globals=None, locals=None, fromlist=(), level=0):\n"
        "    caller = (globals or {}).get('__name__')\n"
        "    if caller == '__main__' and name.split('.')[0] in _tdr_blocked:\n"
        "        raise ImportError(f'Importing {name} is not allowed here.')\n"
        "    return _tdr_import(name, globals, locals, fromlist, level)\n"
        "_tdr_builtins.__import__ = _tdr_guard\n"
    )
    return guard + code


async def run_python(settings: JupyterSettings, code: str) -> ToolOutcome:
    """Run ``code`` on Jupyter with a hard time limit; never raises."""
    source = _guarded(code, compat.code_interpreter_blocked_modules())
    try:
        async with asyncio.timeout(settings.timeout + KERNEL_GRACE_SECONDS):
            result = await compat.execute_code_jupyter(
                settings.url,
                source,
                settings.token,
                settings.password,
                settings.timeout,
            )
    except TimeoutError:
        return ToolOutcome(TIMEOUT_TEXT, ok=False)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # shown to the model, secrets removed
        message = settings.redact(f"{type(error).__name__}: {error}")
        return ToolOutcome(f"[Python Interpreter Error]: {message}", ok=False)
    if result is None:
        return ToolOutcome(
            "[Python Interpreter Error]: Jupyter is not available.", ok=False
        )
    return outcome_from_result(result, settings)


async def build_python_handler(
    request: Any, user: Mapping[str, Any] | None = None
) -> Handler | None:
    """The ``PythonInterpreter`` handler, or None when code cannot run server-side.

    Args:
        request: ``__request__`` (its app holds the 0.6 – 0.8 settings).
        user: ``__user__``; when given, non-admins need the
            ``features.code_interpreter`` permission.

    Returns:
        An async handler for `Toolbox(handlers={"PythonInterpreter": …})`, or
        None, in which case the tool is not offered in the prompt.
    """
    settings = await jupyter_settings(request)
    if settings is None:
        return None
    if user is not None and not await compat.user_has_permission(
        request, user, _PERMISSION
    ):
        return None

    async def python_interpreter(call: ToolCall) -> ToolOutcome:
        if not call.code or not call.code.strip():
            return ToolOutcome(PYTHON_FORMAT_ERROR, ok=False)
        return await run_python(settings, call.code)

    return python_interpreter
