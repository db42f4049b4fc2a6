"""SSRF safety of the visit tool.

Every refused form is checked twice: by `_check_url` directly, and through the
whole tool given a recording transport, a recording Open WebUI loader and a
stub resolver as its seams, so a missing check shows up as a recorded request
(no test ever sends a packet to a non-loopback address).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest

from tests.fakes.pages import (
    FAKE_PUBLIC_IP,
    FakeResolver,
    PageSite,
    RoutingTransport,
    load_visit_tool,
)

vt = load_visit_tool("visit_tool_safety_tests")

FAILURE_BLOCK = (
    "The useful information in {url} for user goal g as follows: \n\n"
    "Evidence in page: \n"
    "The provided webpage content could not be accessed. Please check the URL or "
    "file format.\n\n"
    "Summary: \n"
    "The webpage content could not be processed, and therefore, no information is "
    "available."
)

REFUSED_URLS = [
    "http://127.0.0.1/",
    "http://127.0.0.1:8080/admin",
    "http://localhost/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[64:ff9b::a00:1]/",
    "http://[2002:a00:1::1]/",
    "http://[fc00::1]/",
    "http://[fd12:3456::1]/",
    "http://[fe80::1]/",
    "http://[::]/",
    "http://[ff02::1]/",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.1/",
    "http://172.16.5.4/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",
    "http://0.0.0.0/",
    "http://224.0.0.1/",
    "http://240.0.0.1/",
    "http://255.255.255.255/",
    "http://2130706433/",
    "http://0x7f.1/",
    "http://0x7f000001/",
    "http://017700000001/",
    "http://127.1/",
    "http://0177.0.0.1/",
    "http://good.com@127.0.0.1/",
    "http://user:pass@news.example/",
    "http://127.0.0.1\\@news.example/",
    "http://news.example\t/",
    "ftp://news.example/file",
    "file:///etc/passwd",
    "gopher://news.example/",
    "javascript:alert(1)",
    "http://internal.example/",
    "http://mixed.example/",
    "http://metadata.example/",
    "http://nowhere.example/",
    "http:///path-only",
    "http://news.example:99999/",
    "http://[::1/",
    "http://news.example%2F@127.0.0.1/",
    "http://%31%32%37.0.0.1/",
]

RESOLVER_TABLE = {
    "localhost": ["127.0.0.1", "::1"],
    "news.example": [FAKE_PUBLIC_IP],
    "internal.example": ["10.0.0.1"],
    "mixed.example": [FAKE_PUBLIC_IP, "192.168.0.10"],
    "metadata.example": ["169.254.169.254"],
    "intranet.example": ["10.0.0.1"],
}


class RecordingLoader:
    """Stands in for Open WebUI's get_content_from_url; records calls."""

    def __init__(self, result: Any = ("Loaded by Open WebUI.", [])) -> None:
        self.calls: list[str] = []
        self.result = result

    async def __call__(self, request: Any, url: str, *, config: Any = None) -> Any:
        self.calls.append(url)
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


@pytest.fixture
def network() -> dict[str, Any]:
    """Resolver stub, recording transport and recording Open WebUI loader.

    `seams` holds them as the tool's seams (and a page cache of its own).
    """
    resolver = FakeResolver(dict(RESOLVER_TABLE))
    transport = RoutingTransport()
    loader = RecordingLoader()
    seams = vt._Seams(
        resolve=resolver,
        http_client=lambda verify, timeout: httpx.AsyncClient(
            transport=transport, timeout=timeout
        ),
        find_loader=lambda: loader,
        pages=vt._PageCache(),
    )
    return {
        "resolver": resolver,
        "transport": transport,
        "loader": loader,
        "seams": seams,
    }


def make_tool(network: dict[str, Any], **valves: Any) -> Any:
    tool = vt.Tools(seams=network["seams"])
    tool.valves = tool.Valves(**valves)
    return tool


async def check_url(network: dict[str, Any], url: str, allow_private: bool) -> Any:
    """`_check_url` with the stub resolver."""
    return await vt._check_url(url, allow_private, resolve=network["resolver"])


