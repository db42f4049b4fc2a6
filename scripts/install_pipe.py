"""Install or update the Tongyi DeepResearch pipe in a running Open WebUI.

It does what an administrator does by hand, through Open WebUI's REST API:
paste the content of ``tongyi_deepresearch_pipe.py`` as a new Function, switch
it on and fill in its valves. Running it again updates the function and the
valves in place, so it is safe to run on every start.

Used by ``scripts/serve`` (README's start command) and by the end-to-end tests,
so both install the pipe the same way. Standard library only: it runs with any
Python 3.11, including Open WebUI's own.

Usage::

    python scripts/install_pipe.py --url http://127.0.0.1:8080 --wait-ready 600

Valves come from ``TONGYI_API_BASE_URL``, ``TONGYI_API_KEY`` and
``TONGYI_MODEL_ID``. Without ``--token`` it signs in as ``--email`` /
``--password`` (defaults fit ``WEBUI_AUTH=False``, where Open WebUI creates
its single admin on the first sign-in).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FUNCTION_ID = "tongyi_deepresearch"
FUNCTION_NAME = "Tongyi DeepResearch"
PIPE_MODEL_ID = f"{FUNCTION_ID}.tongyi-deepresearch"
HEAVY_MODEL_ID = f"{FUNCTION_ID}.tongyi-deepresearch-heavy"
ROOT = Path(__file__).resolve().parent.parent
PIPE_FILE = ROOT / "tongyi_deepresearch_pipe.py"

DEFAULT_API_BASE_URL = "http://localhost:8000/v1"
DEFAULT_MODEL_ID = "Alibaba-NLP/Tongyi-DeepResearch-30B-A3B"
# With WEBUI_AUTH=False, Open WebUI signs everyone in as this admin.
NO_AUTH_EMAIL = "admin@localhost"
NO_AUTH_PASSWORD = "admin"  # noqa: S105 - Open WebUI's fixed no-auth account

_FRONTMATTER_LINE = "description:"
NOT_JSON = "the answer is not JSON"


class OpenWebUIError(RuntimeError):
    """Open WebUI answered with an error (or not at all)."""


@dataclass
class RestClient:
    """A minimal JSON client for Open WebUI's REST API (loopback use)."""

    base_url: str
    token: str = ""
    timeout: float = 60.0

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request; return the decoded JSON answer.

        Raises:
            OpenWebUIError: on an HTTP error or when the server cannot be reached.
        """
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        url = self.base_url.rstrip("/") + path
        request = urllib.request.Request(url, data, headers, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                raw = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode("utf-8", "replace")[:500]
            raise OpenWebUIError(
                f"{method} {path} failed: HTTP {error.code}: {detail}"
            ) from None
        except (urllib.error.URLError, OSError) as error:
            raise OpenWebUIError(f"{method} {path} failed: {error}") from None
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            # e.g. the web app's HTML page, served for paths the API lacks
            raise OpenWebUIError(
                f"{method} {path} failed: {NOT_JSON} "
                f"({raw[:40].decode('utf-8', 'replace')!r}…)"
            ) from None

    def get(self, path: str) -> Any:
        """GET ``path``."""
        return self.request("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        """POST ``body`` (JSON) to ``path``."""
        return self.request("POST", path, {} if body is None else body)


def wait_ready(
    base_url: str,
    timeout: float,
    alive: Callable[[], bool] | None = None,
    interval: float = 0.5,
) -> float:
    """Wait until Open WebUI has finished starting; return the seconds waited.

    Polls ``/ready`` (503 until startup is complete), or ``/health`` on
    versions without ``/ready``. ``alive`` is an optional callable that says
    whether the server process still runs, so a crash fails at once.

    Raises:
        OpenWebUIError: when the server died or the deadline passed.
    """
    started = time.monotonic()
    path = "/ready"
    client = RestClient(base_url, timeout=5.0)
    last = "no answer yet"
    while time.monotonic() - started < timeout:
        if alive is not None and not alive():
            raise OpenWebUIError("Open WebUI exited while starting")
        try:
            client.get(path)
            return time.monotonic() - started
        except OpenWebUIError as error:
            last = str(error)
            if path == "/ready" and ("HTTP 404" in last or NOT_JSON in last):
                # Older versions have no readiness endpoint: 404, or (0.6)
                # the web app's HTML page answers it.
                path = "/health"
                continue
        time.sleep(interval)
    raise OpenWebUIError(f"Open WebUI was not ready after {timeout:.0f} s ({last})")


def sign_in(base_url: str, email: str, password: str) -> str:
    """Sign in and return the session token."""
    answer = RestClient(base_url).post(
        "/api/v1/auths/signin", {"email": email, "password": password}
    )
    return str(answer["token"])


def sign_up(base_url: str, name: str, email: str, password: str) -> str:
    """Create the first (admin) account and return its token."""
    answer = RestClient(base_url).post(
        "/api/v1/auths/signup", {"name": name, "email": email, "password": password}
    )
    return str(answer["token"])


def description_of(content: str) -> str:
    """The ``description:`` value of the file's frontmatter ('' when absent)."""
    lines = content.splitlines()
    if not lines or lines[0].strip() != '"""':
        return ""
    for line in lines[1:]:
        if '"""' in line:
            break
        if line.strip().lower().startswith(_FRONTMATTER_LINE):
            return line.split(":", 1)[1].strip()
    return ""


