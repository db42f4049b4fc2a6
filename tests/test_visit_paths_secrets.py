"""Claims that hold on every fetch path, bounded extractor-reply parsing, and
secrets in the extractor path (issue 11).

- Page loader choice: `auto` reads with the built-in fetcher (checked, pinned,
  capped) even inside Open WebUI, unless Open WebUI's web loader engine is a
  browser or a service; whatever Open WebUI's loader returns is classified like
  a downloaded body (PDF to the PDF reader, binary refused).
- Extractor replies: strict JSON first, json5 only on small texts, a linear
  scraper for the rest; hostile replies cannot hold the event loop.
- Secrets: the key valve (any length, stray whitespace) and credentials written
  into EXTRACTOR_BASE_URL appear nowhere: tool output, events, or any log line
  at DEBUG (httpx's and openai's loggers included).

Real parts: pages on 127.0.0.1 (PageSite) and a FakeOpenAI extractor; Open
WebUI's loader (the tool's seam) and its config are the only stand-ins, and
the tool's retries do not wait (its sleep seam).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import sys
import time
from dataclasses import replace
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.fakes.events import Events
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.pages import (
    COMPRESSED_PDF_SECRET,
    PNG_BYTES,
    PageSite,
    load_visit_tool,
    make_pdf,
    page_text_from_prompt,
)

vt = load_visit_tool("visit_tool_paths_secrets_tests")

GOOD = json.dumps({"rational": "r", "evidence": "E1", "summary": "S1"})


def echo(body: dict[str, Any]) -> Reply:
    page = page_text_from_prompt(body["messages"][0]["content"])
    return Reply(
        content=json.dumps({"rational": "r", "evidence": page, "summary": "S"})
    )


@pytest.fixture(scope="module")
def site() -> Any:
    with PageSite() as running:
        yield running


@pytest.fixture(scope="module")
def extractor_server() -> Any:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def extractor(extractor_server: Any) -> Any:
    extractor_server.replies.clear()
    extractor_server.bodies.clear()
    extractor_server.server.requests.clear()
    extractor_server.respond_with(echo)
    return extractor_server


async def no_sleep(_seconds: float) -> None:
    """The tool's wait between extractor retries: none."""


class RecordingLoader:
    """Stands in for Open WebUI's get_content_from_url (0.11+ shape)."""

    def __init__(self, result: Any = ("Loaded by Open WebUI.", [])) -> None:
        self.calls: list[str] = []
        self.result = result

    async def __call__(self, request: Any, url: str, *, config: Any = None) -> Any:
        self.calls.append(url)
        return self.result


def make_tool(extractor: Any, loader: Any = None, **valves: Any) -> Any:
    """A tool that waits for nothing, with `loader` as Open WebUI's (if given)."""
    seams = vt._Seams(sleep=no_sleep, pages=vt._PageCache())
    if loader is not None:
        seams = replace(seams, find_loader=lambda: loader)
    tool = vt.Tools(seams=seams)
    settings = {
        "ALLOW_PRIVATE_URLS": True,
        "EXTRACTOR_BASE_URL": extractor.base_url,
        "EXTRACTOR_MODEL": "extractor-model",
        **valves,
    }
    tool.valves = tool.Valves(**settings)
    return tool


def evidence_of(result: str) -> str:
    assert result.startswith("The useful information in "), result[:300]
    return result.split("Evidence in page: \n", 1)[1].rsplit("\n\nSummary: \n", 1)[0]


def is_failure(result: str) -> bool:
    return vt.FAILURE_EVIDENCE in result and vt.FAILURE_SUMMARY in result


def old_request(engine: str) -> Any:
    """A request as Open WebUI 0.6 / 0.8 passes it: config on app.state."""
    config = SimpleNamespace(WEB_LOADER_ENGINE=engine)
    return SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(config=config)))


def new_config(monkeypatch: pytest.MonkeyPatch, engine: str) -> Any:
    """Open WebUI 0.11+: no app.state.config; `await Config.get(key)` instead."""

    class Config:
        @staticmethod
        async def get(key: str, default: Any = None) -> Any:
            return {"web.loader.engine": engine}.get(key, default)

    module = ModuleType("open_webui.models.config")
    module.Config = Config  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "open_webui.models.config", module)
    return SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace()))


# -- which path reads the page --------------------------------------------------------


