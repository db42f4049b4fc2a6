r"""The ``parse_file`` tool: files the user attached, read by name.

Open WebUI extracts the text of an uploaded file when it is uploaded and keeps
it in its file store (``Files.get_file_by_id(id).data['content']``); the pipe
receives the attachments as ``__files__``. The model was trained to see the
names in front of the question — ``(Uploaded 1 file: ['hello.txt'])\n\n…`` —
and to call ``parse_file`` with them; the result it was trained on is the
Python ``str()`` of a list:

    ['File token number: 3\nFile content:\n', '# File: hello.txt\nHello there!']

where the number is the whitespace-split word count of the joined file
blocks, and a file that cannot be read becomes ``# Error processing {name}:
{reason}``.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.events import ToolOutcome
from ...core.history import ContextSource
from ...core.toolcalls import ToolCall
from . import compat
from .tooldef import Handler

log = logging.getLogger(__name__)

#: Most characters of one file shown to the model (about 25K tokens).
MAX_FILE_CHARS = 100_000

# ``__files__`` entry types that stand for one readable file.
_FILE_TYPES = frozenset({"file", "text"})


@dataclass(frozen=True)
class AttachedFile:
    """One attachment: the name the model uses and where its text is."""

    name: str
    file_id: str | None = None
    #: Text sent with the attachment itself (temporary chats).
    inline_text: str | None = None


class FileReadError(Exception):
    """A file's text cannot be read; the message is shown to the model."""


# -- the attachments -------------------------------------------------------------------


def _nested(item: Mapping[str, Any], *keys: str) -> Any:
    """``item[k1][k2]…`` or None when any level is missing."""
    value: Any = item
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _first_text(*values: Any) -> str:
    """The first non-empty string among ``values``."""
    for value in values:
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def _attachment(item: Any) -> AttachedFile | None:
    """One ``__files__`` entry as an `AttachedFile` (None: not a file)."""
    if not isinstance(item, Mapping) or item.get("type", "file") not in _FILE_TYPES:
        return None
    file_id = _first_text(item.get("id"), _nested(item, "file", "id")) or None
    inline = item.get("content") if isinstance(item.get("content"), str) else None
    if file_id is None and inline is None:
        return None
    name = _first_text(
        item.get("name"),
        _nested(item, "file", "meta", "name"),
        _nested(item, "file", "filename"),
        file_id,
        "attachment.txt",
    )
    return AttachedFile(name, file_id, inline)


def _unique(files: list[AttachedFile]) -> list[AttachedFile]:
    """Drop repeated ids and give files that share a name distinct labels."""
    seen_ids: set[str] = set()
    taken: set[str] = set()
    result: list[AttachedFile] = []
    for file in files:
        if file.file_id and file.file_id in seen_ids:
            continue
        seen_ids.add(file.file_id or "")
        name, number = file.name, 2
        stem, dot, ext = file.name.rpartition(".")
        while name in taken:
            name = (
                f"{stem} ({number}).{ext}"
                if dot and stem
                else f"{file.name} ({number})"
            )
            number += 1
        taken.add(name)
        result.append(AttachedFile(name, file.file_id, file.inline_text))
    return result


def attached_files(files: Iterable[Any] | None) -> list[AttachedFile]:
    """The readable attachments of ``__files__``, each under a unique name."""
    found = [file for file in map(_attachment, files or []) if file is not None]
    return _unique(found)


def uploaded_files_note(files: Iterable[Any] | None) -> str:
    """The reference question prefix naming the attachments (empty when none).

    Returns ``(Uploaded 1 file: ['hello.txt'])`` plus a blank line; the
    reference data uses "file" whatever the count.
    """
    names = [file.name for file in attached_files(files)]
    if not names:
        return ""
    return f"(Uploaded {len(names)} file: {names!r})\n\n"


def with_uploaded_files_note(question: str, files: Iterable[Any] | None) -> str:
    """``question`` with the attachment note in front of it."""
    return uploaded_files_note(files) + question


# -- reading one file ------------------------------------------------------------------


def _missing_text_reason(data: Mapping[str, Any]) -> str:
    """Why a stored file has no text, in words the model can act on."""
    status = str(data.get("status") or "")
    error = str(data.get("error") or "").strip()
    if error:
        return f"Open WebUI could not extract its text ({error[:200]})"
    if status == "pending":
        return "its text is still being extracted; try again in a moment"
    return (
        "Open WebUI holds no text for this file "
        "(it may be an image or an unsupported format)"
    )


async def read_file_text(file: AttachedFile, user: Mapping[str, Any] | None) -> str:
    """The extracted text of an attachment.

    Raises:
        FileReadError: The file is gone, not readable by ``user``, or has no text.
    """
    record = await compat.get_file_by_id(file.file_id) if file.file_id else None
    if record is None:
        if file.inline_text is not None:
            return file.inline_text
        raise FileReadError("the file is no longer in Open WebUI's file store")
    if user is not None and not await compat.user_may_read_file(record, user):
        raise FileReadError("you do not have access to this file")
    data = compat.as_dict(compat.field_of(record, "data"))
    content = data.get("content")
    if isinstance(content, str):
        return content
    raise FileReadError(_missing_text_reason(data))


