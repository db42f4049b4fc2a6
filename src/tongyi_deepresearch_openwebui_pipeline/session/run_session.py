"""One way to open a research, for every front end and every kind of run.

The pipe (one chat turn) and the runner (one command, many questions) open a
`RunSession` the same way: the valves give the model server's settings, the
session's HTTP client carries the research and summary clients, the served
context sets the budgets. Each research then gets its plan (the reference
system prompt listing the tools that can run, the conversation, Heavy's
shape), its checkpointer (whose progress it keeps, and where) and its events
from here, whether it is single or Heavy, new or resumed. What stays with a
front end is what only it knows: the chat's messages and files, its tools'
context, and how the events are shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol

import httpx

from ..adapters.model_client import (
    ModelSettings,
    OpenAIModelClient,
    served_context_tokens,
    shared_ssl_context,
)
from ..adapters.openwebui.catalog import prompt_lines
from ..adapters.openwebui.valves import (
    BaseValves,
    check_settings,
    model_settings,
    research_limits,
    summary_settings,
)
from ..core.checkpoint import CheckpointStore
from ..core.events import ModelPort, RunEvent, ToolPort
from ..core.loop import Limits
from ..core.prompts import system_prompt_with
from ..core.sources import SourceLedger
from ..engine.checkpoints import Checkpointer, RunKey
from ..engine.citations import CitationCheck, with_citations_checked
from ..engine.runs import HeavySettings, RunPlan, research

#: Waits the given number of seconds (between a model server's retries).
Sleep = Callable[[float], Awaitable[None]]
#: A check of the session's HTTP client before any run (the runner's
#: "is a model server there?"); raises to refuse the session.
Check = Callable[[httpx.AsyncClient], Awaitable[None]]


class ModelClientFactory(Protocol):
    """Builds the client of one model endpoint.

    `OpenAIModelClient` is one: the session's HTTP client and sleep go to
    every client it builds, for the research, the summary and a chat's
    background tasks alike.
    """

    def __call__(
        self, settings: ModelSettings, http_client: httpx.AsyncClient, sleep: Sleep, /
    ) -> ModelPort:
        """A client of ``settings``' endpoint that sends through ``http_client``."""
        ...