@pytest.mark.parametrize("shape", ["none", "old", "new"])
@pytest.mark.parametrize("engine", ["", "safe_web", "SAFE_WEB"])
async def test_auto_reads_with_the_builtin_fetcher_inside_open_webui(
    shape: str, engine: str, site: Any, extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    loader = RecordingLoader()
    request = {
        "none": object(),  # engine unreadable: the built-in fetcher
        "old": old_request(engine),
        "new": new_config(monkeypatch, engine),
    }[shape]
    path = f"/count/auto-{shape}-{engine}"
    before = site.hits(path)
    result = await make_tool(extractor, loader).visit(
        url=site.url(path), goal="g", __request__=request
    )
    assert "Counted page" in evidence_of(result)
    assert loader.calls == []
    assert site.hits(path) == before + 1


@pytest.mark.parametrize("shape", ["old", "new"])
@pytest.mark.parametrize("engine", ["playwright", "firecrawl", "tavily", "external"])
async def test_auto_uses_open_webui_for_browser_and_service_engines(
    shape: str, engine: str, site: Any, extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    loader = RecordingLoader()
    request = old_request(engine) if shape == "old" else new_config(monkeypatch, engine)
    path = f"/count/engine-{shape}-{engine}"
    before = site.hits(path)
    result = await make_tool(extractor, loader).visit(
        url=site.url(path), goal="g", __request__=request
    )
    assert "Loaded by Open WebUI." in evidence_of(result)
    assert loader.calls == [site.url(path)]
    assert site.hits(path) == before  # the built-in fetcher was not used


async def test_openwebui_mode_never_falls_back_on_an_empty_page(
    site: Any, extractor: Any
) -> None:
    loader = RecordingLoader(("   ", []))
    before = site.hits("/count/empty")
    result = await make_tool(extractor, loader, PAGE_LOADER="openwebui").visit(
        url=site.url("/count/empty"), goal="g", __request__=object()
    )
    assert is_failure(result)
    assert site.hits("/count/empty") == before


async def test_pdf_bytes_from_the_loader_go_through_the_pdf_reader(
    extractor: Any,
) -> None:
    # Open WebUI 0.8.12's default loader hands back a PDF's raw bytes as text.
    pdf = make_pdf(["Loader PDF page one says 42."], title="Loader PDF")
    loader = RecordingLoader((pdf.decode("latin-1"), []))
    result = await make_tool(extractor, loader, PAGE_LOADER="openwebui").visit(
        url="http://127.0.0.1:9/doc.pdf", goal="g", __request__=object()
    )
    page = evidence_of(result)
    assert "Loader PDF page one says 42." in page
    assert "Title: Loader PDF" in page
    assert all("%PDF-" not in json.dumps(body) for body in extractor.bodies)


@pytest.mark.parametrize("codec", ["latin-1", "utf-8", "cp1252"])
async def test_a_pdf_decoded_as_text_is_read_as_a_pdf_or_refused(
    codec: str, extractor: Any
) -> None:
    """Never as text: binary markers make the decoding lossy for most codecs."""
    pdf = make_pdf(["Decoded PDF text."]).replace(
        b"%PDF-1.4\n", b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\x81\x8d\n", 1
    )
    content = pdf.decode(codec, "replace")
    loader = RecordingLoader((content, []))
    events = Events()
    url = "http://127.0.0.1:9/doc"  # nothing listens there: no download either
    result = await make_tool(extractor, loader, PAGE_LOADER="openwebui").visit(
        url=url, goal="g", __request__=object(), __event_emitter__=events
    )
    if codec == "latin-1":  # every byte survived: the PDF reader reads it
        assert evidence_of(result) == (
            f"Title: \n\nURL Source: {url}\n\n"
            "Markdown Content:\n--- Page 1 ---\nDecoded PDF text."
        )
    else:  # bytes were lost: the file itself is downloaded (and cannot be)
        assert is_failure(result)
        assert f"Could not read {url}: network error (ConnectError)" in (
            events.descriptions()
        )
    assert all("%PDF-" not in json.dumps(body) for body in extractor.bodies)


@pytest.mark.parametrize("mode", ["openwebui", "auto-playwright"])
@pytest.mark.parametrize("codec", ["utf-8", "cp1252"])
async def test_a_compressed_pdf_the_loader_mangled_is_downloaded_again(
    mode: str, codec: str, site: Any, extractor: Any
) -> None:
    """0.8.12's loader hands back a PDF decoded as text: Flate bytes are lost.

    The text of a compressed PDF exists only in its exact bytes, so the tool
    downloads the file itself (the same checked URL) and reads that.
    """
    content = site.compressed_pdf.decode(codec, "replace")
    loader = RecordingLoader((content, []))
    valves = {"PAGE_LOADER": "openwebui"} if mode == "openwebui" else {}
    request = object() if mode == "openwebui" else old_request("playwright")
    before = site.hits("/pdf-compressed")
    result = await make_tool(extractor, loader, **valves).visit(
        url=site.url("/pdf-compressed"), goal="g", __request__=request
    )
    assert loader.calls == [site.url("/pdf-compressed")]
    assert site.hits("/pdf-compressed") == before + 1
    assert COMPRESSED_PDF_SECRET in evidence_of(result)
    assert all("%PDF-" not in json.dumps(body) for body in extractor.bodies)


BINARY = "the URL points to a binary file (unknown type), not a readable page"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("%PDF-1.4\ngarbage that no reader can open",
         "the PDF could not be read (PdfStreamError)"),
        (PNG_BYTES.decode("latin-1"), BINARY),
        (PNG_BYTES.decode("utf-8", "replace") * 20, BINARY),
        ("text\x00with\x00nul\x00bytes " * 50, BINARY),
        (bytes(range(256)).decode("latin-1") * 20, BINARY),
    ],
    ids=["pdf-corrupt", "png-latin1", "png-utf8", "nul", "bytes"],
)  # fmt: skip
async def test_binary_from_the_loader_never_reaches_the_extractor(
    content: str, reason: str, extractor: Any
) -> None:
    loader = RecordingLoader((content, []))
    events = Events()
    result = await make_tool(extractor, loader, PAGE_LOADER="openwebui").visit(
        url="http://127.0.0.1:9/file", goal="g", __request__=object(),
        __event_emitter__=events,
    )  # fmt: skip
    assert is_failure(result)
    assert extractor.bodies == []
    failures = [line for line in events.descriptions() if line.startswith("Could")]
    assert failures == [f"Could not read http://127.0.0.1:9/file: {reason}"]


