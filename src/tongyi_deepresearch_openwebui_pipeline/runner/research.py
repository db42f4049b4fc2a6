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
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import ValidationError

from .. import __version__
from ..adapters.model_client import (
    OpenAIModelClient,
    served_context_tokens,
    shared_ssl_context,
)
from ..adapters.openwebui.catalog import CATALOG, prompt_lines
from ..adapters.openwebui.toolbox import Toolbox, ToolContext, ToolResolver
from ..adapters.openwebui.tooldef import ToolDef
from ..adapters.openwebui.valves import (
    model_settings,
    research_limits,
    shared_endpoints,
    summary_settings,
)
from ..core.checkpoint import CheckpointStore
from ..core.events import RunEvent, RunFinished, WrappingUp
from ..core.loop import RunState
from ..core.prompts import system_prompt_with
from ..core.sources import SourceLedger
from ..engine.checkpoints import Checkpointer, RunKey
from ..engine.runs import HeavySettings, RunPlan, research, single_run
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
            no SearXNG URL).
    """
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
        valves = self.settings.valves
        system = system_prompt_with(
            prompt_lines(self.tools.classes),
            self.today,
            valves.SYSTEM_PROMPT_PREAMBLE.strip(),
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
        self,
        question: str,
        *,
        heavy: int = 0,
        sink: EventSink | None = None,
        checkpoints: CheckpointStore | None = None,
        run_id: str = "",
    ) -> Outcome:
        """Research `question`; every event goes to `sink` as it happens.

        With `checkpoints`, a single run saves its progress there under
        `run_id` after every round and goes on from what an interrupted run
        of the same question left there.
        """
        plan = self.plan(question, heavy)
        ledger = SourceLedger()
        started = time.monotonic()
        state: RunState | None = None
        base = self.toolbox(sink)
        if plan.heavy is None:
            max_age = self.settings.valves.CHECKPOINT_MAX_AGE_HOURS * 3600
            keeper = (
                Checkpointer(
                    checkpoints,
                    RunKey(RUNNER_OWNER, run_id, question),
                    max_age_seconds=max_age,
                )
                if checkpoints is not None
                else None
            )
            if keeper is not None:
                state, resuming = await keeper.starting_state(plan.messages, ledger)
            else:
                state = RunState(messages=list(plan.messages), started=started)
                resuming = False
            events = single_run(
                state,
                self.model,
                base,
                plan.limits,
                ledger,
                summarizer=self.summarizer,
                checkpointer=keeper,
                resuming=resuming,
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
                    finished = event
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
    check_tool_settings(settings)
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
