"""Research runs without Open WebUI: the engine wired to a model server and tools.

A `Researcher` holds what the runs of one command share (the HTTP client,
the model and summary clients, the served context, the tool classes and
their valves) and runs one question at a time or many at once. Each run
builds the `RunPlan` the pipe builds (reference system prompt with the tools
that can run, `Limits` from the same valves) and calls `engine.runs`:
`single_run` for one rollout (so the final conversation is kept for the
record), `research` with `HeavySettings` for a heavy run.

The tools are the package's tool modules, run through the pipe's `Toolbox`
with no Open WebUI request: search and the scholar tool's web fallback go to
SearXNG (``SEARXNG_URL``), visit reads with its built-in fetcher and all its
safety rules (private addresses only with ``ALLOW_PRIVATE_URLS``), and its
extractor is the research model's endpoint, as in the pipe
(`SharedEndpoint`). Code execution and files need Open WebUI and are not
offered.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import httpx
from pydantic import ValidationError

from .. import __version__
from ..adapters.model_client import (
    OpenAIModelClient,
    served_context_tokens,
    shared_ssl_context,
)
from ..adapters.openwebui.catalog import CATALOG
from ..adapters.openwebui.toolbox import Toolbox, ToolContext, ToolResolver
from ..adapters.openwebui.valves import (
    extractor_endpoint,
    model_settings,
    research_limits,
    summary_settings,
)
from ..core.events import RunEvent, RunFinished, WrappingUp
from ..core.loop import RunState
from ..core.prompts import system_prompt_with
from ..core.sources import SourceLedger
from ..engine.runs import HeavySettings, RunPlan, research, single_run
from .render import ToolStatus, plural
from .results import Outcome
from .settings import Settings
from .wording import in_runner_words, runner_text

#: What a run reports as it goes: the engine's events and the tools' statuses.
EventSink = Callable[[RunEvent | ToolStatus], None]
#: Longest the check for a reachable model server may take.
CHECK_SECONDS = 15.0


class RunnerError(Exception):
    """The runner cannot start; the message is one line, written for the user.

    `code` is the exit status: 2 for settings, 1 for everything else.
    """

    def __init__(self, message: str, code: int = 1) -> None:
        """Keep the message and the exit status."""
        super().__init__(message)
        self.code = code


def _tool_valves(settings: Settings) -> dict[str, dict[str, Any]]:
    """Each tool module's valves outside Open WebUI (config tables win)."""
    searxng = settings.options.SEARXNG_URL
    base: dict[str, dict[str, Any]] = {
        "search": {"SEARXNG_URL": searxng},
        "google_scholar": {"SEARXNG_URL": searxng},
        "visit": {
            "PAGE_LOADER": "builtin",
            "ALLOW_PRIVATE_URLS": settings.options.ALLOW_PRIVATE_URLS,
        },
    }
    for name, table in settings.tool_valves.items():
        base.setdefault(name, {}).update(table)
    return base


def check_search(settings: Settings) -> None:
    """Fail clearly when search is on but no search engine is configured.

    Raises:
        RunnerError: Search is offered and no SearXNG URL is set.
    """
    if not settings.enabled("SEARCH_ENABLED"):
        return
    if str(_tool_valves(settings)["search"].get("SEARXNG_URL") or "").strip():
        return
    raise RunnerError(
        "no search engine configured: set SEARXNG_URL (--searxng-url, "
        "TDR_SEARXNG_URL or SEARXNG_URL in the config file) to a SearXNG "
        "search URL with the JSON format enabled, or SEARCH_ENABLED=false "
        "to research without web search",
        code=2,
    )


@dataclass(frozen=True)
class _Tools:
    """The tool classes of this runner and their valves."""

    classes: Mapping[str, type]
    valves: Mapping[str, Mapping[str, Any]]


