"""One-shot mode end to end, in a subprocess, on the tiny model: output, --json, --stats, every bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.fixture
def cli(tiny_model_dir, tmp_path):
    # the test's own config and history, the session's cache (the tiny model's lean file, converted
    # once): tests/conftest.py points them into pytest's tmp dirs, never the user's
    env = {**os.environ, "CHATCLI_CONFIG": str(tmp_path / "config.toml"), "CHATCLI_DATA_DIR": str(tmp_path / "data")}

    def run(*args, stdin: bytes | None = b"", model=True, python=()):
        argv = [sys.executable, *python, "-m", "chatcli", *args]
        if model:
            argv += ["--model", str(tiny_model_dir), "--device", "cpu"]
        return subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=120)

    run.config = tmp_path / "config.toml"
    return run


def one_error_line(result) -> str:
    err = result.stderr.decode()
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("chatcli: error: ")
    return lines[0]


def test_piped_prompt_streams_reply(cli):
    result = cli("--temperature", "0", "--max-tokens", "8", stdin=b"Hello there")
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().strip() != ""


def test_json_output(cli):
    result = cli("-p", "Hello", "--temperature", "0", "--max-tokens", "5", "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert set(record) == {"model", "weights", "template", "conversation", "reply", "finish_reason", "stats"}
    assert record["template"] == "model's own" and record["finish_reason"] in ("stop", "length")
    stats = record["stats"]
    for field in (
        "prompt_tokens",
        "cached_tokens",
        "prefill_tokens",
        "completion_tokens",
        "ttft_s",
        "prefill_tok_s",
        "decode_tok_s",
        "total_s",
        "kv_cache_bytes",
        "context_tokens",
        "context_limit",
        "truncated_turns",
    ):
        assert field in stats
    assert stats["completion_tokens"] <= 5 and stats["context_limit"] == 256


def test_a_reply_cut_mid_character_holds_whole_characters_only(cli, tiny_model_dir):
    """--max-tokens cuts the reply after the first of an emoji's byte ids (a bias makes the model pick
    it): the reply is the characters before it, without a U+FFFD in place of the unfinished one."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    first, *rest = tokenizer.encode("🌱", add_special_tokens=False).ids
    assert rest and tokenizer.decode([first]) == "\ufffd", "the tiny vocabulary spells the emoji in byte ids"
    args = ("-p", "Say hi", "--temperature", "0", "--max-tokens", "1", "--logit-bias", f"{first}=100")
    record = json.loads(cli(*args, "--json").stdout)
    assert (record["reply"], record["finish_reason"], record["stats"]["completion_tokens"]) == ("", "length", 1)
    streamed = cli(*args)
    assert (streamed.returncode, streamed.stdout) == (0, b"")


def test_same_seed_same_reply(cli):
    args = ("-p", "Hello", "--temperature", "1.2", "--seed", "11", "--max-tokens", "12", "--json")
    a, b = (json.loads(cli(*args).stdout)["reply"] for _ in range(2))
    assert a == b


def test_stdin_comes_before_prompt(cli):
    both = json.loads(cli("-p", "second", "--json", "--max-tokens", "1", stdin=b"first").stdout)["stats"]
    alone = json.loads(cli("-p", "first\n\nsecond", "--json", "--max-tokens", "1").stdout)["stats"]
    assert both["prompt_tokens"] == alone["prompt_tokens"]


def test_stats_line_on_stderr(cli):
    result = cli("-p", "Hello", "--max-tokens", "4", "--stats")
    assert result.returncode == 0
    err = result.stderr.decode().strip().splitlines()
    assert len(err) == 1 and "ttft" in err[0] and "decode" in err[0] and "cached 0/" in err[0]


def test_config_file_sets_defaults_and_flags_override(cli):
    cli.config.write_text("[sampling]\nmax_tokens = 2\ntemperature = 0\n")
    assert json.loads(cli("-p", "Hello", "--json").stdout)["stats"]["completion_tokens"] <= 2
    assert json.loads(cli("-p", "Hello", "--json", "--max-tokens", "6").stdout)["stats"]["completion_tokens"] > 2


def test_lookup_drafts_in_one_shot_and_can_be_turned_off(cli):
    prompt = ("-p", "def main():\n    print('hello world')\n    return 0\n" * 3, "--temperature", "0", "--json")
    on = json.loads(cli(*prompt, "--max-tokens", "24").stdout)
    off = json.loads(cli(*prompt, "--max-tokens", "24", "--lookup", "0").stdout)
    assert on["stats"]["draft_tokens"] > 0 and off["stats"]["draft_tokens"] == 0
    assert on["reply"] == off["reply"]


