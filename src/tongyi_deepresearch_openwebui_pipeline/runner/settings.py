"""The runner's settings: the pipe's valves, from flags, environment or TOML.

Every setting has the name and default of the pipe's valve (`Valves`,
defined once in ``adapters/openwebui/valves.py`` and served by the pipe as
``Pipe.Valves``), plus the few only a run outside Open WebUI needs
(`RunnerOptions`: where SearXNG is, whether visit may read private
addresses). Each is read, later sources winning, from:

1. its default;
2. a TOML config file (``--config FILE``, else ``$TDR_CONFIG``, else
   ``$XDG_CONFIG_HOME/tongyi-deepresearch/config.toml`` when it exists):
   top-level ``NAME = value``, and a ``[tools.<name>]`` table with a tool's
   own valves for each tool module of the catalog (``[tools.search]``,
   ``[tools.visit]``, ``[tools.google_scholar]``);
3. the environment: ``TDR_<NAME>`` (e.g. ``TDR_API_BASE_URL``);
4. flags (``--api-base-url`` … and ``--set NAME=VALUE``).

A bad value is a one-line `SettingsError` naming the setting and where it
came from, never the value (it may be a key): a ``--set`` argument without
``=`` or with an unknown name is not echoed either, unless the name is
one a setting could have.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..adapters import secrets
from ..adapters.openwebui.catalog import CATALOG, ToolChoice, choose_tools, tool_modules
from ..adapters.openwebui.valves import BaseValves, Valves

#: Environment variables of settings start with this.
ENV_PREFIX = "TDR_"
#: The environment variable naming the config file.
CONFIG_ENV = "TDR_CONFIG"
#: Tables of tool valves in the config file: ``[tools.<name>]``.
TOOL_TABLES = tuple(tool_modules())
#: The largest config file read. A config file is a few hundred bytes; the
#: TOML parser is pure Python, so a huge file would take long to refuse.
MAX_CONFIG_BYTES = 1 << 20


class SettingsError(Exception):
    """A setting is wrong; the message is one line, written for the user."""


class RunnerOptions(BaseModel):
    """Settings only a run outside Open WebUI needs."""

    model_config = ConfigDict(hide_input_in_errors=True)

    SEARXNG_URL: str = Field(
        default="",
        description="SearXNG search URL with the JSON format enabled, e.g. "
        "http://localhost:8888/search (the search tool, and the scholar "
        "tool's web fallback).",
    )
    ALLOW_PRIVATE_URLS: bool = Field(
        default=False,
        description="Let visit read private and loopback addresses (intranets, "
        "local test servers).",
    )
    TOOLS: str = Field(
        default="",
        description="Only these tools, comma-separated: "
        + ", ".join(TOOL_TABLES)
        + " (empty: every tool switched on).",
    )

    @field_validator("TOOLS")
    @classmethod
    def _known_tools(cls, value: str) -> str:
        names = [name.strip() for name in value.split(",") if name.strip()]
        unknown = [name for name in names if name not in TOOL_TABLES]
        if unknown:
            raise ValueError(
                f"no tool {unknown[0][:40]!r}: choose from {', '.join(TOOL_TABLES)}"
            )
        return ",".join(dict.fromkeys(names))

    def chosen_tools(self) -> list[str]:
        """The tools named by ``TOOLS`` (empty: no choice was made)."""
        return [name for name in self.TOOLS.split(",") if name]


#: Every setting's name, by the model that holds it.
VALVE_NAMES: frozenset[str] = frozenset(Valves.model_fields)
OPTION_NAMES: frozenset[str] = frozenset(RunnerOptions.model_fields)
ALL_NAMES: frozenset[str] = VALVE_NAMES | OPTION_NAMES

#: The settings with a flag of their own (any other: ``--set NAME=VALUE``).
SETTING_FLAGS = (
    "API_BASE_URL",
    "API_KEY",
    "MODEL_ID",
    "MAX_TOOL_ROUNDS",
    "MAX_RESEARCH_MINUTES",
    "MAX_CONTEXT_TOKENS",
    "CONTEXT_STRATEGY",
    "TEMPERATURE",
    "MAX_TOKENS",
    "SEARXNG_URL",
    "TOOLS",
)
#: Settings whose flag takes no value (it switches the setting on).
SWITCH_FLAGS = ("ALLOW_PRIVATE_URLS",)
#: The shortest value taken as quoted when a refusal's message holds it.
_QUOTED_CHARS = 4
#: What a setting's name looks like: a name of another shape typed where a
#: name goes may be a pasted key, and is not echoed.
_NAME_SHAPE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")


def flag_of(name: str) -> str:
    """The command-line flag of setting `name` (``--set NAME=…`` without one)."""
    if name in SETTING_FLAGS or name in SWITCH_FLAGS:
        return "--" + name.lower().replace("_", "-")
    return f"--set {name}=…"


def how_to_set(name: str) -> str:
    """Where the runner takes setting `name` from: ``--api-key or TDR_API_KEY``."""
    return f"{flag_of(name)} or {ENV_PREFIX}{name}"


@dataclass(frozen=True)
class Settings:
    """Everything a runner needs to know, checked."""

    #: The pipe's valves (an instance of `Valves`).
    valves: BaseValves
    options: RunnerOptions
    #: Valves of each tool from the config file's ``[tools.<name>]`` tables.
    tool_valves: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: API keys, decrypted.
    api_key: str = ""
    summary_key: str = ""

    def enabled(self, valve: str) -> bool:
        """Whether the tool switched by valve `valve` runs (``--tools`` narrows)."""
        if not getattr(self.valves, valve, False):
            return False
        if not self.options.chosen_tools():
            return True
        return any(tool.valve == valve for tool in self.tool_choice().tools)

    def tool_choice(self) -> ToolChoice:
        """The tools of every run: the switches on, narrowed by ``TOOLS``."""
        offered = [tool for tool in CATALOG if getattr(self.valves, tool.valve, False)]
        return choose_tools(offered, self.options.chosen_tools())

    def redactor(self) -> secrets.Redactor:
        """Masks every secret these settings hold (for error messages)."""
        return secrets.Redactor(
            [
                self.api_key,
                self.summary_key,
                *secrets.url_secrets(self.valves.API_BASE_URL),
                *secrets.url_secrets(self.valves.SUMMARY_BASE_URL),
                *secrets.url_secrets(self.options.SEARXNG_URL),
            ]
        )


def default_config_path(env: Mapping[str, str]) -> Path:
    """Where the config file is looked for when none is named."""
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tongyi-deepresearch" / "config.toml"


def _read_config(path: Path) -> dict[str, Any]:
    """The TOML of a config file (at most `MAX_CONFIG_BYTES`, UTF-8).

    Raises:
        SettingsError: The file is missing, unreadable, too large, not UTF-8
            or not TOML (nested too deeply included).
    """
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise SettingsError(f"config file {path} does not exist") from None
    except OSError as error:
        raise SettingsError(
            f"config file {path} cannot be read ({error.strerror or error})"
        ) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise SettingsError(f"config file {path} is larger than 1 MiB")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise SettingsError(f"config file {path} is not UTF-8 text") from None
    except RecursionError:  # the parser recurses per level of arrays and tables
        raise SettingsError(f"config file {path} is nested too deeply") from None
    except tomllib.TOMLDecodeError as error:
        raise SettingsError(f"config file {path} is not valid TOML: {error}") from None


def _config_values(
    data: dict[str, Any], path: Path
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(settings, tool tables) of a config file; unknown names are errors."""
    values: dict[str, Any] = {}
    tools: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key == "tools" and isinstance(value, dict):
            for name, table in value.items():
                if name not in TOOL_TABLES or not isinstance(table, dict):
                    known = ", ".join(f"[tools.{n}]" for n in TOOL_TABLES)
                    raise SettingsError(
                        f"config file {path}: unknown table [tools.{name}] "
                        f"(known: {known})"
                    )
                tools[name] = dict(table)
        elif key.upper() in ALL_NAMES:
            values[key.upper()] = value
        else:
            raise SettingsError(f"config file {path}: unknown setting {key}")
    return values, tools


