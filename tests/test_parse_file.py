"""parse_file: the user's attachments, read by name, in the reference format."""

from __future__ import annotations

import ast
from collections.abc import Iterator

import pytest

from tests.fakes.openwebui_shapes import FakeOpenWebUI
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui import files
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.catalog import (
    ChatFacts,
    question_note,
)
from tongyi_deepresearch_openwebui_pipeline.adapters.openwebui.toolbox import (
    Toolbox,
    ToolContext,
)
from tongyi_deepresearch_openwebui_pipeline.core.toolcalls import ToolCall

OWNER = {"id": "u1", "role": "user"}


def attachment(file_id: str, name: str) -> dict[str, object]:
    """A ``__files__`` entry as the Open WebUI UI sends it."""
    return {
        "type": "file",
        "id": file_id,
        "name": name,
        "file": {"id": file_id, "filename": name, "meta": {"name": name}},
        "status": "uploaded",
    }


@pytest.fixture(params=["0.6", "0.12"])
def owui(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeOpenWebUI]:
    """A sync (0.6) and an async (0.12) file store."""
    fake = FakeOpenWebUI(request.param).install(monkeypatch)
    yield fake
    fake.cleanup()


async def parse(handler: files.Handler | None, *names: str) -> tuple[list[str], bool]:
    assert handler is not None
    outcome = await handler(ToolCall("parse_file", {"files": list(names)}))
    parsed = ast.literal_eval(outcome.text)  # the model sees str(list)
    assert isinstance(parsed, list)
    return parsed, outcome.ok


# -- the question prefix ---------------------------------------------------------------


def test_note_matches_the_reference_example() -> None:
    attached = [attachment("f1", "hello.txt")]
    assert files.uploaded_files_note(attached) == "(Uploaded 1 file: ['hello.txt'])\n\n"
    assert (
        files.with_uploaded_files_note("Hello!", attached)
        == "(Uploaded 1 file: ['hello.txt'])\n\nHello!"
    )


def test_the_note_comes_before_the_question_while_parse_file_is_offered() -> None:
    chat = ChatFacts(files=(attachment("f1", "hello.txt"),))
    note = question_note(["search", "parse_file"], chat)
    assert note == "(Uploaded 1 file: ['hello.txt'])\n\n"
    assert question_note(["search", "visit"], chat) == ""


def test_note_lists_every_file_in_order() -> None:
    attached = [attachment("f1", "a.pdf"), attachment("f2", "b.csv")]
    assert (
        files.uploaded_files_note(attached)
        == "(Uploaded 2 file: ['a.pdf', 'b.csv'])\n\n"
    )


@pytest.mark.parametrize(
    "attached",
    [
        None,
        [],
        [{"type": "collection", "id": "c1", "name": "Docs"}],
        [{"type": "file"}],
        ["x"],
    ],
)
def test_no_readable_attachment_means_no_note_and_no_tool(attached: object) -> None:
    assert files.uploaded_files_note(attached) == ""  # type: ignore[arg-type]
    assert files.build_parse_file_handler(attached, None) is None  # type: ignore[arg-type]


def test_names_come_from_the_entry_or_its_file_record() -> None:
    entries = [
        {"type": "file", "id": "f1", "file": {"meta": {"name": "from-meta.txt"}}},
        {"type": "file", "id": "f2", "file": {"filename": "from-filename.txt"}},
        {"id": "f3"},
        {"type": "file", "id": "f1", "name": "duplicate id.txt"},
    ]
    names = [f.name for f in files.attached_files(entries)]
    assert names == ["from-meta.txt", "from-filename.txt", "f3"]


def test_same_names_get_distinct_labels() -> None:
    entries = [
        attachment("f1", "notes.txt"),
        attachment("f2", "notes.txt"),
        attachment("f3", "README"),
    ]
    entries.append(attachment("f4", "README"))
    names = [f.name for f in files.attached_files(entries)]
    assert names == ["notes.txt", "notes (2).txt", "README", "README (2)"]


# -- reading ---------------------------------------------------------------------------


async def test_reads_a_file_in_the_reference_format(owui: FakeOpenWebUI) -> None:
    owui.add_file("f1", "notes.txt", "The uploaded file says: kiwi-42.\n")
    handler = files.build_parse_file_handler(
        [attachment("f1", "notes.txt")], owui.request(), OWNER
    )
    assert handler is not None
    outcome = await handler(ToolCall("parse_file", {"files": ["notes.txt"]}))
    assert outcome.ok
    # 8 words: "# File: notes.txt The uploaded file says: kiwi-42."
    assert outcome.text == (
        "['File token number: 8\\nFile content:\\n', "
        "'# File: notes.txt\\nThe uploaded file says: kiwi-42.\\n']"
    )
    assert owui.sync_calls_on_loop_thread == []


async def test_several_files_are_counted_together(owui: FakeOpenWebUI) -> None:
    owui.add_file("f1", "a.txt", "one two")
    owui.add_file("f2", "b.txt", "three")
    handler = files.build_parse_file_handler(
        [attachment("f1", "a.txt"), attachment("f2", "b.txt")], None, OWNER
    )
    parsed, ok = await parse(handler, "a.txt", "b.txt", "a.txt")
    assert ok
    assert parsed == [
        "File token number: 9\nFile content:\n",
        "# File: a.txt\none two",
        "# File: b.txt\nthree",
    ]