async def _resolve_tools(settings: Settings) -> _Tools:
    resolver = ToolResolver()
    classes: dict[str, type] = {}
    valves: dict[str, dict[str, Any]] = {}
    wanted = _tool_valves(settings)
    for tool in CATALOG:
        if tool.module is None or not settings.enabled(tool.valve):
            continue
        cls = await resolver.resolve(tool.module)
        if cls is None:
            continue
        values = {
            key: value
            for key, value in wanted.get(tool.name, {}).items()
            if key in cls.Valves.model_fields
        }
        unknown = set(settings.tool_valves.get(tool.name, {})) - set(
            cls.Valves.model_fields
        )
        if unknown:
            raise RunnerError(
                f"[tools.{tool.name}]: unknown valve {sorted(unknown)[0]}", code=2
            )
        try:
            cls.Valves(**values)
        except ValidationError as error:
            problem = error.errors()[0]
            name = ".".join(str(part) for part in problem["loc"])
            raise RunnerError(
                f"[tools.{tool.name}] {name}: {problem['msg']}", code=2
            ) from None
        classes[tool.name] = cls
        valves[tool.name] = values
    return _Tools(classes, valves)


class Researcher:
    """Runs questions against one model server with one set of tools."""

    def __init__(
        self,
        settings: Settings,
        http: httpx.AsyncClient,
        tools: _Tools,
        served_context: int,
        today: dt.date,
    ) -> None:
        """Use `http` for every model request (the caller closes it)."""
        self.settings = settings
        valves = settings.valves
        self.model_settings = model_settings(valves, settings.api_key)
        self.model = OpenAIModelClient(self.model_settings, http)
        self.summarizer = OpenAIModelClient(
            summary_settings(valves, self.model_settings, settings.summary_key),
            http,
        )
        self.tools = tools
        self.today = today
        self.limits = research_limits(valves, served_context)

    def toolbox(self, sink: EventSink | None, rollout: int = 0) -> Toolbox:
        """The tools of one run (a rollout's statuses name it)."""
        valves = self.settings.valves
        context = ToolContext(
            chat_id=f"runner-{uuid.uuid4().hex}",
            emitter=_status_relay(sink, rollout) if sink else None,
            shared_endpoints={
                "visit": extractor_endpoint(valves, self.settings.api_key)
            },
        )
        return Toolbox(
            self.tools.classes,
            context,
            admin_valves=self.tools.valves,
            timeout_seconds=valves.TOOL_TIMEOUT_SECONDS,
        )

    def plan(self, question: str, heavy: int = 0) -> RunPlan:
        """The plan of one research of `question` (`heavy` rollouts, 0: single)."""
        valves = self.settings.valves
        lines = [
            tool.prompt_line for tool in CATALOG if tool.name in self.tools.classes
        ]
        system = system_prompt_with(
            lines, self.today, valves.SYSTEM_PROMPT_PREAMBLE.strip()
        )
        return RunPlan(
            messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            limits=self.limits,
            today=self.today,
            heavy=(
                HeavySettings(
                    heavy,
                    min(heavy, valves.HEAVY_CONCURRENT_ROLLOUTS),
                    partial_rollouts=valves.HEAVY_PARTIAL_ROLLOUTS,
                    branch_steps=valves.HEAVY_BRANCH_STEPS,
                )
                if heavy > 1
                else None
            ),
        )

    async def run(
        self, question: str, *, heavy: int = 0, sink: EventSink | None = None
    ) -> Outcome:
        """Research `question`; every event goes to `sink` as it happens."""
        plan = self.plan(question, heavy)
        ledger = SourceLedger()
        started = time.monotonic()
        state: RunState | None = None
        base = self.toolbox(sink)
        if plan.heavy is None:
            state = RunState(messages=list(plan.messages), started=started)
            events = single_run(
                state, self.model, base, plan.limits, ledger, summarizer=self.summarizer
            )
        else:
            shared_chat = base

            def tools_for(rollout: int) -> Toolbox:
                if not rollout or sink is None:
                    return shared_chat
                return shared_chat.with_emitter(_status_relay(sink, rollout))

            events = research(plan, self.model, tools_for, ledger, self.summarizer)
        finished: RunFinished | None = None
        wrapped_up = ""
        async with contextlib.aclosing(events):
            async for event in events:
                event = in_runner_words(event)  # noqa: PLW2901  (said our way)
                if isinstance(event, RunFinished):
                    # A heavy run's synthesis ends without the run's sources.
                    event = finished = _with_run_sources(event, ledger)  # noqa: PLW2901
                elif isinstance(event, WrappingUp):
                    # The run's own (or the synthesis's) wrap-up, not a
                    # rollout's: it says which budget the ending came from.
                    wrapped_up = event.reason
                if sink is not None:
                    sink(event)
        if finished is None:  # pragma: no cover - the engine always ends so
            raise RuntimeError("the run ended without RunFinished")
        messages = _messages(finished, state, plan)
        if state is None and finished.answer:
            messages.append(
                {"role": "assistant", "content": f"<answer>{finished.answer}</answer>"}
            )
        return Outcome(
            question=question,
            finished=finished,
            messages=messages,
            ledger=ledger,
            seconds=time.monotonic() - started,
            wrapped_up=wrapped_up,
        )