async def test_loader_text_over_the_download_cap_is_cut(extractor: Any) -> None:
    loader = RecordingLoader(("word " * 8000, []))
    result = await make_tool(
        extractor, loader, PAGE_LOADER="openwebui", MAX_DOWNLOAD_BYTES=10_000
    ).visit(url="http://127.0.0.1:9/long", goal="g", __request__=object())
    page = evidence_of(result)
    assert page.endswith(vt.TRUNCATION_NOTE)
    assert page.count("word") <= 2_000


# -- extractor replies: bounded parsing ------------------------------------------------

# Hostile replies up to what EXTRACTOR_MAX_TOKENS (8,192) lets a server write
# (~4 characters a token), and beyond.
SIZE = 4 * 8192
HOSTILE_REPLIES = {
    "json5-object": "{'evidence': '" + "word " * (SIZE // 5) + "', 'summary': 'S',}",
    "json5-items": "{'evidence': ["
    + ",".join(f"'item {i}'" for i in range(3000))
    + "], 'summary': 'S',}",
    "many-keys": "{" + "'evidence': [1], " * 2000 + "'summary': 'S'",
    "whitespace-run": '{"evidence": "a' + " " * SIZE + 'b", "summary": "S"}x',
    "fence-run": "```" + " " * SIZE + "x",
    "deep-arrays": "[" * SIZE,
    "deep-evidence": '{"evidence": ' + "[" * 5000 + "]" * 5000 + ', "summary": "S"}',
    "deep-json5": "{'evidence': " + "[" * 900 + "'x'" + "]" * 900 + "}",
    "unclosed": '{"evidence": "' + "x" * SIZE,
    "colons": "evidence" + " " * 2000 + ":" * 10 + "summary:" * 3000,
    "big": "{'evidence': '" + "z" * (20 * SIZE) + "', 'summary': 'S'}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_REPLIES))
def test_json5_never_sees_a_big_reply(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    real = pytest.importorskip("json5")

    def recording_loads(text: str) -> Any:
        seen.append(len(text))
        return real.loads(text)

    fake = ModuleType("json5")
    fake.loads = recording_loads  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "json5", fake)
    vt._parse_extraction(HOSTILE_REPLIES[name])  # no exception, whatever it finds
    assert all(size <= vt._JSON5_MAX_CHARS for size in seen), seen
    assert len(seen) <= 5  # one candidate plus at most one per field


def test_big_non_json_reply_falls_back_to_the_scraper() -> None:
    evidence, summary = vt._parse_extraction(HOSTILE_REPLIES["json5-object"]) or (
        "",
        "",
    )
    assert evidence.startswith("word word") and evidence.endswith("word")
    assert summary == "S"
    parsed = vt._parse_extraction(HOSTILE_REPLIES["json5-items"])
    assert parsed is not None and parsed[1] == "S"


async def test_hostile_replies_do_not_hold_the_event_loop(
    extractor: Any,
) -> None:
    """Each reply goes through the whole extractor path while a ticker runs.

    The bound is generous (a second): the quadratic and pure-Python parsers
    these replies were built against took from 0.6 s to many seconds.
    """
    replies = list(HOSTILE_REPLIES.values())
    extractor.respond_with(lambda body: Reply(content=replies[0]))
    worst = 0.0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            worst = max(worst, now - last)
            last = now

    page = vt._Page("https://news.example/a", "T", "Body text.")
    valves = vt.Tools.Valves(EXTRACTOR_BASE_URL=extractor.base_url, EXTRACTOR_MODEL="m")
    ticking = asyncio.create_task(ticker())
    try:
        for reply in replies:
            extractor.respond_with(lambda body, reply=reply: Reply(content=reply))
            outcome = await vt._extract(page, "g", valves)
            assert outcome.kind in ("extracted", "failed")
    finally:
        stop.set()
        await ticking
    assert worst < 1.0, f"the event loop stalled {worst:.2f} s"


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("deep-arrays", None),  # no object at all
        # Too deep to parse as JSON: the scraper takes the fields as written.
        ("deep-evidence", ("[" * 5000 + "]" * 5000, "S")),
        (
            "deep-json5",
            ("[" * 900 + "'x'" + "]" * 900, "The extractor gave no summary."),
        ),
    ],
)
def test_deeply_nested_replies_do_not_raise(name: str, parsed: Any) -> None:
    assert vt._parse_extraction(HOSTILE_REPLIES[name]) == parsed


