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

Where the model has no chat template (a base model), both render with a built-in one
(`templates.default_for`: by architecture and vocabulary); `use_template` puts another in place of
whichever they had (`--chat-template NAME|FILE`, or `--raw`: none, the conversation's texts continued
as one prompt). A chosen template's text gets the tokenizer's prompt prefix (its BOS) before it, as
llama.cpp's tokenizer adds it; its end-of-turn texts end a reply (`stop_ids` where the vocabulary has
them as tokens, else `stop_texts`).
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Sequence
from pathlib import Path

from chatcli.engine.text.built import take_built
from chatcli.engine.text.control import MARK_END, MARK_START, Alternation, alternation, marked, without_added_tokens
from chatcli.engine.text.folder_files import UnsupportedTokenizer, as_ids, byte_level, chat_template, content, read_json
from chatcli.engine.text.harmony import chat_messages, reply_stops
from chatcli.engine.text.template import compile_template, literal_text, render_bounded
from chatcli.engine.text.templates import OWN, Template, default_for, raw_text, text_of
from chatcli.engine.text.toolcalls import fallback_messages, syntax_of, takes_tools

__all__ = ["ChatTokenizer", "FolderTokenizer", "TransformersTokenizer", "UnsupportedTokenizer", "byte_level"]

# End-of-turn markers of widespread chat templates (ChatML, Llama 3, Gemma, Phi).
END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end_of_turn|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class ChatTokenizer:
    """What the engine needs of a tokenizer; `stop_ids` is set by the implementations."""

    stop_ids: frozenset[int] = frozenset()
    stop_texts: tuple[str, ...] = ()  # texts that end a reply: a chosen template's markers the vocabulary lacks
    template_source: str = ""  # the chat template's text
    chosen: Template = OWN  # the template in use where it is not the model's own (`use_template`)
    chosen_why = ""  # why the model got a built-in one: it has none (the start's note says so)
    _chosen_template = None  # `chosen` compiled

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
        holds one, this is `encode` of the whole text: the same ids as before marking existed.

        A chosen template (`use_template`) gets the tokenizer's prompt prefix first where its text does
        not begin with it; `--raw` (no template) is `encode_prompt` of the messages' texts (`raw_text`)."""
        if self.chosen.raw:
            return self.encode_prompt(raw_text(messages))
        control = self._control_tokens
        text = self.render(marked(messages, control), marked(tools, control), cancel)
        ids = self.encode(text) if MARK_START not in text and MARK_END not in text else self.encodemarked(text)
        prefix = self._prompt_prefix if self._chosen_template is not None else []
        return ids if ids[: len(prefix)] == prefix else prefix + ids

    def use_template(self, chosen: Template, why: str = "") -> None:
        """Render with `chosen` from now on (a built-in, a file, or `RAW`) in place of what it had; `why`:
        why the model got it without asking (it has none of its own). Its stop texts that are added tokens
        of this vocabulary end a reply as those ids, the others as text (`stop_texts`). A template that
        does not parse raises ChatTemplateError."""
        compiled = compile_template(chosen.source) if chosen.source else None
        added = self.added_tokens
        self.chosen, self.chosen_why, self._chosen_template = chosen, why, compiled
        self.template_source = chosen.source
        own = self.__dict__.setdefault("_own_stop_ids", self.stop_ids)  # the vocabulary's, before any template's
        self.settle_stops(own | {added[t][0] for t in chosen.stops if t in added})
        self.stop_texts = tuple(t for t in chosen.stops if t not in added)
        self.__dict__.pop("_control_tokens", None)  # the new template's literal text names them

    def settle_stops(self, ids: frozenset[int]) -> None:
        """`stop_ids` from the end-of-turn `ids` of the vocabulary and the template in use: a Harmony model's
        replies end at `<|return|>` or `<|call|>`, not at `<|end|>` (`harmony.reply_stops`)."""
        self.stop_ids = reply_stops(self, ids)

    @property
    def template_label(self) -> str:
        """The template in use, as the header and `--json` name it ("built-in gemma", "model's own")."""
        return self.chosen.label

    @functools.cached_property
    def _prompt_prefix(self) -> list[int]:
        """The ids the tokenizer puts before a prompt's text (its BOS, where it adds one)."""
        probe = self.encode("a")
        ids = self.encode_prompt("a")
        return ids[: ids.index(probe[0])] if probe and probe[0] in ids else []

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
    def _control_tokens(self) -> Alternation:
        """The texts of the control tokens, longest first: the special tokens, and the other added tokens
        the template writes itself (in its literal text; whitespace ones aside), or those the tokenizer
        lists as `chat_control_tokens`."""
        listed = self.chat_control_tokens
        literal = "\0".join(literal_text(source) for source in self.template_sources) if listed is None else ""
        return Alternation(
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
        if self.chosen.raw:
            return raw_text(messages)
        messages, tools = self.with_tools(messages, tools)
        if "<|channel|>" in self.template_source:  # a Harmony template, the file's own or one chosen
            messages = chat_messages(messages)  # past reasoning as `thinking`, as gpt-oss's template takes it
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        if self._chosen_template is not None:  # ours renders a message's text: OpenAI's parts joined
            chat = [{**m, "content": text_of(m.get("content"))} for m in chat]
        context = dict(messages=chat, tools=tools, documents=None, add_generation_prompt=True, **self.template_tokens)
        return render_bounded(self.template_for(tools), context, cancel)

    def template_for(self, tools: list | None):
        """The compiled chat template that renders a conversation with `tools`: the chosen one, else the
        model's own (`own_template`)."""
        return self._chosen_template if self._chosen_template is not None else self.own_template(tools)

    def own_template(self, tools: list | None):
        """The model's own chat template, compiled (`compile_template`), for a conversation with `tools`."""
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
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's
        template = getattr(tokenizer, "chat_template", None)
        self.template_source = template if isinstance(template, str) else json.dumps(template) if template else ""
        ids: set[int] = set()
        for source in (model_config, generation_config, tokenizer):
            ids.update(as_ids(getattr(source, "eos_token_id", None)))
        vocab = tokenizer.get_vocab()
        ids.update(vocab[m] for m in END_OF_TURN_MARKERS if m in vocab)
        self._own_stop_ids = frozenset(ids)
        if not template:  # a base model: a built-in template, by its architecture and vocabulary
            self.use_template(*default_for(getattr(model_config, "model_type", None) or "", vocab.__contains__))
        else:
            self.settle_stops(self._own_stop_ids)

    def own_template(self, tools: list | None):
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
        if self._chosen_template is not None or not template:
            return [self.template_source]
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

        folder, path = Path(folder), Path(folder) / "tokenizer.json"
        if not path.is_file():
            raise UnsupportedTokenizer(f"{folder.name} has no tokenizer.json")
        settings = read_json(folder / "tokenizer_config.json")
        self.tokenizer = self.backend = take_built(path) or Tokenizer.from_file(str(path))
        if settings.get("clean_up_tokenization_spaces") and type(self.tokenizer.model).__name__ != "BPE":
            raise UnsupportedTokenizer("the tokenizer cleans up spaces when it decodes")
        self.special = {name: content(settings[name]) for name in SPECIAL_TOKENS if settings.get(name)}
        listed = settings.get("chat_control_tokens")
        self.chat_control_tokens = [str(t) for t in listed] if isinstance(listed, list) else None
        own = chat_template(folder, settings)
        self.template_source = own or ""
        self.template = compile_template(own) if own else None
        config = read_json(folder / "config.json")
        ids: set[int] = set()
        for source in (config, read_json(folder / "generation_config.json")):
            ids.update(as_ids(source.get("eos_token_id")))
        for token in (self.special.get("eos_token"), *END_OF_TURN_MARKERS):
            found = self.tokenizer.token_to_id(token) if token else None
            if found is not None:
                ids.add(found)
        self._own_stop_ids = frozenset(ids)
        if own is None:  # a base model: a built-in template, by its architecture and vocabulary
            has = lambda text: self.tokenizer.token_to_id(text) is not None  # noqa: E731
            self.use_template(*default_for(str(config.get("model_type") or ""), has))
        else:
            self.settle_stops(self._own_stop_ids)

    def own_template(self, tools: list | None):
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


@functools.lru_cache(maxsize=16)
def _compiled(source: str):
    return compile_template(source)