def _messages(
    finished: RunFinished, state: RunState | None, plan: RunPlan
) -> list[dict[str, Any]]:
    """What a record keeps of the run's messages (see `Outcome.messages`).

    A single run's whole trajectory, across consolidations (the
    conversation as last sent if the run gives none); a heavy run's plan.
    """
    if state is None:
        return list(plan.messages)
    return list(finished.trajectory) or list(state.messages)


def _with_run_sources(finished: RunFinished, ledger: SourceLedger) -> RunFinished:
    """`finished` carrying the run's sources (a heavy run's ends without them)."""
    if finished.sources or not ledger.sources:
        return finished
    return replace(finished, sources=tuple(ledger.sources))


def _status_relay(sink: EventSink, rollout: int) -> Any:
    """A tool ``__event_emitter__`` that passes its status lines to `sink`."""

    async def relay(event: dict[str, Any]) -> None:
        data = event.get("data") or {}
        if event.get("type") != "status" or not isinstance(data, dict):
            return
        text = data.get("description")
        urls = data.get("urls")
        if data.get("action") == "web_search" and isinstance(urls, list):
            # Open WebUI fills "{{count}}" in the chat; a terminal gets it said.
            text = f"{plural(len(urls), 'result')} for {data.get('query') or 'it'}"
        if isinstance(text, str) and text.strip():
            sink(ToolStatus(runner_text(text.strip()), rollout))

    return relay


async def check_model_server(http: httpx.AsyncClient, settings: Settings) -> None:
    """Fail clearly when no model server answers at ``API_BASE_URL``.

    Any HTTP answer counts as reachable (some servers have no ``/models``),
    except a refused key.

    Raises:
        RunnerError: Nothing answers, or the server refuses the key.
    """
    model = model_settings(settings.valves, settings.api_key)
    where = model.public_base_url
    try:
        response = await http.get(
            model.models_url,
            headers=model.auth_headers(),
            timeout=httpx.Timeout(CHECK_SECONDS),
        )
    except httpx.TimeoutException:
        raise RunnerError(
            f"no model server reachable at {where} (API_BASE_URL): it did not "
            f"answer within {CHECK_SECONDS:.0f} s"
        ) from None
    except httpx.TransportError as error:
        reason = type(error).__name__
        raise RunnerError(
            f"no model server reachable at {where} (API_BASE_URL): {reason}. "
            "Start it, or point --api-base-url / TDR_API_BASE_URL at it"
        ) from None
    if response.status_code in (401, 403):
        raise RunnerError(
            f"the model server at {where} refused the request (HTTP "
            f"{response.status_code}): set API_KEY (TDR_API_KEY or --api-key)"
        )


@contextlib.asynccontextmanager
async def open_researcher(
    settings: Settings, today: dt.date | None = None
) -> AsyncIterator[Researcher]:
    """A `Researcher` whose model server answers and whose tools can run.

    Raises:
        RunnerError: No search engine, no model server, or a bad tool valve.
    """
    check_search(settings)
    tools = await _resolve_tools(settings)
    async with httpx.AsyncClient(
        verify=await shared_ssl_context(),
        headers={"User-Agent": f"tongyi-deepresearch-runner/{__version__}"},
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
    ) as http:
        await check_model_server(http, settings)
        model = model_settings(settings.valves, settings.api_key)
        served = await served_context_tokens(http, model)
        yield Researcher(
            settings, http, tools, served, today or dt.datetime.now(dt.UTC).date()
        )
