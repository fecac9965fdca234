"""The engine in a generation process of its own (`chatcli.engine.ProcessEngine`, the TUI's, issue 50):
the same turns, sessions and KV caches as in process, a cancel that reaches the process at once, and a
process that cannot load or that dies says so in one line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

import pytest

from chatcli.engine import (
    Finished,
    FinishReason,
    InvalidParameter,
    LoadError,
    LoadOptions,
    Prefilled,
    ProcessEngine,
    ProcessLost,
    SamplingParams,
    Token,
    load_engine,
)
from chatcli.engine.process.pipe import Channel

GREEDY = SamplingParams(temperature=0, max_tokens=16)
HI = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def apart(tiny_model_dir):
    engine = ProcessEngine.start(str(tiny_model_dir), LoadOptions(device="cpu"))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def here(tiny_model_dir):
    return load_engine(str(tiny_model_dir), LoadOptions(device="cpu"))


def turn(engine, session, messages, params=GREEDY, cancel=None):
    return list(engine.generate(messages, session, params, cancel))


def reply_of(events) -> Finished:
    return events[-1]


def test_a_turn_is_the_one_the_engine_gives_in_process(apart, here):
    near, far = here.new_session(), apart.new_session()
    ours, theirs = turn(here, near, HI), turn(apart, far, HI)
    assert [type(e) for e in theirs] == [type(e) for e in ours]
    assert theirs[0].ids == ours[0].ids
    tokens = [(e.token_id, e.text) for e in theirs if isinstance(e, Token)]
    assert tokens == [(e.token_id, e.text) for e in ours if isinstance(e, Token)]
    assert (reply_of(theirs).reply, reply_of(theirs).finish_reason) == (
        reply_of(ours).reply,
        reply_of(ours).finish_reason,
    )
    assert (len(far.cache), far.cache.nbytes) == (len(near.cache), near.cache.nbytes)  # the sizes the panels show
    assert apart.name == here.name and apart.context_limit == here.context_limit and apart.weights == here.weights


def test_sessions_keep_crop_fork_save_and_restore_their_caches_there(apart, here, tmp_path):
    def conversation(engine):
        session = engine.new_session()
        first = reply_of(turn(engine, session, HI)).reply
        longer = [*HI, {"role": "assistant", "content": first}, {"role": "user", "content": "And of Spain?"}]
        second = turn(engine, session, longer)
        kept = engine.crop_session(session, HI)  # /undo
        return session, second[0].cached_tokens, kept

    near, near_cached, near_kept = conversation(here)
    far, far_cached, far_kept = conversation(apart)
    assert far_cached == near_cached > 0 and far_kept == near_kept == len(far.cache)

    fork = apart.fork_session(far, 5)  # /edit's branch
    assert len(fork.cache) == 5 and len(far.cache) == far_kept
    assert turn(apart, fork, HI)[0].cached_tokens == 5

    path = tmp_path / "kv" / "conversation.kv"
    path.parent.mkdir()
    assert apart.save_session(far, path)
    again = apart.new_session()
    assert apart.restore_session(again, path) and len(again.cache) == far_kept
    restored = turn(apart, again, HI)[0].cached_tokens
    assert restored == turn(apart, far, HI)[0].cached_tokens > 0  # as from the cache it was saved from


def test_a_cancel_set_before_the_turn_ends_it_before_its_first_step(apart):
    cancel = threading.Event()
    cancel.set()
    events = turn(apart, apart.new_session(), HI, SamplingParams(temperature=0, max_tokens=200), cancel)
    assert reply_of(events).finish_reason == FinishReason.CANCELLED and not any(isinstance(e, Token) for e in events)


@pytest.mark.real_model
def test_esc_mid_reply_stops_the_process_within_a_step_or_two():
    """On the embedded model (a step of milliseconds): the cancel goes over the pipe at once, and the
    process's pipe thread sets it while the decode loop is in the kernel, without the GIL."""
    from tests.conftest import embedded_path

    engine = ProcessEngine.start(embedded_path(), LoadOptions())
    try:
        cancel, seen = threading.Event(), 0
        for event in engine.generate(HI, engine.new_session(), SamplingParams(temperature=0, max_tokens=1000), cancel):
            if isinstance(event, Token):
                seen += 1
                if seen == 20:
                    cancel.set()  # Esc, from the consumer: events already in the pipe still come
                    at = time.perf_counter()
        assert event.finish_reason == FinishReason.CANCELLED
        assert event.stats.completion_tokens < 20 + 10  # the steps the pipe held, then one
        assert time.perf_counter() - at < 2.0
    finally:
        engine.close()


