"""The remote engine: against a real `chatcli serve` on a loopback port (the tiny model), it gives
the in-process engine's greedy replies; against a server that fails on purpose, each fault is one
line and nothing received is lost."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from chatcli.engine.events import ChatEngine, Finished, FinishReason, Prefilled, Token
from chatcli.engine.params import SamplingParams
from chatcli.engine.remote import RemoteEngine, RemoteError
from tests.faults import MODEL, fault_app
from tests.servers import ALIAS, USER, Server, alone, slow_endless

GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture
def faults():
    server = Server(fault_app()).start()
    yield server
    server.stop()


def turn(engine, messages, session=None, params=GREEDY, cancel=None) -> list:
    return list(engine.generate(messages, session or engine.new_session(), params, cancel))


# -- against chatcli serve ---------------------------------------------------------


def test_a_remote_engine_is_a_chat_engine_and_names_the_servers_model(tiny_lean, serve):
    server = serve(tiny_lean)
    remote = RemoteEngine(server.url).connect()
    assert isinstance(remote, ChatEngine)
    assert remote.name == tiny_lean.name
    assert remote.models() == [tiny_lean.name, ALIAS]  # its id first, then its other names (--alias)
    assert remote.backend == server.url + "/v1"
    assert remote.context_limit == tiny_lean.context_limit  # /v1/models says max_model_len


def test_the_greedy_reply_over_http_is_the_in_process_one(tiny_lean, serve):
    server = serve(tiny_lean)
    remote = RemoteEngine(server.url + "/v1").connect()
    events = turn(remote, USER)
    assert isinstance(events[0], Prefilled)
    tokens = [e for e in events if isinstance(e, Token)]
    done = events[-1]
    assert isinstance(done, Finished) and done.error is None
    assert done.reply == "".join(t.text for t in tokens) == alone(tiny_lean, USER, temperature=0, max_tokens=12)
    assert done.finish_reason == FinishReason.LENGTH
    stats = done.stats
    assert stats.completion_tokens == 12  # the server's count, from usage
    assert stats.prompt_tokens == len(tiny_lean.tokenizer.encode_chat(USER))
    assert stats.cached_tokens == 0 and stats.prefill_tokens == stats.prompt_tokens
    assert 0 < stats.ttft_s <= stats.total_s
    assert stats.kv_cache_bytes is None and stats.prefill_tok_s is None  # the client cannot know them


def in_process_scores(engine, messages, params) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """Each reply token's text, logprob and alternatives (text, logprob) from the in-process engine."""
    name = functools.partial(engine.tokenizer.decode, skip_special_tokens=False)
    events = engine.generate(messages, engine.new_session(), params)
    tokens = [e for e in events if isinstance(e, Token) and e.token_id >= 0]
    return [(name([t.token_id]), t.logprob, [(name([i]), lp) for i, lp in t.top_logprobs]) for t in tokens]


def test_logprobs_over_http_are_the_in_process_ones(tiny_lean, serve):
    """With `logprobs` the request asks for them, and each token the server scores comes as a Token with
    its logprob and its alternatives named by their text (a server's ids are not known here)."""
    server = serve(tiny_lean)
    remote = RemoteEngine(server.url).connect()
    params = GREEDY.with_(logprobs=3)
    events = turn(remote, USER, params=params)
    scored = [e for e in events if isinstance(e, Token) and e.logprob is not None]
    got = [(t.text, t.logprob, list(zip(t.top_texts, [lp for _i, lp in t.top_logprobs], strict=True))) for t in scored]
    want = in_process_scores(tiny_lean, USER, params)
    assert [(text, [a for a, _lp in top]) for text, _lp, top in got] == [
        (text, [a for a, _ in top]) for text, _, top in want
    ]
    assert [lp for _t, lp, _top in got] == pytest.approx([lp for _t, lp, _top in want])
    assert all(t.token_id == -1 and [i for i, _lp in t.top_logprobs] == [-1] * 3 for t in scored)
    assert events[-1].reply == alone(tiny_lean, USER, temperature=0, max_tokens=12)


