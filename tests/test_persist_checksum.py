"""A saved KV cache carries a SHA-256 of its contents: a damaged file is refused and said, never
trusted; a cache that cannot be written is one OSError, leaving no partial file."""

from __future__ import annotations

import asyncio
import errno
import struct

import pytest
import safetensors

from chatcli.engine.kv.persist import DAMAGED, fingerprint, read_cache
from chatcli.engine.sample.sampling import SamplingParams
from chatcli.engine.weights.tensorfile import MappedTensors, write_tensors

PARAMS = SamplingParams(temperature=0, max_tokens=6)
ENOSPC_FROM_SAFETENSORS = "Error while serializing: I/O error: No space left on device (os error 28)"  # its words


def turn(engine, session, messages):
    return list(engine.generate(messages, session, PARAMS))[-1]


def saved_conversation(engine, path):
    """One exchange, its cache saved at `path`; the messages of the next turn."""
    session = engine.new_session()
    messages = [{"role": "user", "content": "Hello there, how are you?"}]
    done = turn(engine, session, messages)
    assert engine.save_session(session, path) and path.is_file()
    return messages + [{"role": "assistant", "content": done.reply}, {"role": "user", "content": "And then?"}]


def data_start(path) -> int:
    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]


def flip(path, offset: int, count: int = 4) -> None:
    """Invert `count` bytes at `offset` (past the header, which stays valid)."""
    assert offset >= data_start(path)
    data = bytearray(path.read_bytes())
    data[offset : offset + count] = bytes(b ^ 0xFF for b in data[offset : offset + count])
    path.write_bytes(bytes(data))
    MappedTensors(path)  # still a well-formed safetensors file: only the checksum can tell


def middle_of_the_arrays(path) -> int:
    start = data_start(path)
    return start + (path.stat().st_size - start) // 2


def in_the_ids(path) -> int:
    return MappedTensors(path).tensors["ids"].offset


@pytest.mark.parametrize("where", [middle_of_the_arrays, in_the_ids])
def test_flipped_bytes_are_refused_said_and_the_turn_prefills_from_scratch(tiny_engine, tmp_path, where):
    path = tmp_path / "c.safetensors"
    messages = saved_conversation(tiny_engine, path)
    flip(path, where(path))

    session = tiny_engine.new_session()
    assert not tiny_engine.restore_session(session, path)
    assert session.cache.ids == []
    done = turn(tiny_engine, session, messages)
    cold = turn(tiny_engine, tiny_engine.new_session(), messages)
    assert done.stats.cached_tokens == 0 and done.stats.prefill_tokens == done.stats.prompt_tokens
    assert done.stats.note == DAMAGED and DAMAGED in done.stats.summary()
    assert done.stats.to_dict()["note"] == DAMAGED
    assert done.reply == cold.reply and cold.stats.note == ""
    later = messages + [{"role": "assistant", "content": done.reply}, {"role": "user", "content": "More"}]
    assert turn(tiny_engine, session, later).stats.note == ""  # said once, by the turn it cost


def test_an_intact_file_still_restores(tiny_engine, tmp_path):
    path = tmp_path / "c.safetensors"
    messages = saved_conversation(tiny_engine, path)
    assert MappedTensors(path).metadata["sha256"]
    session = tiny_engine.new_session()
    assert tiny_engine.restore_session(session, path) and len(session.cache) > 0
    done = turn(tiny_engine, session, messages)
    assert done.stats.cached_tokens > 0 and done.stats.note == ""
    assert "·  ·" not in done.stats.summary() and not done.stats.summary().endswith(" · ")
    assert done.reply == turn(tiny_engine, tiny_engine.new_session(), messages).reply


def test_a_file_without_a_checksum_is_not_used_and_not_reported(tiny_lean, tmp_path):
    """As an older chatcli wrote it: the arrays, the ids and the fingerprint, nothing else."""
    import numpy as np

    path = tmp_path / "c.safetensors"
    messages = saved_conversation(tiny_lean, path)
    f = MappedTensors(path)
    tensors = {name: (info.dtype, np.array(f.array(name))) for name, info in f.tensors.items()}
    del f
    write_tensors(path, tensors, {"fingerprint": fingerprint(tiny_lean.runner, tiny_lean.name)}, align=False)
    session = tiny_lean.new_session()
    assert not tiny_lean.restore_session(session, path)
    done = turn(tiny_lean, session, messages)
    assert done.stats.cached_tokens == 0 and done.stats.note == ""