def test_a_turn_given_up_on_stops_in_the_process_too(apart):
    stream = apart.generate(HI, apart.new_session(), SamplingParams(temperature=0, max_tokens=200))
    assert isinstance(next(stream), Prefilled)
    stream.close()  # the front end stopped reading (its turn thread ended)
    events = turn(apart, apart.new_session(), HI)  # queued behind the one given up on: it must have stopped
    assert reply_of(events).stats.completion_tokens == 16


def test_quick_calls_are_the_engine_s(apart, here):
    assert apart.tokenizer.render(HI) == here.tokenizer.render(HI)
    ids = [0, 1, 2, 50, 300]
    assert apart.tokenizer.decode_each(ids) == [here.tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    too_far = SamplingParams(logit_bias=((10**6, 1.0),))
    with pytest.raises(InvalidParameter) as ours:
        here.check_params(too_far)
    with pytest.raises(InvalidParameter) as theirs:
        apart.check_params(too_far)
    assert str(theirs.value) == str(ours.value)
    assert apart.lookup_for(SamplingParams(lookup=4)) == here.lookup_for(SamplingParams(lookup=4))


def test_a_model_that_cannot_load_is_the_same_load_error(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(LoadError) as ours:
        load_engine(missing, LoadOptions(device="cpu"))
    with pytest.raises(LoadError) as theirs:
        ProcessEngine.start(missing, LoadOptions(device="cpu"))
    assert str(theirs.value) == str(ours.value)


def test_a_process_that_dies_fails_the_next_call_in_one_line(tiny_model_dir):
    engine = ProcessEngine.start(str(tiny_model_dir), LoadOptions(device="cpu"))
    os.kill(engine._process.pid, signal.SIGKILL)
    with pytest.raises(ProcessLost) as lost:
        turn(engine, engine.new_session(), HI)
    assert str(lost.value) == "the generation process ended (signal 9)"
    with pytest.raises(ProcessLost):  # and every call after it
        engine.check_params(GREEDY)
    engine.close()


class _PipeClosing:
    """A connection whose host has just died: sends fail at once, the reader learns it a moment later."""

    def send(self, message):
        raise BrokenPipeError(32, "Broken pipe")

    def recv(self):
        time.sleep(0.2)
        raise EOFError

    def close(self):
        pass


def test_a_send_that_beats_the_reader_still_says_how_the_process_ended():
    channel = Channel(_PipeClosing(), lambda: "the generation process ended (signal 9)")
    with pytest.raises(ProcessLost) as lost:
        channel.call("check_params", GREEDY)
    assert str(lost.value) == "the generation process ended (signal 9)"


SLOW_HOST = """
import sys, time
import chatcli.engine.load.build as build
build.load_engine = lambda *args, **kwargs: time.sleep(60)  # a load of minutes (a first conversion)
from chatcli.engine.process.host import main
main()
"""


def test_the_front_end_leaving_during_a_load_ends_the_process_at_once(tmp_path):
    script = tmp_path / "slow_host.py"
    script.write_text(SLOW_HOST)
    ours, theirs = socket.socketpair()
    process = subprocess.Popen([sys.executable, str(script), str(theirs.fileno())], pass_fds=(theirs.fileno(),))
    theirs.close()
    conn = Connection(os.dup(ours.fileno()))
    ours.close()
    try:
        conn.send((1, "load", (None, None, None)))
        time.sleep(1.0)  # the load has begun
        assert process.poll() is None
        conn.close()  # the TUI quit (or died) during the load
        assert process.wait(timeout=10) == 0
    finally:
        process.kill()
        process.wait()
