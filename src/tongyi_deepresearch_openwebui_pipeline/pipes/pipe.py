"""The Open WebUI pipe: Tongyi DeepResearch's ReAct loop inside a chat.

Open WebUI keeps ONE instance of `Pipe` for every chat and user, so nothing
about a request is ever stored on ``self``: each call to `Pipe.pipe` builds its
own run (messages, sources, renderer, HTTP client) and drops it at the end.
The research itself is the pure `ResearchLoop`; this module only wires it to
Open WebUI's arguments, the model server and the tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import traceback
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from .. import __version__
from ..adapters import secrets
from ..adapters.model_client import OpenAIModelClient, shared_ssl_context
from ..adapters.openwebui import compat, durable
from ..adapters.openwebui import valves as shared_valves
from ..adapters.openwebui.catalog import (
    CATALOG,
    ChatFacts,
    ToolDef,
    choice_notes,
    choose_tools,
    question_note,
    selected_ids,
)
from ..adapters.openwebui.continuation import (
    LETTING_GO_SECONDS,
    Continuer,
    HeldRun,
    MessageWriter,
)
from ..adapters.openwebui.emitter import EventRelay, SafeEmitter
from ..adapters.openwebui.files import context_handover, web_results_note
from ..adapters.openwebui.host import ChatHost, OpenWebUIHost
from ..adapters.openwebui.registry import (
    registry_tool_valves,
    schedule_auto_install,
)
from ..adapters.openwebui.render import (
    ChatRenderer,
    Display,
    Exports,
    HeavyRenderer,
    ReasoningSplitter,
    stream_pieces,
)
from ..adapters.openwebui.toolbox import (
    Handler,
    Toolbox,
    ToolContext,
    ToolResolver,
)
from ..adapters.openwebui.valves import (
    BaseValves,
    UserValves,
    answer_language_note,
    export_formats,
    model_settings,
    shared_endpoints,
    with_user_caps,
)
from ..adapters.run_leases import Claimed, LeaseTable, Ticket, TicketError
from ..core.checkpoint import CheckpointStore
from ..core.events import RunEvent, RunFinished
from ..core.history import remove_injected_context, split_conversation
from ..core.tasks import (
    final_reply_text,
    is_kept_task,
    plain_model_reply,
    task_messages,
    task_reply,
)
from ..engine.checkpoints import Checkpointer
from ..session.run_session import ModelClientFactory, Sleep, open_session

log = logging.getLogger(__name__)

#: The models this pipe offers: one research run, or a heavy one.
SINGLE_MODEL = {"id": "tongyi-deepresearch", "name": "Tongyi DeepResearch"}
HEAVY_MODEL = {"id": "tongyi-deepresearch-heavy", "name": "Tongyi DeepResearch Heavy"}


class Pipe:
    """Tongyi DeepResearch as an Open WebUI model."""

    # Defined once, in adapters/openwebui/valves.py: the runner's settings too.
    Valves = shared_valves.Valves

    # Each user's own settings, capped by the admin's (valves.py too).
    UserValves = shared_valves.UserValves

    def __init__(
        self,
        tool_resolver: ToolResolver | None = None,
        *,
        model_client: ModelClientFactory = OpenAIModelClient,
        sleep: Sleep = asyncio.sleep,
        host_ends_streams: Callable[[], Awaitable[bool]] = (
            compat.host_ends_async_streams
        ),
        checkpoints: Callable[[], CheckpointStore | None] = durable.database_store,
        shutting_down: Callable[[], bool] = durable.shutting_down,
        leases: Callable[[], LeaseTable | None] = durable.lease_table,
        host: ChatHost | None = None,
    ) -> None:
        """Set up the shared, request-independent parts.

        Open WebUI constructs the pipe without arguments: every part has the
        real one as its default, and tests pass their own.

        Args:
            tool_resolver: Where tool classes come from.
            model_client: Builds each request's model clients (research,
                summary, background tasks).
            sleep: How the model clients wait between retries.
            host_ends_streams: Whether the Open WebUI that runs the pipe ends
                a streamed reply itself (else the pipe sends the end).
            checkpoints: Where runs keep their progress (None: nowhere);
                Open WebUI's database by default.
            shutting_down: Whether the process is being stopped: a run
                cancelled then keeps its progress (a restart), one cancelled
                otherwise was stopped by its user and is forgotten.
            leases: Which process runs which chat's research (None: runs are
                not continued by themselves); Open WebUI's database by default.
            host: What a run continued after a restart writes through (the
                chat's message, its Stop button); Open WebUI by default.
        """
        self.valves = self.Valves()
        self._resolver = tool_resolver or ToolResolver()
        self._model_client = model_client
        self._sleep = sleep
        self._host_ends_streams = host_ends_streams
        self._checkpoints = checkpoints
        self._shutting_down = shutting_down
        self._leases = leases
        self._host: ChatHost = host or OpenWebUIHost()
        self._continuer: Continuer | None = None

    def pipes(self) -> list[dict[str, str]]:
        """The models this pipe offers (cheap: called on every model listing)."""
        if self.valves.AUTO_INSTALL_TOOLS:
            # Starts one background install per process; returns at once.
            schedule_auto_install(
                tool.name
                for tool in CATALOG
                if tool.module is not None and getattr(self.valves, tool.valve)
            )
        # Open WebUI loads the pipe to list its models: the first listing
        # after a restart starts taking up the researches left behind.
        self.start_continuing()
        return (
            [SINGLE_MODEL, HEAVY_MODEL] if self.valves.HEAVY_ENABLED else [SINGLE_MODEL]
        )

    # -- researches left behind by a dead process --
    def start_continuing(self) -> Continuer | None:
        """Start this process's `Continuer` (once; in Open WebUI's event loop)."""
        if self._continuer is not None:
            return self._continuer
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # listed outside an event loop: next time
            return None
        table = self._leases()
        store = self._checkpoints()
        if table is None or store is None:
            return None

        async def has_checkpoint(owner: str, chat: str) -> bool:
            return await store.load(owner, chat) is not None

        valves = lambda: self.valves  # noqa: E731  (read when used: valves change)
        continuer = Continuer(
            table,
            has_checkpoint,
            self.continue_run,
            seconds=lambda: valves().RUN_LEASE_SECONDS,
            enabled=lambda: (
                valves().RESUME_INTERRUPTED_RUNS and valves().CONTINUE_AFTER_RESTART
            ),
        )
        durable.adopt_continuer(continuer)
        continuer.start()
        self._continuer = continuer
        return continuer

    async def continue_run(self, claimed: Claimed) -> None:
        """Go on with a claimed research, writing into its chat message."""
        ticket, host = claimed.ticket, self._host
        try:
            if not await host.message_exists(
                claimed.owner, claimed.chat, ticket.message
            ):
                await self._give_up(claimed, "its message is gone")
                return
            emit = SafeEmitter(
                await host.emitter(claimed.owner, claimed.chat, ticket.message)
            )
        except Exception as error:  # this Open WebUI cannot be written to
            await self._give_up(claimed, type(error).__name__)
            return
        writer = MessageWriter(emit, host, claimed.chat, ticket.message)
        await host.start(self._continued(claimed, emit, writer), claimed.chat)

    async def _give_up(self, claimed: Claimed, why: str = "") -> None:
        """Let go of this process's claim on a run (``why``: it is not continued).

        Only the claim: a run that took its chat's lease itself holds it
        under its own name, and lets go of it at its end.
        """
        if why:
            log.warning("a research left behind is not continued: %s", why)
        if self._continuer is not None:
            table, holder = self._continuer.table, self._continuer.holder
            with contextlib.suppress(Exception):
                async with asyncio.timeout(LETTING_GO_SECONDS):
                    await asyncio.to_thread(
                        table.release, claimed.owner, claimed.chat, holder
                    )

    async def _continued(
        self, claimed: Claimed, emit: SafeEmitter, writer: MessageWriter
    ) -> None:
        """The chat turn again, from the ticket, its text into the message."""
        ticket = claimed.ticket
        body = {
            "model": ticket.model,
            "messages": [{"role": "user", "content": ticket.question}],
            "stream": True,
        }
        metadata = {
            "chat_id": claimed.chat,
            "message_id": ticket.message,
            "tool_ids": list(ticket.tool_ids),
            "variables": {"{{CURRENT_DATE}}": ticket.today},
        }
        turn = self._turn(
            body,
            # The run is the row's owner's, whatever the ticket says.
            user={**ticket.user, "id": claimed.owner, "valves": ticket.user_valves},
            request=None,
            emitter=emit,
            files=None,
            metadata=metadata,
            chat_id=claimed.chat,
        )
        try:
            async with contextlib.aclosing(turn):
                async for text in turn:
                    await writer.add(text)
        finally:
            # Stopped or ended: what was written stays, and the message is
            # done; a restart leaves it to the process that goes on with it.
            if not self._shutting_down():
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(LETTING_GO_SECONDS):
                        await writer.finish()
                # A turn that ended before the run took the chat's lease (a
                # key that cannot be decrypted, a failing tool set-up) left
                # the claim: kept, it would lapse and be taken up again, over
                # and over. Its progress stays for the user to ask again.
                await self._give_up(claimed)

    async def pipe(
        self,
        body: dict[str, Any],
        *,
        __user__: dict[str, Any] | None = None,
        __request__: Any = None,
        __event_emitter__: Callable[[dict[str, Any]], Awaitable[Any]] | None = None,
        __task__: str | None = None,
        __files__: list[dict[str, Any]] | None = None,
        __metadata__: dict[str, Any] | None = None,
        __chat_id__: str | None = None,
    ) -> AsyncGenerator[str, None]:
        """Answer one chat turn by researching, streaming every step.

        Closing this generator (Open WebUI's Stop: the consuming task is
        cancelled, or ``aclose()`` reaches it) closes every generator under
        it before it returns, down to the model's HTTP connection: each
        ``async for`` over an inner generator runs inside
        ``contextlib.aclosing`` rather than leaving it to garbage collection.
        """
        if __task__:
            yield await self._task(__task__, body)
            return
        turn = self._turn(
            body,
            user=__user__,
            request=__request__,
            emitter=__event_emitter__,
            files=__files__,
            metadata=__metadata__,
            chat_id=__chat_id__,
        )
        async with contextlib.aclosing(turn):
            if not _streamed(body):
                # API callers asking for one reply get the answer and its
                # sources, without the live-only markup (see `_display`), in
                # one piece.
                yield final_reply_text([text async for text in turn])
                return
            pieces = (
                _with_reasoning_apart(turn, str(body.get("model") or ""))
                if await compat.reasoning_goes_apart(__metadata__)
                else turn
            )
            async with contextlib.aclosing(pieces):
                async for text in pieces:
                    yield text
        if body.get("stream") and not await self._host_ends_streams():
            for line in compat.stream_end(str(body.get("model") or "")):
                yield line

    async def _task(self, task: str, body: dict[str, Any]) -> str:
        """The reply to one background task: instant, or one plain model call."""
        if not is_kept_task(task):
            return task_reply(task, body)
        try:
            api_key = secrets.decrypt(self.valves.API_KEY)
        except secrets.SecretError as error:
            log.warning("cannot answer the %s task: %s", task, error)
            return ""
        settings = model_settings(self.valves, api_key)
        async with httpx.AsyncClient(
            verify=await shared_ssl_context(),
            headers={"User-Agent": f"tongyi-deepresearch-openwebui/{__version__}"},
        ) as http:
            return await plain_model_reply(
                self._model_client(settings, http, self._sleep),
                task_messages(body),
                task,
            )

    async def _turn(
        self,
        body: dict[str, Any],
        *,
        user: dict[str, Any] | None,
        request: Any,
        emitter: Callable[[dict[str, Any]], Awaitable[Any]] | None,
        files: list[dict[str, Any]] | None,
        metadata: dict[str, Any] | None,
        chat_id: str | None,
    ) -> AsyncGenerator[str, None]:
        """The research turn itself (errors become a readable message)."""
        valves = self.valves
        emit = SafeEmitter(emitter)
        try:
            api_key = secrets.decrypt(valves.API_KEY)
            summary_key = secrets.decrypt(valves.SUMMARY_API_KEY)
        except secrets.SecretError as error:
            await emit.status(str(error), done=True)
            yield f"> ⚠️ {error}\n"
            return
        redact = secrets.Redactor(
            [
                api_key,
                summary_key,
                *secrets.url_secrets(valves.API_BASE_URL),
                *secrets.url_secrets(valves.SUMMARY_BASE_URL),
            ]
        )
        try:
            run = self._research(
                body,
                valves,
                emit,
                api_key=api_key,
                summary_key=summary_key,
                user=user,
                request=request,
                metadata=metadata,
                chat_id=chat_id,
                files=files,
            )
            # The extractor may share the key: mask it in every HTTP log line.
            with secrets.guard_http_logs(redact):
                async with contextlib.aclosing(run):
                    async for text in run:
                        yield text
        except asyncio.CancelledError:
            await _say_stopped(emit)
            raise
        except Exception as error:
            # The traceback's text too: an exception may quote a key or a URL.
            details = redact("".join(traceback.format_exception(error)))
            log.error("research run failed\n%s", details)
            message = redact(f"{type(error).__name__}: {error}")
            await emit.status(f"Error: {message}", done=True)
            yield f"\n\n> ⚠️ **Unexpected error:** {message}\n"

    # -- one run --
    async def _research(
        self,
        body: dict[str, Any],
        valves: BaseValves,
        emit: SafeEmitter,
        *,
        api_key: str,
        summary_key: str = "",
        user: dict[str, Any] | None,
        request: Any,
        metadata: dict[str, Any] | None,
        chat_id: str | None,
        files: list[dict[str, Any]] | None = None,
    ) -> AsyncGenerator[str, None]:
        mine = _user_valves(user)
        show_thinking = valves.EMIT_THINKING and mine.SHOW_THINKING
        display = Display(
            thinking=bool(show_thinking) and _streamed(body),
            tool_cards=valves.SHOW_TOOL_CARDS and _streamed(body),
            summary=valves.SHOW_RESEARCH_SUMMARY and _streamed(body),
            usage=valves.SHOW_COST_TRACKING,
            rollouts=_streamed(body),
        )
        heavy = valves.HEAVY_ENABLED and _is_heavy(body)
        messages, files, web_urls = await _without_injected_context(
            body, request, metadata, files
        )
        # The tools the chat selected (Open WebUI's tool_ids), within the admin's.
        choice = choose_tools(
            [tool for tool in CATALOG if getattr(valves, tool.valve)],
            (metadata or {}).get("tool_ids"),
        )
        for line in choice_notes(choice):
            await emit.status(line)
        toolbox = await self._toolbox(
            valves,
            choice.tools,
            api_key=api_key,
            request=request,
            user=user,
            chat_id=chat_id,
            relay=EventRelay(emit),
            files=files,
        )
        system_extra, turns = split_conversation(messages)
        if not turns or turns[-1]["role"] != "user":
            await emit.status("Nothing to research", done=True)
            yield "Please ask a question to start the research."
            return
        # What the offered tools put before the question (parse_file: the
        # attachments' names, as the model was trained to find them).
        asked = str(turns[-1]["content"])
        # A chat's answer offers its exports; an API caller gets the answer.
        formats = export_formats(valves, mine) if _streamed(body) else ()
        exports = Exports(formats, asked, _today(metadata))
        renderer: ChatRenderer | HeavyRenderer = (
            HeavyRenderer(display, exports)
            if heavy
            else ChatRenderer(display, exports=exports)
        )
        note = question_note(toolbox.available(), ChatFacts(files=tuple(files)))
        turns[-1] = {
            "role": "user",
            "content": note + web_results_note(web_urls) + asked,
        }
        rollouts = valves.HEAVY_ROLLOUTS if heavy else 0
        await emit.status(
            f"Starting heavy research: {rollouts} rollouts…"
            if heavy
            else "Starting research…"
        )
        async with open_session(
            valves,
            api_key=api_key,
            summary_key=summary_key,
            user_agent=f"tongyi-deepresearch-openwebui/{__version__}",
            today=_today(metadata),
            model_client=self._model_client,
            sleep=self._sleep,
            # Asked only when wanted: the store watches the process's signals.
            checkpoints=self._checkpoints() if valves.RESUME_INTERRUPTED_RUNS else None,
        ) as session:

            def tools_for(rollout: int) -> Toolbox:
                if not rollout:
                    return toolbox
                prefix = f"Rollout {rollout}/{rollouts} · "
                return toolbox.with_emitter(EventRelay(emit, status_prefix=prefix))

            plan = session.plan(
                turns,
                toolbox.available(),
                heavy_rollouts=rollouts,
                extra_preamble="\n\n".join(
                    part for part in (system_extra, answer_language_note(mine)) if part
                ),
                limits=with_user_caps(session.limits, mine),
            )
            # A chat Open WebUI does not store ("local:…") cannot be found again.
            stored_chat = "" if (chat_id or "").startswith("local") else chat_id
            owner = str((user or {}).get("id") or "")
            keeper = session.checkpointer(owner, stored_chat or "", asked, heavy=heavy)
            held = (
                await self._hold(
                    valves,
                    owner,
                    stored_chat or "",
                    body=body,
                    metadata=metadata,
                    user=user,
                    mine=mine,
                    asked=asked,
                )
                if keeper is not None and _streamed(body)
                else None
            )
            # The run engine's; the renderer learns the sources from the events.
            events = session.research(
                plan,
                tools_for,
                checkpointer=keeper,
                # An API caller's reply comes whole: the check would delay it.
                check_citations=mine.CITATION_CHECK and _streamed(body),
            )
            shown = self._shown(events, renderer, emit, keeper=keeper, held=held)
            async with contextlib.aclosing(shown):
                async for piece in shown:
                    yield piece

    async def _shown(
        self,
        events: AsyncGenerator[RunEvent, None],
        renderer: ChatRenderer | HeavyRenderer,
        emit: SafeEmitter,
        *,
        keeper: Checkpointer | None,
        held: HeldRun | None,
    ) -> AsyncGenerator[str, None]:
        """The run's events as the chat's text and events; its end, whichever."""
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    # The end rewrites the whole answer (and writes the
                    # exports): linear, but seconds for a long one.
                    rendered = (
                        await asyncio.to_thread(renderer.render, event)
                        if isinstance(event, RunFinished)
                        else renderer.render(event)
                    )
                    for payload in rendered.events:
                        await emit(payload)
                    # A reasoning block's end goes alone: Open WebUI
                    # 0.6-0.11 strip the text that comes with it.
                    for piece in stream_pieces(rendered.text):
                        if piece:
                            yield piece
        except asyncio.CancelledError:
            if held is not None and held.taken_over:
                # Another process goes on with it (its progress stays).
                _uncancel()
                await emit.status(TAKEN_OVER_STATUS, done=True)
                yield f"\n\n> {TAKEN_OVER_STATUS}\n"
                return
            if keeper is not None and not self._shutting_down():
                await _forget(keeper)  # Stop: the run stays stopped
            raise
        except GeneratorExit:
            if keeper is not None and not self._shutting_down():
                await _forget(keeper)  # Stop: the run stays stopped
            raise
        finally:
            if held is not None:
                await held.let_go(restarting=self._shutting_down())

    async def _hold(
        self,
        valves: BaseValves,
        owner: str,
        chat: str,
        *,
        body: dict[str, Any],
        metadata: dict[str, Any] | None,
        user: dict[str, Any] | None,
        mine: UserValves,
        asked: str,
    ) -> HeldRun | None:
        """The run's lease on its chat, so it goes on if this process dies.

        None when it would not be continued by itself: the valve is off,
        the chat or message has no id, or there is no lease table.
        """
        metadata = metadata or {}
        message = metadata.get("message_id")
        if not (valves.CONTINUE_AFTER_RESTART and owner and chat):
            return None
        if not isinstance(message, str) or not message:
            return None
        table = self._leases()
        if table is None:
            return None
        tool_ids = metadata.get("tool_ids")
        try:
            ticket = Ticket(
                message=message,
                model=str(body.get("model") or ""),
                question=asked,
                tool_ids=tuple(selected_ids(tool_ids)),
                today=_today(metadata).isoformat(),
                user={
                    name: str(value)
                    for name in ("id", "name", "email", "role")
                    if isinstance(value := (user or {}).get(name), str)
                },
                user_valves=mine.model_dump(mode="json"),
            )
            ticket.encode()
        except TicketError as error:
            log.info("this research will not go on by itself: %s", error)
            return None
        held = HeldRun(
            table,
            owner,
            chat,
            ticket,
            seconds=valves.RUN_LEASE_SECONDS,
            run=asyncio.current_task(),
        )
        return held if await held.take() else None

    async def _toolbox(
        self,
        valves: BaseValves,
        offered: Sequence[ToolDef],
        *,
        api_key: str,
        request: Any,
        user: dict[str, Any] | None,
        chat_id: str | None,
        relay: EventRelay,
        files: list[dict[str, Any]] | None = None,
    ) -> Toolbox:
        classes: dict[str, type] = {}
        for tool in offered:
            if tool.module is not None:
                cls = await self._resolver.resolve(tool.module)
                if cls is not None:
                    classes[tool.name] = cls
        # A tool's valves may take the model server (the visit tool's
        # extractor), and only then its key and URL credentials (SharedEndpoint).
        context = ToolContext(
            request=request,
            user=user,
            chat_id=chat_id,
            emitter=relay,
            shared_endpoints=shared_endpoints(valves, api_key),
        )
        # The admin's valves of the installed tools (Workspace → Tools).
        admin_valves = {
            tool.name: await registry_tool_valves(tool.module)
            for tool in offered
            if tool.module is not None and tool.name in classes
        }
        chat = ChatFacts(request, user, tuple(files or ()))
        handlers: dict[str, Handler] = {}
        for tool in offered:
            handler = await tool.handler(chat) if tool.handler is not None else None
            if handler is not None:
                handlers[tool.name] = handler
        return Toolbox(
            classes,
            context,
            admin_valves=admin_valves,
            handlers=handlers,
            timeout_seconds=valves.TOOL_TIMEOUT_SECONDS,
        )


#: Longest the "Stopped" status may hold up a cancelled run.
STOPPED_STATUS_SECONDS = 2.0
#: What a run says when another process took it over.
TAKEN_OVER_STATUS = "This research goes on in another reply."


def _uncancel() -> None:
    """Take back the cancellation being handled (the run ends by itself)."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


