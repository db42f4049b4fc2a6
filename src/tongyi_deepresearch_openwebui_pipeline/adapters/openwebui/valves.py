"""The valves both front ends read, and the settings derived from them.

The pipe's valves (Admin Panel → Functions → Tongyi DeepResearch) are also
the headless runner's settings (``tongyi-deepresearch``, from flags,
``TDR_<NAME>`` or TOML): one `Valves` class, defined here, which the pipe
serves as ``Pipe.Valves`` and the runner validates its settings with. What a
run needs from them is derived here once for both: how to reach the research
model (`model_settings`) and the summary model (`summary_settings`), the
run's budgets (`research_limits`), and the research model's server offered
to the tools whose valves may take it (`shared_endpoints`: the visit tool's
extractor).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from ...core.consolidation import SUMMARY_MAX_TOKENS
from ...core.loop import AtLimit, Limits
from .. import secrets
from ..export.bundle import parse_formats
from ..model_client import ModelSettings
from .catalog import CATALOG
from .toolbox import SharedEndpoint
from .tooldef import ToolDef

DEFAULT_BASE_URL = "http://localhost:8000/v1"
DEFAULT_MODEL = "Alibaba-NLP/Tongyi-DeepResearch-30B-A3B"


def _http_url(value: str) -> str:
    value = value.strip()
    if value and not value.startswith(("http://", "https://")):
        raise ValueError(
            "must start with http:// or https:// (e.g. http://localhost:8000/v1)"
        )
    if value and not urlsplit(value).hostname:
        # "http://" alone would pass the prefix check and fail on every request.
        raise ValueError("has no host name (e.g. http://localhost:8000/v1)")
    return value.rstrip("/")


class BaseValves(BaseModel):
    """Admin settings (Admin Panel → Functions → Tongyi DeepResearch)."""

    # A rejected value may hold a key or a URL with a password: validation
    # errors (shown and logged by Open WebUI) must not repeat it.
    model_config = ConfigDict(hide_input_in_errors=True)

    API_BASE_URL: str = Field(
        default=DEFAULT_BASE_URL,
        description="OpenAI-compatible endpoint of the model server "
        "(vLLM/SGLang: http://localhost:8000/v1; "
        "llama.cpp: http://localhost:8080/v1; "
        "Ollama: http://localhost:11434/v1; or a hosted provider).",
    )
    API_KEY: str = Field(
        default="",
        description="API key for the model server; leave empty for local servers.",
    )
    MODEL_ID: str = Field(
        default=DEFAULT_MODEL,
        description="Model id as the server knows it.",
    )
    TEMPERATURE: float = Field(
        # The lab's runner passes TEMPERATURE=0.85 from its .env.example, and
        # the technical report evaluates at 0.85: the published scores' setting.
        # react_agent.py's 0.6 is only its fallback when nothing is passed.
        default=0.85,
        ge=0.0,
        le=2.0,
        description="Sampling temperature (0.85: the lab's evaluation setting; "
        "0.6 is the reference code's fallback).",
    )
    TOP_P: float = Field(
        default=0.95,
        gt=0.0,
        le=1.0,
        description="Nucleus sampling (reference: 0.95).",
    )
    PRESENCE_PENALTY: float = Field(
        default=1.1,
        ge=-2.0,
        le=2.0,
        description="Presence penalty (reference: 1.1).",
    )
    MAX_TOKENS: int = Field(
        default=10000,
        ge=256,
        le=131072,
        description="Most tokens the model may write per round (reference: 10000).",
    )
    MAX_TOOL_ROUNDS: int = Field(
        default=100,
        ge=1,
        le=500,
        description=(
            "Most model rounds before the model is asked for its final answer "
            "(reference: 100)."
        ),
    )
    MAX_CONTEXT_TOKENS: int = Field(
        default=110 * 1024,
        ge=4096,
        le=1_048_576,
        description=(
            "Context budget in tokens; when the conversation grows past it the "
            "model must answer (reference: 112640 for a 128K model); with "
            "CONTEXT_STRATEGY=consolidate it is summarised at 0.9 x (this, or "
            "the served context if smaller, - 1000) tokens (ReSum's MAX_CONTEXT). "
            "Lower it when your server serves a shorter context."
        ),
    )
    MAX_RESEARCH_MINUTES: float = Field(
        default=150.0,
        gt=0.0,
        le=1440.0,
        description=(
            "Wall-clock limit of one research run (reference: 150); the final "
            "answer may then take up to WRAP_UP_SECONDS more."
        ),
    )
    WRAP_UP_SECONDS: float = Field(
        default=120.0,
        ge=0.0,
        le=3600.0,
        description=(
            "Grace past MAX_RESEARCH_MINUTES for the final answer: the model is "
            "asked for it at the limit and may write it for this long (0: the run "
            "ends at the limit with what was written)."
        ),
    )
    RESUME_INTERRUPTED_RUNS: bool = Field(
        default=True,
        description=(
            "Save a research's progress after every round (Open WebUI's database; "
            "the runner: beside its output) so a research interrupted by a "
            "restart or a crash goes on from its last finished round (by itself: "
            "CONTINUE_AFTER_RESTART; or when the message is regenerated or the "
            "question asked again in that chat)."
        ),
    )
    CHECKPOINT_MAX_AGE_HOURS: float = Field(
        default=168.0,
        ge=1.0,
        le=24.0 * 365,
        description=(
            "How long an interrupted research's saved progress is kept (then "
            "removed; a finished or stopped research's at once)."
        ),
    )
    CONTINUE_AFTER_RESTART: bool = Field(
        default=True,
        description=(
            "When the Open WebUI process running a research dies or restarts, "
            "another (or the same, once it is back) goes on with it by itself "
            "from its last finished round and writes the answer into the chat; "
            "needs RESUME_INTERRUPTED_RUNS."
        ),
    )
    RUN_LEASE_SECONDS: float = Field(
        default=60.0,
        ge=5.0,
        le=3600.0,
        description=(
            "How long a research's process may go silent before another takes "
            "the research over (it renews its claim every third of this)."
        ),
    )
    MAX_CALLS_PER_TURN: int = Field(
        default=5,
        ge=1,
        le=20,
        description="Most tool calls run from one model turn.",
    )
    REQUEST_TIMEOUT_SECONDS: float = Field(
        default=600.0,
        gt=0.0,
        le=3600.0,
        description=(
            "Wall-clock limit of one model request, however the server trickles "
            "(reference: 600)."
        ),
    )
    MAX_RETRIES: int = Field(
        default=5,
        ge=1,
        le=20,
        description=(
            "Attempts per model call on transient errors (connection, timeout, 429,"
            " 5xx)."
        ),
    )
    TOOL_TIMEOUT_SECONDS: float = Field(
        default=900.0,
        gt=0.0,
        le=7200.0,
        description="Longest a single tool call may take.",
    )
    SYSTEM_PROMPT_PREAMBLE: str = Field(
        default="", description="Text placed before the model's own system prompt."
    )
    EMIT_THINKING: bool = Field(
        default=True,
        description="Show the model's thinking as collapsible reasoning blocks.",
    )
    SHOW_TOOL_CARDS: bool = Field(
        default=True,
        description="Show each tool call as a card with its arguments and result.",
    )
    SHOW_RESEARCH_SUMMARY: bool = Field(
        default=True,
        description=(
            "Show the research summary (rounds, searches, pages, tokens, time) "
            "under the answer."
        ),
    )
    SHOW_COST_TRACKING: bool = Field(
        default=True,
        description=(
            "Show tokens (and cost when the provider reports it) in the status line."
        ),
    )
    HEAVY_ENABLED: bool = Field(
        default=True,
        description=(
            "Offer the 'Tongyi DeepResearch Heavy' model: the lab's ParallelMuse. "
            "Several research rollouts, then the model writes a report of each "
            "and answers from them."
        ),
    )
    HEAVY_ROLLOUTS: int = Field(
        default=3,
        ge=2,
        le=8,
        description="Research rollouts of one heavy run.",
    )
    HEAVY_CONCURRENT_ROLLOUTS: int = Field(
        default=3,
        ge=1,
        le=8,
        description=(
            "Rollouts running at once (vLLM and SGLang batch them; lower it for "
            "a server that runs one request at a time, such as llama.cpp "
            "without --parallel)."
        ),
    )
    HEAVY_PARTIAL_ROLLOUTS: bool = Field(
        default=True,
        description=(
            "ParallelMuse's partial rollouts: the first rollout runs alone and "
            "the others branch from its most uncertain steps, measured from "
            "token log-probabilities (vLLM, SGLang and llama.cpp return them; "
            "without them the others start from the question once its first "
            "reply shows it). Off: every rollout starts from the question at once."
        ),
    )
    HEAVY_BRANCH_STEPS: int = Field(
        default=2,
        ge=1,
        le=8,
        description=(
            "Most uncertain steps of the first rollout that the others branch "
            "from, the most uncertain first (ParallelMuse: 2)."
        ),
    )
    CONTEXT_STRATEGY: Literal["consolidate", "wrap_up", "reference"] = Field(
        default="consolidate",
        description=(
            "When the conversation fills the context: 'consolidate' summarises "
            "it as ReSum does (the lab's summary prompt, once it holds 0.9 x "
            "(context - 1000) tokens) and goes on from the summary, so research "
            "outlives a 32K context; 'wrap_up' asks for the answer at once; "
            "'reference' is the lab's inference/react_agent.py at every limit "
            "(the wrap-up written over the last message, no call past the "
            "round or time limit)."
        ),
    )
    MAX_CONSOLIDATIONS: int = Field(
        default=30,
        ge=1,
        le=200,
        description="Most consolidations of one research run (then the wrap-up).",
    )
    SUMMARY_BASE_URL: str = Field(
        default="",
        description=(
            "OpenAI-compatible endpoint that writes the summary when the run "
            "consolidates (the lab used its own ReSum-Tool-30B-A3B); empty: the "
            "research model's server."
        ),
    )
    SUMMARY_API_KEY: str = Field(
        default="",
        description=(
            "API key of SUMMARY_BASE_URL (the research model's key is used only "
            "when the summary runs on the research model's server)."
        ),
    )
    SUMMARY_MODEL: str = Field(
        default="",
        description="Model id of the summary model; empty: MODEL_ID.",
    )
    CITATION_CHECK: bool = Field(
        default=True,
        description=(
            "After the answer, check each cited statement against what was read "
            "on the page it cites (one short call per statement and page, to "
            "the summary endpoint: SUMMARY_BASE_URL, by default the research "
            "model's server) and mark those the page does not support."
        ),
    )
    CITATION_CHECK_MAX_STATEMENTS: int = Field(
        default=20,
        ge=1,
        le=200,
        description="Most cited statements checked per answer (the rest are counted).",
    )
    CITATION_CHECK_SECONDS: float = Field(
        default=90.0,
        gt=0.0,
        le=1800.0,
        description=(
            "Longest the check may take after the answer (never past the "
            "research's time limit)."
        ),
    )
    EXPORT_FORMATS: str = Field(
        default="bibtex,ris,csl-json,markdown",
        max_length=100,
        description=(
            "What an answer offers to take elsewhere, in a collapsed block under "
            "it: any of bibtex, ris, csl-json, markdown (a report), "
            "comma-separated; empty: none."
        ),
    )
    AUTO_INSTALL_TOOLS: bool = Field(
        default=True,
        description=(
            "Install the search, scholar and visit tools into Open WebUI's tool "
            "registry on startup."
        ),
    )

    @field_validator("API_KEY", "SUMMARY_API_KEY")
    @classmethod
    def _encrypt_key(cls, value: str) -> str:
        # Stored encrypted when WEBUI_SECRET_KEY is set; see adapters.secrets.
        return secrets.encrypt(value.strip())

    @field_validator("API_BASE_URL")
    @classmethod
    def _check_url(cls, value: str) -> str:
        value = _http_url(value)
        if not value:
            raise ValueError("is required (e.g. http://localhost:8000/v1)")
        return value

    @field_validator("SUMMARY_BASE_URL")
    @classmethod
    def _check_optional_url(cls, value: str) -> str:
        return _http_url(value)

    @field_validator("EXPORT_FORMATS")
    @classmethod
    def _check_formats(cls, value: str) -> str:
        return ",".join(parse_formats(value))


def with_tool_switches(
    settings: type[BaseValves], catalog: Sequence[ToolDef] = CATALOG
) -> type[BaseValves]:
    """The settings plus one switch per tool, from the tool catalog."""
    switches: dict[str, Any] = {
        tool.valve: (bool, Field(default=True, description=tool.valve_description))
        for tool in catalog
    }
    return create_model(
        "Valves", __base__=settings, __doc__=settings.__doc__, **switches
    )


#: The valves: the settings above plus one switch per tool of the catalog.
#: Annotate with `BaseValves` (a type checker cannot see the switches).
Valves = with_tool_switches(BaseValves)


#: What a language name may hold: letters of any script, spaces, hyphens,
#: parentheses and commas ("Brazilian Portuguese", "中文", "Serbian (Latin)").
_LANGUAGE = r"^[^\W\d_]+(?:[ ,()\-]*[^\W\d_()]+\)?)*$"


class UserValves(BaseModel):
    """Each user's own settings (the model's controls); the admin's are the ceiling."""

    model_config = ConfigDict(hide_input_in_errors=True)

    SHOW_THINKING: bool = Field(
        default=True, description="Show the model's thinking while it researches."
    )
    MAX_RESEARCH_MINUTES: float = Field(
        default=0.0,
        ge=0.0,
        le=1440.0,
        description=(
            "Your time limit for one research, in minutes (0: the administrator's; "
            "never above it)."
        ),
    )
    MAX_TOOL_ROUNDS: int = Field(
        default=0,
        ge=0,
        le=500,
        description=(
            "Your most rounds for one research (0: the administrator's; never "
            "above it)."
        ),
    )
    CITATION_CHECK: bool = Field(
        default=True,
        description=(
            "Check the answer's citations against the pages they cite and mark "
            "those not supported (when the administrator has the check on)."
        ),
    )
    EXPORT_FORMATS: str = Field(
        default="",
        max_length=100,
        description=(
            "Your export formats (of bibtex, ris, csl-json, markdown; empty: the "
            "administrator's; none: no export block)."
        ),
    )
    ANSWER_LANGUAGE: str = Field(
        default="",
        max_length=40,
        pattern=_LANGUAGE + "|^$",
        description=(
            "Language of the final answer, e.g. German (empty: as the model "
            "chooses, usually the question's)."
        ),
    )

    @field_validator("EXPORT_FORMATS")
    @classmethod
    def _check_formats(cls, value: str) -> str:
        if value.strip().lower() == "none":
            return "none"
        return ",".join(parse_formats(value))