@pytest.mark.parametrize(
    "args, stdin, words, code",
    [
        ((), b"   \n\t", "empty prompt", 2),
        ((), b"\xff\xfehello", "not valid UTF-8", 2),
        (("-p", "caf\udce9"), b"", "-p TEXT is not valid UTF-8 (character 3)", 2),  # argv bytes b"caf\xe9"
        (("-p", "hi", "--bogus"), b"", "No such option", 2),
        (("-p", "hi", "--temperature", "-1"), b"", "temperature must be >= 0", 2),
        (("-p", "hi", "--top-p", "0"), b"", "top-p must be in (0, 1]", 2),
        (("-p", "hi", "--min-p", "2"), b"", "min-p must be in [0, 1]", 2),
        (("-p", "hi", "--top-k", "-3"), b"", "top-k must be >= 0", 2),
        (("-p", "hi", "--max-tokens", "0"), b"", "max-tokens must be >= 1", 2),
        (("-p", "hi", "--lookup", "-1"), b"", "lookup must be in [0, 16]", 2),
        (("-p", "hi", "--seed", "-1"), b"", "seed must be in [0, 2**64)", 2),
        (("-p", "hi", "--temperature", "warm"), b"", "Invalid value for '--temperature'", 2),
        (
            (
                "-p",
                "lazy dog " * 400,
            ),
            b"",
            "prompt too long",
            1,
        ),
        (("-p", "hi", "--kv-dtype", "int4"), b"", "Invalid value for '--kv-dtype': 'int4' is not one of 'auto',", 2),
        (("-p", "hi", "--quantize", "q9"), b"", "Invalid value for '--quantize': 'q9' is not one of 'auto',", 2),
        (("-p", "hi", "--dtype", "float8"), b"", "Invalid value for '--dtype': 'float8' is not one of", 2),
        (("-p", "hi", "--runner", "fast"), b"", "Invalid value for '--runner': 'fast' is not one of", 2),
        (("-p", "hi", "--runner", "hf", "--kv-dtype", "bfloat16"), b"", "the HF runner keeps its cache", 1),
        (("-p", "hi", "--runner", "hf", "--kv-dtype", "q8_0"), b"", "--kv-dtype q8_0: the HF runner keeps", 1),
        (("-p", "hi", "--kv-dtype", "q8_0"), b"", "--kv-dtype q8_0", 1),  # heads of 16, or no kernel: one line
    ],
)
def test_bad_input_is_one_line_and_nonzero(cli, args, stdin, words, code):
    result = cli(*args, stdin=stdin)
    assert result.returncode == code
    assert words in one_error_line(result)


def test_a_device_none_of_its_choices_is_a_usage_error(cli):
    result = cli("-p", "hi", "--device", "tpu", model=False)  # the fixture's own --device cpu would win
    assert result.returncode == 2
    assert "Invalid value for '--device': 'tpu' is not one of 'auto', 'cpu', 'cuda', 'mps'" in one_error_line(result)


def test_missing_model_file(cli, tmp_path):
    result = cli("-p", "hi", "--model", str(tmp_path / "nope.gguf"), model=False)
    assert result.returncode == 1
    assert "model file not found" in one_error_line(result)


def test_malformed_config_names_file_and_line(cli):
    cli.config.write_text('theme = "dark"\n[sampling\n')
    result = cli("-p", "hi")
    assert result.returncode == 2
    line = one_error_line(result)
    assert str(cli.config) in line and "line 2" in line


def test_a_piped_prompt_imports_only_what_it_uses(cli):
    """`echo q | chatcli` loads no UI, server or bench code, and (where the kernel runs, once the
    lean file is converted) neither torch nor transformers."""
    from tests.conftest import require_kernel

    assert cli("--max-tokens", "1", stdin=b"warm up").returncode == 0  # the conversion, once
    result = cli("--max-tokens", "2", stdin=b"Hello", python=("-X", "importtime"))
    assert result.returncode == 0, result.stderr
    imported = {line.split("|")[-1].strip() for line in result.stderr.decode().splitlines() if "import time:" in line}
    assert "chatcli.oneshot" in imported and "chatcli.engine.engine" in imported  # the log is read right
    top = {name.split(".")[0] for name in imported}
    assert not top & {"textual", "uvicorn", "starlette", "httpx"}, top
    assert not {n for n in imported if n.startswith(("chatcli.ui", "chatcli.server", "chatcli.bench"))}
    require_kernel()
    assert not top & {"torch", "transformers"}, top & {"torch", "transformers"}


def test_json_schema_holds_the_reply_to_a_file_or_inline_schema(cli, tmp_path):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    path = tmp_path / "answer.json"
    path.write_text(json.dumps(schema))
    for value in (str(path), json.dumps(schema)):
        result = cli("-p", "Are you ok?", "--temperature", "0", "--max-tokens", "40", "--json-schema", value)
        assert result.returncode == 0, result.stderr
        jsonschema.validate(json.loads(result.stdout), schema)


