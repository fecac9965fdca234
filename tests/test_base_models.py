"""A GGUF without a chat template (a base model, as llama.cpp's GGUF-my-repo makes Gemma 3 270M) runs:
loaded with a built-in template named in the note, `--json` and the header; in the one-shot, serve's
chat and completions; `--raw` continues a text; `--chat-template NAME|FILE` and the config's
`chat_template`; an unknown name is one line. Control tokens are never printed as text."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from chatcli.engine import LoadError, LoadOptions, SamplingParams
from chatcli.engine.events import Finished
from chatcli.engine.load.build import load_engine
from tests.gguf_models import base_model_gguf

GREEDY = SamplingParams(temperature=0, max_tokens=6)
USER = [{"role": "user", "content": "Hello there"}]
# a user-defined token llama.cpp's converter writes for Gemma 3's <start_of_image>, one it would have
# typed control (`<unused7>`), one that is text (`<think>`, as Qwen's), and a padding token typed UNUSED
# (what llama.cpp's `token_to_piece` prints nothing for, `special` or not)
MEDIA, UNUSED, THINK, PAD = 500, 501, 502, 503
TOKENS = {MEDIA: ("<start_of_image>", 4), UNUSED: ("<unused7>", 4), THINK: ("<think>", 4), PAD: ("[PAD503]", 5)}


@pytest.fixture(scope="module")
def base_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    return {
        "gemma3": base_model_gguf("gemma3_text", folder / "gemma3-base.gguf"),
        "llama": base_model_gguf("llama", folder / "llama-base.gguf", TOKENS),
    }


def reply(engine, messages=USER, params=GREEDY) -> Finished:
    events = list(engine.generate(messages, engine.new_session(), params))
    assert isinstance(events[-1], Finished)
    return events[-1]


def test_a_gemma_file_without_a_template_answers_with_gemmas_turns(base_files):
    engine = load_engine(str(base_files["gemma3"]))  # before: "the tokenizer has no chat template"
    assert engine.template == "built-in gemma"
    assert "has no chat template: the built-in gemma template renders its turns (its architecture is" in engine.note
    rendered = engine.tokenizer.render(USER)
    assert rendered == "<start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\n"
    done = reply(engine)
    assert done.stats.prompt_tokens == len(engine.tokenizer.encode_chat(USER)) and done.stats.completion_tokens


def test_a_llama_file_gets_chatml_and_a_chosen_template_replaces_it(base_files, tmp_path):
    engine = load_engine(str(base_files["llama"]))
    assert engine.template == "built-in chatml" and "ChatML's tokens" in engine.note
    path = tmp_path / "qa.jinja"
    path.write_text("{% for m in messages %}Q: {{ m.content }}\n{% endfor %}A:")
    chosen = load_engine(str(base_files["llama"]), LoadOptions(chat_template=str(path)))
    assert chosen.template == "file qa.jinja" and not chosen.note  # asked for: nothing to say
    first = reply(chosen)
    prompt = chosen.tokenizer.encode_prompt("Q: Hello there\nA:")  # its BOS (where it adds one), then the text
    assert first.stats.prompt_tokens == len(prompt) == len(chosen.tokenizer.encode_chat(USER))
    with pytest.raises(LoadError, match="not a built-in template nor a file"):
        load_engine(str(base_files["llama"]), LoadOptions(chat_template="nope"))


@pytest.mark.parametrize("runner", ["auto", "hf"])  # hf: the file dequantized by transformers' converter
def test_control_tokens_are_never_printed_and_other_added_tokens_are(base_files, runner):
    engine = load_engine(str(base_files["llama"]), LoadOptions(runner=runner))
    tokenizer = engine.tokenizer
    for token_id, shown in ((MEDIA, ""), (UNUSED, ""), (PAD, ""), (THINK, "<think>" * 3)):
        done = reply(engine, params=SamplingParams(temperature=0, max_tokens=3, logit_bias=((token_id, 100.0),)))
        assert done.stats.completion_tokens == 3 and done.reply == shown, token_id
    assert tokenizer.decode([MEDIA], skip_special_tokens=False) == "<start_of_image>"  # the inspector's name
    from chatcli.engine import Token
    from chatcli.ui.widgets.tokens import turn_pieces

    pieces = turn_pieces([MEDIA], 0, [Token(THINK, "<think>", 1, 0.0, 0.0)], tokenizer.decode)
    assert [(p.text, p.control) for p in pieces] == [("<start_of_image>", True), ("<think>", False)]


def test_the_files_tokenizer_marks_control_tokens_special(base_files, tmp_path):
    """Both writers of a GGUF's tokenizer: ours (byte-level BPE) and transformers' converter (the rest,
    as Gemma's SentencePiece), corrected by `mark_controls`."""
    from transformers import AutoTokenizer

    from chatcli.engine.text.tokenize import FolderTokenizer
    from chatcli.engine.weights import gguf_meta
    from chatcli.engine.weights.gguf_file import GGUFFile

    path = base_files["llama"]
    ours = gguf_meta.build_tokenizer(GGUFFile(path))
    assert ours.decode([MEDIA, UNUSED, PAD, THINK], skip_special_tokens=True) == "<think>"
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(tmp_path)
    gguf_meta.mark_controls(GGUFFile(path), tmp_path)
    theirs = FolderTokenizer(tmp_path)
    assert theirs.decode([MEDIA, UNUSED, PAD, THINK]) == "<think>"
    assert theirs.decode([MEDIA, THINK], skip_special_tokens=False) == "<start_of_image><think>"


def test_a_template_text_the_vocabulary_lacks_ends_a_reply(base_files):
    engine = load_engine(str(base_files["llama"]), LoadOptions(chat_template="vicuna"))
    assert engine.tokenizer.stop_texts == ("</s>", "USER:")  # plain text in this vocabulary
    params = SamplingParams(temperature=0, max_tokens=12)
    whole = reply(engine, params=params).reply
    assert len(whole) > 2
    engine.tokenizer.stop_texts = (whole[1:3],)  # as if the model wrote its end of turn there
    assert reply(engine, params=params).reply == whole[:1]


def one_shot(*args, tmp_path, config: str | None = None, stdin: bytes | None = None):
    env = {**os.environ, "CHATCLI_CONFIG": str(tmp_path / "config.toml"), "CHATCLI_DATA_DIR": str(tmp_path / "data")}
    if config is not None:
        (tmp_path / "config.toml").write_text(config)
    argv = [sys.executable, "-m", "chatcli", "--no-save", *args]
    return subprocess.run(argv, capture_output=True, env=env, timeout=300, input=stdin)


def test_the_one_shot_answers_and_names_the_template(base_files, tmp_path):
    model = str(base_files["llama"])
    result = one_shot("-m", model, "-p", "Hello there", "--temperature", "0", "--max-tokens", "4", "--json",
                      tmp_path=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    record = json.loads(result.stdout)
    assert record["template"] == "built-in chatml" and record["stats"]["completion_tokens"] == 4
    assert "has no chat template: the built-in chatml template" in result.stderr.decode()
    config = 'chat_template = "vicuna"\n'
    result = one_shot("-m", str(base_files["llama"]), "-p", "hi", "--json", tmp_path=tmp_path, config=config)
    assert result.returncode == 0 and json.loads(result.stdout)["template"] == "built-in vicuna"


def test_raw_continues_the_text_in_the_one_shot(base_files, tmp_path):
    text = "The capital of France is"
    result = one_shot("-m", str(base_files["llama"]), "--raw", "--temperature", "0", "--max-tokens", "5", "--json",
                      tmp_path=tmp_path, stdin=text.encode())  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    record = json.loads(result.stdout)
    engine = load_engine(str(base_files["llama"]))
    ids = engine.tokenizer.encode_prompt(text)
    events = list(engine.complete(ids, engine.new_session(), SamplingParams(temperature=0, max_tokens=5)))
    assert record["template"] == "raw" and record["stats"]["prompt_tokens"] == len(ids)
    assert record["reply"] == events[-1].reply  # the text continued, as /v1/completions continues it
    plain = one_shot("-m", str(base_files["llama"]), "--raw", "-p", text, "--temperature", "0", "--max-tokens", "5",
                   tmp_path=tmp_path)  # fmt: skip
    assert plain.stdout.decode().rstrip("\n") == events[-1].reply.rstrip("\n")


def test_an_unknown_template_name_is_one_line(base_files, tmp_path):
    from chatcli.engine.text.templates import names

    result = one_shot("-m", str(base_files["llama"]), "-p", "hi", "--chat-template", "chatlm", tmp_path=tmp_path)
    said = result.stderr.decode()
    assert result.returncode == 2 and said.count("\n") == 1  # refused as the line is parsed, as a bad --device
    assert said.startswith("chatcli: error: Invalid value for '--chat-template': chatlm: not a built-in template")
    assert all(name in said for name in names())
    result = one_shot("-m", str(base_files["llama"]), "-p", "hi", tmp_path=tmp_path, config='chat_template = "x"\n')
    assert result.returncode == 2 and "chat_template: x: not a built-in template" in result.stderr.decode()


def test_serve_answers_chat_and_completions_for_a_file_without_a_template(base_files, serve):
    from openai import OpenAI

    engine = load_engine(str(base_files["gemma3"]))
    server = serve(engine)
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    model = client.models.list().data[0].id  # the file's name: a name the server does not serve is a 404
    chat = client.chat.completions.create(model=model, messages=USER, temperature=0, max_tokens=6)
    assert chat.choices[0].message.content == reply(engine).reply
    text = client.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=6)
    ids = engine.tokenizer.encode_prompt("The capital of France is")
    events = list(engine.complete(ids, engine.new_session(), GREEDY))
    assert text.choices[0].text == events[-1].reply and text.usage.prompt_tokens == len(ids)