def test_a_foreign_file_is_ignored_silently_an_unreadable_one_is_said(tiny_lean, tmp_path):
    path = tmp_path / "c.safetensors"
    saved_conversation(tiny_lean, path)
    assert read_cache(tiny_lean.runner, path, fingerprint(tiny_lean.runner, "other-model")) == (None, "")
    assert read_cache(tiny_lean.runner, tmp_path / "missing.safetensors", "fp") == (None, "")
    path.write_bytes(path.read_bytes()[:-100])  # truncated
    assert read_cache(tiny_lean.runner, path, fingerprint(tiny_lean.runner, tiny_lean.name)) == (None, DAMAGED)
    path.write_bytes(b"")
    assert read_cache(tiny_lean.runner, path, fingerprint(tiny_lean.runner, tiny_lean.name)) == (None, DAMAGED)


def test_stats_saved_by_an_older_version_have_no_note():
    from chatcli.engine import TurnStats

    stats = TurnStats.from_dict({"prompt_tokens": 5, "cached_tokens": 2, "unknown": 1})
    assert stats.note == "" and stats.prompt_tokens == 5 and "·  " not in stats.summary()


# -- a cache that cannot be written ---------------------------------------------------------------


def full_disk(kind):
    """A stand-in for safetensors.serialize_file that writes part of the file, then fails as a full disk does."""

    def serialize_file(specs, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\0" * 4096)
        if kind == "safetensors":
            raise safetensors.SafetensorError(ENOSPC_FROM_SAFETENSORS)
        if kind == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise RuntimeError("something else\nwith a second line")

    return serialize_file


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("safetensors", "[Errno 28] No space left on device"),
        ("oserror", "[Errno 28] No space left on device"),
        ("other", "cannot write the KV cache: something else"),
    ],
)
def test_a_failed_save_is_one_oserror_and_leaves_no_partial_file(tiny_lean, tmp_path, monkeypatch, kind, said):
    from chatcli.chat.saved import save_kv

    path = tmp_path / "kv" / "c.safetensors"
    messages = saved_conversation(tiny_lean, path)
    before = path.read_bytes()
    session = tiny_lean.new_session()
    turn(tiny_lean, session, messages)
    monkeypatch.setattr(safetensors, "serialize_file", full_disk(kind))
    with pytest.raises(OSError) as failed:
        tiny_lean.save_session(session, path)
    assert str(failed.value) == said
    assert save_kv(tiny_lean, session, path) == said  # what the one-shot and the TUI print
    assert [p.name for p in path.parent.iterdir()] == ["c.safetensors"]  # no temporary file left
    assert path.read_bytes() == before  # the earlier file stays whole (it still fits a prefix)
    monkeypatch.undo()
    assert tiny_lean.restore_session(tiny_lean.new_session(), path)


# -- the TUI -------------------------------------------------------------------------------------


def test_the_tui_says_a_damaged_cache_once_and_a_failed_save_keeps_the_reply(tiny_lean, monkeypatch):
    from chatcli.chat.saved import kv_path
    from chatcli.chat.store import Store
    from chatcli.options import StartOptions
    from tests.ui.conftest import make_app, ready, send

    def notes(app):
        return [n.message for n in app._notifications]

    async def first():
        app = make_app(tiny_lean, start=StartOptions(params=PARAMS))
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await ready(pilot)
            await send(pilot, "Hello")
            return screen.conversation.id

    async def reopen(*prompts):
        app = make_app(tiny_lean, start=StartOptions(params=PARAMS, continue_last=True))
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await ready(pilot)
            stats = []
            for prompt in prompts:
                await send(pilot, prompt)
                stats.append(screen.last_stats)
            await pilot.pause()
            return stats, notes(app), screen.conversation.messages[-1].content

    cid = asyncio.run(first())
    path = kv_path(Store(), cid)
    flip(path, middle_of_the_arrays(path))
    stats, said, _ = asyncio.run(reopen("More", "Again"))
    assert stats[0].cached_tokens == 0 and stats[0].note == DAMAGED
    assert stats[1].cached_tokens > 0 and stats[1].note == ""
    assert said.count("Saved KV cache was damaged, prefilled again.") == 1

    stats, said, _ = asyncio.run(reopen("Once more"))  # the turn after the damage saved a good file
    assert stats[0].cached_tokens > 0 and not [n for n in said if "damaged" in n]

    monkeypatch.setattr(safetensors, "serialize_file", full_disk("safetensors"))
    stats, said, reply = asyncio.run(reopen("Last"))
    assert stats[0].completion_tokens >= 1 and reply  # the turn finished, its reply shown
    assert [n for n in said if "not saved" in n] == [
        "The KV cache was not saved ([Errno 28] No space left on device); a later start prefills again."
    ]
    assert Store().load(cid).messages[-1].content == reply  # and stored
