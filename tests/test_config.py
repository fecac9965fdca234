"""The config file: its [sampling] table, wrong types and ranges as one-line ConfigErrors."""

import pytest

from chatcli.config import ConfigError, load_config
from chatcli.engine.params import SamplingParams


def write(tmp_path, text: str):
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_sampling_values_override_the_defaults(tmp_path):
    path = write(tmp_path, "[sampling]\ntemperature = 1\ntop_k = 5\nseed = 7\nlookup = 0\n")
    params = load_config(path).params()
    assert (params.temperature, params.top_k, params.seed, params.lookup) == (1.0, 5, 7, 0)
    assert isinstance(params.temperature, float)  # a TOML integer where a number goes
    assert params.top_p == SamplingParams().top_p


def test_a_missing_file_is_the_defaults(tmp_path):
    assert load_config(tmp_path / "none.toml").params() == SamplingParams()


@pytest.mark.parametrize(
    "line, words",
    [
        ('temperature = "hot"', "[sampling] temperature must be a number, got 'hot'"),
        ("top_k = 1.5", "[sampling] top_k must be a whole number, got 1.5"),
        ("seed = true", "[sampling] seed must be a whole number, got true"),
        ('seed = "off"', "[sampling] seed must be a whole number, got 'off'"),
        ("max_tokens = [1]", "[sampling] max_tokens must be a whole number, got [1]"),
        ("top_p = false", "[sampling] top_p must be a number, got false"),
        ("top_k = -1", "[sampling] top-k must be >= 0"),
        ("temperature = nan", "[sampling] temperature must be >= 0"),
        ("lookup = 17", "[sampling] lookup must be in [0, 16]"),
        ("bogus = 1", "unknown [sampling] key 'bogus' (known: temperature, top_k"),
        ("stop = ['x']", "unknown [sampling] key 'stop'"),
    ],
)
def test_a_wrong_value_is_one_line_naming_the_file_and_key(tmp_path, line, words):
    path = write(tmp_path, f"[sampling]\n{line}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and words in message and "\n" not in message


def test_a_remote_backend_in_the_config(tmp_path):
    config = load_config(write(tmp_path, 'api = "http://gpu-box:8000/v1"\napi_key = "k"\nmodel = "big"\n'))
    assert (config.api, config.api_key, config.model) == ("http://gpu-box:8000/v1", "k", "big")
    for line in ("api = 8000", "api_key = true"):
        with pytest.raises(ConfigError, match=f"{line.split()[0]} must be a string"):
            load_config(write(tmp_path, line + "\n"))


def test_a_byte_order_mark_is_read_past(tmp_path):
    path = tmp_path / "config.toml"
    path.write_bytes("\ufeff[sampling]\ntemperature = 0.25\n".encode())  # as Notepad saves UTF-8
    assert load_config(path).params().temperature == 0.25