def cap_text(text: str, limit: int = MAX_FILE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with a note saying so."""
    if len(text) <= limit:
        return text
    return (
        f"{text[:limit]}\n\n[Truncated: showing the first {limit:,} of "
        f"{len(text):,} characters of this file.]"
    )


# -- the tool --------------------------------------------------------------------------


def _base_name(name: str) -> str:
    return posixpath.basename(name.replace("\\", "/")).strip()


def find_attachment(
    requested: str, files: Sequence[AttachedFile]
) -> AttachedFile | None:
    """The attachment the model means: exact name, any case, or without a path."""
    candidates = (requested.strip(), _base_name(requested))
    for wanted in candidates:
        for file in files:
            if file.name == wanted:
                return file
    for wanted in candidates:
        for file in files:
            if file.name.casefold() == wanted.casefold():
                return file
    return None


async def _block(
    requested: str,
    files: Sequence[AttachedFile],
    user: Mapping[str, Any] | None,
    limit: int,
) -> tuple[str, bool]:
    """One file's block of the result, and whether the file was read."""
    file = find_attachment(requested, files)
    if file is None:
        names = [f.name for f in files]
        return (
            f"# Error processing {requested}: no attached file has this name. "
            f"The attached files are: {names!r}",
            False,
        )
    try:
        text = await read_file_text(file, user)
    except FileReadError as error:
        return f"# Error processing {file.name}: {error}", False
    return f"# File: {file.name}\n{cap_text(text, limit)}", True


async def parse_files(
    requested: Iterable[str],
    files: Sequence[AttachedFile],
    user: Mapping[str, Any] | None = None,
    limit: int = MAX_FILE_CHARS,
) -> ToolOutcome:
    """The ``parse_file`` result for the requested names (reference format)."""
    blocks: list[str] = []
    read_any = False
    for name in dict.fromkeys(requested):  # each file once, in the asked order
        block, ok = await _block(name, files, user, limit)
        blocks.append(block)
        read_any = read_any or ok
    words = len(" ".join(blocks).split())
    head = f"File token number: {words}\nFile content:\n"
    return ToolOutcome(str([head, *blocks]), ok=read_any)


def build_parse_file_handler(
    files: Iterable[Any] | None,
    request: Any = None,
    user: Mapping[str, Any] | None = None,
    max_chars_per_file: int = MAX_FILE_CHARS,
) -> Handler | None:
    """The ``parse_file`` handler for this chat, or None when nothing is attached.

    Args:
        files: ``__files__`` as Open WebUI passes it.
        request: ``__request__`` (unused today; kept for version-specific reads).
        user: ``__user__``; when given, each file's access is checked.
        max_chars_per_file: Longest text of one file shown to the model.

    Returns:
        An async handler for `Toolbox(handlers={"parse_file": …})`, or None,
        in which case the tool is not offered in the prompt.
    """
    del request  # reads go through Open WebUI's file store directly
    attachments = attached_files(files)
    if not attachments:
        return None

    async def parse_file(call: ToolCall) -> ToolOutcome:
        requested = [str(name) for name in call.arguments.get("files") or []]
        return await parse_files(requested, attachments, user, max_chars_per_file)

    return parse_file


# -- context Open WebUI injected (RAG) -------------------------------------------------
#
# `core.history.remove_injected_context` takes Open WebUI's RAG template out of
# the question; what it carried is handed to the model the protocol's way:
# attached files are read with parse_file anyway, other retrieved text
# (knowledge collections) becomes a file parse_file can read, and pages Open
# WebUI's web search found are named by URL so the model can visit them.

#: Name of retrieved text whose source has no name.
CONTEXT_FILE_NAME = "retrieved_context.txt"
_URL_KEYS = ("url", "source", "name")


def _is_url(value: str) -> bool:
    return value.startswith(("http://", "https://")) and " " not in value


def _web_search_entries(files: Iterable[Any] | None) -> list[Mapping[str, Any]]:
    return [
        item
        for item in files or []
        if isinstance(item, Mapping) and item.get("type") == "web_search"
    ]


def _source_urls(source: ContextSource) -> list[str]:
    values = [source.attributes.get(key, "") for key in _URL_KEYS]
    return [value for value in values if _is_url(value)][:1]


def _is_web_result(
    source: ContextSource, searches: Sequence[Mapping[str, Any]]
) -> bool:
    if source.attributes.get("resource-type") == "web_search":
        return True
    if _source_urls(source):
        return True
    return any(source.name and source.name == s.get("name") for s in searches)


def context_handover(
    sources: Sequence[ContextSource], files: Iterable[Any] | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """What injected sources become: (extra ``__files__`` entries, web page URLs).

    Sources that are attached files are dropped (parse_file reads the file
    itself); web-search results give their URLs; everything else (knowledge)
    is joined per name into one text file for parse_file.
    """
    files = list(files or [])
    attached = {file.name for file in attached_files(files)}
    searches = _web_search_entries(files)
    urls: list[str] = [
        str(url) for search in searches for url in search.get("urls") or []
    ]
    texts: dict[str, list[str]] = {}
    for source in sources:
        if source.name in attached:
            continue
        if _is_web_result(source, searches):
            urls.extend(_source_urls(source))
            continue
        if source.text:
            texts.setdefault(source.name or CONTEXT_FILE_NAME, []).append(source.text)
    extra = [
        {"type": "text", "name": name, "content": "\n\n".join(parts)}
        for name, parts in texts.items()
        if name not in attached
    ]
    return extra, [url for url in dict.fromkeys(urls) if _is_url(url)]


def web_results_note(urls: Sequence[str]) -> str:
    """A line naming the pages Open WebUI's web search found (empty when none)."""
    if not urls:
        return ""
    return f"(Open WebUI's web search found these pages: {list(urls)!r})\n\n"
