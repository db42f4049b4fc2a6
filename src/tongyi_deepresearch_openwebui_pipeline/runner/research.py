"""Research runs without Open WebUI: the run session wired to the tool modules.

A `Researcher` holds what the runs of one command share: a `RunSession`
(the HTTP client, the model and summary clients, the served context and
budgets, the checkpoint store, opened as the pipe opens its own) and the
tool classes with their valves. It runs one question at a time or many at
once; each run gets its plan, checkpointer and events from the session, as
a chat's run does in the pipe.

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
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import ValidationError

from .. import __version__
from ..adapters.openwebui.catalog import CATALOG
from ..adapters.openwebui.toolbox import Toolbox, ToolContext, ToolResolver
from ..adapters.openwebui.tooldef import ToolDef
from ..adapters.openwebui.valves import (
    model_settings,
    shared_endpoints,
)
from ..core.checkpoint import CheckpointStore
from ..core.events import (
    RolloutEvent,
    RunEvent,
    RunFinished,
    RunResumed,
    ToolCallFinished,
    WrappingUp,
)
from ..core.loop import Limits
from ..core.sources import Paper
from ..engine.runs import RunPlan
from ..session.run_session import RunSession, open_session
from .render import ToolStatus, plural
from .results import Outcome
from .settings import ENV_PREFIX, Settings, flag_of
from .wording import in_runner_words, runner_text

#: What a run reports as it goes: the engine's events and the tools' statuses.
EventSink = Callable[[RunEvent | ToolStatus], None]
#: Whose checkpoints the runner keeps (the runner has one user: its own).
RUNNER_OWNER = "runner"
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


def tool_valves(
    settings: Settings, catalog: Sequence[ToolDef] = CATALOG
) -> dict[str, dict[str, Any]]:
    """Each tool module's valves outside Open WebUI (config tables win).

    What each tool takes from the runner is in its definition
    (`ToolModule.runner`): fixed values, and the runner settings of the
    valves' own names.
    """
    options = settings.options
    base: dict[str, dict[str, Any]] = {}
    for tool in catalog:
        if tool.module is None:
            continue
        runner = tool.module.runner
        values = dict(runner.fixed)
        values |= {name: getattr(options, name) for name in runner.settings}
        if values:
            base[tool.name] = values
    for name, table in settings.tool_valves.items():
        base.setdefault(name, {}).update(table)
    return base


def check_tool_settings(
    settings: Settings, catalog: Sequence[ToolDef] = CATALOG
) -> None:
    """Fail clearly when a tool is on but a setting it needs is empty.

    Raises:
        RunnerError: A tool that is offered lacks its required setting (search:
            no SearXNG URL), or ``--tools`` names one that is switched off.
    """
    for name in settings.tool_choice().switched_off:
        switch = next(tool.valve for tool in CATALOG if tool.name == name)
        raise RunnerError(
            f"--tools names {name}, which {switch}=false switches off", code=2
        )
    valves = tool_valves(settings, catalog)
    for tool in catalog:
        required = tool.module.runner.required if tool.module else None
        if required is None or not settings.enabled(tool.valve):
            continue
        if str(valves.get(tool.name, {}).get(required.setting) or "").strip():
            continue
        name = required.setting
        raise RunnerError(
            f"{required.problem}: set {name} ({flag_of(name)}, {ENV_PREFIX}{name} "
            f"or {name} in the config file) to {required.wanted}, or "
            f"{tool.valve}=false to research without {required.without}",
            code=2,
        )


@dataclass(frozen=True)
class _Tools:
    """The tool classes of this runner and their valves."""

    classes: Mapping[str, type]
    valves: Mapping[str, Mapping[str, Any]]


async def _resolve_tools(
    settings: Settings, catalog: Sequence[ToolDef] = CATALOG
) -> _Tools:
    resolver = ToolResolver()
    classes: dict[str, type] = {}
    valves: dict[str, dict[str, Any]] = {}
    wanted = tool_valves(settings, catalog)
    for tool in catalog:
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

    def __init__(self, settings: Settings, session: RunSession, tools: _Tools) -> None:
        """Run each question in ``session`` (the caller closes it)."""
        self.settings = settings
        self.session = session
        self.tools = tools

    @property
    def limits(self) -> Limits:
        """The budgets of every run (the valves, within the served context)."""
        return self.session.limits

    def toolbox(self, sink: EventSink | None, rollout: int = 0) -> Toolbox:
        """The tools of one run (a rollout's statuses name it)."""
        valves = self.settings.valves
        context = ToolContext(
            chat_id=f"runner-{uuid.uuid4().hex}",
            emitter=_status_relay(sink, rollout) if sink else None,
            shared_endpoints=shared_endpoints(valves, self.settings.api_key),
        )
        return Toolbox(
            self.tools.classes,
            context,
            admin_valves=self.tools.valves,
            timeout_seconds=valves.TOOL_TIMEOUT_SECONDS,
        )

    def plan(self, question: str, heavy: int = 0) -> RunPlan:
        """The plan of one research of `question` (`heavy` rollouts, 0: single)."""
        conversation = [{"role": "user", "content": question}]
        return self.session.plan(conversation, self.tools.classes, heavy_rollouts=heavy)

    async def run(
        self,
        question: str,
        *,
        heavy: int = 0,
        sink: EventSink | None = None,
        run_id: str = "",
    ) -> Outcome:
        """Research `question`; every event goes to `sink` as it happens.

        With a checkpoint store in the session, the run saves its progress
        there under `run_id` as it goes, and goes on from what an interrupted
        run of the same question left there.
        """
        plan = self.plan(question, heavy)
        started = time.monotonic()
        keeper = self.session.checkpointer(
            RUNNER_OWNER, run_id, question, heavy=plan.heavy is not None
        )
        shared_chat = self.toolbox(sink)

        def tools_for(rollout: int) -> Toolbox:
            if not rollout or sink is None:
                return shared_chat
            return shared_chat.with_emitter(_status_relay(sink, rollout))

        events = self.session.research(plan, tools_for, checkpointer=keeper)
        finished: RunFinished | None = None
        wrapped_up = ""
        papers: dict[str, Paper] = {}
        async with contextlib.aclosing(events):
            async for event in events:
                event = in_runner_words(event)  # noqa: PLW2901  (said our way)
                called = event.event if isinstance(event, RolloutEvent) else event
                # A resumed run's papers were found before the interruption.
                if isinstance(called, ToolCallFinished | RunResumed):
                    papers.update((p.url, p) for p in called.papers)
                if isinstance(event, RunFinished):
                    finished = event
                elif isinstance(event, WrappingUp):
                    # The run's own (or the synthesis's) wrap-up, not a
                    # rollout's: it says which budget the ending came from.
                    wrapped_up = event.reason
                if sink is not None:
                    sink(event)
        if finished is None:  # pragma: no cover - the engine always ends so
            raise RuntimeError("the run ended without RunFinished")
        return Outcome(
            question=question,
            finished=finished,
            messages=_messages(finished, plan),
            seconds=time.monotonic() - started,
            wrapped_up=wrapped_up,
            papers=tuple(papers.values()),
        )


def _messages(finished: RunFinished, plan: RunPlan) -> list[dict[str, Any]]:
    """What a record keeps of the run's messages (see `Outcome.messages`).

    A single run's whole trajectory, across consolidations; a heavy run's
    plan and its answer.
    """
    if plan.heavy is None and finished.trajectory:
        return list(finished.trajectory)
    messages = list(plan.messages)
    if finished.answer:
        messages.append(
            {"role": "assistant", "content": f"<answer>{finished.answer}</answer>"}
        )
    return messages


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
    settings: Settings,
    today: dt.date | None = None,
    *,
    checkpoints: CheckpointStore | None = None,
) -> AsyncIterator[Researcher]:
    """A `Researcher` whose model server answers and whose tools can run.

    With ``checkpoints``, every run keeps its progress there.

    Raises:
        RunnerError: No search engine, no model server, or a bad tool valve.
    """
    check_tool_settings(settings)
    tools = await _resolve_tools(settings)

    async def server_answers(http: httpx.AsyncClient) -> None:
        await check_model_server(http, settings)

    async with open_session(
        settings.valves,
        api_key=settings.api_key,
        summary_key=settings.summary_key,
        user_agent=f"tongyi-deepresearch-runner/{__version__}",
        today=today or dt.datetime.now(dt.UTC).date(),
        checkpoints=checkpoints,
        # A batch runs many questions at once on one client.
        http_limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        check=server_answers,
    ) as session:
        yield Researcher(settings, session, tools)