def test_the_second_turn_reports_the_servers_cached_tokens(tiny_lean, serve):
    server = serve(tiny_lean)
    remote = RemoteEngine(server.url).connect()
    session = remote.new_session()
    first = turn(remote, USER, session)[-1]
    follow = [*USER, {"role": "assistant", "content": first.reply}, {"role": "user", "content": "And Spain?"}]
    second = turn(remote, follow, session)[-1]
    assert second.stats.cached_tokens >= first.stats.prompt_tokens  # the first turn was not prefilled again
    assert second.stats.prefill_tokens == second.stats.prompt_tokens - second.stats.cached_tokens > 0
    assert second.reply == alone(tiny_lean, follow, temperature=0, max_tokens=12)
    assert len(session.cache) == second.stats.prompt_tokens + second.stats.completion_tokens


def test_a_seed_and_stop_strings_travel(tiny_lean, serve):
    server = serve(tiny_lean)
    remote = RemoteEngine(server.url).connect()
    hot = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=16, seed=2**64 - 3)
    assert turn(remote, USER, params=hot)[-1].reply == alone(tiny_lean, USER, **_fields(hot))
    full = alone(tiny_lean, USER, temperature=0, max_tokens=24)
    stop = full[6:9]
    done = turn(remote, USER, params=SamplingParams(temperature=0, max_tokens=24, stop=(stop,)))[-1]
    assert done.reply == full[: full.index(stop)] and done.finish_reason == FinishReason.STOP


def _fields(params: SamplingParams) -> dict:
    return {name: getattr(params, name) for name in SamplingParams.field_names()}


def test_a_cancel_closes_the_stream_and_the_server_stops(tiny_lean, serve):
    server = serve(slow_endless(tiny_lean))
    remote = RemoteEngine(server.url).connect()
    cancel = threading.Event()
    events = []
    for event in remote.generate(USER, remote.new_session(), SamplingParams(temperature=0, max_tokens=500), cancel):
        events.append(event)
        if isinstance(event, Token) and event.completion_tokens == 3:
            cancel.set()
    done = events[-1]
    assert isinstance(done, Finished) and done.finish_reason == FinishReason.CANCELLED
    assert done.reply.startswith("".join(e.text for e in events if isinstance(e, Token)))
    assert server.worker.wait_idle(30)
    last = server.worker.history[-1]
    assert last["finish_reason"] == "cancelled" and last["completion_tokens"] < 500
    assert server.worker.cancelled == 1


def test_an_api_key_is_sent_and_a_wrong_one_is_one_line(tiny_lean, serve):
    server = serve(tiny_lean, api_key="s3cret")
    assert RemoteEngine(server.url, api_key="s3cret").connect().name == tiny_lean.name
    with pytest.raises(RemoteError, match=r"answered 401: .*API key.*\(check --api-key or \$CHATCLI_API_KEY\)$"):
        RemoteEngine(server.url, api_key="wrong").connect()


# -- faults, each one line ------------------------------------------------------------


def fault(faults, scenario: str, **kwargs) -> RemoteEngine:
    return RemoteEngine(f"{faults.url}/{scenario}/v1", **kwargs)


