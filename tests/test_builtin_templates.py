"""The built-in chat templates (`text.templates`): each renders a two-turn conversation as llama.cpp's
`llm_chat_apply_template` writes it for the same name; a tokenizer without a template of its own gets
one by its architecture and vocabulary; `--chat-template NAME|FILE` and `--raw` replace it."""

from __future__ import annotations

import pytest

from chatcli.engine.load.options import LoadError, LoadOptions, chosen_template
from chatcli.engine.text.template import compile_template, render_bounded
from chatcli.engine.text.templates import RAW, UnknownTemplate, built_in, choose, default_for, names
from chatcli.engine.text.tokenize import FolderTokenizer, TransformersTokenizer
from tests.tiny import build_tokenizer

TWO_TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": " Hello! "},
    {"role": "user", "content": "Bye"},
]
# what llama.cpp's src/llama-chat.cpp writes for TWO_TURNS with the assistant's turn opened (llama2 and
# the mistral ones open none: the user's [/INST] ends it), by name
RENDERED = {
    "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    " Hello! <|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
    "command-r": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Be brief.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
    "<|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hello!<|END_OF_TURN_TOKEN|>"
    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Bye<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    "deepseek": "Be brief.### Instruction:\nHi\n### Response:\n Hello! \n<|EOT|>\n### Instruction:\nBye\n"
    "### Response:\n",
    "deepseek2": "Be brief.\n\nUser: Hi\n\nAssistant:  Hello! <｜end▁of▁sentence｜>User: Bye\n\nAssistant:",
    "deepseek3": "Be brief.\n\n<｜User｜>Hi<｜Assistant｜> Hello! <｜end▁of▁sentence｜><｜User｜>Bye<｜Assistant｜>",
    "exaone3": "[|system|]Be brief.[|endofturn|]\n[|user|]Hi\n[|assistant|]Hello![|endofturn|]\n[|user|]Bye\n"
    "[|assistant|]",
    "falcon3": "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n Hello! \n<|user|>\nBye\n<|assistant|>\n",
    "gemma": "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
    "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
    "granite": "<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>"
    "Hi<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|> Hello! <|end_of_text|>\n<|start_of_role|>user"
    "<|end_of_role|>Bye<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>\n",
    "llama2": "[INST] Be brief.\nHi [/INST] Hello! </s>[INST] Bye [/INST]",
    "llama2-sys": "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s>[INST] Bye [/INST]",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
    "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user"
    "<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "llama4": "<|header_start|>system<|header_end|>\n\nBe brief.<|eot|><|header_start|>user<|header_end|>\n\nHi<|eot|>"
    "<|header_start|>assistant<|header_end|>\n\nHello!<|eot|><|header_start|>user<|header_end|>\n\nBye<|eot|>"
    "<|header_start|>assistant<|header_end|>\n\n",
    "megrez": "<|role_start|>system<|role_end|>Be brief.<|turn_end|><|role_start|>user<|role_end|>Hi<|turn_end|>"
    "<|role_start|>assistant<|role_end|> Hello! <|turn_end|><|role_start|>user<|role_end|>Bye<|turn_end|>"
    "<|role_start|>assistant<|role_end|>",
    "mistral": "[INST] Be brief.\n\nHi[/INST] Hello!</s>[INST] Bye[/INST]",
    "mistral-v1": " [INST] Be brief.\n\nHi [/INST]  Hello! </s> [INST] Bye [/INST]",
    "mistral-v3": "[INST] Be brief.\n\nHi[/INST] Hello!</s>[INST] Bye[/INST]",
    "mistral-v3-tekken": "[INST]Be brief.\n\nHi[/INST] Hello! </s>[INST]Bye[/INST]",
    "mistral-v7": "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Hi[/INST]  Hello! </s>[INST] Bye[/INST]",
    "openchat": "Be brief.<|end_of_turn|>GPT4 Correct User: Hi<|end_of_turn|>GPT4 Correct Assistant:  Hello! "
    "<|end_of_turn|>GPT4 Correct User: Bye<|end_of_turn|>GPT4 Correct Assistant:",
    "phi3": "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n Hello! <|end|>\n<|user|>\nBye<|end|>\n"
    "<|assistant|>\n",
    "phi4": "<|im_start|>system<|im_sep|>Be brief.<|im_end|><|im_start|>user<|im_sep|>Hi<|im_end|><|im_start|>"
    "assistant<|im_sep|> Hello! <|im_end|><|im_start|>user<|im_sep|>Bye<|im_end|><|im_start|>assistant<|im_sep|>",
    "vicuna": "Be brief.\n\nUSER: Hi\nASSISTANT:  Hello! </s>\nUSER: Bye\nASSISTANT:",
    "vicuna-orca": "SYSTEM: Be brief.\nUSER: Hi\nASSISTANT:  Hello! </s>\nUSER: Bye\nASSISTANT:",
    "zephyr": "<|system|>\nBe brief.<|endoftext|>\n<|user|>\nHi<|endoftext|>\n<|assistant|>\n Hello! <|endoftext|>\n"
    "<|user|>\nBye<|endoftext|>\n<|assistant|>\n",
}