def _env_values(env: Mapping[str, str]) -> dict[str, str]:
    return {
        name: env[ENV_PREFIX + name] for name in ALL_NAMES if ENV_PREFIX + name in env
    }


def parse_assignments(assignments: list[str]) -> dict[str, str]:
    """``NAME=VALUE`` strings (``--set``) as settings.

    Raises:
        SettingsError: An argument is not ``NAME=VALUE`` or names no setting.
            The message never holds the argument's value, nor a "name" that
            cannot be one (a key pasted without ``NAME=``).
    """
    values: dict[str, str] = {}
    for number, item in enumerate(assignments, start=1):
        name, sep, value = item.partition("=")
        name = name.strip().upper()
        which = f"--set (argument {number} of --set)"
        if not sep or not name:
            raise SettingsError(f"{which}: expected NAME=VALUE")
        if name not in ALL_NAMES:
            shown = name if _NAME_SHAPE.fullmatch(name) else "(not a setting name)"
            raise SettingsError(f"{which}: unknown setting {shown}")
        values[name] = value
    return values


def _validated(
    model: type[BaseModel], values: dict[str, Any], origin: Mapping[str, str]
) -> Any:
    try:
        return model(**values)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            name = ".".join(str(part) for part in item["loc"]) or "settings"
            where = origin.get(name, "")
            where = f" (from {where})" if where else ""
            reason = _reason(item["msg"], values.get(name))
            problems.append(f"setting {name}{where}: {reason}")
        raise SettingsError("; ".join(problems)) from None