# -- _check_url -------------------------------------------------------------------


@pytest.mark.parametrize("url", REFUSED_URLS)
async def test_check_url_refuses(url: str, network: dict[str, Any]) -> None:
    with pytest.raises(vt._RefusedError):
        await check_url(network, url, allow_private=False)


@pytest.mark.parametrize(
    "host", ["2130706433", "0x7f.1", "0x7f000001", "017700000001", "127.1", "1.2.3"]
)
async def test_numeric_host_spellings_are_refused_before_any_lookup(
    host: str, network: dict[str, Any]
) -> None:
    with pytest.raises(vt._RefusedError, match="non-standard form"):
        await check_url(network, f"http://{host}/", allow_private=True)
    assert network["resolver"].calls == []


async def test_check_url_accepts_a_public_name_and_pins_its_address(
    network: dict[str, Any],
) -> None:
    target = await check_url(network, "HTTP://News.Example:8080/a/b?q=1#frag", False)
    assert target.ip == FAKE_PUBLIC_IP
    assert target.host == "news.example"
    assert target.port == 8080
    assert target.url == "http://news.example:8080/a/b?q=1"
    assert target.host_header == "news.example:8080"


async def test_check_url_accepts_public_ip_literals(network: dict[str, Any]) -> None:
    assert (await check_url(network, "http://8.8.8.8/", False)).ip == "8.8.8.8"
    v6 = await check_url(network, "https://[2606:4700:4700::1111]/", False)
    assert v6.ip == "2606:4700:4700::1111"
    assert v6.host_header == "[2606:4700:4700::1111]"
    # The IPv4 inside a mapped / NAT64 address decides.
    assert (await check_url(network, "http://[::ffff:8.8.8.8]/", False)).ip
    assert (await check_url(network, "http://[64:ff9b::808:808]/", False)).ip
    assert network["resolver"].calls == []  # literals are never looked up


async def test_allow_private_urls_opens_private_addresses_only(
    network: dict[str, Any],
) -> None:
    assert (await check_url(network, "http://10.0.0.1/x", True)).ip == "10.0.0.1"
    assert (await check_url(network, "http://localhost/", True)).ip == "127.0.0.1"
    for url in ("ftp://10.0.0.1/", "http://2130706433/", "http://a@10.0.0.1/"):
        with pytest.raises(vt._RefusedError):
            await check_url(network, url, True)


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "100.100.0.1", "169.254.1.1", "::1", "fe80::1",
     "fc00::1", "::ffff:10.0.0.1", "64:ff9b:1::1", "2001:db8::1", "fe80::1%1",
     "0.0.0.0", "not-an-ip"],
)  # fmt: skip
def test_is_public_refuses_non_global(address: str) -> None:
    assert vt._is_public(address) is False


@pytest.mark.parametrize("address", ["8.8.8.8", FAKE_PUBLIC_IP, "2606:4700::1111"])
def test_is_public_accepts_global(address: str) -> None:
    assert vt._is_public(address) is True


# -- through the tool: nothing leaves ----------------------------------------------


@pytest.mark.parametrize("loader", ["auto", "openwebui"])
@pytest.mark.parametrize("url", REFUSED_URLS)
async def test_visit_refused_urls_send_nothing(
    url: str, loader: str, network: dict[str, Any]
) -> None:
    events: list[dict] = []

    async def emit(event: dict) -> None:
        events.append(event)

    tool = make_tool(
        network, EXTRACTOR_BASE_URL="http://127.0.0.1:9/v1", PAGE_LOADER=loader
    )
    result = await tool.visit(
        url=[url], goal="g", __request__=object(), __event_emitter__=emit,
        __chat_id__="chat-safety",
    )  # fmt: skip
    assert result == FAILURE_BLOCK.format(url=url.strip())
    assert network["transport"].requests == []
    assert network["loader"].calls == []
    failures = [e for e in events if "Could not read" in e["data"]["description"]]
    assert failures
    assert "refused" in failures[0]["data"]["description"]