def export_formats(admin: BaseValves, user: UserValves) -> tuple[str, ...]:
    """The formats a user's answers offer: theirs, within the admin's."""
    offered = parse_formats(admin.EXPORT_FORMATS)
    chosen = user.EXPORT_FORMATS.strip().lower()
    if not chosen:
        return offered
    if chosen == "none":
        return ()
    return tuple(name for name in offered if name in parse_formats(chosen))


def with_user_caps(limits: Limits, user: UserValves) -> Limits:
    """``limits`` lowered to a user's own, where they set lower ones."""
    seconds, rounds = limits.max_seconds, limits.max_rounds
    if user.MAX_RESEARCH_MINUTES > 0:
        seconds = min(seconds, user.MAX_RESEARCH_MINUTES * 60)
    if user.MAX_TOOL_ROUNDS > 0:
        rounds = min(rounds, user.MAX_TOOL_ROUNDS)
    return replace(limits, max_seconds=seconds, max_rounds=rounds)


def answer_language_note(user: UserValves) -> str:
    """What the system prompt's preamble says of the answer's language ("": nothing)."""
    language = user.ANSWER_LANGUAGE.strip()
    return f"Write the final answer in {language}." if language else ""


def model_settings(valves: BaseValves, api_key: str) -> ModelSettings:
    """How to reach the research model, from the valves and the decrypted key."""
    return ModelSettings(
        base_url=valves.API_BASE_URL,
        model=valves.MODEL_ID,
        api_key=api_key,
        temperature=valves.TEMPERATURE,
        top_p=valves.TOP_P,
        presence_penalty=valves.PRESENCE_PENALTY,
        max_tokens=valves.MAX_TOKENS,
        timeout_seconds=valves.REQUEST_TIMEOUT_SECONDS,
        max_attempts=valves.MAX_RETRIES,
    )


