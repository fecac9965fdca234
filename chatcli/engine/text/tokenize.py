"""Ingress: chat messages → token ids through the model's chat template and BPE tokenizer.

Two implementations of one small interface (`encode_chat`, `encode`, `decode`, `stop_ids`):

- `FolderTokenizer`: the model folder's own files, read without transformers — the
  `tokenizers` library over `tokenizer.json`, and the chat template rendered by jinja2 in
  the same sandbox, with the same options and helpers, as transformers renders it. This is
  what the lean runners use: loading it takes ~0.1 s, where transformers' tokenizer chain
  imports ~1.3 s of modules first.
- `TransformersTokenizer`: a transformers tokenizer (the HF runner, the bench baseline, and
  folders the first cannot read: no `tokenizer.json`, or a decode clean-up it does not do).

Both know which ids end a reply: every end-of-sequence id the model config, the generation
config and the tokenizer define, plus the end-of-turn markers of common chat templates when
the vocabulary has them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from chatcli.engine.text.toolcalls import fallback_messages, syntax_of, takes_tools

# End-of-turn markers of widespread chat templates (ChatML, Llama 3, Gemma, Phi).
END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end_of_turn|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class UnsupportedTokenizer(ValueError):
    """The folder's tokenizer needs transformers (the message says why)."""


class ChatTokenizer:
    """What the engine needs of a tokenizer; `stop_ids` is set by the implementations."""

    stop_ids: frozenset[int] = frozenset()
    template_source: str = ""  # the chat template's text

    def encode_chat(self, messages: Sequence[dict], tools: list[dict] | None = None) -> list[int]:
        """The whole conversation, templated with the assistant's turn opened; `tools` (OpenAI's list)
        shown to the model (`with_tools`)."""
        raise NotImplementedError

    @property
    def tool_syntax(self) -> str:
        """How this model writes a tool call (`chatcli.engine.text.toolcalls`: HERMES or LLAMA3)."""
        return syntax_of(self.template_source)

    def with_tools(self, messages: Sequence[dict], tools: list[dict] | None) -> tuple[list[dict], list | None]:
        """The messages and tools the template renders: as they are where it takes tools, else the
        fallback (the tools in the system prompt, calls and results as text: `fallback_messages`)."""
        if takes_tools(self.template_source):
            return list(messages), tools or None
        if tools or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages):
            return fallback_messages(messages, tools), None
        return list(messages), None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        raise NotImplementedError

    def encode_prompt(self, text: str) -> list[int]:
        """A raw prompt (no chat template) as the model reads one: with the tokenizer's own special
        tokens (a Llama's BOS), as `tokenizer(text)` gives them."""
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        """Ids below this are the tokenizer's (added tokens included)."""
        raise NotImplementedError

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one id stands for (where it holds part of a character, that part)."""
        return self.decode([token_id], skip_special_tokens=False).encode()


class TransformersTokenizer(ChatTokenizer):
    def __init__(self, tokenizer, model_config=None, generation_config=None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        template = tokenizer.chat_template
        self.template_source = template if isinstance(template, str) else json.dumps(template)
        ids: set[int] = set()
        for source in (model_config, generation_config, tokenizer):
            ids.update(_as_ids(getattr(source, "eos_token_id", None)))
        vocab = tokenizer.get_vocab()
        ids.update(vocab[m] for m in END_OF_TURN_MARKERS if m in vocab)
        self.stop_ids = frozenset(ids)

    def encode_chat(self, messages: Sequence[dict], tools: list[dict] | None = None) -> list[int]:
        messages, tools = self.with_tools(messages, tools)
        ids = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return [int(i) for i in ids]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_prompt(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


class FolderTokenizer(ChatTokenizer):
    """A model folder's `tokenizer.json`, chat template and configs, without transformers."""

    def __init__(self, folder: str | Path) -> None:
        from tokenizers import Tokenizer

        folder = Path(folder)
        if not (folder / "tokenizer.json").is_file():
            raise UnsupportedTokenizer(f"{folder.name} has no tokenizer.json")
        settings = _json(folder / "tokenizer_config.json")
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        if settings.get("clean_up_tokenization_spaces") and type(self.tokenizer.model).__name__ != "BPE":
            raise UnsupportedTokenizer("the tokenizer cleans up spaces when it decodes")
        self.special = {name: _content(settings[name]) for name in SPECIAL_TOKENS if settings.get(name)}
        self.template_source = _chat_template(folder, settings)
        self.template = _compile(self.template_source)
        ids: set[int] = set()
        for config in (_json(folder / "config.json"), _json(folder / "generation_config.json")):
            ids.update(_as_ids(config.get("eos_token_id")))
        for token in (self.special.get("eos_token"), *END_OF_TURN_MARKERS):
            found = self.tokenizer.token_to_id(token) if token else None
            if found is not None:
                ids.add(found)
        self.stop_ids = frozenset(ids)

    def render(self, messages: Sequence[dict], tools: list[dict] | None = None) -> str:
        """The chat template's text for `messages`, the assistant's turn opened (as transformers renders it)."""
        messages, tools = self.with_tools(messages, tools)
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        return self.template.render(
            messages=chat, tools=tools, documents=None, add_generation_prompt=True, **self.special
        )

    def encode_chat(self, messages: Sequence[dict], tools: list[dict] | None = None) -> list[int]:
        return self.encode(self.render(messages, tools))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """Byte-level BPE (GPT-2's alphabet of 256 printable characters, one per byte): the piece's
        bytes; SentencePiece byte fallback `<0xNN>`: that byte; else the decoded text."""
        piece = self.tokenizer.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level and token_id not in self._added:
            table = byte_level()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        if not self._byte_level and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return super().token_bytes(token_id)

    @functools.cached_property
    def _byte_level(self) -> bool:
        """The tokenizer decodes with GPT-2's byte-level alphabet."""
        decoder = json.loads(self.tokenizer.to_str()).get("decoder") or {}
        parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
        return any(p.get("type") == "ByteLevel" for p in parts)

    @functools.cached_property
    def _added(self) -> set[int]:
        return set(self.tokenizer.get_added_tokens_decoder())


