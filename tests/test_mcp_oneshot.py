"""MCP tools in the one-shot: the tiny MCP server (tests/mcp_server.py) and the scripted engine that calls
its tools (tests/mcp_fake.py), in a subprocess as a user runs it; and the [mcp.NAME] config tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chatcli.config import ConfigError, load_config

ROOT = Path(__file__).parent.parent
SERVER = Path(__file__).parent / "mcp_server.py"


def server_table(name: str = "tiny", timeout: float = 5, command: str = sys.executable, args=(str(SERVER),)) -> str:
    return f"[mcp.{name}]\ncommand = {json.dumps(command)}\nargs = {json.dumps(list(args))}\ntimeout = {timeout}\n"


@pytest.fixture
def tools_cli(tmp_path):
    """`chatcli ARGS` with the scripted engine, the test's own config (the tiny server as [mcp.tiny]) and data."""
    config = tmp_path / "config.toml"
    config.write_text(server_table(timeout=2), encoding="utf-8")
    env = {**os.environ, "CHATCLI_CONFIG": str(config), "CHATCLI_DATA_DIR": str(tmp_path / "data")}

    def run(*args):
        argv = [sys.executable, "-m", "tests.mcp_fake", *args]
        return subprocess.run(argv, capture_output=True, env=env, timeout=120, cwd=ROOT, text=True)

    def export(fmt: str = "md"):
        listed = json.loads(run("history", "--json").stdout)
        return run("export", listed[0]["id"], "--format", fmt).stdout

    run.config, run.export = config, export
    return run


def lines(text: str) -> list[str]:
    assert "Traceback" not in text, text
    return [line for line in text.splitlines() if line.strip()]


def test_allowed_calls_run_their_results_go_back_and_the_round_trip_prefills_only_the_result(tools_cli):
    result = tools_cli("-p", 'call shout {"text": "hi"}', "--mcp", "tiny", "--allow-tools", "--json")
    assert result.returncode == 0, result.stderr
    assert lines(result.stderr) == ['chatcli: tool: shout {"text": "hi"}', "chatcli: tool shout: HI"]
    record = json.loads(result.stdout)
    assert record["reply"] == "The tool said: HI"
    assert [(c["name"], c["arguments"], c["status"], c["result"]) for c in record["tool_calls"]] == [
        ("shout", '{"text": "hi"}', "ok", "HI")
    ]
    # the cache kept the prompt and the call: the second reply prefilled the result's ids and the markers
    # around it (end, tool role, H, I, end, assistant), nothing before
    assert record["stats"]["prefill_tokens"] == 6


def test_the_reply_streams_without_the_call_blocks(tools_cli):
    result = tools_cli("-p", 'call add {"a": 2, "b": 3}', "--mcp", "tiny", "--allow-tools")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Calling.\nThe tool said: 5\n"
    assert lines(result.stderr) == ['chatcli: tool: add {"a": 2, "b": 3}', "chatcli: tool add: 5"]


def test_without_allow_tools_a_call_is_printed_and_not_run(tools_cli):
    result = tools_cli("-p", 'call add {"a": 2, "b": 3}', "--mcp", "tiny")
    assert result.returncode == 0, result.stderr
    assert lines(result.stderr) == ['chatcli: tool call not run (--allow-tools runs it): add {"a": 2, "b": 3}']
    assert "The tool said: This call was not run" in result.stdout  # the model was told, and went on


def test_a_server_that_does_not_start_is_one_line_naming_it(tools_cli):
    tools_cli.config.write_text(
        server_table("broken", args=["-c", "import sys; print('no API key set', file=sys.stderr); sys.exit(3)"])
        + server_table("missing", command="no-such-mcp-server"),
        encoding="utf-8",
    )
    for name, words in (("broken", "no API key set"), ("missing", "no such command: no-such-mcp-server")):
        result = tools_cli("-p", "hello", "--mcp", name, "--allow-tools")
        assert result.returncode == 1 and result.stdout == ""
        (line,) = lines(result.stderr)
        assert line.startswith(f"chatcli: error: the MCP server {name!r} did not start: ") and words in line


@pytest.mark.parametrize(
    "args, words",
    [
        (("--mcp", "nope"), "chatcli: error: --mcp: no MCP server 'nope' (known: tiny)"),
        (("--allow-tools",), "chatcli: error: --allow-tools runs the tools of --mcp NAME: name a server too"),
    ],
)
def test_a_bad_mcp_flag_is_one_line_and_exit_2(tools_cli, args, words):
    result = tools_cli("-p", "hello", *args)
    assert result.returncode == 2 and lines(result.stderr) == [words]


