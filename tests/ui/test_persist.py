import json
import tomllib

from chatcli.config import load_config
from chatcli.engine.sample.sampling import SamplingParams
from chatcli.engine.stats import TurnStats
from chatcli.ui.format import human_bytes, sampling_line, stats_lines
from chatcli.ui.persist import PromptHistory, data_dir, remember_theme
from chatcli.ui.themes import base_theme, shipped_themes, theme_dir


def test_data_dir_follows_the_environment(isolated_dirs):
    assert data_dir() == isolated_dirs / "data"


def test_history_walks_back_and_forth_and_keeps_the_draft(tmp_path):
    h = PromptHistory(tmp_path / "h.jsonl")
    for text in ("one", "two\nlines", "three"):
        h.add(text)
    assert h.older("draft") == "three"
    assert h.older("three") == "two\nlines"
    assert h.older("x") == "one"
    assert h.older("x") is None
    assert h.newer() == "two\nlines"
    assert h.newer() == "three"
    assert h.newer() == "draft"
    assert h.newer() is None


def test_history_persists_skips_repeats_and_damaged_lines(tmp_path):
    path = tmp_path / "h.jsonl"
    h = PromptHistory(path)
    h.add("a")
    h.add("a")
    h.add("   ")
    h.add("b")
    with path.open("a", encoding="utf-8") as f:
        f.write("{not json\n" + json.dumps(42) + "\n")
    assert PromptHistory(path).entries == ["a", "b"]


def test_history_is_capped(tmp_path):
    h = PromptHistory(tmp_path / "h.jsonl", limit=3)
    for i in range(10):
        h.add(str(i))
    assert PromptHistory(tmp_path / "h.jsonl", limit=3).entries == ["7", "8", "9"]


def test_remember_theme_creates_or_edits_the_top_level_key(tmp_path):
    path = tmp_path / "sub" / "config.toml"
    remember_theme("light", path)
    assert tomllib.loads(path.read_text()) == {"theme": "light"}
    path.write_text('model = "m"\ntheme = "dark"  # old\n[sampling]\ntheme_like = 1\n')
    remember_theme("high-contrast", path)
    data = tomllib.loads(path.read_text())
    assert data["theme"] == "high-contrast" and data["model"] == "m" and data["sampling"] == {"theme_like": 1}


def test_a_remembered_theme_loads_back_through_the_config(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[sampling]\ntop_k = 5\n")
    remember_theme("nord", path)
    config = load_config(path)
    assert (config.theme, config.sampling) == ("nord", {"top_k": 5})


def test_shipped_themes_are_found_with_their_base():
    themes = shipped_themes()
    assert theme_dir().is_dir()
    assert base_theme(themes["light"]) == "textual-light"
    assert base_theme(themes["high-contrast"]) == "chatcli-high-contrast"
    for name, path in themes.items():  # every rule is scoped to its theme's class
        rules = [line for line in path.read_text().splitlines() if "{" in line]
        assert rules and all(line.startswith(f".-theme-{name} ") for line in rules)


def test_format_helpers():
    assert human_bytes(512) == "512 B"
    assert human_bytes(3 * 1024 * 1024) == "3.0 MiB"
    assert human_bytes(5 * 1024**3) == "5.0 GiB"
    assert sampling_line(SamplingParams(seed=None, temperature=0.25)).startswith("temp 0.25 · top-k 40")
    lines = stats_lines(TurnStats(ttft_s=0.1234, decode_tok_s=12.345, kv_cache_bytes=2048))
    assert "ttft               123 ms" in lines and "decode             12.3 tok/s" in lines
    assert "kv cache           2.0 KiB" in lines and "prompt tokens      0" in lines
