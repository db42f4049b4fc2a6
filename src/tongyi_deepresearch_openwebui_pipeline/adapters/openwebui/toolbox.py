"""The tools the loop can call, found once and run per chat.

The three tools are self-contained Open WebUI Tools modules. The pipe finds
each module's ``Tools`` class with four strategies, in order, once per process
(`ToolResolver`): the installed package, a plain module import, a module Open
WebUI already loaded (``sys.modules``), and Open WebUI's tool registry. Each
call gets a fresh ``Tools()`` whose valves are the admin's (when the tool is
installed in Open WebUI) with the pipe's model endpoint filled into any empty
extractor setting, so a single API key in the pipe is enough.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...core.events import ToolOutcome
from ...core.toolcalls import ToolCall

log = logging.getLogger(__name__)

PACKAGE = "tongyi_deepresearch_openwebui_pipeline"


@dataclass(frozen=True)
class ToolModule:
    """Where a model-facing tool lives."""

    name: str
    module: str
    method: str
    registry_id: str


TOOL_MODULES: dict[str, ToolModule] = {
    "search": ToolModule("search", "search_tool", "search", "deepresearch_search"),
    "google_scholar": ToolModule(
        "google_scholar", "scholar_tool", "google_scholar", "deepresearch_scholar"
    ),
    "visit": ToolModule("visit", "visit_tool", "visit", "deepresearch_visit"),
}

# Extra ways to find a Tools class (Open WebUI's registry), set by the adapter
# that knows the running Open WebUI; each returns the class or None.
RegistryLookup = Callable[[ToolModule], Awaitable[type | None]]
Handler = Callable[[ToolCall], Awaitable[ToolOutcome]]


def _tools_class(module: Any, method: str) -> type | None:
    cls = getattr(module, "Tools", None)
    if isinstance(cls, type) and callable(getattr(cls, method, None)):
        return cls
    return None


def _from_package(spec: ToolModule) -> type | None:
    try:
        module = importlib.import_module(f"{PACKAGE}.tools.{spec.module}")
    except ImportError:
        return None
    return _tools_class(module, spec.method)


def _from_plain_module(spec: ToolModule) -> type | None:
    try:
        module = importlib.import_module(spec.module)
    except ImportError:
        return None
    return _tools_class(module, spec.method)


def _from_loaded_modules(spec: ToolModule) -> type | None:
    # Open WebUI registers loaded tools as ``tool_<id>`` (0.12 adds a suffix).
    preferred = f"tool_{spec.registry_id}"
    names = sorted(
        (name for name in list(sys.modules) if name.startswith("tool_")),
        key=lambda name: not name.startswith(preferred),
    )
    for name in names:
        cls = _tools_class(sys.modules.get(name), spec.method)
        if cls is not None:
            return cls
    return None


class ToolResolver:
    """Finds each tool's class once per process (then serves it from cache)."""

    def __init__(
        self,
        registry_lookup: RegistryLookup | None = None,
        classes: Mapping[str, type | None] | None = None,
    ) -> None:
        """Optionally add Open WebUI's registry as the last strategy.

        Args:
            registry_lookup: The fourth strategy (Open WebUI's tool registry).
            classes: Known classes by tool name, used as resolved (a test seam).
        """
        self._registry_lookup = registry_lookup
        self._cache: dict[str, type | None] = dict(classes or {})
        self._lock = asyncio.Lock()

    async def resolve(self, spec: ToolModule) -> type | None:
        """The ``Tools`` class for ``spec``, or None when none can be found."""
        if spec.name in self._cache:
            return self._cache[spec.name]
        async with self._lock:
            if spec.name not in self._cache:
                self._cache[spec.name] = await self._find(spec)
        return self._cache[spec.name]

    async def _find(self, spec: ToolModule) -> type | None:
        for strategy in (_from_package, _from_plain_module, _from_loaded_modules):
            cls = strategy(spec)
            if cls is not None:
                return cls
        if self._registry_lookup is not None:
            try:
                return await self._registry_lookup(spec)
            except Exception as error:
                log.info("tool registry lookup failed: %s", type(error).__name__)
        log.warning("no Tools class found for %s", spec.name)
        return None


@dataclass
class ToolContext:
    """Per-chat values handed to the tools."""

    request: Any = None
    user: dict[str, Any] | None = None
    chat_id: str | None = None
    emitter: Callable[[dict[str, Any]], Awaitable[None]] | None = None
    #: Values the pipe fills into the tool's valves when they are empty.
    valve_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


class Toolbox:
    """`ToolPort` over the resolved tool classes and built-in handlers."""

    def __init__(
        self,
        classes: Mapping[str, type],
        context: ToolContext,
        admin_valves: Mapping[str, Mapping[str, Any]] | None = None,
        handlers: Mapping[str, Handler] | None = None,
        timeout_seconds: float = 900.0,
    ) -> None:
        """Offer ``classes`` (by tool name) plus ``handlers`` (e.g. parse_file)."""
        self._classes = dict(classes)
        self._context = context
        self._admin_valves = dict(admin_valves or {})
        self._handlers = dict(handlers or {})
        self._timeout = timeout_seconds

    def available(self) -> list[str]:
        """Tool names the model may call in this run."""
        return [*self._classes, *self._handlers]

    def _instance(self, name: str) -> Any:
        cls = self._classes[name]
        instance = cls()
        valves_cls = getattr(cls, "Valves", None)
        if valves_cls is None:
            return instance
        values: dict[str, Any] = {
            key: value
            for key, value in (self._admin_valves.get(name) or {}).items()
            if value is not None
        }
        fields = getattr(valves_cls, "model_fields", {})
        for key, value in (self._context.valve_defaults.get(name) or {}).items():
            if key in fields and not values.get(key) and value not in (None, ""):
                values[key] = value
        try:
            instance.valves = valves_cls(**values)
        except Exception as error:
            log.warning("invalid valves for %s (%s); using defaults", name, error)
            instance.valves = valves_cls()
        return instance

    async def run(self, call: ToolCall) -> ToolOutcome:
        """Run one validated call with a time limit."""
        try:
            async with asyncio.timeout(self._timeout):
                return await self._dispatch(call)
        except TimeoutError:
            return ToolOutcome(
                f"Error: the {call.name} tool did not finish within "
                f"{self._timeout:.0f} seconds. Try fewer queries or URLs.",
                ok=False,
            )

    async def _dispatch(self, call: ToolCall) -> ToolOutcome:
        if call.name in self._handlers:
            return await self._handlers[call.name](call)
        spec = TOOL_MODULES[call.name]
        method = getattr(self._instance(call.name), spec.method)
        ctx = self._context
        kwargs: dict[str, Any] = {
            "__request__": ctx.request,
            "__user__": ctx.user,
            "__event_emitter__": ctx.emitter,
        }
        if call.name == "visit":
            kwargs["__chat_id__"] = ctx.chat_id
        accepted = inspect.signature(method).parameters
        # The model may add arguments the tool does not take; drop them.
        arguments = {k: v for k, v in call.arguments.items() if k in accepted}
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
        result = await method(**arguments, **kwargs)
        text = result if isinstance(result, str) else str(result)
        return ToolOutcome(text, ok=not text.startswith(("Error", "[Visit] Invalid")))