async def test_public_name_is_fetched_from_the_checked_address(
    network: dict[str, Any],
) -> None:
    """The control case: the same setup lets a public page through, pinned."""
    with PageSite() as site:
        url = f"http://news.example:{site.port}/plain"
        tool = make_tool(network, PAGE_LOADER="builtin")
        result = await tool.visit(url=[url], goal="g")
    transport = network["transport"]
    assert "Plain facts: water boils at 100 C." in result
    assert [r.url.host for r in transport.requests] == [FAKE_PUBLIC_IP]
    assert transport.requests[0].headers["host"] == f"news.example:{site.port}"
    assert transport.blocked == []


async def test_dns_rebinding_cannot_redirect_the_connection(
    network: dict[str, Any],
) -> None:
    """The name is resolved once; a second, private answer is never used."""
    calls: list[str] = []

    async def rebinding(host: str) -> list[str]:
        calls.append(host)
        return [FAKE_PUBLIC_IP] if len(calls) == 1 else ["127.0.0.1"]

    network["seams"] = replace(network["seams"], resolve=rebinding)
    with PageSite() as site:
        tool = make_tool(network, PAGE_LOADER="builtin")
        result = await tool.visit(
            url=f"http://rebind.example:{site.port}/plain", goal="g"
        )
    assert "Plain facts" in result
    assert calls == ["rebind.example"]
    assert [r.url.host for r in network["transport"].requests] == [FAKE_PUBLIC_IP]


@pytest.mark.parametrize(
    ("path", "refused_host"),
    [
        ("/redirect-private", "169.254.169.254"),
        ("/redirect-ten", "10.0.0.1"),
        ("/redirect-internal-name", "intranet.example"),
    ],
)
async def test_redirect_to_private_address_is_refused_at_the_hop(
    path: str, refused_host: str, network: dict[str, Any]
) -> None:
    events: list[dict] = []
    with PageSite() as site:
        url = f"http://news.example:{site.port}{path}"
        tool = make_tool(network, PAGE_LOADER="builtin")
        result = await tool.visit(url=[url], goal="g", __event_emitter__=events.append)
        assert site.hits(path) == 1  # the first hop really was served
    transport = network["transport"]
    assert result == FAILURE_BLOCK.format(url=url)
    assert [r.url.host for r in transport.requests] == [FAKE_PUBLIC_IP]
    assert transport.blocked == []
    reasons = " ".join(e["data"].get("description", "") for e in events)
    assert "refused" in reasons
    assert refused_host in reasons


async def test_https_connects_to_the_ip_with_sni_and_host_header(
    network: dict[str, Any],
) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200,
            headers={"Content-Type": "text/plain"},
            stream=httpx.ByteStream(b"secure text"),
        )

    network["resolver"].table["secure.example"] = [FAKE_PUBLIC_IP]
    network["seams"] = replace(
        network["seams"],
        http_client=lambda verify, timeout: httpx.AsyncClient(
            transport=httpx.MockTransport(handler)
        ),
    )
    result = await make_tool(network).visit(
        url="https://secure.example/page?x=1", goal="g"
    )
    assert "secure text" in result
    (request,) = seen
    assert request.url.host == FAKE_PUBLIC_IP
    assert request.url.scheme == "https"
    assert request.url.raw_path == b"/page?x=1"
    assert request.headers["host"] == "secure.example"
    assert request.extensions.get("sni_hostname") == "secure.example"


async def test_open_webui_refusal_is_final(network: dict[str, Any]) -> None:
    """validate_url saying no must not be retried through the built-in fetcher."""
    network["loader"].result = ValueError(
        "The URL you provided is invalid. Please double-check and try again."
    )
    with PageSite() as site:
        url = f"http://news.example:{site.port}/plain"
        tool = make_tool(network, PAGE_LOADER="openwebui")
        result = await tool.visit(url=[url], goal="g", __request__=object())
    assert result == FAILURE_BLOCK.format(url=url)
    assert network["loader"].calls == [url]
    assert network["transport"].requests == []


async def test_http_client_does_not_follow_redirects_or_use_env_proxies() -> None:
    client = vt._http_client(True, 5.0)
    try:
        assert client.follow_redirects is False
        assert client._trust_env is False
    finally:
        await client.aclose()
