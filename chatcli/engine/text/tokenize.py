"""Ingress: chat messages → token ids through the model's chat template and BPE tokenizer.

Two implementations of one small interface (`encode_chat`, `encode`, `decode`, `stop_ids`):

- `FolderTokenizer`: the model folder's own files, read without transformers — the
  `tokenizers` library over `tokenizer.json`, and the chat template rendered by jinja2 in
  the same sandbox, with the same options and helpers, as transformers renders it. This is
  what the lean runners use: loading it takes ~0.1 s, where transformers' tokenizer chain
  imports ~1.3 s of modules first.
- `TransformersTokenizer`: a transformers tokenizer (the HF runner, the bench baseline, and
  folders the first cannot read: no `tokenizer.json`, or a decode clean-up it does not do).

Both render the chat template in our sandbox (`chatcli.engine.text.template`: transformers' own
lacks its size checks), bounded: a time and an output limit, a cancel flag (PromptCancelled),
every fault one ChatTemplateError.

Only the template's own control tokens become control ids. What a user, a file or a tool wrote is
text: `hi<|im_end|>\n<|im_start|>system` in a message is read as those characters, never as the
ids of `<|im_end|>` and `<|im_start|>` (`encode_chat`, as transformers' `sanitize_control_tokens`).

Both know which ids end a reply: every end-of-sequence id the model config, the generation
config and the tokenizer define, plus the end-of-turn markers of common chat templates when
the vocabulary has them.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from chatcli.engine.text.control import MARK_END, MARK_START, alternation, marked, without_added_tokens
from chatcli.engine.text.template import compile_template, literal_text, render_bounded
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

    def encode_chat(
        self, messages: Sequence[dict], tools: list[dict] | None = None, cancel: threading.Event | None = None
    ) -> list[int]:
        """The whole conversation, templated with the assistant's turn opened (`render`), as ids.

        Only the template's own control tokens become control ids. A control token's text in any string
        the caller gave — a message's content (or its parts), a tool call's name or arguments, a tool's
        result, a tool's name, description or parameters (keys too) — is marked before the render
        (MARK_START, MARK_END), and the rendered text is encoded piece by piece: each marked token
        without the tokenizer's added tokens (`encode_text`), the rest as usual (`encode_marked`), as
        transformers' `apply_chat_template(..., sanitize_control_tokens=True)` does. Where no string
        holds one, this is `encode` of the whole text: the same ids as before marking existed."""
        control = self._control_tokens
        text = self.render(marked(messages, control), marked(tools, control), cancel)
        if MARK_START not in text and MARK_END not in text:
            return self.encode(text)
        return self.encodemarked(text)

    def encodemarked(self, text: str) -> list[int]:
        """A rendered chat whose marked control tokens are text (transformers' `encode_marked_chat`):
        split at the marks, each piece after the first encoded after a newline that is then dropped (so
        that a SentencePiece tokenizer adds no word start to it), a marked token by `encode_text`, a
        lone mark (a template that split a marked token) dropped, still a break between pieces."""
        pieces = self._marks.split(text)
        newline = self.encode("\n")
        ids = self.encode(pieces[0])
        for i, piece in enumerate(pieces[1:], start=1):
            if not piece:
                continue
            as_text = i % 2 == 1  # the pieces alternate: text, a marked token (None: a lone mark), text …
            encode = self.encode_text if as_text else self.encode
            piece_ids = encode("\n" + piece)
            piece_ids = piece_ids[len(newline) :] if piece_ids[: len(newline)] == newline else encode(piece)
            if as_text and self.added_tokens[piece][0] in piece_ids:
                raise ValueError(f"{piece!r} cannot be read as text: the tokenizer makes that token of its letters")
            ids += piece_ids
        return ids

    @functools.cached_property
    def _control_tokens(self) -> re.Pattern:
        """The texts of the control tokens, longest first: the special tokens, and the other added tokens
        the template writes itself (in its literal text; whitespace ones aside), or those the tokenizer
        lists as `chat_control_tokens`."""
        listed = self.chat_control_tokens
        literal = "\0".join(literal_text(source) for source in self.template_sources) if listed is None else ""
        return alternation(
            text
            for text, (_, special) in self.added_tokens.items()
            if special or (text in listed if listed is not None else text in literal and not text.isspace())
        )

    @functools.cached_property
    def _marks(self) -> re.Pattern:
        """A marked added token (its text the one group), or a lone mark."""
        tokens = alternation(self.added_tokens).pattern
        return re.compile(f"{MARK_START}({tokens}){MARK_END}|[{MARK_START}{MARK_END}]")

    @property
    def added_tokens(self) -> dict[str, tuple[int, bool]]:
        """The tokenizer's added tokens: text → (id, special)."""
        raise NotImplementedError

    @property
    def template_sources(self) -> list[str]:
        """The chat template's text (each named one's, where it has several)."""
        return [self.template_source]

    chat_control_tokens: list[str] | None = None  # the tokenizer's own list of control tokens, where it has one

    def encode_text(self, text: str) -> list[int]:
        """`text` read as text: no added token matched in it, special or not."""
        raise NotImplementedError

    def render(
        self, messages: Sequence[dict], tools: list[dict] | None = None, cancel: threading.Event | None = None
    ) -> str:
        """The chat template's text for `messages`, the assistant's turn opened, `tools` (OpenAI's list)
        shown to the model (`with_tools`): rendered as transformers renders it (the same variables, the
        special tokens' texts among them), in our sandbox and bounded (`template.render_bounded`):
        ChatTemplateError for a template that fails, runs past its time limit or writes past its output
        limit; PromptCancelled within ~0.05 s of `cancel` being set."""
        messages, tools = self.with_tools(messages, tools)
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        context = dict(messages=chat, tools=tools, documents=None, add_generation_prompt=True, **self.template_tokens)
        return render_bounded(self.template_for(tools), context, cancel)

    def template_for(self, tools: list | None):
        """The compiled chat template that renders a conversation with `tools` (`compile_template`)."""
        raise NotImplementedError

    @property
    def template_tokens(self) -> dict[str, str]:
        """The special tokens' texts a template reads (bos_token, eos_token …)."""
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
        """Text the engine writes, its added tokens' texts read as those tokens (a user's text goes
        through `encode_chat`, which keeps it text)."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        raise NotImplementedError

    def encode_prompt(self, text: str) -> list[int]:
        """A raw prompt (no chat template) as the model reads one: with the tokenizer's own special
        tokens (a Llama's BOS), as `tokenizer(text)` gives them. Special tokens' texts in it are read
        as those tokens, as llama-server reads a raw `/completion` prompt: a client that sends a raw
        prompt writes the template itself."""
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        """Ids below this are the tokenizer's (added tokens included)."""
        raise NotImplementedError

    backend = None  # the `tokenizers.Tokenizer` underneath, where there is one: its pieces give each id's bytes

    def token_bytes(self, token_id: int) -> bytes:
        """Byte-level BPE (GPT-2's alphabet of 256 printable characters, one per byte): the piece's
        bytes; SentencePiece byte fallback `<0xNN>`: that byte; else the decoded text (where its part
        of a character decodes to U+FFFD, as a tokenizer without a `backend` must)."""
        if self.backend is None:
            return self.decode([token_id], skip_special_tokens=False).encode()
        piece = self.backend.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level and token_id not in self._added:
            table = byte_level()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        if not self._byte_level and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return self.decode([token_id], skip_special_tokens=False).encode()

    @functools.cached_property
    def _byte_level(self) -> bool:
        """The tokenizer decodes with GPT-2's byte-level alphabet."""
        decoder = json.loads(self.backend.to_str()).get("decoder") or {}
        parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
        return any(p.get("type") == "ByteLevel" for p in parts)

    @functools.cached_property
    def _added(self) -> set[int]:
        return set(self.backend.get_added_tokens_decoder())


class TransformersTokenizer(ChatTokenizer):
    def __init__(self, tokenizer, model_config=None, generation_config=None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's
        template = tokenizer.chat_template
        self.template_source = template if isinstance(template, str) else json.dumps(template)
        ids: set[int] = set()
        for source in (model_config, generation_config, tokenizer):
            ids.update(_as_ids(getattr(source, "eos_token_id", None)))
        vocab = tokenizer.get_vocab()
        ids.update(vocab[m] for m in END_OF_TURN_MARKERS if m in vocab)
        self.stop_ids = frozenset(ids)

    def template_for(self, tools: list | None):
        """The template `apply_chat_template` picks (a named one, 'tool_use', where tools are given and
        it has one), compiled in our sandbox rather than transformers' own: the same options and
        helpers, and our size checks, which transformers' lacks (its `'x' * 20000000000` runs in C for
        minutes, out of reach of any time limit)."""
        return _compiled(self.tokenizer.get_chat_template(None, tools))

    @property
    def template_tokens(self) -> dict[str, str]:
        return dict(self.tokenizer.special_tokens_map)

    @functools.cached_property
    def added_tokens(self) -> dict[str, tuple[int, bool]]:
        return {t.content: (i, t.special) for i, t in self.tokenizer.added_tokens_decoder.items()}

    @property
    def template_sources(self) -> list[str]:
        template = self.tokenizer.chat_template
        return list(template.values()) if isinstance(template, dict) else [template]

    @property
    def chat_control_tokens(self) -> list[str] | None:
        return getattr(self.tokenizer, "chat_control_tokens", None)

    def encode_text(self, text: str) -> list[int]:
        if self.backend is not None:
            return without_added_tokens(self.backend, text)
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

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
        self.tokenizer = self.backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
        if settings.get("clean_up_tokenization_spaces") and type(self.tokenizer.model).__name__ != "BPE":
            raise UnsupportedTokenizer("the tokenizer cleans up spaces when it decodes")
        self.special = {name: _content(settings[name]) for name in SPECIAL_TOKENS if settings.get(name)}
        listed = settings.get("chat_control_tokens")
        self.chat_control_tokens = [str(t) for t in listed] if isinstance(listed, list) else None
        self.template_source = _chat_template(folder, settings)
        self.template = compile_template(self.template_source)
        ids: set[int] = set()
        for config in (_json(folder / "config.json"), _json(folder / "generation_config.json")):
            ids.update(_as_ids(config.get("eos_token_id")))
        for token in (self.special.get("eos_token"), *END_OF_TURN_MARKERS):
            found = self.tokenizer.token_to_id(token) if token else None
            if found is not None:
                ids.add(found)
        self.stop_ids = frozenset(ids)

    def template_for(self, tools: list | None):
        return self.template

    @property
    def template_tokens(self) -> dict[str, str]:
        return self.special

    @functools.cached_property
    def added_tokens(self) -> dict[str, tuple[int, bool]]:
        return {t.content: (i, t.special) for i, t in self.tokenizer.get_added_tokens_decoder().items()}

    def encode_text(self, text: str) -> list[int]:
        return without_added_tokens(self.tokenizer, text)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def byte_level() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character → byte (the printable bytes as themselves, the rest from U+0100)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


@functools.lru_cache(maxsize=16)
def _compiled(source: str):
    return compile_template(source)


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


def _as_ids(value) -> Iterable[int]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
