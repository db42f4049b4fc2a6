"""A tool is defined once: its `ToolDef` is all any part needs.

The first half adds a tool, ``quote``, with a prompt line of its own, a
module class and every kind of wiring a definition holds (reserved
arguments, valves that take the research model's server, its valves in the
headless runner, a question note, a status line and tallies), and follows it
through each part that reads the catalog: the valves, the system prompt, the
argument checks, the toolbox, the runner's tool settings, the status line.
Each part takes the catalog as a parameter (the real `CATALOG` by default);
nothing else is edited.

The second half holds the real catalog to the same rule: each definition
agrees with its tool module and with the settings it names, and the scripts
read their tool lists from it.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
from typing import Any

import pytest
from pydantic import BaseModel

from tests.packaging_support import ROOT, load_script
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.catalog import (
    CATALOG,
    describe_call,
    prompt_lines,
    question_note,
    tool_modules,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.toolbox import (
    Toolbox,
    ToolContext,
    ToolResolver,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.tooldef import (
    RESERVED_ARGUMENTS,
    ChatFacts,
    ModelServerValves,
    RunnerRequirement,
    RunnerValves,
    ToolDef,
    ToolModule,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.valves import (
    BaseValves,
    shared_endpoints,
    with_tool_switches,
)
from tongyi_deepresearch_openwebui_pipeline.core.events import ToolOutcome
from tongyi_deepresearch_openwebui_pipeline.core.prompts import (
    TOOL_LINES,
    system_prompt_with,
)
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import (
    SCHEMAS,
    SchemaError,
    ToolCall,
)
from tongyi_deepresearch_openwebui_pipeline.runner.research import (
    RunnerError,
    check_tool_settings,
    tool_valves,
)
from tongyi_deepresearch_openwebui_pipeline.runner.settings import (
    RunnerOptions,
    Settings,
)

# -- a new tool, added in one place -------------------------------------------------

QUOTE_LINE = json.dumps(
    {
        "type": "function",
        "function": {
            "name": "quote",
            "description": "Quote words.",
            "parameters": {
                "type": "object",
                "properties": {
                    "words": {"type": "array", "items": {"type": "string"}},
                    "style": {"type": "string"},
                },
                "required": ["words"],
            },
        },
    }
)
QUOTE_EXAMPLE = '{"name": "quote", "arguments": {"words": ["to be"]}}'


class QuoteTools:
    """The quote tool's module: says what it was given."""

    class Valves(BaseModel):
        QUOTE_BASE_URL: str = ""
        QUOTE_API_KEY: str = ""
        QUOTE_MODEL: str = ""
        QUOTE_MODE: str = "online"
        SEARXNG_URL: str = ""

    def __init__(self) -> None:
        self.valves = self.Valves()

    async def quote(
        self,
        words: list[str],
        style: str = "plain",
        __request__: Any = "not passed",
        __user__: Any = None,
        __chat_id__: Any = None,
    ) -> str:
        return json.dumps(
            {
                "words": words,
                "style": style,
                "request": __request__,
                "user": __user__,
                "chat_id": __chat_id__,
                "valves": self.valves.model_dump(),
            }
        )


QUOTE = ToolDef(
    name="quote",
    prompt_line=QUOTE_LINE,
    valve="QUOTE_ENABLED",
    valve_description="Offer the quote tool.",
    status=lambda a: "Quoting: " + ", ".join(a.get("words") or []),
    module=ToolModule(
        "quote",
        "quote_tool",
        "quote",
        "deepresearch_quote",
        reserved=("__user__", "__chat_id__"),
        model_server=ModelServerValves(
            "QUOTE_BASE_URL", "QUOTE_API_KEY", "QUOTE_MODEL"
        ),
        runner=RunnerValves(
            fixed=(("QUOTE_MODE", "offline"),),
            settings=("SEARXNG_URL",),
            required=RunnerRequirement(
                setting="SEARXNG_URL",
                problem="nothing to quote from",
                wanted="a SearXNG search URL",
                without="quotes",
            ),
        ),
    ),
    tallies=lambda a: (("searches", len(a.get("words") or [])),),
    question_note=lambda chat: f"(Quotes wanted for {len(chat.files)} files)\n\n",
    call_example=QUOTE_EXAMPLE,
)
WITH_QUOTE = (*CATALOG, QUOTE)
PIPE_URL = "http://127.0.0.1:9/v1"


