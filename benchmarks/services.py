"""Fake model, search engine and web site, served from a child process.

The benchmarks measure the client side (the pipe and the tools). If the fake
servers ran as threads of the benchmark's own interpreter they would compete
for its GIL and blur every figure, so `Services` starts them in a child
process (``python -m benchmarks.services '<json config>'``): the child prints
one JSON line with the addresses and serves until its stdin closes. All
servers listen on 127.0.0.1 only.

The fake model (`BenchModel`, built on the test suite's `FakeOpenAI`) plays a
script chosen by a directive in the chat's first user message:

- ``bench:stream chunks=N``: one answer in N small chunks, pre-rendered and
  written in large blocks so the server is never the bottleneck;
- ``bench:rounds n=N``: N-1 rounds of thinking + a search call, then an answer;
- ``bench:chat token=T``: search for T, read a page about T, answer with T;
  a tool result that carries another chat's token is answered with
  ``CROSSTALK`` (the benchmark checks for it).

Requests that are not streamed and start with the visit tool's extractor
prompt get an extraction reply quoting the start of the page.
"""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.fakes.http import LocalServer, Request, Response
from tests.fakes.openai_server import FakeOpenAI, Reply, answer, tool_call

from tongyi_deepresearch_openwebui_pipeline.core.parallelmuse import (
    CONVERGE_SYSTEM_PROMPT,
)

from .documents import big_html, big_pdf

ROOT = Path(__file__).resolve().parents[1]
STREAM_CHUNK_CHARS = 4
_BLOCK = 64 * 1024
_DIRECTIVE = re.compile(r"bench:(\w+)((?:\s+\w+=\S+)*)")
_TOKEN = re.compile(r"tok\d{3}q")
_EXTRACTOR_PROMPT_START = "Please process the following webpage content"
_REASONING = (
    "The user wants a well sourced answer, so I should look at what the search "
    "results say about the topic, compare the figures of at least two sources, "
    "and check the dates of the reports before I trust any single number. "
) * 3


@dataclass
class Config:
    """What the child serves and how slowly."""

    search_latency: float = 0.0
    page_latency: float = 0.0
    extract_latency: float = 0.0
    chunk_delay: float = 0.0
    big_html_bytes: int = 0
    big_pdf_bytes: int = 0
    documents: dict[str, bytes] = field(default_factory=dict)


