"""Presets: named system prompts (and sampling values) in the config file, `--preset`, `/preset`."""

from __future__ import annotations

import pytest

from chatcli.cli import start_options
from chatcli.config import ConfigError, load_config
from chatcli.errors import UserError

CONFIG = """
system = "You are helpful."
[sampling]
temperature = 0.7
[presets.coder]
system = "You write Python."
temperature = 0.2
top_k = 10
[presets.cold]
temperature = 0.0
"""


@pytest.fixture
def config(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    monkeypatch.setenv("CHATCLI_CONFIG", str(path))
    return path


def test_presets_are_read_and_checked(config):
    presets = load_config().presets
    assert set(presets) == {"coder", "cold"} and presets["coder"].system == "You write Python."
    assert presets["cold"].system is None and presets["cold"].sampling == {"temperature": 0.0}
    for body, message in (
        ("[presets.x]\nsystem = 3\n", r"\[presets.x\] system must be a string"),
        ("[presets.x]\ncolour = 'red'\n", r"unknown \[presets.x\] key 'colour'"),
        ("[presets.x]\ntop_k = -1\n", r"\[presets.x\] top-k must be >= 0"),
        ("[presets.x]\ntemperature = 'hot'\n", r"\[presets.x\] temperature must be a number"),
        ("presets = 3\n", r"\[presets\] must hold tables"),
    ):
        config.write_text(body)
        with pytest.raises(ConfigError, match=message):
            load_config()


def test_preset_on_the_command_line(config):
    start = start_options(preset="coder")
    assert start.system == "You write Python." and start.system_given
    assert start.params.temperature == 0.2 and start.params.top_k == 10
    assert start_options(preset="coder", temperature=0.9).params.temperature == 0.9  # a flag wins
    assert start_options(preset="coder", system="Be brief.").system == "Be brief."
    cold = start_options(preset="cold")
    assert cold.system == "You are helpful." and not cold.system_given and cold.params.temperature == 0.0
    with pytest.raises(UserError, match=r"no preset 'nope' \(known: coder, cold\)"):
        start_options(preset="nope")


def test_the_preset_flag_in_one_line(config, tiny_model_dir):
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "chatcli", "--preset", "nope", "-p", "hi", "-m", str(tiny_model_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert proc.returncode == 2 and "no preset 'nope' (known: coder, cold)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""