async def _forget(keeper: Checkpointer) -> None:
    """Remove the run's saved progress, bounded (the run is being cancelled)."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(5.0):
            await keeper.finish()


async def _say_stopped(emit: SafeEmitter) -> None:
    """Stop was pressed: end the status line, which would otherwise spin on.

    Bounded, and never an error: the run is being cancelled either way.
    """
    with contextlib.suppress(Exception):
        async with asyncio.timeout(STOPPED_STATUS_SECONDS):
            await emit.status("Stopped", done=True)


async def _with_reasoning_apart(
    turn: AsyncGenerator[str, None], model: str
) -> AsyncGenerator[str, None]:
    """The turn's text with each round's reasoning as ``reasoning_content`` lines.

    For the hosts that copy a message's text at every ``<think>`` (0.6, see
    `compat.reasoning_goes_apart`): the same reasoning blocks, made from deltas.
    """
    splitter = ReasoningSplitter()
    async with contextlib.aclosing(turn):
        async for text in turn:
            for part in splitter.split(text):
                yield (
                    compat.reasoning_line(model, part.text)
                    if part.reasoning
                    else part.text
                )


def _user_valves(user: dict[str, Any] | None) -> UserValves:
    """The user's own valves as Open WebUI gave them (defaults when unreadable)."""
    given = (user or {}).get("valves")
    if isinstance(given, UserValves):
        return given
    try:
        if isinstance(given, BaseModel):
            return UserValves.model_validate(given.model_dump())
        if isinstance(given, dict):
            return UserValves.model_validate(given)
    except ValidationError:
        log.warning("a user's valves could not be read; their defaults are used")
    return UserValves()