# The summary call samples as ReSum's does (WebResummer summary_utils.py:
# temperature 0.6, top_p 0.95, max_tokens 4096, no presence penalty, no
# stop), whatever the research model's valves say: its request carries
# neither a presence penalty nor stop sequences.
SUMMARY_TEMPERATURE = 0.6
SUMMARY_TOP_P = 0.95


def summary_settings(
    valves: BaseValves, research: ModelSettings, summary_key: str
) -> ModelSettings:
    """How to reach the summary model: its own endpoint, or the research model's.

    The research model's key and URL credentials go to the summary endpoint
    only when it is the research model's server (`SharedEndpoint`). It
    samples as ReSum's summary call does.
    """
    values = {
        "SUMMARY_BASE_URL": valves.SUMMARY_BASE_URL,
        "SUMMARY_API_KEY": summary_key,
        "SUMMARY_MODEL": valves.SUMMARY_MODEL,
    }
    SharedEndpoint(
        url_valve="SUMMARY_BASE_URL",
        key_valve="SUMMARY_API_KEY",
        model_valve="SUMMARY_MODEL",
        base_url=research.base_url,
        api_key=research.api_key,
        model=research.model,
    ).fill(values, {})
    return replace(
        research,
        base_url=values["SUMMARY_BASE_URL"],
        api_key=values["SUMMARY_API_KEY"],
        model=values["SUMMARY_MODEL"] or research.model,
        temperature=SUMMARY_TEMPERATURE,
        top_p=SUMMARY_TOP_P,
        presence_penalty=None,
        stop=(),
        max_tokens=SUMMARY_MAX_TOKENS,
    )


