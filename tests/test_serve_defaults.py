"""The defaults of `chatcli serve` (issue 48): a request that sends no max_tokens runs to the context
limit, as OpenAI's and llama-server's do (most agent clients send none; 1024, the built-in [sampling]
default, cut their replies), unless `--max-tokens` or the config file's [sampling] max_tokens says
otherwise."""

from __future__ import annotations

import pytest

from chatcli.engine import SamplingParams
from tests.servers import USER, slow_endless


def defaults_of(args: list[str], tmp_path, monkeypatch, config: str = "") -> SamplingParams:
    """The request defaults `chatcli serve ARGS` starts its server with (the server itself not run)."""
    from click.testing import CliRunner

    from chatcli.server import cli as server_cli

    seen = []
    monkeypatch.setattr(server_cli, "serve", lambda load, **kw: seen.append(kw["defaults"]))
    (tmp_path / "config.toml").write_text(config)
    monkeypatch.setenv("CHATCLI_CONFIG", str(tmp_path / "config.toml"))
    result = CliRunner().invoke(server_cli.serve_command, args)
    assert result.exit_code == 0, result.output
    return seen[0]


def test_max_tokens_of_a_request_that_sends_none(tmp_path, monkeypatch):
    from chatcli.server.schema import TO_CONTEXT

    assert defaults_of([], tmp_path, monkeypatch).max_tokens == TO_CONTEXT  # the context limit
    assert defaults_of(["--max-tokens", "300"], tmp_path, monkeypatch).max_tokens == 300
    config = "[sampling]\nmax_tokens = 500\ntemperature = 0.5\n"
    found = defaults_of([], tmp_path, monkeypatch, config)
    assert found.max_tokens == 500 and found.temperature == 0.5
    assert defaults_of(["--max-tokens", "40"], tmp_path, monkeypatch, config).max_tokens == 40  # the flag wins


@pytest.fixture(scope="module")
def long_context(tmp_path_factory):
    """The tiny random model with 1100 positions, past the old default of 1024, never ending its turn."""
    from chatcli.engine.load.hf import LoadOptions, build_engine, load
    from tests.tiny import build_tiny_model_dir

    folder = build_tiny_model_dir(tmp_path_factory.mktemp("tiny-long"), max_positions=1100)
    loaded = load(str(folder), LoadOptions(device="cpu"))
    return slow_endless(build_engine(loaded, runner="lean", kv_dtype="float32", kernel=False), 0)


def test_a_request_without_max_tokens_runs_to_the_context_limit(long_context, serve, tmp_path, monkeypatch):
    from openai import OpenAI

    defaults = defaults_of([], tmp_path, monkeypatch)
    server = serve(long_context, defaults=defaults.with_(lookup=0))
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    done = client.chat.completions.create(model="tiny", messages=USER, temperature=0)
    use = done.usage
    assert use.completion_tokens > 1024 and use.total_tokens >= long_context.context_limit == 1100  # all of it
    assert done.choices[0].finish_reason == "length"
    capped = client.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=7)
    assert capped.usage.completion_tokens == 7  # a request's own max_tokens still holds