def test_the_valves_get_its_switch() -> None:
    valves = with_tool_switches(BaseValves, WITH_QUOTE)
    field = valves.model_fields["QUOTE_ENABLED"]
    assert (field.default, field.description) == (True, "Offer the quote tool.")
    off = valves.model_validate({"QUOTE_ENABLED": False})
    assert off.model_dump()["QUOTE_ENABLED"] is False


def test_the_system_prompt_gets_its_line_in_catalog_order() -> None:
    today = dt.date(2026, 11, 24)
    lines = prompt_lines(["quote", "search"], WITH_QUOTE)
    assert lines == [TOOL_LINES["search"], QUOTE_LINE]
    prompt = system_prompt_with(lines, today)
    assert f"<tools>\n{TOOL_LINES['search']}\n{QUOTE_LINE}\n</tools>" in prompt


def test_the_status_line_and_the_question_note_are_its_own() -> None:
    arguments = {"words": ["to be", "or not"]}
    assert describe_call("quote", arguments, WITH_QUOTE) == "Quoting: to be, or not"
    assert describe_call("quote", arguments) == "Calling quote"  # not in CATALOG
    chat = ChatFacts(files=({"id": "f1"}, {"id": "f2"}))
    assert question_note(["quote"], chat, WITH_QUOTE) == (
        "(Quotes wanted for 2 files)\n\n"
    )
    assert question_note(["search"], chat, WITH_QUOTE) == ""


def quote_toolbox() -> Toolbox:
    valves = with_tool_switches(BaseValves, WITH_QUOTE)(API_BASE_URL=PIPE_URL)
    context = ToolContext(
        request="the request",
        user={"id": "u1"},
        chat_id="chat-7",
        shared_endpoints=shared_endpoints(valves, "sk-pipe", WITH_QUOTE),
    )
    return Toolbox({"quote": QuoteTools}, context, catalog=WITH_QUOTE)


async def test_the_toolbox_runs_it_with_its_wiring() -> None:
    outcome = await quote_toolbox().run(ToolCall("quote", {"words": " to be "}))
    assert json.loads(outcome.text) == {
        "words": ["to be"],  # checked against its line: a bare string is a list
        "style": "plain",
        "request": "not passed",  # not one of its reserved arguments
        "user": {"id": "u1"},
        "chat_id": "chat-7",
        "valves": {
            # Its model-server valves take the pipe's server and key.
            "QUOTE_BASE_URL": PIPE_URL,
            "QUOTE_API_KEY": "sk-pipe",
            "QUOTE_MODEL": BaseValves().MODEL_ID,
            "QUOTE_MODE": "online",
            "SEARXNG_URL": "",
        },
    }
    assert (outcome.ok, outcome.counts) == (True, (("searches", 1),))


async def test_the_toolbox_checks_its_calls_against_its_line() -> None:
    outcome = await quote_toolbox().run(ToolCall("quote", {"words": ["a"], "style": 4}))
    assert outcome == ToolOutcome(
        "Error: invalid arguments for quote: 'style' must be a non-empty string. "
        f"A valid call looks like: {QUOTE_EXAMPLE}",
        ok=False,
    )


def quote_settings(searxng: str) -> Settings:
    valves = with_tool_switches(BaseValves, (QUOTE,))()
    return Settings(valves=valves, options=RunnerOptions(SEARXNG_URL=searxng))


def test_the_runner_gives_it_its_valves() -> None:
    settings = quote_settings("http://127.0.0.1:8/search")
    assert tool_valves(settings, (QUOTE,)) == {
        "quote": {"QUOTE_MODE": "offline", "SEARXNG_URL": "http://127.0.0.1:8/search"}
    }
    check_tool_settings(settings, (QUOTE,))  # its required setting is there


def test_the_runner_refuses_to_start_without_its_required_setting() -> None:
    with pytest.raises(RunnerError) as refused:
        check_tool_settings(quote_settings(""), (QUOTE,))
    assert str(refused.value) == (
        "nothing to quote from: set SEARXNG_URL (--searxng-url, TDR_SEARXNG_URL or "
        "SEARXNG_URL in the config file) to a SearXNG search URL, or "
        "QUOTE_ENABLED=false to research without quotes"
    )
    assert refused.value.code == 2