async def test_an_empty_file_reads_as_empty(owui: FakeOpenWebUI) -> None:
    owui.add_file("f1", "hello.txt", "")
    handler = files.build_parse_file_handler(
        [attachment("f1", "hello.txt")], None, OWNER
    )
    parsed, ok = await parse(handler, "hello.txt")
    assert ok
    assert parsed == ["File token number: 3\nFile content:\n", "# File: hello.txt\n"]


async def test_model_may_use_any_case_or_a_path(owui: FakeOpenWebUI) -> None:
    owui.add_file("f1", "Report.PDF", "pdf text")
    handler = files.build_parse_file_handler(
        [attachment("f1", "Report.PDF")], None, OWNER
    )
    for name in ("report.pdf", "/data/uploads/Report.PDF", "C:\\files\\report.pdf"):
        parsed, ok = await parse(handler, name)
        assert ok, name
        assert parsed[1] == "# File: Report.PDF\npdf text"


async def test_unknown_name_lists_the_attached_files(owui: FakeOpenWebUI) -> None:
    owui.add_file("f1", "a.txt", "alpha")
    handler = files.build_parse_file_handler(
        [attachment("f1", "a.txt"), attachment("f2", "b.txt")], None, OWNER
    )
    parsed, ok = await parse(handler, "c.txt")
    assert not ok
    assert parsed[1] == (
        "# Error processing c.txt: no attached file has this name. "
        "The attached files are: ['a.txt', 'b.txt']"
    )


async def test_unreadable_files_explain_why(owui: FakeOpenWebUI) -> None:
    owui.add_file("pending", "p.txt", None, status="pending")
    owui.add_file("failed", "f.txt", None, status="failed", error="no parser")
    owui.add_file("image", "i.png", None)
    entries = [
        attachment("pending", "p.txt"),
        attachment("failed", "f.txt"),
        attachment("image", "i.png"),
        attachment("gone", "g.txt"),
    ]
    handler = files.build_parse_file_handler(entries, None, OWNER)
    parsed, ok = await parse(handler, "p.txt", "f.txt", "i.png", "g.txt")
    assert not ok
    assert parsed[1].startswith(
        "# Error processing p.txt: its text is still being extracted"
    )
    assert (
        parsed[2]
        == "# Error processing f.txt: Open WebUI could not extract its text (no parser)"
    )
    assert parsed[3].startswith("# Error processing i.png: Open WebUI holds no text")
    assert (
        parsed[4]
        == "# Error processing g.txt: the file is no longer in Open WebUI's file store"
    )


async def test_one_good_file_among_bad_ones_is_still_read(owui: FakeOpenWebUI) -> None:
    owui.add_file("f1", "a.txt", "alpha")
    handler = files.build_parse_file_handler([attachment("f1", "a.txt")], None, OWNER)
    parsed, ok = await parse(handler, "missing.txt", "a.txt")
    assert ok
    assert parsed[2] == "# File: a.txt\nalpha"


async def test_other_users_files_are_refused(owui: FakeOpenWebUI) -> None:
    owui.add_file("f1", "secret.txt", "salary list", user_id="someone-else")
    attached = [attachment("f1", "secret.txt")]
    stranger = files.build_parse_file_handler(
        attached, None, {"id": "u1", "role": "user"}
    )
    parsed, ok = await parse(stranger, "secret.txt")
    assert not ok
    assert (
        parsed[1]
        == "# Error processing secret.txt: you do not have access to this file"
    )
    admin = files.build_parse_file_handler(
        attached, None, {"id": "boss", "role": "admin"}
    )
    parsed, ok = await parse(admin, "secret.txt")
    assert ok
    owui.shared_files["f1"] = {"u1"}
    parsed, ok = await parse(stranger, "secret.txt")
    assert ok


async def test_long_files_are_capped_with_a_note(owui: FakeOpenWebUI) -> None:
    owui.add_file("f1", "big.txt", "x" * 250)
    handler = files.build_parse_file_handler(
        [attachment("f1", "big.txt")], None, OWNER, max_chars_per_file=100
    )
    parsed, ok = await parse(handler, "big.txt")
    assert ok
    assert parsed[1] == (
        "# File: big.txt\n" + "x" * 100 + "\n\n[Truncated: showing the first 100 of "
        "250 characters of this file.]"
    )


async def test_inline_text_of_temporary_chats_is_used(owui: FakeOpenWebUI) -> None:
    entry = {
        "type": "text",
        "id": "t1",
        "name": "pasted.txt",
        "content": "inline words",
    }
    handler = files.build_parse_file_handler([entry], None, OWNER)
    parsed, ok = await parse(handler, "pasted.txt")
    assert ok
    assert parsed[1] == "# File: pasted.txt\ninline words"


async def test_without_open_webui_files_are_reported_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "open_webui", None)
    handler = files.build_parse_file_handler([attachment("f1", "a.txt")], None, OWNER)
    parsed, ok = await parse(handler, "a.txt")
    assert not ok
    assert (
        parsed[1]
        == "# Error processing a.txt: the file is no longer in Open WebUI's file store"
    )


async def test_the_toolbox_offers_and_runs_parse_file(owui: FakeOpenWebUI) -> None:
    owui.add_file("f1", "a.txt", "alpha beta")
    handler = files.build_parse_file_handler([attachment("f1", "a.txt")], None, OWNER)
    assert handler is not None
    toolbox = Toolbox({}, ToolContext(), handlers={"parse_file": handler})
    assert toolbox.available() == ["parse_file"]
    outcome = await toolbox.run(ToolCall("parse_file", {"files": ["a.txt"]}))
    assert ast.literal_eval(outcome.text)[1] == "# File: a.txt\nalpha beta"