def valves_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The pipe's connection valves from ``TONGYI_*`` environment variables."""
    return {
        "API_BASE_URL": environ.get("TONGYI_API_BASE_URL") or DEFAULT_API_BASE_URL,
        "API_KEY": environ.get("TONGYI_API_KEY", ""),
        "MODEL_ID": environ.get("TONGYI_MODEL_ID") or DEFAULT_MODEL_ID,
    }


def find_function(client: RestClient, function_id: str) -> dict[str, Any] | None:
    """The stored function with this id, or None.

    (Open WebUI answers a missing id with 401, so the list is asked instead.)
    """
    for function in client.get("/api/v1/functions/") or []:
        if function.get("id") == function_id:
            return function
    return None


def install_pipe(
    client: RestClient,
    content: str,
    valves: Mapping[str, Any],
    function_id: str = FUNCTION_ID,
    name: str = FUNCTION_NAME,
) -> dict[str, Any]:
    """Create or update the pipe function, switch it on and set its valves.

    Returns:
        The stored function record after the update.
    """
    form = {
        "id": function_id,
        "name": name,
        "content": content,
        "meta": {"description": description_of(content)},
    }
    if find_function(client, function_id) is None:
        client.post("/api/v1/functions/create", form)
    else:
        client.post(f"/api/v1/functions/id/{function_id}/update", form)
    function = client.get(f"/api/v1/functions/id/{function_id}")
    if not function.get("is_active"):
        function = client.post(f"/api/v1/functions/id/{function_id}/toggle")
    client.post(f"/api/v1/functions/id/{function_id}/valves/update", dict(valves))
    return function


def wait_for_model(
    client: RestClient, model_id: str = PIPE_MODEL_ID, timeout: float = 30.0
) -> dict[str, Any]:
    """Wait until ``model_id`` is in Open WebUI's model list; return its entry.

    Raises:
        OpenWebUIError: when it does not show up in time.
    """
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while True:
        models = (client.get("/api/models") or {}).get("data") or []
        seen = [str(model.get("id")) for model in models]
        for model in models:
            if model.get("id") == model_id:
                return model
        if time.monotonic() > deadline:
            raise OpenWebUIError(f"model {model_id} is not listed (models: {seen})")
        time.sleep(0.5)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Install or update the Tongyi DeepResearch pipe in Open WebUI."
    )
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="Open WebUI")
    parser.add_argument("--pipe-file", type=Path, default=PIPE_FILE)
    parser.add_argument("--token", default=os.environ.get("OPEN_WEBUI_TOKEN", ""))
    parser.add_argument("--email", default=NO_AUTH_EMAIL)
    parser.add_argument("--password", default=NO_AUTH_PASSWORD)
    parser.add_argument(
        "--wait-ready",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to SECONDS for Open WebUI to finish starting",
    )
    parser.add_argument(
        "--server-pid",
        type=int,
        default=0,
        help="stop waiting at once if this process exits",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    args = _parse_args(argv)
    try:
        if args.wait_ready > 0:
            pid = args.server_pid
            alive = (lambda: _process_alive(pid)) if pid else None
            seconds = wait_ready(args.url, args.wait_ready, alive)
            print(f"Open WebUI is ready ({seconds:.1f} s).", file=sys.stderr)
        token = args.token or sign_in(args.url, args.email, args.password)
        client = RestClient(args.url, token)
        content = args.pipe_file.read_text(encoding="utf-8")
        valves = valves_from_env(os.environ)
        install_pipe(client, content, valves)
        wait_for_model(client)
    except (OpenWebUIError, OSError, KeyError) as error:
        print(f"install_pipe: {error}", file=sys.stderr)
        return 1
    print(
        f"Installed the pipe '{FUNCTION_NAME}' (model {PIPE_MODEL_ID}); "
        f"model server {valves['API_BASE_URL']}, model {valves['MODEL_ID']}.",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
