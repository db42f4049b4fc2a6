"""The prompts Tongyi DeepResearch was trained with, and the loop's own messages.

The system prompt, the tool lines and the extractor prompt are an interface:
they are the exact bytes of the reference agent's ``inference/prompt.py``
(Alibaba-NLP/DeepResearch, Apache-2.0). Accuracy depends on them, so they are
reproduced verbatim and checked byte for byte against the golden copy in
``tests/fixtures/reference_agent/prompts.json``. The only thing the product
changes is which tool lines appear: a tool that is disabled or unavailable is
left out, so the model is never offered a tool it cannot use.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Container, Iterable

_HEAD = (
    "You are a deep research assistant. Your core function is to conduct thorough, multi-source investigations into any topic. You must handle both broad, open-domain inquiries and queries within specialized academic fields. For every request, synthesize information from credible, diverse sources to deliver a comprehensive, accurate, and objective response. When you have gathered sufficient information and are ready to provide the definitive response, you must enclose the entire final answer within <answer></answer> tags.\n"
    "\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
)

_TOOL_LINE_SEARCH = '{"type": "function", "function": {"name": "search", "description": "Perform Google web searches then returns a string of the top search results. Accepts multiple queries.", "parameters": {"type": "object", "properties": {"query": {"type": "array", "items": {"type": "string", "description": "The search query."}, "minItems": 1, "description": "The list of search queries."}}, "required": ["query"]}}}'

_TOOL_LINE_VISIT = '{"type": "function", "function": {"name": "visit", "description": "Visit webpage(s) and return the summary of the content.", "parameters": {"type": "object", "properties": {"url": {"type": "array", "items": {"type": "string"}, "description": "The URL(s) of the webpage(s) to visit. Can be a single URL or an array of URLs."}, "goal": {"type": "string", "description": "The specific information goal for visiting webpage(s)."}}, "required": ["url", "goal"]}}}'

_TOOL_LINE_PYTHONINTERPRETER = (
    '{"type": "function", "function": {"name": "PythonInterpreter", "description": "Executes Python code in a sandboxed environment. To use this tool, you must follow this format:\n'
    "1. The 'arguments' JSON object must be empty: {}.\n"
    "2. The Python code to be executed must be placed immediately after the JSON block, enclosed within <code> and </code> tags.\n"
    "\n"
    "IMPORTANT: Any output you want to see MUST be printed to standard output using the print() function.\n"
    "\n"
    "Example of a correct call:\n"
    "<tool_call>\n"
    '{"name": "PythonInterpreter", "arguments": {}}\n'
    "<code>\n"
    "import numpy as np\n"
    "# Your code here\n"
    'print(f"The result is: {np.mean([1,2,3])}")\n'
    "</code>\n"
    '</tool_call>", "parameters": {"type": "object", "properties": {}, "required": []}}}'
)

_TOOL_LINE_GOOGLE_SCHOLAR = '{"type": "function", "function": {"name": "google_scholar", "description": "Leverage Google Scholar to retrieve relevant information from academic publications. Accepts multiple queries. This tool will also return results from google search", "parameters": {"type": "object", "properties": {"query": {"type": "array", "items": {"type": "string", "description": "The search query."}, "minItems": 1, "description": "The list of search queries for Google Scholar."}}, "required": ["query"]}}}'

_TOOL_LINE_PARSE_FILE = '{"type": "function", "function": {"name": "parse_file", "description": "This is a tool that can be used to parse multiple user uploaded local files such as PDF, DOCX, PPTX, TXT, CSV, XLSX, DOC, ZIP, MP4, MP3.", "parameters": {"type": "object", "properties": {"files": {"type": "array", "items": {"type": "string"}, "description": "The file name of the user uploaded local files to be parsed."}}, "required": ["files"]}}}'

_TAIL = (
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>\n"
    "\n"
    "Current date: "
)

EXTRACTOR_PROMPT = (
    "Please process the following webpage content and user goal to extract relevant information:\n"
    "\n"
    "## **Webpage Content** \n"
    "{webpage_content}\n"
    "\n"
    "## **User Goal**\n"
    "{goal}\n"
    "\n"
    "## **Task Guidelines**\n"
    "1. **Content Scanning for Rationale**: Locate the **specific sections/data** directly related to the user's goal within the webpage content\n"
    "2. **Key Extraction for Evidence**: Identify and extract the **most relevant information** from the content, you never miss any important information, output the **full original context** of the content as far as possible, it can be more than three paragraphs.\n"
    "3. **Summary Output for Summary**: Organize into a concise paragraph with logical flow, prioritizing clarity and judge the contribution of the information to the goal.\n"
    "\n"
    '**Final Output Format using JSON format has "rational", "evidence", "summary" feilds**\n'
)

#: Tool name -> its line inside ``<tools>``, in the reference order.
TOOL_LINES: dict[str, str] = {
    "search": _TOOL_LINE_SEARCH,
    "visit": _TOOL_LINE_VISIT,
    "PythonInterpreter": _TOOL_LINE_PYTHONINTERPRETER,
    "google_scholar": _TOOL_LINE_GOOGLE_SCHOLAR,
    "parse_file": _TOOL_LINE_PARSE_FILE,
}

#: Every tool the model knows, in prompt order.
ALL_TOOLS: tuple[str, ...] = tuple(TOOL_LINES)

#: The reference loop's wrap-up message (sent when a budget runs out).
WRAP_UP_MESSAGE = (
    "You have now reached the maximum context length you can handle. You should "
    "stop making tool calls and, based on all the information above, think again "
    "and provide what you consider the most likely answer in the following "
    "format:<think>your final thinking</think>\n<answer>your answer</answer>"
)

#: The reference loop's error for a call it cannot parse.
INVALID_TOOL_CALL = (
    'Error: Tool call is not a valid JSON. Tool call must contain a valid "name" '
    'and "arguments" field.'
)


def tool_not_found(name: str, available: Iterable[str]) -> str:
    """Model-facing error for a call to a tool that is not offered.

    Starts with the reference text, then tells the model what it can use.
    """
    names = ", ".join(available) or "none"
    return f"Error: Tool {name} not found. Available tools: {names}."


def format_date(today: dt.date) -> str:
    """The date the way the reference loop appends it (``YYYY-MM-DD``)."""
    return today.strftime("%Y-%m-%d")


def build_system_prompt(
    tools: Iterable[str], today: dt.date, preamble: str = ""
) -> str:
    """The reference system prompt with only ``tools`` listed and today's date.

    Args:
        tools: Names of the tools that are enabled and can run; unknown names are
            ignored and the reference order is kept whatever order they come in.
        today: The date to append after ``Current date: ``.
        preamble: Optional admin text, prepended before the reference prompt.

    Returns:
        The system message content.
    """
    wanted = set(tools)
    lines = [TOOL_LINES[name] for name in ALL_TOOLS if name in wanted]
    return system_prompt_with(lines, today, preamble)


def system_prompt_with(
    tool_lines: Iterable[str], today: dt.date, preamble: str = ""
) -> str:
    """The reference system prompt around these tool lines, in this order.

    The tool catalog gives each tool's line (for the model's own tools, the
    `TOOL_LINES` bytes above); `build_system_prompt` is this with the
    reference lines of the tools named.
    """
    lines = "".join(line + "\n" for line in tool_lines)
    prompt = _HEAD + lines + _TAIL + format_date(today)
    preamble = preamble.strip()
    return f"{preamble}\n\n{prompt}" if preamble else prompt


# -- Heavy mode: the synthesis of several rollouts --
#
# The lab has not published the prompts of its Heavy mode (nor trained the
# model on one), so these are this project's own, written for the research
# model as its own aggregator (the approach of ParallelMuse, arXiv 2510.24698).
# Each rollout's report is built from what the run produced, without another
# model call: its answer, and the evidence the visit tool extracted from each
# page it read, numbered as the sources of the whole run.

#: The system message of the synthesis call.
SYNTHESIS_SYSTEM = (
    "You are a deep research assistant. You combine the findings of several "
    "independent research runs on one question into a single, well-supported "
    "answer. Current date: "
)

#: The synthesis request: `{count}` reports on `{question}` follow it.
SYNTHESIS_REQUEST = (
    "{count} researchers worked on the question below independently: each "
    "searched the web, read pages and wrote an answer. Their reports follow, "
    "each with its answer and the evidence taken from the pages it read, "
    "numbered as sources [n].\n"
    "\n"
    "Write the final answer to the question from these reports:\n"
    "- Rely on the evidence. A claim that several reports support, or that "
    "rests on quoted evidence, outweighs one that does not; where reports "
    "disagree, weigh their evidence and say which answer is better supported "
    "and why.\n"
    "- Use only what the reports contain; do not invent facts or sources.\n"
    "- Cite the pages you rely on as Markdown links to their URLs, e.g. "
    "[title](https://example.org/page).\n"
    "- Answer in the language of the question.\n"
    "\n"
    "Think it through, then give the complete final answer inside "
    "<answer></answer> tags.\n"
    "\n"
    "# Question\n"
    "\n"
    "{question}\n"
    "\n"
    "{reports}"
)

#: One rollout's report inside the synthesis request.
SYNTHESIS_REPORT = "# Report {number} ({ending})\n\n## Answer\n\n{answer}\n\n{evidence}"

#: One source's evidence inside a report.
SYNTHESIS_SOURCE = "[{number}] {title} ({url})\n{evidence}"


def build_synthesis_system(today: dt.date) -> str:
    """The synthesis call's system message, with today's date."""
    return SYNTHESIS_SYSTEM + format_date(today)


# What a rollout wrote, and what its pages said, goes into the synthesis
# request between the request's own lines. Its structure is in two kinds of
# line: Markdown headings ("# Report 2 (…)", "## Answer", "# Question") and
# source entries ("[3] Title (url)"). A rollout's text is made unable to
# produce either (`escape_structure_lines`), and its bracketed numbers that
# are no source of the run are dropped (`drop_unknown_source_numbers`), so a
# report can neither end early, add a report or a source, nor cite one that
# does not exist.

#: What ends a line for `str.splitlines` (and so, possibly, for a reader).
_LINE_BREAKS = r"\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029"
#: A line starting (after blanks) as a heading or a source entry. Possessive
#: blanks and a lookahead: each line start is examined once, in linear time.
_STRUCTURE_LINE = re.compile(
    rf"(\A|[{_LINE_BREAKS}])([^\S{_LINE_BREAKS}]*+)(?=#|\[[0-9]++\])"
)
_SOURCE_NUMBER = re.compile(r"\[([0-9]+)\]")
#: More digits than any run's count of sources (and than `int` reads quickly).
_MAX_SOURCE_DIGITS = 6
#: What may end / start the text around a dropped ``[n]`` and join into a new one.
_NUMBER_OPENING = frozenset("[0123456789")
_NUMBER_CLOSING = frozenset("]0123456789")


def escape_structure_lines(text: str) -> str:
    r"""Escape the lines of ``text`` that read as the synthesis request's structure.

    A line that starts (after blanks) with ``#`` or with ``[n]`` gets a
    backslash before it (``\# Report 4``, ``\[2] Title``), Markdown's escape:
    still readable, no longer a heading or a source entry. Every line break
    `str.splitlines` knows counts, and the start of ``text``.
    """
    return _STRUCTURE_LINE.sub(lambda line: f"{line[1]}{line[2]}\\", text)


def drop_unknown_source_numbers(text: str, known: Container[int]) -> str:
    """``text`` without the bracketed numbers ``[n]`` that are not in ``known``.

    A rollout never saw the run's numbering, so an ``[n]`` it wrote that is no
    source of the run cites nothing the synthesis could check: it is dropped
    rather than shown as a source. Where dropping would join its neighbours
    into a new ``[n]`` (``[1[99]]``), a space stands in for it (``[1 ]``).
    """
    pieces: list[str] = []
    last, at = "", 0
    for found in _SOURCE_NUMBER.finditer(text):
        if _is_known(found[1], known):
            continue
        before = text[at : found.start()]
        last = before[-1:] or last
        following = text[found.end() : found.end() + 1]
        joins = last in _NUMBER_OPENING and following in _NUMBER_CLOSING
        pieces += [before, " " if joins else ""]
        last = " " if joins else last
        at = found.end()
    pieces.append(text[at:])
    return "".join(pieces)


def _is_known(digits: str, known: Container[int]) -> bool:
    return len(digits) <= _MAX_SOURCE_DIGITS and int(digits) in known


# -- Research beyond the context window: consolidate and continue --
#
# The resumption message is the lab's interface: ReSum (arXiv 2509.13313)
# restarts the conversation as one user message in this exact shape
# (Alibaba-NLP/DeepResearch, WebAgent/WebResummer/src/react_agent.py), and its
# ReSum-GRPO agents were trained to continue from it, so it is reproduced byte
# for byte (`resumption_message`). The lab's summary prompts were written for
# its own summary model (ReSumTool-30B) and ask for the essential information
# only, without the URLs that citations need or what is still open; this
# project's summary model is the research model itself, so the request below
# is its own: it is sent as one more user message after the conversation (the
# reference wrap-up's shape), which the model reads in its own format.

#: Asks for the research state that replaces the conversation.
CONSOLIDATION_REQUEST = (
    "Stop here and do not call any tool: the conversation has grown too long "
    "for the context window. It will be cleared, and the research will go on "
    "from the question and the state you write now; anything you leave out of "
    "the state is lost.\n"
    "\n"
    "Write the state inside <summary></summary> tags, in three parts:\n"
    "1. Established: every finding that bears on the question, each followed "
    "by the URL of the page it came from. Keep exact names, numbers, dates and "
    "short quotations.\n"
    "2. Still open: what the question still needs, and the most promising "
    "next steps.\n"
    "3. Tried without success: searches and pages that gave nothing useful or "
    "failed, so they are not repeated.\n"
    "\n"
    "Write only what the conversation shows; mark anything uncertain as "
    "uncertain. Be complete but brief."
)

#: The lab's resumption text, between the question and the summary.
_RESUMPTION_MIDDLE = (
    "\nBelow is a summary of the previous conversation. This summary condenses "
    "key information from earlier steps, so please consider it carefully. Assess "
    "whether the summary provides enough information to answer the question and "
    "use it as the basis for further reasoning and information gathering to "
    "answer the question.\n"
)

#: Heads the list of pages read, which the loop adds inside the summary.
PAGES_READ_HEADING = "Pages read so far (cite them by their URLs):"


def resumption_message(question: str, summary: str) -> str:
    """The user message a consolidated conversation restarts from (the lab's).

    ``summary`` is the state without tags; it is wrapped in
    ``<summary></summary>`` as the lab's summary tool returns it.
    """
    return (
        "Question: "
        + question
        + _RESUMPTION_MIDDLE
        + "Summary: "
        + "<summary>"
        + summary
        + "</summary>"
        + "\n"
    )
