"""scripts/serve and scripts/install_pipe.py without a running Open WebUI.

The full run (start, install, chat, Ctrl-C) is tests/e2e/test_serve.py.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.fakes.http import LocalServer, Request, Response

ROOT = Path(__file__).resolve().parents[1]
SERVE = ROOT / "scripts" / "serve"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


installer = _load("install_pipe_under_test", ROOT / "scripts" / "install_pipe.py")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_description_comes_from_the_release_asset_frontmatter() -> None:
    content = (ROOT / "tongyi_deepresearch_pipe.py").read_text(encoding="utf-8")

    description = installer.description_of(content)

    line = next(
        line for line in content.splitlines() if line.startswith("description:")
    )
    assert description == line.split(":", 1)[1].strip()
    assert description


def test_description_needs_a_bare_first_line() -> None:
    assert installer.description_of('"""Title\ndescription: x\n"""') == ""
    assert installer.description_of('"""\ntitle: T\n"""\ndescription: late') == ""
    assert installer.description_of('"""\nDescription:  spaced  \n"""') == "spaced"


def test_valves_default_to_a_local_vllm_server() -> None:
    assert installer.valves_from_env({}) == {
        "API_BASE_URL": "http://localhost:8000/v1",
        "API_KEY": "",
        "MODEL_ID": "Alibaba-NLP/Tongyi-DeepResearch-30B-A3B",
    }


def test_valves_follow_the_environment() -> None:
    valves = installer.valves_from_env(
        {
            "TONGYI_API_BASE_URL": "http://gpu-box:8001/v1",
            "TONGYI_API_KEY": "sk-local",
            "TONGYI_MODEL_ID": "tongyi",
        }
    )

    assert valves == {
        "API_BASE_URL": "http://gpu-box:8001/v1",
        "API_KEY": "sk-local",
        "MODEL_ID": "tongyi",
    }


def test_installer_reports_an_unreachable_server(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TONGYI_API_KEY", "sk-never-printed")
    port = _closed_port()

    code = installer.main(["--url", f"http://127.0.0.1:{port}"])

    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("install_pipe: POST /api/v1/auths/signin failed")
    assert "sk-never-printed" not in err


def test_installer_stops_waiting_when_the_server_process_is_gone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dead_pid = 2**22 + 12345  # above the default pid_max: never a live process

    code = installer.main(
        [
            "--url",
            f"http://127.0.0.1:{_closed_port()}",
            "--wait-ready",
            "60",
            "--server-pid",
            str(dead_pid),
        ]
    )

    assert code == 1
    assert "Open WebUI exited while starting" in capsys.readouterr().err


def _serve(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SERVE), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )


def test_serve_help_describes_the_settings() -> None:
    result = _serve("--help")

    assert result.returncode == 0
    for name in ("PORT", "DATA_DIR", "TONGYI_API_BASE_URL", "TONGYI_API_KEY"):
        assert name in result.stdout
    assert "TONGYI_MODEL_ID" in result.stdout
    assert not result.stdout.startswith("#")


def test_serve_rejects_unknown_arguments() -> None:
    result = _serve("--bogus")

    assert result.returncode != 0
    assert "unknown argument: --bogus" in result.stderr


def test_serve_without_prepare_needs_an_existing_venv(tmp_path: Path) -> None:
    result = _serve(
        "--no-prepare",
        TDR_OWUI_VENV=str(tmp_path / "missing-venv"),
        DATA_DIR=str(tmp_path / "data"),
    )

    assert result.returncode != 0
    assert f"no Open WebUI in {tmp_path / 'missing-venv'}" in result.stderr
    assert not (tmp_path / "data").exists()


def _spa_page(_request: Request) -> Response:
    """What Open WebUI 0.6 answers for a path its API lacks: the web app."""
    return Response.text("<!doctype html>\n<html>…</html>\n", content_type="text/html")


def test_wait_ready_polls_ready_where_it_exists() -> None:
    routes = {
        "/ready": lambda _r: Response.json({"status": True}),
        "/health": lambda _r: Response.json({"status": True}),
    }
    with LocalServer(routes) as server:
        installer.wait_ready(server.base_url, timeout=10, interval=0.01)

    assert [r.path for r in server.requests] == ["/ready"]


def test_wait_ready_falls_back_to_health_when_ready_is_the_web_app() -> None:
    # Open WebUI 0.6 has no /ready: its catch-all serves index.html with 200.
    routes = {"/": _spa_page, "/health": lambda _r: Response.json({"status": True})}
    with LocalServer(routes) as server:
        installer.wait_ready(server.base_url, timeout=10, interval=0.01)

    assert [r.path for r in server.requests] == ["/ready", "/health"]


def test_wait_ready_falls_back_to_health_on_404() -> None:
    routes = {"/health": lambda _r: Response.json({"status": True})}
    with LocalServer(routes) as server:
        installer.wait_ready(server.base_url, timeout=10, interval=0.01)

    assert [r.path for r in server.requests] == ["/ready", "/health"]


def test_an_html_answer_from_the_api_is_a_clear_error() -> None:
    with LocalServer({"/": _spa_page}) as server:
        client = installer.RestClient(server.base_url)
        with pytest.raises(installer.OpenWebUIError, match="not JSON"):
            client.get("/api/v1/functions/")


def _serve_with_fake_openwebui(
    tmp_path: Path, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run scripts/serve over an ``open-webui`` that records its settings.

    Returns the run and the web search settings ``open-webui`` got. The
    environment has no search settings but ``env``'s.
    """
    venv, seen = tmp_path / "venv", tmp_path / "seen.env"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    server = venv / "bin" / "open-webui"
    server.write_text(
        "#!/usr/bin/env bash\n"
        f'printf "%s\\n" "ENABLE_WEB_SEARCH=$ENABLE_WEB_SEARCH" '
        f'"WEB_SEARCH_ENGINE=$WEB_SEARCH_ENGINE" > "{seen}"\n',
        encoding="utf-8",
    )
    server.chmod(0o755)
    names = ("WEB_SEARCH_ENGINE", "ENABLE_WEB_SEARCH")
    result = subprocess.run(
        ["bash", str(SERVE), "--no-prepare"],
        capture_output=True,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if k not in names},
            **env,
            "TDR_OWUI_VENV": str(venv),
            "DATA_DIR": str(tmp_path / "data"),
            "PORT": str(_closed_port()),
        },
        timeout=120,
        check=False,
    )
    return result, seen.read_text(encoding="utf-8").splitlines()


def test_serve_searches_with_duckduckgo_when_no_engine_is_named(tmp_path: Path) -> None:
    result, settings = _serve_with_fake_openwebui(tmp_path)

    assert settings == ["ENABLE_WEB_SEARCH=true", "WEB_SEARCH_ENGINE=duckduckgo"]
    assert (
        "[serve] web search: DuckDuckGo (no key needed; name another with "
        "WEB_SEARCH_ENGINE=..., read on a data directory's first start, then in "
        "Admin Settings > Web Search)"
    ) in result.stderr.splitlines()


def test_serve_keeps_the_engine_the_user_named(tmp_path: Path) -> None:
    result, settings = _serve_with_fake_openwebui(tmp_path, WEB_SEARCH_ENGINE="searxng")

    assert settings == ["ENABLE_WEB_SEARCH=true", "WEB_SEARCH_ENGINE=searxng"]
    assert "[serve] web search: searxng" in result.stderr.splitlines()
