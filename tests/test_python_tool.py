"""PythonInterpreter on Open WebUI's Jupyter code interpreter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.openwebui_shapes import SHAPES, FakeOpenWebUI
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui import code
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.toolbox import (
    Toolbox,
    ToolContext,
)
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import (
    PYTHON_FORMAT_ERROR,
    ToolCall,
)

ADMIN = {"id": "a1", "role": "admin"}
ENV_NAMES = {
    "enable": "ENABLE_CODE_INTERPRETER",
    "engine": "CODE_INTERPRETER_ENGINE",
    "jupyter.url": "CODE_INTERPRETER_JUPYTER_URL",
    "jupyter.auth": "CODE_INTERPRETER_JUPYTER_AUTH",
    "jupyter.auth_token": "CODE_INTERPRETER_JUPYTER_AUTH_TOKEN",
    "jupyter.auth_password": "CODE_INTERPRETER_JUPYTER_AUTH_PASSWORD",
    "jupyter.timeout": "CODE_INTERPRETER_JUPYTER_TIMEOUT",
}


def configure(fake: FakeOpenWebUI, **settings: Any) -> None:
    """Store code-interpreter settings the way this version keeps them."""
    for raw_key, value in settings.items():
        key = raw_key.replace("__", ".")
        name = ENV_NAMES[key] if fake.is_sync else f"code_interpreter.{key}"
        fake.config[name] = value


def jupyter_ready(fake: FakeOpenWebUI, **extra: Any) -> None:
    settings: dict[str, Any] = {
        "enable": True,
        "engine": "jupyter",
        "jupyter__url": "http://127.0.0.1:8888",
        "jupyter__auth": "",
        "jupyter__timeout": 40,
    }
    configure(fake, **(settings | extra))


@pytest.fixture(params=SHAPES)
def owui(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeOpenWebUI]:
    """A fake Open WebUI of every version shape."""
    fake = FakeOpenWebUI(request.param).install(monkeypatch)
    yield fake
    fake.cleanup()


async def run(
    fake: FakeOpenWebUI, source: str | None, user: dict | None = ADMIN
) -> Any:
    handler = await code.build_python_handler(fake.request(), user)
    assert handler is not None
    return await handler(ToolCall("PythonInterpreter", {}, source))


# -- when the tool is offered ----------------------------------------------------------


async def test_not_offered_without_open_webui(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "open_webui", None)
    assert await code.build_python_handler(None, ADMIN) is None


@pytest.mark.parametrize(
    "settings",
    [
        {},  # Open WebUI's defaults: pyodide, no URL
        {"engine": "pyodide", "jupyter__url": "http://127.0.0.1:8888"},
        {"engine": "jupyter", "jupyter__url": "  "},
        {"enable": False, "engine": "jupyter", "jupyter__url": "http://127.0.0.1:8888"},
    ],
)
async def test_not_offered_unless_jupyter_is_configured(
    owui: FakeOpenWebUI, settings: dict[str, Any]
) -> None:
    configure(owui, **settings)
    assert await code.build_python_handler(owui.request(), ADMIN) is None


async def test_offered_when_jupyter_is_configured(owui: FakeOpenWebUI) -> None:
    jupyter_ready(owui)
    assert await code.build_python_handler(owui.request(), ADMIN) is not None
    toolbox_handler = await code.build_python_handler(owui.request())
    assert toolbox_handler is not None  # no user given: no permission check


async def test_users_need_the_code_interpreter_permission(owui: FakeOpenWebUI) -> None:
    jupyter_ready(owui)
    user = {"id": "u1", "role": "user"}
    assert await code.build_python_handler(owui.request(), user) is None
    owui.permissions["u1"] = {"features.code_interpreter"}
    assert await code.build_python_handler(owui.request(), user) is not None


# -- settings --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("auth", "token", "password"),
    [("token", "tok-123", ""), ("password", "", "pw-456"), ("", "", "")],
)
async def test_credentials_follow_the_auth_mode(
    owui: FakeOpenWebUI, auth: str, token: str, password: str
) -> None:
    jupyter_ready(
        owui,
        jupyter__auth=auth,
        jupyter__auth_token="tok-123",
        jupyter__auth_password="pw-456",
    )
    settings = await code.jupyter_settings(owui.request())
    assert settings == code.JupyterSettings(
        "http://127.0.0.1:8888", token, password, 40
    )
    await run(owui, "print(1)")
    call = owui.jupyter_calls[-1]
    assert (call["token"], call["password"], call["timeout"]) == (token, password, 40)
    assert call["base_url"] == "http://127.0.0.1:8888"
    assert call["code"] == "print(1)"


@pytest.mark.parametrize("value", [None, "abc", 0, -5])
async def test_bad_timeouts_fall_back_to_open_webui_default(
    owui: FakeOpenWebUI, value: object
) -> None:
    jupyter_ready(owui, jupyter__timeout=value)
    settings = await code.jupyter_settings(owui.request())
    assert settings is not None
    assert settings.timeout == code.DEFAULT_TIMEOUT


# -- output format ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "expected", "ok"),
    [
        ({"stdout": "6", "stderr": "", "result": ""}, "stdout:\n6", True),
        (
            {
                "stdout": "partial",
                "stderr": "Traceback: ZeroDivisionError",
                "result": "",
            },
            "stdout:\npartial\nstderr:\nTraceback: ZeroDivisionError",
            False,
        ),
        ({"stdout": "", "stderr": "", "result": "42"}, "Finished execution.", True),
        ({"stdout": None, "stderr": None}, "Finished execution.", True),
        (
            {"stdout": "tick", "stderr": "\nExecution timed out.", "result": ""},
            "stdout:\ntick\n" + code.TIMEOUT_TEXT,
            False,
        ),
        (
            {"stdout": "", "stderr": "warn\nExecution timed out.", "result": ""},
            "stderr:\nwarn\n" + code.TIMEOUT_TEXT,
            False,
        ),
    ],
)
async def test_output_uses_the_reference_format(
    owui: FakeOpenWebUI, result: dict[str, Any], expected: str, ok: bool
) -> None:
    jupyter_ready(owui)
    owui.jupyter = lambda _code: result
    outcome = await run(owui, "print(6)")
    assert outcome.text == expected
    assert outcome.ok is ok


async def test_missing_code_is_a_formatting_error(owui: FakeOpenWebUI) -> None:
    jupyter_ready(owui)
    for source in (None, "   "):
        outcome = await run(owui, source)
        assert outcome.text == PYTHON_FORMAT_ERROR
    assert owui.jupyter_calls == []


async def test_secrets_never_reach_the_model(owui: FakeOpenWebUI) -> None:
    jupyter_ready(owui, jupyter__auth="token", jupyter__auth_token="s3cret-token")
    owui.jupyter = lambda _code: {
        "stdout": "",
        "stderr": "Error: 403, url='http://127.0.0.1:8888/api/kernels?token=s3cret-token'",
    }
    outcome = await run(owui, "print(1)")
    assert "s3cret-token" not in outcome.text
    assert "token=***" in outcome.text

    def explode(_code: str) -> dict[str, str]:
        raise RuntimeError("cannot reach http://127.0.0.1:8888/?token=s3cret-token")

    owui.jupyter = explode
    outcome = await run(owui, "print(1)")
    assert outcome.text == (
        "[Python Interpreter Error]: RuntimeError: cannot reach "
        "http://127.0.0.1:8888/?token=***"
    )
    assert not outcome.ok


async def test_a_hanging_server_is_cut_off(
    owui: FakeOpenWebUI, monkeypatch: pytest.MonkeyPatch
) -> None:
    jupyter_ready(owui, jupyter__timeout=1)
    monkeypatch.setattr(code, "KERNEL_GRACE_SECONDS", 0)
    never = asyncio.Event()

    async def hang(_code: str) -> dict[str, str]:
        await never.wait()
        return {}

    owui.jupyter = hang
    outcome = await run(owui, "while True: pass")
    assert outcome.text == code.TIMEOUT_TEXT
    assert not outcome.ok


async def test_the_toolbox_runs_python_through_the_handler(owui: FakeOpenWebUI) -> None:
    jupyter_ready(owui)
    owui.jupyter = lambda source: {"stdout": f"ran {len(source)} chars", "stderr": ""}
    handler = await code.build_python_handler(owui.request(), ADMIN)
    assert handler is not None
    toolbox = Toolbox({}, ToolContext(), handlers={"PythonInterpreter": handler})
    assert toolbox.available() == ["PythonInterpreter"]
    outcome = await toolbox.run(ToolCall("PythonInterpreter", {}, "print(123)"))
    assert outcome.text == "stdout:\nran 10 chars"


# -- blocked modules -------------------------------------------------------------------


async def test_blocked_modules_are_guarded(owui: FakeOpenWebUI) -> None:
    jupyter_ready(owui)
    owui.blocked_modules.extend(["subprocess"])
    await run(owui, "print('hi')")
    sent = owui.jupyter_calls[-1]["code"]
    assert sent.endswith("print('hi')")
    # The guard really refuses the module when the code runs as a program.
    blocked = subprocess.run(
        [sys.executable, "-c", sent.replace("print('hi')", "import subprocess")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert blocked.returncode == 1
    assert "ImportError: Importing subprocess is not allowed here." in blocked.stderr
    allowed = subprocess.run(
        [sys.executable, "-c", sent.replace("print('hi')", "import json; print('ok')")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert allowed.stdout == "ok\n"


async def test_no_guard_without_blocked_modules(owui: FakeOpenWebUI) -> None:
    jupyter_ready(owui)
    await run(owui, "print('hi')")
    assert owui.jupyter_calls[-1]["code"] == "print('hi')"


def test_format_python_output_directly() -> None:
    assert code.format_python_output("a", "b", timed_out=True) == (
        "stdout:\na\nstderr:\nb\n"
        "[PythonInterpreter Error] TimeoutError: Execution timed out."
    )
    assert code.format_python_output("", "", timed_out=False) == "Finished execution."
