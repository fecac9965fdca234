"""Files attached to a message: `-f FILE` on the one-shot, the text before the prompt under its
name; a binary, huge, missing file or a folder refused in one line (exit 2)."""

from __future__ import annotations

import io
import json
import re

import pytest

from chatcli.chat.attach import MAX_BYTES, AttachError, Attachment, read_attachment, with_attachments
from tests import test_oneshot
from tests.test_oneshot import one_error_line

cli = test_oneshot.cli  # the one-shot's fixture: the tiny model, the test's own data dir


def test_files_go_before_the_text_each_under_its_name(tmp_path):
    code = tmp_path / "add.py"
    code.write_text("def add(a, b):\n    return a + b\n")
    notes = tmp_path / "notes.md"
    notes.write_text("Some ```fenced``` words\n````\nand a longer fence\n")
    message = with_attachments("What does it do?", [read_attachment(str(code)), read_attachment(str(notes))])
    assert message == (
        f"{code}:\n```\ndef add(a, b):\n    return a + b\n```\n\n"
        f"{notes}:\n`````\nSome ```fenced``` words\n````\nand a longer fence\n`````\n\n"  # a fence longer than its own
        "What does it do?"
    )
    assert with_attachments("plain", []) == "plain"
    assert with_attachments("", [Attachment("x", "y")]) == "x:\n```\ny\n```"  # the file alone is the message
    assert Attachment("x", "a\nb").lines == 2 and Attachment("x", "a\nb\n").lines == 2


def test_a_conversation_is_titled_by_the_words_not_the_files():
    from chatcli.chat.attach import split_attachments
    from chatcli.chat.conversation import Conversation

    files = [Attachment("add.py", "def add(a, b):\n    return a + b\n"), Attachment("n.md", "a ```b``` c\n````\n")]
    message = with_attachments("What does it do?", files)
    assert split_attachments(message) == (["add.py", "n.md"], "What does it do?")
    conv = Conversation()
    conv.add_user(message)
    assert conv.title == "What does it do?"
    alone = Conversation()
    alone.add_user(with_attachments("", files))
    assert alone.title == "add.py, n.md"
    plain = Conversation()
    plain.add_user("x:\n```\nnot closed")  # text that only looks like a block: kept as it is
    assert plain.title == "x: ``` not closed"


def test_a_file_too_large_says_its_size_exactly(tmp_path):
    path = tmp_path / "big.txt"
    path.write_bytes(b"x" * (MAX_BYTES + 1))
    with pytest.raises(AttachError) as info:
        read_attachment(str(path))
    assert str(info.value) == f"{path}: 1,048,577 bytes is too large to attach (at most 1 MiB)"
    with pytest.raises(AttachError) as info:
        read_attachment("-", io.BytesIO(b"x" * (MAX_BYTES + 1)))  # read up to one byte past the limit
    assert str(info.value) == "stdin: over 1,048,576 bytes, too large to attach (at most 1 MiB)"


def test_stdin_is_dash_and_a_bom_is_dropped():
    got = read_attachment("-", io.BytesIO("\ufeffhello\n".encode()))
    assert got == Attachment("stdin", "hello\n")


@pytest.mark.parametrize(
    "content,words",
    [
        (b"\x7fELF\x00\x01", "not a text file (it holds binary data)"),
        (b"caf\xe9", "not a UTF-8 text file (byte 3)"),
        (b"x" * (MAX_BYTES + 1), "too large to attach (at most 1 MiB)"),
    ],
    ids=["binary", "latin-1", "huge"],
)
def test_what_cannot_be_attached_is_one_line(tmp_path, content, words):
    path = tmp_path / "f"
    path.write_bytes(content)
    with pytest.raises(AttachError, match=re.escape(words)):
        read_attachment(str(path))
    with pytest.raises(AttachError, match=re.escape(words)):
        read_attachment("-", io.BytesIO(content))
    with pytest.raises(AttachError, match="is a folder"):
        read_attachment(str(tmp_path))
    with pytest.raises(AttachError, match="cannot read it: No such file"):
        read_attachment(str(tmp_path / "missing.txt"))


def test_the_one_shot_sends_the_files_with_the_prompt(cli, tmp_path):
    code = tmp_path / "add.py"
    code.write_text("def add(a, b):\n    return a + b\n")
    done = cli("-p", "Explain.", "-f", str(code), "-f", "-", "--json", "--max-tokens", "3", stdin=b"from stdin\n")
    assert done.returncode == 0, done.stderr
    conversation = json.loads(done.stdout)["conversation"]
    exported = json.loads(cli("export", conversation, "--format", "json", model=False).stdout)
    assert exported["messages"][0]["content"] == (
        f"{code}:\n```\ndef add(a, b):\n    return a + b\n```\n\nstdin:\n```\nfrom stdin\n```\n\nExplain."
    )


@pytest.mark.parametrize("name,words", [("/", "is a folder"), ("missing.txt", "cannot read it")])
def test_a_file_that_cannot_be_attached_exits_2(cli, tmp_path, name, words):
    done = cli("-p", "hi", "-f", name)
    assert done.returncode == 2
    assert one_error_line(done).startswith(f"chatcli: error: -f {name}: {words}")