def _is_heavy(body: dict[str, Any]) -> bool:
    """Whether the chat picked the heavy model ("<function id>.<model id>")."""
    return str(body.get("model") or "").endswith(HEAVY_MODEL["id"])


def _streamed(body: dict[str, Any]) -> bool:
    """Whether the caller reads the reply as a stream (Open WebUI's UI always does)."""
    return body.get("stream") is not False


async def _without_injected_context(
    body: dict[str, Any],
    request: Any,
    metadata: dict[str, Any] | None,
    files: list[dict[str, Any]] | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """The chat without Open WebUI's RAG template: (messages, files, web URLs).

    What the template carried goes to the model the protocol's way: retrieved
    text as files for parse_file, web-search results as URLs to visit.
    """
    template = await compat.get_config(request, "rag.template", "RAG_TEMPLATE", "")
    metadata = metadata or {}
    # The user's own last message, kept before the rewrite (0.12: base_user_prompt,
    # 0.8 – 0.11: user_prompt; 0.6 keeps none).
    prompt = metadata.get("base_user_prompt") or metadata.get("user_prompt")
    messages, sources = remove_injected_context(
        body.get("messages") or [],
        [template] if isinstance(template, str) else [],
        prompt if isinstance(prompt, str) else None,
    )
    extra, urls = context_handover(sources, files)
    return messages, [*(files or []), *extra], urls


def _today(metadata: dict[str, Any] | None) -> dt.date:
    """The user's date when Open WebUI passes it, else today in UTC."""
    variables = (metadata or {}).get("variables") or {}
    value = variables.get("{{CURRENT_DATE}}") if isinstance(variables, dict) else None
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip()[:10])
        except ValueError:
            pass
    return dt.datetime.now(dt.UTC).date()
