import pytest

from chatcli.chat import commands
from chatcli.chat.commands import Command, CommandError, apply_setting, common_completion, complete, parse
from chatcli.engine.sample.sampling import SamplingParams


@pytest.mark.parametrize(
    "line, field, value",
    [
        ("/temp 0.3", "temperature", 0.3),
        ("/temperature 1.5", "temperature", 1.5),
        ("/top-k 20", "top_k", 20),
        ("/top-p 0.9", "top_p", 0.9),
        ("/min-p 0.1", "min_p", 0.1),
        ("/max-tokens 64", "max_tokens", 64),
        ("/repeat-penalty 1.1", "repeat_penalty", 1.1),
        ("/seed 42", "seed", 42),
        ("/seed off", "seed", None),
        ("  /TEMP   0.5  ", "temperature", 0.5),
    ],
)
def test_setting_commands_parse_to_a_field_and_value(line, field, value):
    cmd = parse(line)
    assert cmd.setting == (field, value)
    assert apply_setting(SamplingParams(), cmd).__getattribute__(field) == value


def test_a_setting_command_without_a_value_asks_for_it():
    assert parse("/temp") == Command("temp", field="temperature")  # the front end shows the value
    assert parse("/seed").field == "seed" and parse("/seed").setting is None
    assert parse("/temp 0.3").field == "temperature"


def test_load_completes_json_files_and_folders_only(tmp_path):
    for name in ("a.json", "b.md", "c.JSON"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "sub").mkdir()
    assert complete(f"/load {tmp_path}/") == [f"/load {tmp_path}/{n}" for n in ("a.json", "c.JSON", "sub/")]
    assert complete(f"/save {tmp_path}/") == [f"/save {tmp_path}/{n}" for n in ("a.json", "b.md", "c.JSON", "sub/")]
    assert f"/file {tmp_path}/b.md" in complete(f"/file {tmp_path}/")  # /file takes any text file


def test_alias_maps_to_canonical_name():
    assert parse("/temperature 1").name == "temp"
    assert parse("/exit").name == "quit"
    assert parse("/bye").name == "quit"


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("/temp hot", "'hot' is not a number"),
        ("/temp nan", "is not a number"),
        ("/top-k 2.5", "is not a whole number"),
        ("/seed maybe", "whole number or 'off'"),
        ("/clear now", "takes no argument"),
    ],
)
def test_bad_values_are_one_line_errors(line, fragment):
    with pytest.raises(CommandError) as info:
        parse(line)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "line, suggestion", [("/tmep 1", "/temp"), ("/retyr", "/retry"), ("/sett", "/settings"), ("/thme", "/theme")]
)
def test_unknown_command_names_the_nearest(line, suggestion):
    with pytest.raises(CommandError) as info:
        parse(line)
    assert f"did you mean {suggestion}?" in str(info.value)


def test_unknown_command_with_nothing_close_points_to_help():
    with pytest.raises(CommandError, match="/help"):
        parse("/zzzzzz")


def test_out_of_range_value_is_rejected_by_the_params_and_changes_nothing():
    params = SamplingParams(temperature=0.7)
    with pytest.raises(ValueError, match="top-p"):
        apply_setting(params, parse("/top-p 1.5"))
    assert params.top_p == SamplingParams().top_p


def test_free_text_commands_keep_their_argument():
    assert parse("/system You are terse.  ") == Command("system", "You are terse.")
    assert parse("/system") == Command("system", "")
    assert parse("/theme light") == Command("theme", "light")


def test_is_command():
    assert commands.is_command("/help")
    assert not commands.is_command("hello /help")
    assert not commands.is_command("/ leading slash then space")
    assert not commands.is_command("//not a command")
    assert not commands.is_command("/")


def test_completion():
    assert complete("/te") == ["/temp", "/temperature"]
    assert complete("/und") == ["/undo"]
    assert complete("/temp 0") == []
    assert complete("hello") == []
    assert common_completion("/und") == "/undo "
    assert common_completion("/se") is None  # /seed and /settings share only "/se"
    assert common_completion("/max") == "/max-tokens "
    assert common_completion("/rep") == "/repeat-penalty "
    assert common_completion("/xyz") is None


def test_completion_extends_to_the_longest_common_prefix():
    assert common_completion("/t") is None  # temp, top-k, top-p, theme: nothing longer in common
    assert common_completion("/top") == "/top-"


def test_help_lists_every_command_once_with_a_description():
    rows = commands.help_lines()
    listed = [usage.split()[0] for usage, _ in rows]
    assert listed == [f"/{s.name}" for s in commands.COMMANDS]
    assert all(desc for _, desc in rows)
    assert any("/temperature" in usage for usage, _ in rows)
    samples = {"switch": " 2", "rename": " Notes", "save": " out.md", "load": " in.json", "logit-bias": " 1=-100"}
    for spec in commands.COMMANDS:  # every command parses by name (settings and the like with a sample value)
        line = f"/{spec.name}" + samples.get(spec.name, " 1" if spec.reader else "")
        assert parse(line).name == spec.name


@pytest.mark.parametrize(
    "line, expected",
    [
        ("/new", Command("new")),
        ("/switch 3", Command("switch", "3")),
        ("/rename  My   notes ", Command("rename", "My   notes")),
        ("/delete", Command("delete")),
        ("/save ~/chat.MD", Command("save", "~/chat.MD")),
        ("/save out.json", Command("save", "out.json")),
        ("/load export.json", Command("load", "export.json")),
        ("/load whatever.txt", Command("load", "whatever.txt")),  # the content decides, not the name
    ],
)
def test_conversation_commands_parse(line, expected):
    assert parse(line) == expected


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("/switch", "/switch needs a value: /switch N"),
        ("/switch two", "'two' is not a conversation number"),
        ("/switch 0", "'0' is not a conversation number"),
        ("/switch -1", "'-1' is not a conversation number"),
        ("/rename", "/rename needs a value"),
        ("/save", "/save needs a value"),
        ("/save notes.txt", "name it .md or .json"),
        ("/save notes", "name it .md or .json"),
        ("/load", "/load needs a value"),
        ("/new chat", "takes no argument"),
        ("/delete 2", "takes no argument"),
    ],
)
def test_conversation_commands_refuse_bad_arguments(line, fragment):
    with pytest.raises(CommandError) as info:
        parse(line)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_export_format_from_the_extension():
    assert commands.export_format("a/b.md") == "md"
    assert commands.export_format("X.JSON") == "json"
    with pytest.raises(ValueError):
        commands.export_format("b.html")