def one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_the_ok_scenario_streams_with_no_cache_figures(faults):
    remote = fault(faults, "ok").connect()
    assert remote.name == MODEL and remote.context_limit == 4096
    done = turn(remote, USER)[-1]
    assert done.reply == "Hello world" and done.finish_reason == FinishReason.STOP
    assert done.stats.prompt_tokens == 12 and done.stats.completion_tokens == 2
    assert done.stats.cached_tokens is None and done.stats.prefill_tokens is None  # shown as n/a
    body = faults.app.state.faults.bodies[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == MODEL and body["temperature"] == 0


def test_connection_refused(faults):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens there
    with pytest.raises(RemoteError) as exc:
        RemoteEngine(f"http://127.0.0.1:{port}").connect()
    assert one_line(exc).startswith(f"cannot connect to http://127.0.0.1:{port}/v1: ")


def test_an_unknown_host():
    with pytest.raises(RemoteError) as exc:
        RemoteEngine("http://no-such-host.invalid:8000").connect()
    assert one_line(exc).startswith("cannot connect to http://no-such-host.invalid:8000/v1: ")


@pytest.mark.parametrize(
    ("scenario", "words"),
    [
        ("unauthorized", "answered 401: Incorrect API key provided (check --api-key"),
        ("missing", "answered 404: The model `fault-model` does not exist (model 'fault-model': /models lists"),
        ("ratelimited", "answered 429: Rate limit reached; retry after 7 s"),
        ("unavailable", "answered 503: The server is loading the model; retry after 30 s"),
    ],
)
def test_an_http_error_is_one_line_with_what_to_do(faults, scenario, words):
    remote = fault(faults, scenario, model=MODEL)
    with pytest.raises(RemoteError) as exc:
        turn(remote, USER)
    assert words in one_line(exc)


def test_a_timeout(faults):
    remote = fault(faults, "slow", timeout=0.5).connect()
    start = time.monotonic()
    with pytest.raises(RemoteError) as exc:
        turn(remote, USER)
    assert one_line(exc).endswith("/slow/v1: no answer within 0.5 s")
    assert time.monotonic() - start < 4


@pytest.mark.parametrize(
    ("scenario", "kept", "words"),
    [
        ("cut", "Hello world", "the server's stream ended mid-reply ("),
        ("malformed", "Hello", "a malformed event from the server"),
    ],
)
def test_a_stream_that_breaks_mid_reply_keeps_the_text_and_says_so(faults, scenario, kept, words):
    done = turn(fault(faults, scenario).connect(), USER)[-1]
    assert done.finish_reason == FinishReason.ERROR
    assert done.reply == kept
    assert done.error.startswith(words) and "\n" not in done.error


def test_a_server_that_refuses_the_extra_sampling_fields_gets_the_request_again_without_them(faults):
    remote = fault(faults, "fussy").connect()
    assert turn(remote, USER)[-1].reply == "Hello world"
    first, second = faults.app.state.faults.bodies[-2:]
    assert "top_k" in first and "min_p" in first
    assert "top_k" not in second and "min_p" not in second
    turn(remote, USER)  # and later turns do not ask again
    assert "top_k" not in faults.app.state.faults.bodies[-1]


def test_a_server_that_refuses_logprobs_is_asked_again_without_them(faults):
    """A 400 naming `logprobs` (after the one naming top_k): the request goes again without them, and
    later turns do not ask; the reply comes as text."""
    remote = fault(faults, "fussy").connect()
    events = turn(remote, USER, params=GREEDY.with_(logprobs=2))
    assert events[-1].reply == "Hello world" and all(e.logprob is None for e in events if isinstance(e, Token))
    bodies = faults.app.state.faults.bodies[-3:]
    assert [("top_k" in b, b.get("logprobs"), b.get("top_logprobs")) for b in bodies] == [
        (True, True, 2),
        (False, True, 2),
        (False, None, None),
    ]
    turn(remote, USER, params=GREEDY.with_(logprobs=2))
    assert "logprobs" not in faults.app.state.faults.bodies[-1]


def test_a_cancel_mid_stream_makes_the_server_see_the_client_leave(faults):
    remote = fault(faults, "endless").connect()
    cancel = threading.Event()
    events = []
    for event in remote.generate(USER, remote.new_session(), GREEDY, cancel):
        events.append(event)
        if isinstance(event, Token) and event.completion_tokens == 5:
            cancel.set()
    assert events[-1].finish_reason == FinishReason.CANCELLED
    assert events[-1].reply.startswith("la la la la la")
    assert faults.app.state.faults.left.wait(5)


@pytest.mark.parametrize(
    ("scenario", "words"), [("empty", "lists no model: name one with --model"), ("html", "did not answer JSON")]
)
def test_a_server_that_is_not_an_openai_one(faults, scenario, words):
    with pytest.raises(RemoteError) as exc:
        fault(faults, scenario).connect()
    assert words in one_line(exc)


# -- a hostile or broken server: every shape is one line, every size is bounded -----------------


@pytest.mark.parametrize(
    ("scenario", "words"),
    [
        ("content5", "choices[0].delta.content is 5, not text"),
        ("notalist", 'choices is "notalist", not a list'),
        ("badchoice", "choices[0] is 5, not an object"),
        ("badtools", 'choices[0].delta.tool_calls[0].index is "first", not a count'),
        ("badusage", 'usage.prompt_tokens is "many", not a count'),
        ("deep", "an event that is not JSON: '[[[["),
    ],
)
def test_a_chunk_of_the_wrong_shape_ends_the_turn_in_one_line_and_keeps_the_text(faults, scenario, words):
    done = turn(fault(faults, scenario).connect(), USER)[-1]
    assert done.finish_reason == FinishReason.ERROR and done.reply == "Hello"
    assert done.error.startswith(f"a malformed event from the server: {words}") and "\n" not in done.error


@pytest.mark.parametrize("scenario", ["notjson-first", "content5-first"])
def test_a_wrong_shape_before_any_text_is_a_remote_error(faults, scenario):
    with pytest.raises(RemoteError) as exc:
        turn(fault(faults, scenario).connect(), USER)
    assert one_line(exc).startswith(f"{faults.url}/{scenario}/v1: a malformed event from the server: ")


def test_an_event_line_that_never_ends_stops_at_the_cap(faults):
    with pytest.raises(RemoteError) as exc:
        turn(fault(faults, "endlessline").connect(), USER)
    assert one_line(exc).endswith("the server sent an event line over 1 MiB (it never ended)")
    state = faults.app.state.faults
    assert state.left.wait(5) and not state.sent_all.is_set()  # the client left after about 1 MiB of 13 GB


def test_a_reply_past_max_tokens_is_cut_there(faults):
    events = turn(fault(faults, "overrun").connect(), USER, params=SamplingParams(temperature=0, max_tokens=10))
    done = events[-1]
    assert done.finish_reason == FinishReason.LENGTH and done.error is None
    assert done.reply.startswith("Hello la la") and done.reply.count(" la") <= 10 + 64  # reply_cap's margin
    state = faults.app.state.faults
    assert state.left.wait(5) and not state.sent_all.is_set()  # 200,000 chunks were on their way


@pytest.mark.parametrize(
    ("scenario", "words"),
    [("modelsshape", 'data is "everything", not a list'), ("models5", "data[0].id is 5, not text")],
)
def test_a_list_of_models_of_the_wrong_shape_is_one_line(faults, scenario, words):
    with pytest.raises(RemoteError) as exc:
        fault(faults, scenario).connect()
    assert one_line(exc) == f"{faults.url}/{scenario}/v1/models answered {words}: is it an OpenAI-compatible server?"


def test_an_error_body_of_the_wrong_shape_is_one_line(faults):
    with pytest.raises(RemoteError) as exc:
        turn(fault(faults, "listerror", model=MODEL), USER)
    assert one_line(exc) == f"{faults.url}/listerror/v1 answered 500: Internal Server Error"


# -- the one-shot over HTTP -------------------------------------------------------------


@pytest.fixture
def cli(tmp_path):
    env = {
        **os.environ,
        "CHATCLI_CONFIG": str(tmp_path / "config.toml"),
        "CHATCLI_DATA_DIR": str(tmp_path / "data"),
        "CHATCLI_API_KEY": "",
    }

    def run(*args, stdin: bytes = b""):
        return subprocess.run(
            [sys.executable, "-m", "chatcli", *args], input=stdin, capture_output=True, env=env, timeout=120
        )

    run.config = tmp_path / "config.toml"
    return run


def test_the_one_shot_over_http_gives_the_in_process_reply(tiny_lean, serve, cli):
    server = serve(tiny_lean)
    result = cli("--api", server.url, "-p", USER[0]["content"], "--temperature", "0", "--max-tokens", "12", "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["reply"] == alone(tiny_lean, USER, temperature=0, max_tokens=12)
    assert record["model"] == tiny_lean.name and record["finish_reason"] == "length"
    assert record["stats"]["cached_tokens"] == 0 and record["stats"]["kv_cache_bytes"] is None
    again = cli("--api", server.url, "-c", "-p", "And Spain?", "--temperature", "0", "--max-tokens", "4", "--json")
    assert again.returncode == 0, again.stderr
    again = json.loads(again.stdout)
    assert again["conversation"] == record["conversation"]  # -c continued it, over HTTP too
    assert again["stats"]["cached_tokens"] >= record["stats"]["prompt_tokens"]


def test_the_one_shot_logprobs_over_http(tiny_lean, serve, cli):
    """`--api URL --json --logprobs 3`: each token the server scored, its text, logprob, bytes and the 3
    alternatives, as the in-process one-shot writes them (less the ids a server does not send)."""
    server = serve(tiny_lean)
    args = ("-p", USER[0]["content"], "--temperature", "0", "--max-tokens", "6", "--json", "--logprobs", "3")
    result = cli("--api", server.url, "--no-save", *args)
    assert result.returncode == 0, result.stderr
    assert b"no logprobs" not in result.stderr
    entries = json.loads(result.stdout)["logprobs"]
    want = in_process_scores(tiny_lean, USER, SamplingParams(temperature=0, max_tokens=6, logprobs=3))
    assert [(e["token"], [a["token"] for a in e["top"]]) for e in entries] == [
        (text, [a for a, _lp in top]) for text, _lp, top in want
    ]
    assert [e["logprob"] for e in entries] == pytest.approx([lp for _t, lp, _top in want])
    assert all(e["bytes"] == list(e["token"].encode()) and "id" not in e for e in entries)


def test_the_one_shot_reads_the_api_and_its_key_from_the_config(tiny_lean, serve, cli):
    server = serve(tiny_lean, api_key="k3y")
    cli.config.write_text(f'api = "{server.url}/v1"\napi_key = "k3y"\n')
    result = cli("-p", "Hi", "--temperature", "0", "--max-tokens", "3")
    assert result.returncode == 0, result.stderr
    hi = [{"role": "user", "content": "Hi"}]
    assert result.stdout.decode().strip() == alone(tiny_lean, hi, temperature=0, max_tokens=3).strip()


def test_a_one_shot_fault_is_one_line_and_a_cut_reply_is_printed_and_marked(faults, cli):
    refused = cli("--api", faults.url + "/unavailable", "--model", MODEL, "-p", "Hi")
    assert refused.returncode == 1
    assert refused.stderr.decode().strip().splitlines() == [
        f"chatcli: error: {faults.url}/unavailable/v1 answered 503: The server is loading the model; retry after 30 s"
    ]
    cut = cli("--api", faults.url + "/cut", "-p", "Hi")
    assert cut.returncode == 1
    assert cut.stdout.decode().strip() == "Hello world"
    err = cut.stderr.decode().strip().splitlines()
    assert len(err) == 1 and err[0].startswith("chatcli: error: the server's stream ended mid-reply (")
    assert err[0].endswith("(the reply above is partial)")


def test_the_configs_key_and_model_go_only_to_the_configs_server(faults, tmp_path, monkeypatch):
    from chatcli.cli import start_options

    api = f"{faults.url}/ok/v1"
    config = tmp_path / "config.toml"
    config.write_text(f'api = "{api}"\napi_key = "k"\nmodel = "chosen"\n')
    monkeypatch.setenv("CHATCLI_CONFIG", str(config))
    start = start_options()
    assert (start.api, start.api_key) == (api, "k")
    with pytest.raises(RemoteError, match="lists no model 'chosen'"):  # the config's model, asked of its server
        start.load_engine()
    other = start_options(api=faults.url + "/ok")  # another URL on the command line
    assert other.api_key is None  # the config's key is not sent to it
    assert other.load_engine().name == MODEL  # nor its model named: the server's first
    assert start_options(api=faults.url + "/ok", api_key="x", model="m").api_key == "x"


@pytest.mark.parametrize(
    ("scenario", "printed", "words"),
    [
        ("content5", "Hello", "chatcli: error: a malformed event from the server: choices[0].delta.content is 5"),
        ("notalist", "Hello", 'chatcli: error: a malformed event from the server: choices is "notalist"'),
        ("endlessline", "", "/endlessline/v1: the server sent an event line over 1 MiB (it never ended)"),
    ],
)
def test_a_hostile_server_is_one_line_on_the_command_line(faults, cli, scenario, printed, words):
    result = cli("--api", f"{faults.url}/{scenario}", "-p", "Hi")
    err = result.stderr.decode().strip().splitlines()
    assert result.returncode == 1 and len(err) == 1 and words in err[0], result.stderr
    assert result.stdout.decode().strip() == printed


def test_a_server_past_max_tokens_on_the_command_line(faults, cli):
    result = cli("--api", f"{faults.url}/overrun", "-p", "Hi", "--max-tokens", "10", "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["finish_reason"] == "length" and record["reply"].count(" la") <= 10 + 64