# -- secrets -------------------------------------------------------------------------


def leaks(secrets: list[str], *outputs: str) -> list[str]:
    """The secrets (and 12-character prefixes of long ones) found in outputs."""
    found = []
    for secret in secrets:
        probes = {secret, secret[:12]} if len(secret) > 24 else {secret}
        found += [p for p in probes for text in outputs if p.strip() and p in text]
    return found


async def run_visit(tool: Any, site: Any, caplog: pytest.LogCaptureFixture) -> tuple:
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore", "openai"):
        caplog.set_level(logging.DEBUG, logger=name)
    events = Events()
    result = await tool.visit(
        url=site.url("/plain"), goal="g", __event_emitter__=events, __chat_id__=""
    )
    logged = "\n".join(
        f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records
    )
    return result, json.dumps(events), logged


@pytest.mark.parametrize(
    "key",
    [
        "sk-live-SECRET-0123456789 ",
        "sk-live-SECRET-0123456789\n",
        "\tsk-live-SECRET-0123456789\r\n",
        "sk-" + "LONGSECRET" * 40,  # far past any cut of an error message
        "k1",  # short keys are redacted too
    ],
    ids=["space", "newline", "tabs", "long", "short"],
)
@pytest.mark.parametrize("status", [401, 400, 404, 500])
async def test_extractor_key_never_appears_anywhere(
    key: str,
    status: int,
    site: Any,
    extractor: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    clean = key.strip()
    # A server that echoes the key it was sent, in full, at the start of the body.
    extractor.respond_with(
        lambda body: Reply(
            status=status, error=f"{clean} is not a valid key (Bearer {clean})"
        )
    )
    tool = make_tool(extractor, EXTRACTOR_API_KEY=key, EXTRACTOR_MAX_RETRIES=1)
    result, events, logged = await run_visit(tool, site, caplog)
    assert extractor.requests[0].headers["authorization"] == f"Bearer {clean}"
    assert "Plain facts" in result  # the page is still given, as an excerpt
    assert leaks([key, clean], result, events, logged) == []


@pytest.mark.parametrize("scenario", ["ok", "outage", "refused"])
async def test_credentials_in_the_base_url_go_only_in_a_header(
    scenario: str,
    site: Any,
    extractor: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    password = "pa$$-URL-SECRET-7"  # written percent-encoded in the URL
    pair = f"alice:{password}"
    basic = base64.b64encode(pair.encode()).decode()
    base = extractor.base_url.replace("http://", "http://alice:pa%24%24-URL-SECRET-7@")
    if scenario == "ok":
        extractor.respond_with(lambda body: Reply(content=GOOD))
    else:
        status = 503 if scenario == "outage" else 401
        extractor.respond_with(
            lambda body: Reply(status=status, error=f"no access for {pair} / {basic}")
        )
    tool = make_tool(extractor, EXTRACTOR_BASE_URL=base, EXTRACTOR_MAX_RETRIES=1)
    result, events, logged = await run_visit(tool, site, caplog)
    request = extractor.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Basic {basic}"
    assert "HTTP Request: POST" in logged  # httpx's own line was captured
    secrets = [password, "pa%24%24-URL-SECRET-7", basic, pair]
    assert leaks(secrets, result, events, logged) == []


async def test_the_key_valve_wins_over_url_credentials(extractor: Any) -> None:
    extractor.respond_with(lambda body: Reply(content=GOOD))
    base = extractor.base_url.replace("http://", "http://bob:hunter2@")
    valves = vt.Tools.Valves(
        EXTRACTOR_BASE_URL=base, EXTRACTOR_API_KEY="sk-key", EXTRACTOR_MODEL="m"
    )
    outcome = await vt._extract(vt._Page("u", "t", "text"), "g", valves)
    assert outcome.kind == "extracted"
    assert extractor.requests[0].headers["authorization"] == "Bearer sk-key"


# -- the openai SDK ------------------------------------------------------------------


async def test_extractor_is_called_through_the_openai_sdk(extractor: Any) -> None:
    extractor.respond_with(lambda body: Reply(content=GOOD))
    valves = vt.Tools.Valves(EXTRACTOR_BASE_URL=extractor.base_url)
    outcome = await vt._extract(vt._Page("u", "t", "text"), "g", valves)
    assert outcome.kind == "extracted"
    headers = extractor.requests[0].headers
    assert headers["user-agent"].startswith("AsyncOpenAI/Python")
    assert headers["authorization"] == "Bearer EMPTY"  # the reference's placeholder


async def test_extractor_ignores_environment_proxies(
    extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    extractor.respond_with(lambda body: Reply(content=GOOD))
    valves = vt.Tools.Valves(EXTRACTOR_BASE_URL=extractor.base_url)
    outcome = await vt._extract(vt._Page("u", "t", "text"), "g", valves)
    assert outcome.kind == "extracted"


async def test_extractor_gets_no_openai_environment_headers(
    extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK reads these from the environment; they belong to OpenAI accounts of
    # the server's operator, never to an extractor endpoint configured here.
    monkeypatch.setenv("OPENAI_ORG_ID", "org-from-the-environment")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-from-the-environment")
    extractor.respond_with(lambda body: Reply(content=GOOD))
    valves = vt.Tools.Valves(EXTRACTOR_BASE_URL=extractor.base_url)
    outcome = await vt._extract(vt._Page("u", "t", "text"), "g", valves)
    assert outcome.kind == "extracted"
    headers = extractor.requests[0].headers
    assert "openai-organization" not in headers
    assert "openai-project" not in headers
    assert "from-the-environment" not in str(dict(headers))


async def test_without_the_openai_package_the_page_start_is_given(
    extractor: Any,
) -> None:
    # The SDK under a name no module has: its import fails, as without openai.
    not_installed = functools.partial(vt._openai_sdk, "openai_is_not_installed")
    valves = vt.Tools.Valves(EXTRACTOR_BASE_URL=extractor.base_url)
    outcome = await vt._extract(
        vt._Page("u", "t", "Page text."), "g", valves, openai_sdk=not_installed
    )
    assert outcome.kind == "excerpt"
    assert outcome.evidence == "Page text."
    assert "'openai' Python package" in outcome.summary
    assert extractor.bodies == []


async def test_a_package_being_imported_is_never_handed_out_half_initialised(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two pages read at once both need the SDK on first use. While the first
    # import runs (in a thread), sys.modules already holds the partly initialised
    # module: the second caller must wait for the whole module, not take that.
    import threading

    gate = SimpleNamespace(started=threading.Event(), release=threading.Event())
    monkeypatch.setitem(sys.modules, "visit_import_gate", gate)
    (tmp_path / "slow_sdk.py").write_text(
        "import visit_import_gate as gate\n"
        "gate.started.set()\n"
        "gate.release.wait(30)\n"
        "AsyncOpenAI = object\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_sdk", raising=False)

    first = asyncio.create_task(vt._openai_sdk("slow_sdk"))
    assert await asyncio.to_thread(gate.started.wait, 30)
    assert "slow_sdk" in sys.modules  # the import is under way
    second = asyncio.create_task(vt._openai_sdk("slow_sdk"))
    for _ in range(5):  # let the second caller reach its own look-up
        await asyncio.sleep(0)
    gate.release.set()
    modules = await asyncio.gather(first, second)
    assert all(hasattr(module, "AsyncOpenAI") for module in modules)