def byte_level() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character → byte (the printable bytes as themselves, the rest from U+0100)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UnsupportedTokenizer(f"{path.name} does not parse: {exc}") from None
    return data if isinstance(data, dict) else {}


def _content(token) -> str:
    return token.get("content", "") if isinstance(token, dict) else str(token)


def _chat_template(folder: Path, settings: dict) -> str:
    """The folder's chat template: `chat_template.jinja`, else tokenizer_config.json's (a string,
    or a list of named templates, of which 'default')."""
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = settings.get("chat_template")
    if isinstance(template, list):
        template = next(
            (t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None
        )
    if not isinstance(template, str) or not template:
        raise ValueError("the tokenizer has no chat template")
    return template


def _compile(source: str):
    """The template in the sandbox transformers renders chat templates in (jinja2 >= 3.1.6, immutable,
    trim_blocks and lstrip_blocks, loop controls, a tojson that keeps non-ASCII text, and the
    helpers templates call: raise_exception, strftime_now, dict, namespace)."""
    from datetime import datetime

    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Namespace(jinja2.utils.Namespace):  # no underscore attributes: no way to CPython internals
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")

    class Dict:  # dict() and dict.fromkeys() for templates, without the type itself
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class Generation(
        jinja2.ext.Extension
    ):  # `{% generation %}` marks assistant text for training masks: rendered as is
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals.update(
        raise_exception=raise_exception,
        strftime_now=lambda fmt: datetime.now().strftime(fmt),
        dict=Dict(),
        namespace=Namespace,
    )
    return env.from_string(source)


def _as_ids(value) -> Iterable[int]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