def test_a_line_whose_schema_cannot_be_read_is_refused_when_defined() -> None:
    integer = {"type": "object", "properties": {"n": {"type": "integer"}}}
    line = json.dumps(
        {"type": "function", "function": {"name": "count", "parameters": integer}}
    )
    with pytest.raises(SchemaError) as refused:
        ToolDef("count", line, "COUNT_ENABLED", "Offer count.", lambda _a: "Counting")
    assert str(refused.value) == "count.n: type 'integer' not read by this checker"


def test_a_reserved_argument_no_chat_gives_is_refused() -> None:
    with pytest.raises(ValueError, match="no such reserved argument __files__"):
        ToolModule("q", "q_tool", "q", "deepresearch_q", reserved=("__files__",))


# -- the real catalog ---------------------------------------------------------------


@pytest.mark.parametrize("tool", CATALOG, ids=lambda tool: tool.name)
def test_each_definition_is_checked_by_the_loop_against_its_own_line(
    tool: ToolDef,
) -> None:
    # The model's own tools: the loop's check is the definition's (the
    # toolbox does not check them again).
    assert tool.schema.tool == tool.name
    assert SCHEMAS[tool.name] == tool.schema


def test_search_needs_a_searxng_url_in_the_runner() -> None:
    settings = Settings(
        valves=with_tool_switches(BaseValves)(), options=RunnerOptions()
    )
    with pytest.raises(RunnerError) as refused:
        check_tool_settings(settings)
    assert str(refused.value) == (
        "no search engine configured: set SEARXNG_URL (--searxng-url, "
        "TDR_SEARXNG_URL or SEARXNG_URL in the config file) to a SearXNG search "
        "URL with the JSON format enabled, or SEARCH_ENABLED=false to research "
        "without web search"
    )


MODULES = [tool for tool in CATALOG if tool.module is not None]


async def tools_class(tool: ToolDef) -> type:
    assert tool.module is not None
    cls = await ToolResolver().resolve(tool.module)
    assert cls is not None
    return cls


@pytest.mark.parametrize("tool", MODULES, ids=lambda tool: tool.name)
async def test_each_module_takes_what_its_definition_says(tool: ToolDef) -> None:
    assert tool.module is not None
    cls = await tools_class(tool)
    parameters = list(inspect.signature(getattr(cls, tool.module.method)).parameters)
    reserved = [name for name in parameters if name in RESERVED_ARGUMENTS]
    offered = [name for name in parameters if name != "self" and name not in reserved]
    assert offered == [parameter.name for parameter in tool.schema.parameters]
    assert reserved == list(tool.module.reserved)


@pytest.mark.parametrize("tool", MODULES, ids=lambda tool: tool.name)
async def test_each_valve_a_definition_names_is_its_modules(tool: ToolDef) -> None:
    assert tool.module is not None
    valves = set((await tools_class(tool)).Valves.model_fields)
    runner = tool.module.runner
    named = {name for name, _ in runner.fixed} | set(runner.settings)
    server = tool.module.model_server
    if server is not None:
        named |= {server.url, server.key, server.model}
    assert named <= valves
    # The runner settings it takes are the runner's.
    assert set(runner.settings) <= set(RunnerOptions.model_fields)
    if runner.required is not None:
        assert runner.required.setting in runner.settings


def test_the_scripts_read_the_tool_list_from_the_catalog() -> None:
    modules = [spec.module for spec in tool_modules().values()]
    assert modules == ["search_tool", "visit_tool", "scholar_tool"]
    build_release = load_script("build_release")
    assert tuple(f"{name}.py" for name in modules) == build_release.TOOL_FILES
    valves_doc = load_script("valves_doc")
    assert {name: module for name, (module, _) in valves_doc.TABLES.items()} == {
        "pipe": "tongyi_deepresearch_openwebui_pipeline.pipes.pipe",
        "user": "tongyi_deepresearch_openwebui_pipeline.pipes.pipe",
        **{
            name.removesuffix(
                "_tool"
            ): f"tongyi_deepresearch_openwebui_pipeline.tools.{name}"
            for name in modules
        },
    }
    assert all((ROOT / f"{name}.py").is_file() for name in modules)