def _reason(message: str, value: Any) -> str:
    """Why a value was refused: the validator's words, unless they quote it.

    Pydantic's own messages say what was expected, not what was given; a
    validator's message could hold the value (a key): then only "invalid
    value" is said. (A value shorter than `_QUOTED_CHARS` is in a message by
    chance, "1" in "less than 10", and is no key.)
    """
    given = str(value).strip() if value is not None else ""
    quoted = len(given) >= _QUOTED_CHARS and given in message
    return "invalid value" if quoted else message


def load_settings(
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    config: Path | None = None,
) -> Settings:
    """The settings, from defaults, the config file, `env` and `flags`.

    Args:
        flags: Settings given on the command line, by name (None: not given).
        env: The environment (default: ``os.environ``).
        config: The config file named on the command line, if any.

    Raises:
        SettingsError: A file, name or value is wrong (one line).
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    tools: dict[str, dict[str, Any]] = {}
    path = config or (Path(env[CONFIG_ENV]) if env.get(CONFIG_ENV) else None)
    if path is None and default_config_path(env).is_file():
        path = default_config_path(env)
    if path is not None:
        found, tools = _config_values(_read_config(path), path)
        values.update(found)
        origin.update(dict.fromkeys(found, f"config file {path}"))
    from_env = _env_values(env)
    values.update(from_env)
    origin.update({name: f"{ENV_PREFIX}{name}" for name in from_env})
    given = {name: value for name, value in flags.items() if value is not None}
    unknown = sorted(set(given) - ALL_NAMES)
    if unknown:
        raise SettingsError(f"unknown setting {unknown[0]}")
    values.update(given)
    origin.update(dict.fromkeys(given, "the command line"))
    valves = _validated(
        Valves,
        {k: v for k, v in values.items() if k in VALVE_NAMES},
        origin,
    )
    options = _validated(
        RunnerOptions,
        {k: v for k, v in values.items() if k in OPTION_NAMES},
        origin,
    )
    try:
        api_key = secrets.decrypt(valves.API_KEY)
        summary_key = secrets.decrypt(valves.SUMMARY_API_KEY)
    except secrets.SecretError as error:
        raise SettingsError(str(error)) from None
    return Settings(
        valves=valves,
        options=options,
        tool_valves=tools,
        api_key=api_key,
        summary_key=summary_key,
    )