def test_every_built_in_name_has_its_rendering_here():
    assert sorted(RENDERED) == names()
    assert {"chatml", "llama3", "gemma", "mistral", "phi3", "zephyr", "vicuna", "deepseek"} <= set(names())


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_each_built_in_renders_two_turns_as_llama_cpp(name):
    template = built_in(name)
    assert template.label == f"built-in {name}" and template.stops
    context = dict(messages=TWO_TURNS, add_generation_prompt=True, bos_token="<BOS>")
    assert render_bounded(compile_template(template.source), context) == RENDERED[name]


def test_the_default_is_chosen_by_architecture_and_vocabulary():
    vocab = {"<|start_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<|assistant|>", "<|end|>"}
    assert default_for("gemma3_text", vocab.__contains__)[0].label == "built-in gemma"
    assert default_for("llama", vocab.__contains__)[0].label == "built-in llama3"
    assert default_for("phi3", {"<|assistant|>", "<|end|>"}.__contains__)[0].label == "built-in phi3"
    chatml, why = default_for("qwen2", {"<|im_start|>", "<|im_end|>"}.__contains__)
    assert chatml.label == "built-in chatml" and "ChatML's tokens" in why
    plain, why = default_for("llama", set().__contains__)
    assert plain.label == "built-in chatml" and "plain text" in why


def without_template():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    return tokenizer


def test_a_tokenizer_without_a_template_renders_with_a_built_in_one(tmp_path):
    folder = tmp_path / "base"
    without_template().save_pretrained(folder)
    (folder / "config.json").write_text('{"model_type": "gemma3_text"}')
    ours, theirs = FolderTokenizer(folder), TransformersTokenizer(without_template())
    assert (ours.template_label, theirs.template_label) == ("built-in gemma", "built-in chatml")
    assert ours.chosen_why == "its architecture is gemma3_text"
    user = [{"role": "user", "content": "Hi"}]
    assert ours.render(user) == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    # gemma's markers are not this vocabulary's tokens: its end of turn ends a reply as text
    assert ours.stop_texts == ("<end_of_turn>", "<start_of_turn>")
    # chatml's are: its end of turn is an end id, and the rendered markers its control ids
    im_start, im_end = (theirs.added_tokens[t][0] for t in ("<|im_start|>", "<|im_end|>"))
    assert im_end in theirs.stop_ids and im_start in theirs.stop_ids and theirs.stop_texts == ()
    ids = theirs.encode_chat(user)
    assert ids[: len(theirs._prompt_prefix)] == theirs._prompt_prefix and ids.count(im_start) == 2


def test_a_chosen_template_replaces_the_models_own_and_raw_continues_the_text():
    tokenizer = TransformersTokenizer(build_tokenizer())
    assert tokenizer.template_label == "model's own"
    chat = [{"role": "system", "content": "Sys."}, {"role": "user", "content": "Once upon"}]
    chat += [{"role": "assistant", "content": " a time"}, {"role": "user", "content": [{"type": "text", "text": ","}]}]
    tokenizer.use_template(built_in("vicuna"))
    assert tokenizer.render(chat) == "Sys.\n\nUSER: Once upon\nASSISTANT:  a time</s>\nUSER: ,\nASSISTANT:"
    assert tokenizer.template_label == "built-in vicuna" and tokenizer.stop_texts == ("</s>", "USER:")
    tokenizer.use_template(RAW)
    assert tokenizer.render(chat) == "Once upon a time,"  # what was typed and written, the system prompt aside
    assert tokenizer.encode_chat(chat) == tokenizer.encode_prompt("Once upon a time,")
    assert tokenizer.template_label == "raw" and tokenizer.stop_texts == ()


def test_chat_template_takes_a_name_or_a_jinja_file(tmp_path):
    path = tmp_path / "qa.jinja"
    path.write_text("{% for m in messages %}Q: {{ m.content }}\n{% endfor %}A:")
    chosen = chosen_template(LoadOptions(chat_template=str(path)))
    assert chosen.label == "file qa.jinja" and chosen.source == path.read_text()
    assert chosen_template(LoadOptions(chat_template="mistral")).label == "built-in mistral"
    assert chosen_template(LoadOptions(raw=True)) is RAW and chosen_template(LoadOptions()) is None


def test_a_name_that_is_no_template_is_one_line_listing_the_names(tmp_path):
    with pytest.raises(LoadError) as caught:
        chosen_template(LoadOptions(chat_template="chatlm"))
    said = str(caught.value)
    assert "\n" not in said and said.startswith("--chat-template chatlm: not a built-in template nor a file")
    assert all(name in said for name in names())
    (tmp_path / "bad.jinja").write_text("{% for m in messages %}")
    with pytest.raises(LoadError, match=r"bad.jinja: the chat template does not parse at line 1"):
        chosen_template(LoadOptions(chat_template=str(tmp_path / "bad.jinja")))
    with pytest.raises(LoadError, match="--raw"):
        chosen_template(LoadOptions(chat_template="gemma", raw=True))
    with pytest.raises(UnknownTemplate):
        choose(str(tmp_path / "missing.jinja"))
