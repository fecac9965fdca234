"""Escape sequences never reach the terminal raw: what a model, a tool, an MCP server, an `--api` server
or a saved message wrote is shown with its control characters written out (`errors.shown`) in the
one-shot, `history`, `history --search` and `export`, each run under a pseudo-terminal as a user runs
it; piped, the one-shot's reply and the export stay byte-exact, and `--json` is exact everywhere."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.responses import JSONResponse, StreamingResponse

from chatcli.errors import clip, shown, shown_json
from tests.faults import scenario_app
from tests.servers import Server

ROOT = Path(__file__).parent.parent
SERVER = Path(__file__).parent / "mcp_server.py"
# A clipboard write (OSC 52, ended by BEL), a title change ended by ESC-backslash (ST), a screen clear,
# an 8-bit CSI (C1, U+009B) and a carriage return over the line
EVIL = "A\x1b]52;c;ZXZpbA==\x07B\x1b]0;PWNED\x1b\\C\x1b[2J\u009b31mD\rE"
SHOWN = r"A\x1b]52;c;ZXZpbA==\x07B\x1b]0;PWNED\x1b\C\x1b[2J\x9b31mD\x0dE"
LINE = EVIL.split("\r")[0]  # one line of it (a CR ends a line of an MCP server's stderr)
RAW = [b"\x1b]", b"\x1b[2J", b"\x07", b"\xc2\x9b", b"\rE"]  # what no payload may put on a terminal


def test_shown_writes_out_every_control_but_newline_and_tab():
    assert shown(EVIL) == SHOWN
    assert shown("a\tb\nc\x00\x7f\u0080\u009f\u00a0é") == "a\tb\nc\\x00\\x7f\\x80\\x9f\u00a0é"
    assert shown(SHOWN) == SHOWN  # nothing left to escape
    assert "".join(shown(c) for c in EVIL) == shown(EVIL)  # per character: a stream shows the same
    assert clip("tool \x1b]0;X\x07\n  done", 80) == r"tool \x1b]0;X\x07 done"


def test_shown_json_is_the_same_value_with_no_control_left():
    text = shown_json(json.dumps({"reply": EVIL}, ensure_ascii=False))
    assert json.loads(text) == {"reply": EVIL}
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text)


def on_a_terminal(argv: list[str], env: dict, timeout: float = 120) -> tuple[int, bytes, bytes]:
    """Run `argv` with its stdout and its stderr each on a pseudo-terminal of its own (stdin empty, not
    a terminal): the exit code and every byte each terminal received."""
    masters, slaves = zip(*(pty.openpty() for _ in range(2)), strict=True)
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=slaves[0], stderr=slaves[1], env=env, cwd=ROOT, close_fds=True
    )
    for fd in slaves:
        os.close(fd)
    got = {fd: b"" for fd in masters}
    open_ = set(masters)
    try:
        while open_:
            ready, _, _ = select.select(list(open_), [], [], timeout)
            assert ready, f"no output for {timeout} s"
            for fd in ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the child closed its end
                    chunk = b""
                if chunk:
                    got[fd] += chunk
                else:
                    open_.discard(fd)
        code = proc.wait(timeout=timeout)
    finally:
        proc.kill()
        for fd in masters:
            os.close(fd)
    return code, got[masters[0]], got[masters[1]]


def assert_safe(data: bytes) -> None:
    for raw in RAW:
        assert raw not in data, (raw, data)


@pytest.fixture
def chatcli(tmp_path):
    """`chatcli ARGS` with the scripted engine (tests/mcp_fake.py: echoes, calls tools) and the test's own
    config (the tiny MCP server as [mcp.tiny]) and data: on terminals (`.tty`) or piped (`.piped`)."""
    config = tmp_path / "config.toml"
    config.write_text(
        f"[mcp.tiny]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(SERVER))}]\ntimeout = 5\n"
        f"[mcp.noisy]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = ['-c', {json.dumps(f'import sys; sys.stderr.write({LINE!r}); sys.exit(3)')}]\n",
        encoding="utf-8",
    )
    env = {**os.environ, "CHATCLI_CONFIG": str(config), "CHATCLI_DATA_DIR": str(tmp_path / "data"), "TERM": "xterm"}
    argv = [sys.executable, "-m", "tests.mcp_fake"]

    def tty(*args):
        return on_a_terminal([*argv, *args], env)

    def piped(*args):
        return subprocess.run([*argv, *args], capture_output=True, env=env, cwd=ROOT, timeout=120)

    tty.piped = piped
    return tty


def test_a_reply_on_a_terminal_is_shown_escaped_and_piped_or_json_is_exact(chatcli):
    code, out, err = chatcli("-p", EVIL)
    assert code == 0, err
    assert_safe(out + err)
    assert out.decode() == f"You said: {SHOWN}\r\n"  # the terminal's own \r\n ends the line
    piped = chatcli.piped("-p", EVIL)
    assert (piped.returncode, piped.stdout) == (0, f"You said: {EVIL}\n".encode())  # `> file`: every byte
    code, out, err = chatcli("-p", EVIL, "--json")
    assert code == 0, err
    assert_safe(out)
    assert json.loads(out)["reply"] == f"You said: {EVIL}"


def test_stored_text_through_history_search_and_export_is_shown_escaped(chatcli):
    assert chatcli.piped("-p", EVIL).returncode == 0
    listed = json.loads(chatcli.piped("history", "--json").stdout)
    assert listed[0]["title"].startswith("A\x1b]52")  # saved exact
    for args in (("history",), ("history", "--search", "PWNED"), ("export", listed[0]["id"])):
        code, out, err = chatcli(*args)
        assert code == 0, (args, err)
        assert_safe(out + err)
        assert SHOWN[:30] in out.decode(), (args, out)
    exported = chatcli.piped("export", listed[0]["id"]).stdout.decode()
    assert f"You said: {EVIL}" in exported  # to a file: exact
    record = chatcli.piped("export", listed[0]["id"], "--format", "json").stdout.decode()
    assert json.loads(record)["messages"][1]["content"] == f"You said: {EVIL}"


def test_a_tool_name_its_arguments_and_its_result_are_shown_escaped(chatcli):
    prompt = f"call \x1b]0;PWNED\x07 {{}} ; call shout {json.dumps({'text': EVIL})}"
    code, out, err = chatcli("-p", prompt, "--mcp", "tiny", "--allow-tools")
    assert code == 0, err
    assert_safe(out + err)
    said = err.decode()
    assert "chatcli: tool shout: " + shown(EVIL.upper())[:40] in said  # the result, from the tool
    assert r"chatcli: tool \x1b]0;PWNED\x07: error" in said  # a name the model made up
    assert "The tool said: " + shown(EVIL.upper())[:30] in out.decode()  # the model's reply, on the result


def test_an_mcp_servers_last_words_are_shown_escaped(chatcli):
    code, out, err = chatcli("-p", "hi", "--mcp", "noisy")
    assert code == 1
    assert_safe(out + err)
    assert f"(it said: {shown(LINE)})" in err.decode()


@pytest.fixture
def evil_api():
    """An OpenAI-shaped server whose reply streams EVIL in two pieces cut inside its escapes, and whose
    `/refuse` scenario answers 400 with EVIL as its message."""

    def chunk(content: str) -> bytes:
        delta = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}
        return b"data: " + json.dumps(delta).encode() + b"\n\n"

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "evil", "object": "model"}]})

    async def chat(request):
        if request.path_params["scenario"] == "refuse":
            return JSONResponse({"error": {"message": EVIL, "type": "error"}}, status_code=400)

        async def events():
            yield chunk(EVIL[:2])  # "A" and the ESC alone: the sequence goes on in the next piece
            yield chunk(EVIL[2:])
            yield b"data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).encode()
            yield b"\n\ndata: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    server = Server(scenario_app(models, chat)).start()
    yield server
    server.stop()


def test_an_api_servers_reply_and_error_are_shown_escaped(evil_api, tmp_path):
    env = {**os.environ, "CHATCLI_CONFIG": str(tmp_path / "c.toml"), "CHATCLI_DATA_DIR": str(tmp_path / "d")}
    argv = [sys.executable, "-m", "chatcli", "-p", "hi", "--api"]
    code, out, err = on_a_terminal([*argv, evil_api.url + "/ok/v1"], env)
    assert code == 0, err
    assert_safe(out + err)
    assert out.decode() == f"{SHOWN}\r\n"
    code, out, err = on_a_terminal([*argv, evil_api.url + "/refuse/v1"], env)
    assert code == 1
    assert_safe(out + err)
    assert SHOWN[:20] in err.decode()
