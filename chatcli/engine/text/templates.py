"""Chat templates beside the model's own: the built-in ones, a Jinja file, or none (`--raw`).

A model whose files hold no chat template (a base model: Gemma 3 270M from llama.cpp's GGUF-my-repo)
still chats: `default_for` picks a built-in template by its architecture and vocabulary —

- `gemma` for the gemma* architectures (Gemma's `<start_of_turn>user\\n…<end_of_turn>\\n` turns);
- `llama3` where the vocabulary has Llama 3's header tokens (`<|start_header_id|>`, `<|eot_id|>`);
- `phi3` for a phi3 file whose vocabulary has `<|assistant|>` and `<|end|>`;
- `chatml` otherwise, as llama.cpp and ollama fall back to. Where the vocabulary lacks `<|im_start|>`,
  ChatML's markers are read as plain text (the template still tells the turns apart, in letters a base
  model has read on the web), and its end-of-turn text ends a reply as a stop string (`Template.stops`).

`choose` reads `--chat-template NAME|FILE` (the config's `chat_template`): a built-in name as llama.cpp
spells it (its `src/llama-chat.cpp`: chatml, llama3, gemma, mistral-v7, phi3, zephyr, vicuna, deepseek, …;
`mistral` is `mistral-v3`'s `[INST]` turns), else a Jinja file; an unknown name is one line listing the
names. `RAW` (`--raw`) is no template: a conversation is the concatenation of its texts (`raw_text`), a
prompt continued as the model reads a raw one.

Each built-in is our own Jinja (`chat_templates/NAME.jinja`, in the wheel), rendering what llama.cpp's
`llm_chat_apply_template` writes for the name. Like llama.cpp's, none writes the BOS token: the
tokenizer puts its prompt prefix before a chosen template's text (`ChatTokenizer.encode_chat`), as
llama.cpp's tokenizer adds it. Stdlib only: `chatcli.engine` exports `check_chat_template`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# name -> the texts that end the assistant's turn (its end-of-turn marker, the next turn's opener): an
# added token of the vocabulary among them ends a reply as its id, any other as a stop string
BUILT_IN = {
    "chatml": ("<|im_end|>", "<|im_start|>"),
    "command-r": ("<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>"),
    "deepseek": ("<|EOT|>", "### Instruction:"),
    "deepseek2": ("<｜end▁of▁sentence｜>", "User:"),
    "deepseek3": ("<｜end▁of▁sentence｜>", "<｜User｜>"),
    "exaone3": ("[|endofturn|]", "[|user|]"),
    "falcon3": ("<|user|>",),
    "gemma": ("<end_of_turn>", "<start_of_turn>"),
    "granite": ("<|end_of_text|>", "<|start_of_role|>"),
    "llama2": ("</s>", "[INST]"),
    "llama2-sys": ("</s>", "[INST]"),
    "llama3": ("<|eot_id|>", "<|start_header_id|>"),
    "llama4": ("<|eot|>", "<|header_start|>"),
    "megrez": ("<|turn_end|>", "<|role_start|>"),
    "mistral-v1": ("</s>", "[INST]"),
    "mistral-v3": ("</s>", "[INST]"),
    "mistral-v3-tekken": ("</s>", "[INST]"),
    "mistral-v7": ("</s>", "[INST]"),
    "openchat": ("<|end_of_turn|>", "GPT4 Correct User:"),
    "phi3": ("<|end|>", "<|user|>"),
    "phi4": ("<|im_end|>", "<|im_start|>"),
    "vicuna": ("</s>", "USER:"),
    "vicuna-orca": ("</s>", "USER:"),
    "zephyr": ("<|endoftext|>", "<|user|>"),
}
ALIASES = {"mistral": "mistral-v3"}  # names llama.cpp does not have, for a template it has


@dataclass(frozen=True)
class Template:
    """A chat template other than the model's own (or `OWN`), and how the header and `--json` name it."""

    label: str  # "built-in gemma", "file chat.jinja", "raw", "model's own"
    source: str = ""  # the Jinja text ('' for the model's own and for raw)
    stops: tuple[str, ...] = ()  # texts that end the assistant's turn
    raw: bool = False  # no template: the messages' texts continued as one prompt


OWN = Template("model's own")
RAW = Template("raw", raw=True)


class UnknownTemplate(ValueError):
    """A --chat-template that is neither a built-in name nor a readable Jinja file (one line)."""


def names() -> list[str]:
    """The built-in templates' names, llama.cpp's spelling (and `mistral`)."""
    return sorted([*BUILT_IN, *ALIASES])


def built_in(name: str) -> Template:
    """The built-in template `name` (UnknownTemplate where there is none)."""
    canonical = ALIASES.get(name, name)
    if canonical not in BUILT_IN:
        raise UnknownTemplate(f"no built-in chat template {name!r}")
    return Template(f"built-in {name}", _text(canonical), BUILT_IN[canonical])


@functools.cache
def _text(name: str) -> str:
    return (resources.files(__package__) / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def choose(spec: str) -> Template:
    """`--chat-template NAME|FILE`: a built-in name, else a Jinja file's text (a stop string of its own
    it cannot say: the model's end-of-turn ids end its replies). UnknownTemplate, one line listing the
    names, for anything else; a file that cannot be read, one line naming why."""
    if spec in BUILT_IN or spec in ALIASES:
        return built_in(spec)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise UnknownTemplate(
            f"--chat-template {spec}: not a built-in template nor a file (built-in: {', '.join(names())})"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise UnknownTemplate(f"--chat-template {spec}: cannot read it: {why}") from None
    if not text.strip():
        raise UnknownTemplate(f"--chat-template {spec}: the file is empty")
    return Template(f"file {path.name}", text)


def check_chat_template(spec: str | None) -> None:
    """Refuse a `--chat-template` (or the config's `chat_template`) that names nothing (UnknownTemplate)."""
    if spec is not None:
        choose(spec)


def default_for(model_type: str, has: Callable[[str], bool]) -> tuple[Template, str]:
    """The built-in template for a model without one of its own, and why it is that one (the start's
    note says it): by `model_type` (config.json's: `gemma3_text`, `llama`, …) and the vocabulary
    (`has(text)`: the tokenizer has that token)."""
    if model_type.startswith("gemma"):
        return built_in("gemma"), f"its architecture is {model_type}"
    if has("<|start_header_id|>") and has("<|eot_id|>"):
        return built_in("llama3"), "its vocabulary has Llama 3's header tokens"
    if model_type.startswith("phi3") and has("<|assistant|>") and has("<|end|>"):
        return built_in("phi3"), "its architecture is phi3 and its vocabulary has Phi-3's turn tokens"
    if has("<|im_start|>") and has("<|im_end|>"):
        return built_in("chatml"), "its vocabulary has ChatML's tokens"
    return built_in("chatml"), "ChatML by default; its vocabulary lacks <|im_start|>, so the markers are plain text"


def raw_text(messages: Sequence[dict]) -> str:
    """`--raw`'s prompt: what was typed and what the model wrote, one after the other, as they are (a
    system prompt left out: it is no part of a text being continued)."""
    return "".join(text_of(m.get("content")) for m in messages if m.get("role") != "system")


def text_of(content) -> str:
    """A message's content as text: a string as it is, OpenAI's parts' texts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return ""
