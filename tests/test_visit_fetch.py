"""Reading pages: the built-in fetcher against a real local site, Open WebUI's
loader in each version's shape, caps, content types, charsets, cache, concurrency.

The site runs on 127.0.0.1, so these tests set ALLOW_PRIVATE_URLS=True (the
refusal side is covered in test_visit_safety.py). The extractor is a real
FakeOpenAI server that echoes back the page text it was given, so each test
sees exactly what the extractor model would read.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.pages import PageSite, load_visit_tool, page_text_from_prompt

vt = load_visit_tool("visit_tool_fetch_tests")


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
def extractor() -> Any:
    with FakeOpenAI() as fake:
        fake.respond_with(echo)
        yield fake


@pytest.fixture(autouse=True)
def _empty_cache() -> Any:
    vt._PAGE_CACHE.clear()
    yield
    vt._PAGE_CACHE.clear()


class Events(list):
    """An event emitter that records events."""

    async def __call__(self, event: dict) -> None:
        self.append(event)

    def descriptions(self) -> str:
        return "\n".join(e["data"].get("description", "") for e in self)

    def sources(self) -> list[dict]:
        return [e["data"] for e in self if e["type"] == "source"]


def make_tool(extractor: Any, **valves: Any) -> Any:
    tool = vt.Tools()
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


# -- HTML and friends -------------------------------------------------------------


async def test_html_article_becomes_clean_markdown(site: Any, extractor: Any) -> None:
    events = Events()
    url = site.url("/article")
    result = await make_tool(extractor).visit(
        url=[url], goal="efficiency", __event_emitter__=events
    )
    page = evidence_of(result)
    assert page.startswith("Title: Solar Panels & Efficiency\n\nURL Source: ")
    assert "# Solar panel efficiency in 2024" in page
    assert "## Key figures" in page
    assert "- Monocrystalline: 22.8%" in page
    assert "  - Older models: 15%" in page
    assert "| Type | Efficiency |\n| --- | --- |\n| Mono | 22.8% |" in page
    assert f"[annual report]({site.url('/reports/2024.html')})" in page
    assert "Modern panels reach 22.8% efficiency" in page
    junk_markers = ["SCRIPT", "STYLE-TEXT", "SITE-HEADER", "NAV-LINK", "HIDDEN"]
    junk_markers += [
        "NOSCRIPT",
        "TEMPLATE",
        "SVG-TEXT",
        "ASIDE",
        "FOOTER",
        "<p>",
        "[top]",
    ]
    for junk in junk_markers:
        assert junk not in page, junk
    assert events.sources()[0]["source"] == {
        "name": "Solar Panels & Efficiency",
        "url": url,
    }


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/plain", "Plain facts: water boils at 100 C."),
        ("/markdown", "# Notes\n\n- item"),
        ("/json", '{"answer": 42, "unit": "widgets"}'),
        ("/gzip", "# Solar panel efficiency in 2024"),
        ("/html-as-octet", "# Solar panel efficiency in 2024"),
        ("/latin1", "Café crème brûlée"),
        ("/meta-charset", "Привет, мир"),
        ("/bom", "BOM wins: naïve"),
        ("/bad-charset", "broken \ufffd"),
        ("/pdf", "--- Page 1 ---\nPhotosynthesis converts light into chemical energy."),
        ("/pdf-as-html", "--- Page 2 ---\nPage two."),
    ],
)
async def test_content_types_and_charsets(
    path: str, expected: str, site: Any, extractor: Any
) -> None:
    result = await make_tool(extractor).visit(url=site.url(path), goal="g")
    assert expected in evidence_of(result)


async def test_wrong_type_html_is_not_shown_as_markup(
    site: Any, extractor: Any
) -> None:
    page = evidence_of(
        await make_tool(extractor).visit(url=site.url("/html-as-octet"), goal="g")
    )
    assert "<html" not in page
    assert "SCRIPT-TEXT" not in page


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/image", "PNG image"),
        ("/image-as-html", "PNG image"),
        ("/zip", "ZIP archive"),
        ("/octet-binary", "binary file"),
        ("/empty", "empty"),
        ("/pdf-corrupt", "PDF could not be read"),
        ("/status/404", "HTTP 404"),
        ("/status/500", "HTTP 500"),
        ("/cut-off", "network error"),
        ("/bad-encoding", "unsupported content encoding"),
        ("/redirect-no-location", "HTTP 302"),
        ("/bomb-zeros", "binary"),
    ],
)
async def test_unreadable_pages_fail_with_a_clear_reason(
    path: str, reason: str, site: Any, extractor: Any
) -> None:
    events = Events()
    requests_before = len(extractor.requests)
    result = await make_tool(extractor).visit(
        url=[site.url(path)], goal="g", __event_emitter__=events
    )
    assert is_failure(result)
    assert reason in events.descriptions()
    assert len(extractor.requests) == requests_before  # nothing to extract from
    assert events.sources() == []


@pytest.mark.parametrize("where", ["child process", "worker thread"])
async def test_pypdf_missing_gives_a_clear_message(
    site: Any,
    extractor: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    where: str,
) -> None:
    # pypdf absent for this process AND for a converter process, which imports
    # from the server's sys.path: a stand-in module there fails to import.
    monkeypatch.setitem(sys.modules, "pypdf", None)
    (tmp_path / "pypdf.py").write_text("raise ImportError('no pypdf here')\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    if where == "worker thread":
        monkeypatch.setattr(vt._CONVERTER, "program", "")
    await vt._stop_idle_workers()  # a worker takes sys.path when it starts
    events = Events()
    result = await make_tool(extractor).visit(
        url=site.url("/pdf"), goal="g", __event_emitter__=events
    )
    assert is_failure(result)
    assert "pip install pypdf" in events.descriptions()


# -- caps ---------------------------------------------------------------------------


async def test_huge_page_is_cut_to_the_token_budget(site: Any, extractor: Any) -> None:
    tool = make_tool(extractor, MAX_PAGE_TOKENS=2000)
    page = evidence_of(await tool.visit(url=site.url("/huge"), goal="g"))
    assert page.endswith("\n\n[Page truncated to fit the reading budget]")
    body = page.split("Markdown Content:\n", 1)[1]
    assert 7000 < len(body) < 8200  # ~4 chars per token
    assert "Lorem ipsum" in body


async def test_gzip_bomb_is_cut_while_inflating(site: Any, extractor: Any) -> None:
    seen: list[int] = []
    original = vt._convert_page

    async def spy(raw: Any, max_tokens: int) -> Any:
        seen.append(len(raw.body))
        return await original(raw, max_tokens)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vt, "_convert_page", spy)
        tool = make_tool(extractor, MAX_DOWNLOAD_BYTES=300_000)
        result = await tool.visit(url=site.url("/bomb-text"), goal="g")
    assert seen == [300_000]  # 50 MB on the wire after inflating; 300 kB read
    assert evidence_of(result).endswith("[Page truncated to fit the reading budget]")


async def test_bounded_decoder_never_inflates_beyond_the_limit() -> None:
    from tests.fakes.pages import bomb

    decoder = vt._BoundedDecoder("gzip")
    out = decoder.feed(bomb("zeros"), 1000)
    assert len(out) == 1000


async def test_endless_body_is_cut(site: Any, extractor: Any) -> None:
    tool = make_tool(extractor, MAX_DOWNLOAD_BYTES=200_000)
    page = evidence_of(await tool.visit(url=site.url("/endless"), goal="g"))
    assert "endless text" in page
    assert page.endswith("[Page truncated to fit the reading budget]")


async def test_slow_page_times_out(site: Any, extractor: Any) -> None:
    events = Events()
    tool = make_tool(extractor, PAGE_TIMEOUT_SECONDS=0.5)
    result = await tool.visit(url=site.url("/slow"), goal="g", __event_emitter__=events)
    assert is_failure(result)
    assert "timed out" in events.descriptions()


async def test_redirect_chain_is_followed_and_reported(
    site: Any, extractor: Any
) -> None:
    events = Events()
    url = site.url("/redirect/3")
    result = await make_tool(extractor).visit(
        url=url, goal="g", __event_emitter__=events
    )
    assert "# Solar panel efficiency in 2024" in evidence_of(result)
    assert result.startswith(f"The useful information in {url} for user goal g")
    (source,) = events.sources()
    meta = source["metadata"][0]
    assert meta["final_url"] == site.url("/article")
    assert meta["redirects"] == [
        site.url("/redirect/2"),
        site.url("/redirect/1"),
        site.url("/article"),
    ]


async def test_endless_redirects_stop_at_the_limit(site: Any, extractor: Any) -> None:
    events = Events()
    before = site.hits("/redirect-loop")
    tool = make_tool(extractor, MAX_REDIRECTS=4)
    result = await tool.visit(
        url=site.url("/redirect-loop"), goal="g", __event_emitter__=events
    )
    assert is_failure(result)
    assert site.hits("/redirect-loop") - before == 5
    assert "more than 4 redirects" in events.descriptions()


# -- cache, de-duplication, concurrency --------------------------------------------


async def test_same_chat_reads_a_page_once_other_chats_read_again(
    site: Any, extractor: Any
) -> None:
    tool = make_tool(extractor)
    url = site.url("/count/cache")
    first = await tool.visit(url=url, goal="g", __chat_id__="chat-A")
    second = await tool.visit(url=url + "#section", goal="g", __chat_id__="chat-A")
    assert site.hits("/count/cache") == 1
    assert evidence_of(first) == evidence_of(second)
    await tool.visit(url=url, goal="g", __chat_id__="chat-B")
    assert site.hits("/count/cache") == 2
    await tool.visit(url=url, goal="g")  # no chat id: never cached
    await tool.visit(url=url, goal="g")
    assert site.hits("/count/cache") == 4


async def test_a_page_read_twice_at_once_in_a_chat_is_fetched_once(
    site: Any, extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A heavy run's rollouts read the same page at the same time: the second
    # read waits for the first. Handshakes, no clock: the first load is held
    # until the second read has found it in flight.
    loads: list[str] = []
    release = asyncio.Event()
    original = vt._load

    async def held_load(target: Any, ctx: Any) -> Any:
        loads.append(target.url)
        await release.wait()
        return await original(target, ctx)

    looked_up: list[Any] = []

    class Recording(dict):
        def get(self, key: Any, default: Any = None) -> Any:
            looked_up.append(key)
            return super().get(key, default)

    monkeypatch.setattr(vt, "_load", held_load)
    monkeypatch.setattr(vt, "_LOADING", Recording())
    tool = make_tool(extractor)
    url = site.url("/count/together")
    first = asyncio.create_task(tool.visit(url=url, goal="a", __chat_id__="chat-H"))
    for _ in range(1500):
        if loads:
            break
        await asyncio.sleep(0.02)
    second = asyncio.create_task(tool.visit(url=url, goal="b", __chat_id__="chat-H"))
    for _ in range(1500):
        if len(looked_up) == 2:
            break
        await asyncio.sleep(0.02)
    assert len(looked_up) == 2 and len(vt._LOADING) == 1  # found in flight
    release.set()
    results = await asyncio.gather(first, second)
    assert loads == [url] and site.hits("/count/together") == 1
    assert all("Counted page /count/together content." in r for r in results)
    assert vt._LOADING == {}


async def test_cache_can_be_switched_off(site: Any, extractor: Any) -> None:
    tool = make_tool(extractor, CACHE_TTL_SECONDS=0)
    for _ in range(2):
        await tool.visit(url=site.url("/count/nocache"), goal="g", __chat_id__="c")
    assert site.hits("/count/nocache") == 2


async def test_same_url_twice_in_one_call_is_read_once(
    site: Any, extractor: Any
) -> None:
    url = site.url("/count/dup")
    result = await make_tool(extractor).visit(url=[url, url], goal="g")
    assert site.hits("/count/dup") == 1
    assert result.count("Counted page /count/dup content.") == 2


async def test_urls_are_read_concurrently(site: Any, extractor: Any) -> None:
    """The server answers only when all three requests are in flight together."""
    urls = [site.url(f"/hold/{n}") for n in range(3)]
    result = await make_tool(extractor, CONCURRENT_URLS=3).visit(url=urls, goal="g")
    blocks = result.split("\n=======\n")
    assert [f"Held page {n} content." in block for n, block in enumerate(blocks)] == [
        True
    ] * 3


async def test_concurrency_is_capped(
    site: Any, extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    urls = [site.url(f"/track/{n}") for n in range(4)]
    site.max_active = 0
    # The first read waits for the second to arrive: no race with a busy machine.
    monkeypatch.setattr(site, "track_together", 2)
    result = await make_tool(extractor, CONCURRENT_URLS=2).visit(url=urls, goal="g")
    assert result.count("Tracked page") == 4
    assert site.max_active == 2


async def test_heavy_conversion_runs_off_the_event_loop(
    site: Any, extractor: Any
) -> None:
    in_server: list[Any] = []
    workers: list[int] = []
    original = vt._run_job

    async def job(worker: Any, raw: Any, max_tokens: int) -> Any:
        workers.append(worker.process.pid)
        return await original(worker, raw, max_tokens)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vt, "_html_to_text", lambda *a: in_server.append(a))
        patch.setattr(vt, "_run_job", job)
        result = await make_tool(extractor).visit(url=site.url("/article"), goal="g")
    assert "# Solar panel efficiency in 2024" in evidence_of(result)
    assert in_server == []  # not a thread of the server: a worker process
    assert len(workers) == 1
    assert workers[0] != os.getpid()


# -- Open WebUI's loader, in each version's shape -----------------------------------


def doc(text: str, title: str) -> Any:
    return SimpleNamespace(page_content=text, metadata={"source": "x", "title": title})


def loader_v06(calls: list) -> Any:
    def get_content_from_url(request: Any, url: str) -> tuple[str, list]:
        calls.append((request, url, threading.current_thread()))
        return "Loaded by 0.6 loader.", [doc("Loaded by 0.6 loader.", "Six")]

    return get_content_from_url


def loader_v011(calls: list) -> Any:
    async def get_content_from_url(request: Any, url: str) -> tuple[str, list]:
        calls.append((request, url, threading.current_thread()))
        return "Loaded by 0.11 loader.", [{"metadata": {"title": "Eleven"}}]

    return get_content_from_url


def loader_v012(calls: list) -> Any:
    async def get_content_from_url(
        request: Any, url: str, *, config: dict | None = None
    ) -> tuple[str, list]:
        calls.append((request, url, threading.current_thread()))
        return "Loaded by 0.12 loader.", [doc("Loaded by 0.12 loader.", "Twelve")]

    return get_content_from_url


@pytest.mark.parametrize(
    "shape",
    [
        (loader_v06, "Loaded by 0.6 loader.", "Six", True),
        (loader_v011, "Loaded by 0.11 loader.", "Eleven", False),
        (loader_v012, "Loaded by 0.12 loader.", "Twelve", False),
    ],
)
async def test_open_webui_loader_shapes(
    shape: tuple, site: Any, extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    factory, text, title, threaded = shape
    calls: list = []
    monkeypatch.setattr(vt, "_openwebui_content_loader", lambda: factory(calls))
    request = object()
    events = Events()
    url = site.url("/count/owui")
    before = site.hits("/count/owui")
    result = await make_tool(extractor, PAGE_LOADER="openwebui").visit(
        url=url, goal="g", __request__=request, __event_emitter__=events
    )
    assert text in evidence_of(result)
    assert [(c[0], c[1]) for c in calls] == [(request, url)]
    assert (calls[0][2] is not threading.main_thread()) is threaded
    assert site.hits("/count/owui") == before  # the built-in fetcher was not used
    assert events.sources()[0]["source"]["name"] == title


@pytest.mark.parametrize(
    "failure", [RuntimeError("loader engine down"), ("", []), ("   ", []), None]
)
async def test_open_webui_loader_falls_back_when_it_cannot_serve(
    failure: Any, site: Any, extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def loader(request: Any, url: str) -> Any:
        if isinstance(failure, Exception):
            raise failure
        return failure

    monkeypatch.setattr(vt, "_openwebui_content_loader", lambda: loader)
    # auto with a browser engine configured (0.6/0.8 shape of Open WebUI's config)
    playwright = SimpleNamespace(
        app=SimpleNamespace(
            state=SimpleNamespace(
                config=SimpleNamespace(WEB_LOADER_ENGINE="playwright")
            )
        )
    )
    result = await make_tool(extractor).visit(
        url=site.url("/plain"), goal="g", __request__=playwright
    )
    assert "Plain facts" in evidence_of(result)


async def test_open_webui_only_mode_does_not_fall_back(
    site: Any, extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def loader(request: Any, url: str) -> Any:
        raise RuntimeError("down")

    monkeypatch.setattr(vt, "_openwebui_content_loader", lambda: loader)
    before = site.hits("/count/only")
    result = await make_tool(extractor, PAGE_LOADER="openwebui").visit(
        url=site.url("/count/only"), goal="g", __request__=object()
    )
    assert is_failure(result)
    assert site.hits("/count/only") == before


async def test_builtin_mode_and_no_request_skip_open_webui(
    site: Any, extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list = []
    monkeypatch.setattr(vt, "_openwebui_content_loader", lambda: loader_v012(calls))
    tool = make_tool(extractor, PAGE_LOADER="builtin")
    assert "Plain facts" in await tool.visit(
        url=site.url("/plain"), goal="g", __request__=object()
    )
    tool = make_tool(extractor)
    assert "Plain facts" in await tool.visit(url=site.url("/plain"), goal="g")
    assert calls == []


async def test_open_webui_not_installed_means_builtin(
    site: Any, extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "open_webui", None)  # as if not installed
    assert vt._openwebui_content_loader() is None
    result = await make_tool(extractor).visit(
        url=site.url("/plain"), goal="g", __request__=object()
    )
    assert "Plain facts" in evidence_of(result)


async def test_open_webui_text_is_cut_to_the_budget(
    site: Any, extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def loader(request: Any, url: str) -> Any:
        return "word " * 50_000, []

    monkeypatch.setattr(vt, "_openwebui_content_loader", lambda: loader)
    tool = make_tool(extractor, MAX_PAGE_TOKENS=1000, PAGE_LOADER="openwebui")
    page = evidence_of(
        await tool.visit(url=site.url("/plain"), goal="g", __request__=object())
    )
    assert page.endswith("[Page truncated to fit the reading budget]")
    assert len(page) < 4500


async def test_url_timeout_covers_the_whole_visit(
    site: Any, extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def never(*_args: Any) -> Any:
        await asyncio.Event().wait()

    monkeypatch.setattr(vt, "_extract", never)
    events = Events()
    tool = make_tool(extractor, URL_TIMEOUT_SECONDS=0.3)
    result = await tool.visit(
        url=site.url("/plain"), goal="g", __event_emitter__=events
    )
    assert is_failure(result)
    assert "timed out" in events.descriptions()


# -- big bodies ----------------------------------------------------------------------


@pytest.mark.parametrize("cap", [10**8, 2_000_000, 999_999])
async def test_big_bodies_are_read_exactly(site: Any, cap: int) -> None:
    expected = site.huge_body
    client = vt._http_client(await vt._ssl_context(True), 30.0)
    async with client, client.stream("GET", site.url("/huge")) as response:
        body, cut = await vt._read_capped(response, cap)
    assert (body, cut) == (expected[:cap], cap < len(expected))


async def test_joining_megabytes_runs_in_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: list[threading.Thread] = []
    real_join = bytes.join

    def join(chunks: list[bytes]) -> bytes:
        threads.append(threading.current_thread())
        return real_join(b"", chunks)

    monkeypatch.setattr(vt, "_join_bytes", join)
    chunks = [bytes([n]) * 65536 for n in range(20)]  # 1.3 MB
    assert await vt._joined(chunks) == b"".join(chunks)
    assert await vt._joined(chunks[:2]) == b"".join(chunks[:2])
    assert len(threads) == 2
    assert threads[0] is not threading.main_thread()  # the big one
    assert threads[1] is threading.main_thread()  # 128 kB: not worth a thread