class RunSession:
    """What the researches of one chat turn, or of one runner command, share."""

    def __init__(
        self,
        valves: BaseValves,
        http: httpx.AsyncClient,
        *,
        api_key: str,
        summary_key: str = "",
        served_context: int,
        today: dt.date,
        model_client: ModelClientFactory = OpenAIModelClient,
        sleep: Sleep = asyncio.sleep,
        checkpoints: CheckpointStore | None = None,
    ) -> None:
        """A session on ``http`` (the caller closes it).

        Args:
            valves: The pipe's valves, or the runner's settings as valves.
            http: Every model request of the session goes through it.
            api_key: The model server's key (decrypted; "" for none).
            summary_key: The summary endpoint's key, when it has its own.
            served_context: The context window the server reported (0:
                unknown); every budget is capped by it.
            today: The date the system prompt gives.
            model_client: Builds the research and summary clients.
            sleep: How those clients wait between retries.
            checkpoints: Where runs keep their progress (None: nowhere).
        """
        self.valves = valves
        self.http = http
        self.today = today
        self.checkpoints = checkpoints
        self.model_settings = model_settings(valves, api_key)
        self.model = model_client(self.model_settings, http, sleep)
        self.summarizer = model_client(
            summary_settings(valves, self.model_settings, summary_key), http, sleep
        )
        self.checker = model_client(
            check_settings(valves, self.model_settings, summary_key), http, sleep
        )
        self.limits = research_limits(valves, served_context)

    def plan(
        self,
        conversation: list[dict[str, Any]],
        tools: Iterable[str],
        *,
        heavy_rollouts: int = 0,
        extra_preamble: str = "",
        limits: Limits | None = None,
    ) -> RunPlan:
        """The plan of one research.

        Args:
            conversation: The chat without its system messages, the question
                last.
            tools: The names of the tools that can run (the prompt lists
                only those, in the reference order).
            heavy_rollouts: Rollouts of a Heavy run; 0 or 1: a single run.
            extra_preamble: What the chat's own system messages add after
                the valve's preamble.
            limits: This run's budgets, when lower than the session's (a
                user's own caps).
        """
        preamble = "\n\n".join(
            part
            for part in (self.valves.SYSTEM_PROMPT_PREAMBLE.strip(), extra_preamble)
            if part
        )
        system = system_prompt_with(prompt_lines(tools), self.today, preamble)
        return RunPlan(
            messages=[{"role": "system", "content": system}, *conversation],
            limits=limits or self.limits,
            today=self.today,
            heavy=self._heavy(heavy_rollouts),
        )

    def _heavy(self, rollouts: int) -> HeavySettings | None:
        if rollouts <= 1:
            return None
        valves = self.valves
        return HeavySettings(
            rollouts,
            valves.HEAVY_CONCURRENT_ROLLOUTS,
            partial_rollouts=valves.HEAVY_PARTIAL_ROLLOUTS,
            branch_steps=valves.HEAVY_BRANCH_STEPS,
        )

    def checkpointer(
        self, owner: str, run_id: str, question: str, *, heavy: bool = False
    ) -> Checkpointer | None:
        """Where one research keeps its progress: ``owner``'s run ``run_id``.

        None when the session has no store, the valve is off, or the run has
        no owner or id to be found again by (nothing is saved then).
        """
        valves = self.valves
        if self.checkpoints is None or not valves.RESUME_INTERRUPTED_RUNS:
            return None
        if not owner or not run_id:
            return None
        return Checkpointer(
            self.checkpoints,
            RunKey(owner, run_id, question, mode="heavy" if heavy else "single"),
            max_age_seconds=valves.CHECKPOINT_MAX_AGE_HOURS * 3600,
        )

    def research(
        self,
        plan: RunPlan,
        tools_for: Callable[[int], ToolPort],
        *,
        checkpointer: Checkpointer | None = None,
        ledger: SourceLedger | None = None,
        check_citations: bool = True,
    ) -> AsyncGenerator[RunEvent, None]:
        """The events of the research of ``plan``, ending with `RunFinished`.

        ``tools_for(k)`` gives rollout k of a Heavy run its tools (0: a single
        run's). With a ``checkpointer`` the run goes on from its saved
        progress, if any, and saves as it goes. The answer's citations are
        checked when the valve and ``check_citations`` both say so.
        """
        events = research(
            plan,
            self.model,
            tools_for,
            ledger if ledger is not None else SourceLedger(),
            self.summarizer,
            checkpointer=checkpointer,
        )
        valves = self.valves
        if not (valves.CITATION_CHECK and check_citations):
            return events
        check = CitationCheck(
            self.checker,
            max_statements=valves.CITATION_CHECK_MAX_STATEMENTS,
            max_seconds=valves.CITATION_CHECK_SECONDS,
        )
        limits = plan.limits
        # Within the run's own time: its limit and the wrap-up's grace.
        return with_citations_checked(
            events, check, limits.max_seconds + limits.wrap_up_seconds
        )


@contextlib.asynccontextmanager
async def open_session(
    valves: BaseValves,
    *,
    api_key: str,
    summary_key: str = "",
    user_agent: str,
    today: dt.date,
    model_client: ModelClientFactory = OpenAIModelClient,
    sleep: Sleep = asyncio.sleep,
    checkpoints: CheckpointStore | None = None,
    http_limits: httpx.Limits | None = None,
    check: Check | None = None,
) -> AsyncIterator[RunSession]:
    """A `RunSession` with its own HTTP client, closed on the way out.

    The served context is asked of the model server once (after ``check``,
    if given, accepted the server).
    """
    async with httpx.AsyncClient(
        verify=await shared_ssl_context(),
        headers={"User-Agent": user_agent},
        limits=http_limits or httpx.Limits(),
    ) as http:
        if check is not None:
            await check(http)
        served = await served_context_tokens(http, model_settings(valves, api_key))
        yield RunSession(
            valves,
            http,
            api_key=api_key,
            summary_key=summary_key,
            served_context=served,
            today=today,
            model_client=model_client,
            sleep=sleep,
            checkpoints=checkpoints,
        )