#: The citation check's verdicts: the most likely word, not a sample.
CHECK_TEMPERATURE = 0.0


def check_settings(
    valves: BaseValves, research: ModelSettings, summary_key: str
) -> ModelSettings:
    """How to reach the citation check's model: the summary endpoint, greedily.

    The same endpoint, key scoping and model as the summary call
    (`summary_settings`), sampled at temperature 0 (a verdict, not prose).
    """
    return replace(
        summary_settings(valves, research, summary_key),
        temperature=CHECK_TEMPERATURE,
        top_p=1.0,
    )


def research_limits(valves: BaseValves, served_context_tokens: int) -> Limits:
    """The budgets of one run: the valves, within the context the server serves.

    Args:
        valves: The front end's valves.
        served_context_tokens: The context the model server reports (0:
            unknown, then the valves alone hold).
    """
    strategy = valves.CONTEXT_STRATEGY
    # The reference run never consolidates: it wraps up as the lab's agent.
    at_limit: AtLimit = "consolidate" if strategy == "consolidate" else "wrap_up"
    return Limits(
        max_rounds=valves.MAX_TOOL_ROUNDS,
        max_context_tokens=valves.MAX_CONTEXT_TOKENS,
        max_seconds=valves.MAX_RESEARCH_MINUTES * 60,
        wrap_up_seconds=valves.WRAP_UP_SECONDS,
        max_calls_per_turn=valves.MAX_CALLS_PER_TURN,
        model_context_tokens=served_context_tokens,
        max_output_tokens=valves.MAX_TOKENS,
        at_limit=at_limit,
        max_consolidations=valves.MAX_CONSOLIDATIONS,
        reference_run=strategy == "reference",
    )


def shared_endpoints(
    valves: BaseValves, api_key: str, catalog: Sequence[ToolDef] = CATALOG
) -> dict[str, SharedEndpoint]:
    """The research model's server, offered to each tool whose valves may take it.

    By tool name, for `toolbox.ToolContext.shared_endpoints`: the tools whose
    definition names such valves (`ToolModule.model_server`: the visit tool's
    extractor). The key and URL credentials reach a tool only when it is left
    to the research model's server (see `SharedEndpoint`).
    """
    return {
        tool.name: SharedEndpoint(
            url_valve=tool.module.model_server.url,
            key_valve=tool.module.model_server.key,
            model_valve=tool.module.model_server.model,
            base_url=valves.API_BASE_URL,
            api_key=api_key,
            model=valves.MODEL_ID,
        )
        for tool in catalog
        if tool.module is not None and tool.module.model_server is not None
    }