def test_a_tool_that_raises_hangs_or_floods_is_a_result_the_model_sees(tools_cli):
    began = time.monotonic()
    prompt = 'call fail {} ; call sleep {"seconds": 30} ; call huge {"n": 20000}'
    result = tools_cli("-p", prompt, "--mcp", "tiny", "--allow-tools", "--json")
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - began < 25  # the 2 s timeout, not the 30 s sleep
    told = lines(result.stderr)
    assert told[1] == "chatcli: tool fail: error: Error executing tool fail"
    assert (
        told[3] == "chatcli: tool sleep: timeout: Error: the tool sleep did not answer within 2 s, so it was stopped."
    )
    assert told[5].startswith("chatcli: tool huge: xxx") and told[5].endswith(
        "(cut: 20,000 characters, the model saw the first 8,000)"
    )
    calls = json.loads(result.stdout)["tool_calls"]
    assert [c["status"] for c in calls] == ["error", "timeout", "ok"]
    assert calls[2]["result"].endswith("[cut: the result was 20,000 characters; the first 8,000 are shown]")
    assert len(calls[2]["result"]) < 8100


def test_calls_and_results_are_saved_exported_and_resumed(tools_cli):
    first = tools_cli("-p", 'call add {"a": 2, "b": 3}', "--mcp", "tiny", "--allow-tools")
    assert first.returncode == 0, first.stderr
    again = tools_cli("-c", "-p", "and now?", "--mcp", "tiny")
    assert (again.returncode, again.stdout) == (0, "You said: and now?\n"), again.stderr
    markdown = tools_cli.export("md")
    assert '**Tool call:** `add` `{"a": 2, "b": 3}`' in markdown
    assert "### Tool result: `add`\n\n```\n5\n```" in markdown
    messages = json.loads(tools_cli.export("json"))["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    call = messages[1]["tool_calls"][0]
    assert (call["name"], call["arguments"]) == ("add", '{"a": 2, "b": 3}')
    assert messages[2]["tool_call"] == {"id": call["id"], "name": "add", "status": "ok"}
    assert messages[2]["content"] == "5" and messages[3]["content"] == "The tool said: 5"


def test_ctrl_c_in_a_call_answers_it_as_stopped_and_c_resumes(tools_cli, tmp_path):
    """The reply with the call is saved before the call runs; Ctrl+C while it runs saves the call's result
    as stopped (exit 130), so the conversation stays whole and -c goes on from it."""
    tools_cli.config.write_text(server_table(timeout=60), encoding="utf-8")
    env = {**os.environ, "CHATCLI_CONFIG": str(tools_cli.config), "CHATCLI_DATA_DIR": str(tmp_path / "data")}
    argv = [sys.executable, "-m", "tests.mcp_fake", "-p", 'call sleep {"seconds": 30}']
    argv += ["--mcp", "tiny", "--allow-tools"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT, text=True)
    try:
        line = proc.stderr.readline()  # the call, printed as it starts
        assert line.startswith("chatcli: tool: sleep"), line
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    messages = json.loads(tools_cli.export("json"))["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[2]["tool_call"]["status"] == "stopped"
    again = tools_cli("-c", "-p", "and now?", "--mcp", "tiny")
    assert (again.returncode, again.stdout) == (0, "You said: and now?\n"), again.stderr


# -- the config's [mcp.NAME] tables ---------------------------------------------------------------


def test_mcp_tables_take_the_keys_other_clients_use(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        '[mcp.time]\ncommand = "uvx"\nargs = ["mcp-server-time"]\nenv = { TZ = "UTC" }\n'
        '[mcp.fetch]\ncommand = "python"\nargs = ["-m", "mcp_server_fetch"]\ntimeout = 5\nstartup_timeout = 9\n',
        encoding="utf-8",
    )
    config = load_config(path)
    time_, fetch = config.mcp_servers(["time", "fetch", "time"])
    assert (time_.command, time_.args, time_.env, time_.timeout) == ("uvx", ("mcp-server-time",), {"TZ": "UTC"}, 60)
    assert (fetch.args, fetch.timeout, fetch.startup_timeout) == (("-m", "mcp_server_fetch"), 5.0, 9.0)
    with pytest.raises(ConfigError, match=r"no MCP server 'nope' \(known: fetch, time\)"):
        config.mcp_servers(["nope"])


@pytest.mark.parametrize(
    "table, words",
    [
        ('args = ["x"]', "[mcp.x]: command must be a string"),
        ('command = "x"\nargs = "y"', "[mcp.x]: args must be a list of strings"),
        ('command = "x"\nenv = { A = 1 }', "[mcp.x]: env must be a table of strings"),
        ('command = "x"\ntimeout = 0', "[mcp.x]: timeout must be a number of seconds > 0, got 0"),
        ('command = "x"\nurl = "http://h"', "[mcp.x]: unknown key 'url' (known: command, args, env, cwd, timeout"),
    ],
)
def test_a_bad_mcp_table_is_one_line_naming_it(tmp_path, table, words):
    path = tmp_path / "config.toml"
    path.write_text(f"[mcp.x]\n{table}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ") and words in str(info.value) and "\n" not in str(info.value)
