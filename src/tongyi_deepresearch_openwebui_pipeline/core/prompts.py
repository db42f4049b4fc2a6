"""The prompts Tongyi DeepResearch was trained with, and the loop's own messages.

The system prompt, the tool lines and the extractor prompt are an interface:
they are the exact bytes of the reference agent's ``inference/prompt.py``
(Alibaba-NLP/DeepResearch, Apache-2.0). Accuracy depends on them, so they are
reproduced verbatim and checked byte for byte against the golden copy in
``tests/fixtures/reference_agent/prompts.json``. The only thing the product
changes is which tool lines appear: a tool that is disabled or unavailable is
left out, so the model is never offered a tool it cannot use.

The reference loop's words at its limits (the wrap-up, the round limit) are
``inference/react_agent.py``'s, and ReSum's summary prompts and restart
message are ``WebAgent/WebResummer/src``'s, all checked byte for byte
against ``tests/fixtures/lab/``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

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

#: What the reference loop writes over the last message when its last
#: available call gave no answer (it makes no call after it).
CALLS_EXCEEDED_MESSAGE = "Sorry, the number of llm calls exceeds the limit."

#: The reference loop's error for a call it cannot parse.
INVALID_TOOL_CALL = (
    'Error: Tool call is not a valid JSON. Tool call must contain a valid "name" '
    'and "arguments" field.'
)


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


# -- Research beyond the context window: ReSum, as published --
#
# ReSum (arXiv 2509.13313; Alibaba-NLP/DeepResearch, WebAgent/WebResummer/src)
# summarises the conversation when it nears the context and restarts from the
# question and that summary. Its prompts and its restart message are an
# interface: the summary model was prompted with these exact bytes
# (`prompt.py`), and the ReSum-GRPO agents were trained to go on from the
# restart message (`react_agent.py`). Both are reproduced verbatim and checked
# byte for byte against `tests/fixtures/lab/resum_prompts.json`.

#: The first summary's request (WebResummer ``prompt.py``, QUERY_SUMMARY_PROMPT).
QUERY_SUMMARY_PROMPT = (
    "You are an expert at analyzing conversation history and extracting relevant information. Your task is to thoroughly evaluate the conversation history and current question to provide a comprehensive summary that will help answer the question.\n"
    "\n"
    "Task Guidelines \n"
    "1. Information Analysis:\n"
    "   - Carefully analyze the conversation history to identify truly useful information.\n"
    "   - Focus on information that directly contributes to answering the question.\n"
    "   - Do NOT make assumptions, guesses, or inferences beyond what is explicitly stated in the conversation.\n"
    "   - If information is missing or unclear, do NOT include it in your summary.\n"
    "\n"
    "2. Summary Requirements:\n"
    "   - Extract only the most relevant information that is explicitly present in the conversation.\n"
    "   - Synthesize information from multiple exchanges when relevant.\n"
    "   - Only include information that is certain and clearly stated in the conversation.\n"
    "   - Do NOT output or mention any information that is uncertain, insufficient, or cannot be confirmed from the conversation.\n"
    "\n"
    "3. Output Format: Your response should be structured as follows:\n"
    "<summary>\n"
    "- Essential Information: [Organize the relevant and certain information from the conversation history that helps address the question.]\n"
    "</summary>\n"
    "\n"
    "Strictly avoid fabricating, inferring, or exaggerating any information not present in the conversation. Only output information that is certain and explicitly stated.\n"
    "\n"
    "Question\n"
    "{{{question}}} \n"
    "\n"
    "Conversation History\n"
    "{{{recent_history_messages}}}\n"
    "\n"
    "Please generate a comprehensive and useful summary. Note that you are not permitted to invoke tools during this process.\n"
)

#: Every later summary's request, which also carries the last summary
#: (WebResummer ``prompt.py``, QUERY_SUMMARY_PROMPT_LAST).
QUERY_SUMMARY_PROMPT_LAST = (
    "You are an expert at analyzing conversation history and extracting relevant information. Your task is to thoroughly evaluate the conversation history and current question to provide a comprehensive summary that will help answer the question.\n"
    "\n"
    "The last summary serves as your starting point, marking the information landscape previously collected. Your role is to:\n"
    "- Analyze progress made since the last summary\n"
    "- Identify remaining information gaps\n"
    "- Generate a useful summary that combines previous and new information\n"
    "- Maintain continuity, especially when recent conversation history is limited\n"
    "\n"
    "Task Guidelines\n"
    "\n"
    "1. Information Analysis:\n"
    "   - Carefully analyze the conversation history to identify truly useful information.\n"
    "   - Focus on information that directly contributes to answering the question.\n"
    "   - Do NOT make assumptions, guesses, or inferences beyond what is explicitly stated.\n"
    "   - If information is missing or unclear, do NOT include it in your summary.\n"
    "   - Use the last summary as a baseline when recent history is sparse.\n"
    "\n"
    "2. Summary Requirements:\n"
    "   - Extract only the most relevant information that is explicitly present in the conversation.\n"
    "   - Synthesize information from multiple exchanges when relevant.\n"
    "   - Only include information that is certain and clearly stated.\n"
    "   - Do NOT output or mention any information that is uncertain, insufficient, or cannot be confirmed.\n"
    "\n"
    "3. Output Format: Your response should be structured as follows:\n"
    "<summary>\n"
    "- Essential Information: [Organize the relevant and certain information from the conversation history that helps address the question.]\n"
    "</summary>\n"
    "\n"
    "Strictly avoid fabricating, inferring, or exaggerating any information not present in the conversation. Only output information that is certain and explicitly stated.\n"
    "\n"
    "Question\n"
    "{{{question}}}\n"
    "\n"
    "Last Summary\n"
    "{{{last_summary}}}\n"
    "\n"
    "Conversation History\n"
    "{{{recent_history_messages}}}\n"
    "\n"
    "Please generate a comprehensive and useful summary. Note that you are not permitted to invoke tools during this process.\n"
)

#: The placeholders of the two summary prompts.
QUESTION_SLOT = "{{{question}}}"
HISTORY_SLOT = "{{{recent_history_messages}}}"
LAST_SUMMARY_SLOT = "{{{last_summary}}}"

#: A summary as ReSum passes it on (``summary_utils.py``): the text between tags.
SUMMARY_OPEN = "<summary>"
SUMMARY_CLOSE = "</summary>"

#: The lab's resumption text, between the question and the summary.
_RESUMPTION_MIDDLE = (
    "\nBelow is a summary of the previous conversation. This summary condenses "
    "key information from earlier steps, so please consider it carefully. Assess "
    "whether the summary provides enough information to answer the question and "
    "use it as the basis for further reasoning and information gathering to "
    "answer the question.\n"
)


def summary_prompt(question: str, history: str, last_summary: str = "") -> str:
    """The summary request ReSum sends: its prompt with the slots filled.

    The first summary fills `QUERY_SUMMARY_PROMPT`; once there is a
    ``last_summary`` (as the restart carried it, tags included),
    `QUERY_SUMMARY_PROMPT_LAST`. Each slot of the prompt is filled once, in
    the prompt only: the lab chains ``str.replace``, so a question or a page
    holding ``{{{last_summary}}}`` had the summary spliced into it; here the
    text put in a slot is never searched again. Ordinary text gives the
    lab's bytes.
    """
    template = QUERY_SUMMARY_PROMPT_LAST if last_summary else QUERY_SUMMARY_PROMPT
    values = {
        QUESTION_SLOT: question,
        HISTORY_SLOT: history,
        LAST_SUMMARY_SLOT: last_summary,
    }
    return _fill_once(template, values)


def _fill_once(template: str, values: dict[str, str]) -> str:
    """``template`` with each slot in ``values`` replaced, its text left as is."""
    pieces: list[str] = []
    at = 0
    while True:
        found = [
            (index, slot) for slot in values if (index := template.find(slot, at)) >= 0
        ]
        if not found:
            pieces.append(template[at:])
            return "".join(pieces)
        index, slot = min(found)
        pieces += [template[at:index], values[slot]]
        at = index + len(slot)


def resumption_message(question: str, summary: str) -> str:
    """The user message a consolidated conversation restarts from (the lab's).

    ``summary`` is the summary's text without its tags; it is wrapped in
    ``<summary></summary>`` as the lab's summary tool returns it
    (``summary_utils.py``), and put after ``Summary: ``
    (``react_agent.py``).
    """
    return (
        "Question: "
        + question
        + _RESUMPTION_MIDDLE
        + "Summary: "
        + SUMMARY_OPEN
        + summary
        + SUMMARY_CLOSE
        + "\n"
    )
