"""HTTPS with the shared TLS context: pinned connections still send SNI and check
the certificate against the real host name, and no call builds a new context.

A real TLS server runs on 127.0.0.1 with a certificate from a throw-away CA; a
stub resolver maps made-up names to 127.0.0.1, so nothing leaves the machine.
The tool is given both as its seams, with TLS contexts of its own whose
verifying one trusts that CA.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.pages import (
    FakeResolver,
    TlsPageSite,
    load_visit_tool,
    make_certificates,
)

pytest.importorskip("cryptography")  # make_certificates needs it

vt = load_visit_tool("visit_tool_tls_tests")

HOST = "secure.example"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return make_certificates(tmp_path_factory.mktemp("tls"), HOST)


@pytest.fixture
def site(certificates: tuple[Path, Path, Path]) -> Iterator[TlsPageSite]:
    _ca, cert, key = certificates
    with TlsPageSite(cert, key) as running:
        yield running


@pytest.fixture
def seams(certificates: tuple[Path, Path, Path]) -> Any:
    """A stub resolver, and TLS contexts whose verifying one trusts the test CA."""
    ca = str(certificates[0])

    def create(verify: bool) -> ssl.SSLContext:
        if verify:  # the test CA instead of the system's CAs
            return ssl.create_default_context(cafile=ca)
        return httpx.create_ssl_context(verify=False)

    resolver = FakeResolver({HOST: ["127.0.0.1"], "other.example": ["127.0.0.1"]})
    return vt._Seams(resolve=resolver, tls=vt._TlsContexts(create))


def make_tool(seams: Any, **valves: Any) -> Any:
    tool = vt.Tools(seams=seams)
    tool.valves = tool.Valves(ALLOW_PRIVATE_URLS=True, PAGE_LOADER="builtin", **valves)
    return tool


async def test_pinned_https_sends_sni_and_the_host_header(
    site: TlsPageSite, seams: Any
) -> None:
    urls = [f"https://{HOST}:{site.port}/article", f"https://{HOST}:{site.port}/plain"]
    result = await make_tool(seams).visit(url=urls, goal="g")
    assert "Modern panels reach 22.8% efficiency" in result
    assert "Plain facts: water boils at 100 C." in result
    assert site.server_names == [HOST, HOST]  # one handshake per page, real name
    hosts = {request.headers["host"] for request in site.server.requests}
    assert hosts == {f"{HOST}:{site.port}"}


async def test_the_certificate_is_still_checked_against_the_host_name(
    site: TlsPageSite, seams: Any
) -> None:
    url = f"https://other.example:{site.port}/article"
    statuses: list[str] = []

    async def emitter(event: dict) -> None:
        statuses.append(event["data"].get("description", ""))

    result = await make_tool(seams).visit(
        url=[url], goal="g", __event_emitter__=emitter
    )
    assert vt.FAILURE_EVIDENCE in result
    assert f"Could not read {url}: network error (ConnectError)" in statuses
    assert site.server_names == ["other.example"]
    assert site.server.requests == []  # no request after a failed check


async def test_verify_ssl_off_reads_the_page_and_still_sends_sni(
    site: TlsPageSite, seams: Any
) -> None:
    url = f"https://other.example:{site.port}/article"
    result = await make_tool(seams, VERIFY_SSL=False).visit(url=[url], goal="g")
    assert "Modern panels reach 22.8% efficiency" in result
    assert site.server_names == ["other.example"]
    (unverified,) = seams.tls  # the only context this call needed
    assert seams.tls[False] is unverified
    assert unverified.verify_mode == ssl.CERT_NONE
    assert unverified.check_hostname is False


async def test_no_call_builds_a_tls_context(
    site: TlsPageSite, seams: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"https://{HOST}:{site.port}/article"
    for verify in (True, False):  # each context is built once, by a first call
        await make_tool(seams, VERIFY_SSL=verify).visit(url=[url], goal="warm up")
    built: list[tuple[Any, ...]] = []
    original = ssl.SSLContext.__new__

    def counting(cls: type, *args: Any, **kwargs: Any) -> Any:
        built.append(args)
        return original(cls, *args, **kwargs)

    # Every TLS context, verifying or not, is an ssl.SSLContext.
    monkeypatch.setattr(ssl.SSLContext, "__new__", staticmethod(counting))
    for verify in (True, False, True):
        result = await make_tool(seams, VERIFY_SSL=verify).visit(url=[url], goal="g")
        assert "Modern panels reach" in result
    assert built == []
    ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    assert len(built) == 1  # the counter does count


async def test_the_tool_uses_the_process_contexts_unless_given_others() -> None:
    # Every call shares the process's contexts (`_ssl_context` builds each
    # once, off the event loop: tests/test_tool_shared_snippets.py).
    assert vt._Seams().tls is vt._SSL_CONTEXTS
    assert isinstance(vt._SSL_CONTEXTS, vt._TlsContexts)