def _directive(body: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The scenario named in the first user message, with its parameters."""
    for message in body.get("messages") or []:
        if message.get("role") == "user":
            match = _DIRECTIVE.search(str(message.get("content", "")))
            if match:
                params = dict(p.split("=", 1) for p in match.group(2).split())
                return match.group(1), params
            break
    return "", {}


def _rounds_done(body: dict[str, Any]) -> int:
    return sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")


def stream_text(chunks: int) -> str:
    """The answer text of the streaming scenario (plain prose, no links)."""
    words = "the quick brown fox jumps over a lazy dog while it rains "
    size = chunks * STREAM_CHUNK_CHARS - len(answer(""))
    return (words * (size // len(words) + 1))[:size]


def rounds_reply(done: int, total: int) -> Reply:
    """Reply number `done` of the rounds scenario."""
    if done < total - 1:
        call = tool_call("search", {"query": [f"solar cell efficiency {done}"]})
        return Reply(reasoning=_REASONING, content=call)
    return Reply(reasoning=_REASONING, content=answer("Efficiency is 22.8 %."))


class BenchModel(FakeOpenAI):
    """`FakeOpenAI` playing the benchmark scenarios."""

    def __init__(self, config: Config, pages_url: str) -> None:
        """Serve `config`'s scenarios; chat visits go to `pages_url`."""
        super().__init__()
        self.config = config
        self.pages_url = pages_url
        self._rendered: dict[tuple[int, bool], list[bytes]] = {}
        self.respond_with(self._reply)
        self.server.routes["/v1/chat/completions"] = self._fast_chat

    def _fast_chat(self, request: Request) -> Response:
        if b"bench:stream" not in request.body:  # no second parse of big bodies
            return self._chat(request)
        body = request.json()
        kind, params = _directive(body)
        if kind != "stream" or not body.get("stream"):
            return self._chat(request)
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        key = (int(params["chunks"]), usage)
        if key not in self._rendered:
            reply = Reply(
                content=answer(stream_text(key[0])), chunk_size=STREAM_CHUNK_CHARS
            )
            data = b"".join(self._stream(reply, body))
            self._rendered[key] = [
                data[i : i + _BLOCK] for i in range(0, len(data), _BLOCK)
            ]
        return Response(
            200,
            {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
            iter(self._rendered[key]),
        )

    def _reply(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        first = str(messages[0].get("content", "")) if messages else ""
        if not body.get("stream") and first.startswith(_EXTRACTOR_PROMPT_START):
            return self._extraction(first)
        if first == CONVERGE_SYSTEM_PROMPT:  # a heavy run's report or integrate call
            request = str(messages[-1].get("content"))
            tokens = " ".join(sorted(set(_TOKEN.findall(request))))
            if request.startswith("Given the following problem-solving trajectory:"):
                found = f"The rollout found the answer for {tokens}."
                text = f"<report>\n{found}\n</report>"
            else:
                text = answer(f"The answer for {tokens} is ready.")
            return Reply(content=text, chunk_size=4, delay=self.config.chunk_delay)
        kind, params = _directive(body)
        if kind == "rounds":
            return rounds_reply(_rounds_done(body), int(params["n"]))
        if kind == "chat":
            return self._chat_turn(body, params["token"])
        return Reply(content=answer("No benchmark directive."))

    def _extraction(self, prompt: str) -> Reply:
        self.server.stopping.wait(self.config.extract_latency)
        start = prompt.find("Markdown Content:\n") + len("Markdown Content:\n")
        evidence = prompt[start : start + 300]
        reply = {"rational": "relevant", "evidence": evidence, "summary": "Read."}
        return Reply(content=json.dumps(reply))

    def _chat_turn(self, body: dict[str, Any], token: str) -> Reply:
        done = _rounds_done(body)
        last = str(body["messages"][-1].get("content", ""))
        delay = self.config.chunk_delay
        if done and set(_TOKEN.findall(last)) != {token}:
            return Reply(content=answer(f"CROSSTALK in {token}"))
        if done == 0:
            call = tool_call("search", {"query": [f"about {token}"]})
        elif done == 1:
            url = f"{self.pages_url}/page/{token}"
            call = tool_call("visit", {"url": [url], "goal": f"facts on {token}"})
        else:
            text = f"The answer for {token} is ready."
            return Reply(content=answer(text), chunk_size=4, delay=delay)
        # Token-sized chunks, `chunk_delay` apart: a model writing at a steady
        # pace (0.01 s per chunk is 100 tokens per second).
        return Reply(
            reasoning=f"Working on {token}. " * 6,
            content=call,
            chunk_size=4,
            delay=delay,
        )


def search_server(config: Config) -> LocalServer:
    """A SearXNG JSON endpoint that takes `search_latency` per query."""
    server = LocalServer()

    def search(request: Request) -> Response:
        query = request.query.get("q", [""])[0]
        server.stopping.wait(config.search_latency)
        slug = "-".join(query.split())
        results = [
            {
                "url": f"https://example.org/{slug}/{i}",
                "title": f"Result {i} for {query}",
                "content": f"Snippet {i} about {query}.",
                "score": 10 - i,
            }
            for i in range(1, 4)
        ]
        return Response.json({"query": query, "results": results})

    server.routes["/search"] = search
    return server


def pages_server(config: Config) -> LocalServer:
    """Pages that take `page_latency` to serve, and the two big documents."""
    server = LocalServer()

    def page(request: Request) -> Response:
        name = request.path.rsplit("/", 1)[-1]
        server.stopping.wait(config.page_latency)
        html = (
            f"<html><head><title>Page {name}</title></head><body><main>"
            f"<h1>About {name}</h1><p>Facts on {name}: the figure is 42.</p>"
            + "<p>Background paragraph with ordinary words.</p>" * 20
            + "</main></body></html>"
        )
        return Response.text(html, content_type="text/html")

    def document(content_type: str, name: str) -> Any:
        return lambda _request: Response(
            200, {"Content-Type": content_type}, config.documents[name]
        )

    def hits(_request: Request) -> Response:
        paths = [request.path for request in server.requests]
        return Response.json({path: paths.count(path) for path in set(paths)})

    server.routes["/page/"] = page
    server.routes["/hits"] = hits
    server.routes["/big.html"] = document("text/html; charset=utf-8", "html")
    server.routes["/big.pdf"] = document("application/pdf", "pdf")
    return server


def serve(config: Config) -> None:
    """Run every server until stdin closes (the parent ended or exited)."""
    # Real servers accept hundreds of pending connections; socketserver's
    # default backlog of 5 would refuse 50 chats connecting at once.
    ThreadingHTTPServer.request_queue_size = 512
    if config.big_html_bytes:
        config.documents["html"] = big_html(config.big_html_bytes)
    if config.big_pdf_bytes:
        config.documents["pdf"] = big_pdf(config.big_pdf_bytes)
    pages = pages_server(config).start()
    search = search_server(config).start()
    model = BenchModel(config, pages.base_url).__enter__()
    try:
        ready = {
            "model": model.base_url,
            "search": search.url("/search"),
            "pages": pages.base_url,
            "sizes": {name: len(data) for name, data in config.documents.items()},
        }
        print(json.dumps(ready), flush=True)
        sys.stdin.read()
    finally:
        model.__exit__(None, None, None)
        search.stop()
        pages.stop()


class Services:
    """Parent side: start the child, read its addresses, stop it on exit."""

    def __init__(self, **config: Any) -> None:
        """Keep the `Config` fields for the child."""
        self.config = config
        self.info: dict[str, Any] = {}
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Services:
        """Start the child and wait (bounded) for its ready line."""
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.services", json.dumps(self.config)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        readable, _, _ = select.select([self._process.stdout], [], [], 120)
        line = self._process.stdout.readline() if readable else ""
        if not line:
            self.__exit__()
            raise RuntimeError("the fake services did not start")
        self.info = json.loads(line)
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the child's stdin (it stops its servers); kill it if it lingers."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()

    @property
    def model_url(self) -> str:
        """OpenAI base URL of the fake model (ends in /v1)."""
        return self.info["model"]

    @property
    def search_url(self) -> str:
        """SearXNG search URL (for the search tool's SEARXNG_URL valve)."""
        return self.info["search"]

    @property
    def pages_url(self) -> str:
        """Base URL of the fake web site."""
        return self.info["pages"]


if __name__ == "__main__":
    serve(Config(**json.loads(sys.argv[1])))