def test_a_logit_bias_past_the_vocabulary_is_one_line(cli):
    result = cli("-p", "hi", "--logit-bias", "99999999=5")
    assert result.returncode == 2
    assert one_error_line(result).startswith("chatcli: error: --logit-bias: token id 99999999 is past the vocabulary")


@pytest.mark.parametrize(
    "value,words",
    [
        ("missing.json", "cannot read"),
        ('{"type": ', "does not parse"),
        ('{"type": "nosuchtype"}', "nosuchtype"),
        ("[1, 2]", "an object"),  # JSON, but no schema: not a file name
        ('{"$ref": "#"}', "admits no JSON value"),  # recursive: exit 2, not an empty reply
    ],
)
def test_a_bad_json_schema_is_one_line(cli, tmp_path, value, words):
    result = cli("-p", "hi", "--json-schema", str(tmp_path / value) if value.endswith(".json") else value)
    assert result.returncode == 2
    line = one_error_line(result)
    assert line.startswith("chatcli: error: --json-schema: ") and words in line


def test_a_structured_reply_cut_by_max_tokens_exits_1(cli):
    schema = '{"type": "array", "items": {"type": "string"}, "minItems": 3}'  # more than 2 tokens, whatever is drawn
    result = cli("-p", "hi", "--max-tokens", "2", "--temperature", "0", "--json-schema", schema)
    assert result.returncode == 1
    assert "before its JSON was complete" in one_error_line(result)
    assert result.stdout.decode().startswith("[")  # what came is printed


def saved_roles(data_dir) -> list[list[str]]:
    """Each saved conversation's message roles, oldest conversation first."""
    import sqlite3

    db = sqlite3.connect(data_dir / "chatcli.db")
    try:
        ids = [row[0] for row in db.execute("SELECT id FROM conversations ORDER BY created")]
        query = "SELECT role FROM messages WHERE conversation_id=? ORDER BY id"
        return [[role for (role,) in db.execute(query, (i,))] for i in ids]
    finally:
        db.close()


def test_a_refused_prompt_is_not_saved(cli, tmp_path):
    too_long = "lazy dog " * 400
    assert cli("-p", too_long).returncode == 1  # a new conversation: none is made
    assert not (tmp_path / "data" / "chatcli.db").exists() or saved_roles(tmp_path / "data") == []
    assert cli("-p", "hi", "--max-tokens", "2").returncode == 0
    for _ in range(3):  # -c: the conversation keeps its one exchange
        assert cli("-c", "-p", too_long).returncode == 1
    assert saved_roles(tmp_path / "data") == [["user", "assistant"]]


def test_parallel_continues_save_whole_exchanges(cli, tmp_path, tiny_model_dir):
    """Processes answering in one conversation at once: each prompt lands with its own reply."""
    assert cli("-p", "hi", "--max-tokens", "2").returncode == 0
    env = {**os.environ, "CHATCLI_CONFIG": str(cli.config), "CHATCLI_DATA_DIR": str(tmp_path / "data")}
    argv = [sys.executable, "-m", "chatcli", "--model", str(tiny_model_dir), "-c", "--max-tokens", "6"]
    runs = [subprocess.Popen([*argv, "-p", f"question {i}"], env=env, stdout=subprocess.DEVNULL) for i in range(4)]
    assert [p.wait(120) for p in runs] == [0] * 4
    (roles,) = saved_roles(tmp_path / "data")
    assert roles == ["user", "assistant"] * 5


def test_no_save_answers_without_a_trace(cli, tmp_path):
    """--no-save (or `save = false` in the config, which --save overrides): a reply, no conversation."""
    data = tmp_path / "data"
    result = cli("-p", "hi", "--max-tokens", "2", "--no-save", "--json")
    assert result.returncode == 0 and json.loads(result.stdout)["conversation"] is None
    assert not data.exists()  # not even the database: nothing read, nothing written
    assert cli("-p", "hi", "--max-tokens", "2").returncode == 0
    assert saved_roles(data) == [["user", "assistant"]]
    cli.config.write_text("save = false\n")
    assert cli("-c", "-p", "again", "--max-tokens", "2").returncode == 0  # reads the history, writes nothing
    assert cli("-p", "new", "--max-tokens", "2").returncode == 0
    assert saved_roles(data) == [["user", "assistant"]]
    assert cli("-p", "kept", "--max-tokens", "2", "--save").returncode == 0
    assert saved_roles(data) == [["user", "assistant"], ["user", "assistant"]]
    cli.config.write_text('save = "no"\n')
    assert "save must be true or false" in one_error_line(cli("-p", "hi"))
