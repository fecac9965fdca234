"""Constrained decoding: a reply held to JSON (any object, or a JSON schema) by a token mask each step.

Contract. `ResponseFormat` (`chatcli.engine.params`, pure data) says what the reply must be.
`TokenGrammar` ties one tokenizer to llguidance — the grammar engine llama.cpp, vLLM and SGLang use —
built once per engine on first use (~0.2 s for a 49k vocabulary). `TokenGrammar.constraint(fmt)`
compiles the format into a per-turn `Constraint`, or raises `GrammarError` in one line for a schema it
cannot hold a reply to (an unknown keyword, a bad reference). Each step the engine masks the logits
with `Constraint.mask` (an id the grammar cannot take next gets -inf) before the sampler's chain and
tells `advance` the id it took. A draft's positions are masked one at a time, in the order the ids are
taken, so a drafted reply is the one single steps would give. Once the value is complete only
end-of-turn ids are left, and `stopped` says so. A format's objects are closed unless its schema opens
them (`additionalProperties`), `strict` or not, as OpenAI's strict mode and llama.cpp close them. Tool
calls are held the same way, by the Lark grammar of `chatcli.engine.sample.tools` (`check_params`,
`constraint_for`). Beyond the grammar, `chatcli.engine.sample.steer` narrows each mask: numbers of
bounded length, no call made twice, calls that end within max_tokens (or the context left).

No torch and no UI: numpy logits in, numpy logits out.
"""

from __future__ import annotations

import functools
import json

import numpy as np

from chatcli.engine.params import ResponseFormat, SamplingParams
from chatcli.engine.sample.steer import Steer, Vocab
from chatcli.engine.sample.tools import (
    JSON_OPTIONS,
    call_text_of,
    calls_lark,
    closed,
    held,
    parameters_of,
    several,
    with_options,
)
from chatcli.engine.text import harmony
from chatcli.engine.text.tokenize import ChatTokenizer
from chatcli.engine.text.toolcalls import HARMONY, HARMONY_OPEN

CLOSING_RESERVE = 64  # a reply of calls' last ids, where a call in progress closes at its next JSON boundary
ARGS_ROOM = 32  # ids a forced Harmony call keeps for its arguments: its analysis closes before less is left


class GrammarError(ValueError):
    """A response format (or tools) that cannot constrain this model's replies; the message says why, in
    one line; `param` the request's field at fault (OpenAI's `param` of a 400)."""

    def __init__(self, message: str, param: str = "response_format") -> None:
        super().__init__(message)
        self.param = param


def _llguidance():
    try:
        import llguidance
    except ImportError:  # a wheel without it, or a platform it has no build for
        raise GrammarError("structured output needs the llguidance package (pip install llguidance)") from None
    return llguidance


def grammar_of(fmt: ResponseFormat) -> str:
    """The llguidance grammar (its JSON text) that holds a reply to `fmt` (its objects closed)."""
    return _llguidance().LLMatcher.grammar_from_json_schema(closed(fmt.schema_object()), defaults=JSON_OPTIONS)


def _ll_tokenizer(tokenizer: ChatTokenizer, vocab: int | None):
    """The llguidance tokenizer of a `FolderTokenizer` (its tokenizers JSON) or a fast transformers one."""
    llguidance = _llguidance()
    eos = sorted(tokenizer.stop_ids) or None  # gpt-oss's: `<|return|>` and `<|call|>`, not `<|end|>`
    inner = getattr(tokenizer, "tokenizer", None)
    try:
        if hasattr(inner, "to_str"):  # a tokenizers.Tokenizer (FolderTokenizer)
            return llguidance.LLTokenizer(inner.to_str(), n_vocab=vocab, eos_token=eos)
        if hasattr(inner, "backend_tokenizer"):  # a fast transformers tokenizer
            from llguidance.hf import from_tokenizer

            return from_tokenizer(inner, n_vocab=vocab, eos_token=eos)
    except ValueError as exc:
        raise GrammarError(f"structured output cannot read this tokenizer: {exc}") from None
    raise GrammarError("structured output needs a tokenizer.json (a fast tokenizer)")


def matcher_error(matcher) -> str:
    """A failed matcher's reason in one line (llguidance adds its whole state and grammar below)."""
    line = (matcher.get_error() or "").split("<state>")[0].strip()
    line = line.splitlines()[0].strip() if line else ""
    if line in ("", "NoExtensionBias"):  # nothing can start: no value matches
        return "it admits no JSON value (a $ref that only leads back to itself?)"
    line = line.removeprefix("Parser Error: ").split("; consider")[0]  # llguidance's advice is for grammar authors
    return f"{line} (the schema is too large or too open for the grammar engine)"


PROBE = 8  # the first ids are followed one step further where at most this many may start a reply


def first_steps(matcher, vocab: int) -> str | None:
    """Why a grammar fails at its start (None: it does not): a schema that admits no value stops
    before any id, and one too large for the parser (2,000 optional properties) right after `{`.
    Checked at once, so the request gets its 400 and a turn never starts on it."""
    start = Constraint(matcher, vocab)
    allowed = np.flatnonzero(start.allowed())
    if matcher.is_error():
        return matcher_error(matcher)
    for token in allowed if len(allowed) <= PROBE else ():
        step = matcher.deep_copy()
        if step.consume_token(int(token)):
            Constraint(step, vocab).allowed()
        if step.is_error():
            return matcher_error(step)
    return None


class TokenGrammar:
    """One tokenizer's side of constrained decoding; `constraint` compiles a format for one turn."""

    def __init__(self, tokenizer: ChatTokenizer, vocab: int | None = None) -> None:
        self.tokenizer = _ll_tokenizer(tokenizer, vocab)
        self.vocab = self.tokenizer.vocab_size
        self.syntax = tokenizer.tool_syntax  # how the model writes a tool call
        found = harmony.markers(tokenizer) if self.syntax == HARMONY else None
        self.think_end = found[harmony.END] if found else None  # closes the analysis a forced call may follow
        self._encode = tokenizer.encode
        self.stop_ids = sorted(t for t in tokenizer.stop_ids if t < self.vocab)
        self._compiled: dict[object, str] = {}  # a format's checked grammar (clients resend the same one)

    def check(self, fmt: ResponseFormat) -> str:
        """The grammar of `fmt`, checked against this tokenizer; GrammarError naming the problem."""
        return self._checked(fmt, lambda: grammar_of(fmt), "the JSON schema is not usable")

    def check_params(self, params: SamplingParams) -> str | None:
        """The grammar a turn with `params` is held to (None: its reply is free), checked; each tool's
        parameters schema checked on its own first, so that a GrammarError names the tool."""
        if params.tools is not None:
            for i, function in enumerate(params.tools.functions()):
                schema = with_options(parameters_of(function))
                where = f"tools[{i}] ({function.get('name')}): the parameters schema is not usable"
                grammar = _llguidance().LLMatcher.grammar_from_json_schema
                self._checked(("call", json.dumps(schema)), lambda s=schema, g=grammar: g(s), where, "tools")
        if not held(params):
            return None
        fmt, tools = params.response_format, params.tools
        if tools is None or not tools.callable():  # no calls to make (tool_choice none): the format alone
            return self.check(fmt)
        fmt = None if tools.forced else fmt  # calls that must be made: the format has no say; auto: either
        lark = _llguidance().LLMatcher.grammar_from_lark
        what = "the tools' call grammar is not usable"
        key = (tools, fmt, self.syntax)
        return self._checked(key, lambda: lark(calls_lark(tools, self.syntax, fmt)), what, "tools")

    def _checked(self, key, build, what: str, param: str = "response_format") -> str:
        """The grammar `build()` gives, validated and probed (`first_steps`) once per `key`."""
        found = self._compiled.get(key)
        if found is not None:
            return found
        llguidance = _llguidance()
        try:
            grammar = build()
        except ValueError as exc:
            raise GrammarError(f"{what}: {exc}", param) from None
        error = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise GrammarError(f"{what}: {' '.join(error.split())}", param)  # one line
        problem = first_steps(llguidance.LLMatcher(self.tokenizer, grammar, log_level=0), self.vocab)
        if problem:
            raise GrammarError(f"{what}: {problem}", param)
        if len(self._compiled) >= 32:
            self._compiled.clear()
        self._compiled[key] = grammar
        return grammar

    def constraint(self, fmt: ResponseFormat) -> Constraint:
        return self._matched(self.check(fmt), Steer(self.spelling))

    def constraint_for(self, params: SamplingParams, room: int | None = None) -> Constraint | None:
        """A turn's grammar state for its response format or the calls it may make; None: a free reply.
        `room`: the reply ids the context has left (with max_tokens, the budget calls end within)."""
        grammar = self.check_params(params)
        if grammar is None:
            return None
        tools = params.tools
        if tools is None or not tools.callable():
            return self._matched(grammar, Steer(self.spelling))
        limit = params.max_tokens if room is None else max(1, min(params.max_tokens, room))
        fmt = None if tools.forced else params.response_format
        text = call_text_of(self.syntax)
        window = min(CLOSING_RESERVE, limit // 2)
        think = (self.think_end, max(0, limit - self.call_room(tools))) if tools.forced and self.think_end else ()
        steer = Steer(self.spelling, text, fmt is not None, several(tools), limit, window, *think)
        return self._matched(grammar, steer)

    def call_room(self, tools) -> int:
        """The ids a forced Harmony call needs after its analysis: the longest of its openings as this
        tokenizer writes it (`<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json
        <|message|>`), its `<|call|>`, and ARGS_ROOM for the arguments."""
        head = harmony.START + "assistant" + HARMONY_OPEN
        longest = max(
            len(self._encode(f"{head}{f['name']} {harmony.CONSTRAIN}json{harmony.MESSAGE}")) for f in tools.callable()
        )
        return longest + 1 + ARGS_ROOM

    @functools.cached_property
    def spelling(self) -> Vocab:
        """The vocabulary by bytes, for steering (built on first use: ~0.3 s for 49k ids)."""
        return Vocab(self.tokenizer, self.vocab, self.stop_ids)

    def _matched(self, grammar: str, steer: Steer | None = None) -> Constraint:
        matcher = _llguidance().LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"the JSON schema is not usable: {matcher.get_error()}")
        return Constraint(matcher, self.vocab, steer)


class Constraint:
    """One turn's grammar state: which ids may come next, advanced by each id taken."""

    def __init__(self, matcher, vocab: int, steer: Steer | None = None) -> None:
        self.matcher = matcher
        self.vocab = vocab
        self._bits = np.zeros((vocab + 31) // 32, dtype=np.int32)  # [ceil(V/32)]: one bit an id
        self.steer = steer  # narrows each mask past the grammar (`chatcli.engine.sample.steer`), or None

    def allowed(self) -> np.ndarray:
        """[vocab] bool: the ids the grammar takes next."""
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.vocab].view(np.bool_)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """[V] logits → a copy where every id the grammar cannot take next is -inf (ids past the
        tokenizer's vocabulary, padding rows of the head, too)."""
        allowed = self.allowed()
        if self.steer is not None:
            allowed = self.steer.narrow(allowed, self.matcher)
        n = min(len(allowed), len(logits))
        allowed = allowed[:n]
        if 2 * np.count_nonzero(allowed) < n:  # few ids allowed (between values): copy those
            out = np.full(logits.shape, -np.inf, dtype=np.float32)
            keep = np.flatnonzero(allowed)
            out[keep] = logits[keep]
        else:  # most allowed (inside a string): ban the rest (~20 us either way on 49k ids, not ~230)
            out = np.array(logits, dtype=np.float32)
            out[:n][~allowed] = -np.inf
            out[n:] = -np.inf
        return out

    def advance(self, token: int) -> None:
        """The id the engine took; it came from the mask, so the grammar accepts it."""
        if not self.matcher.consume_token(int(token)):
            raise GrammarError(f"the JSON schema is not usable: {matcher_error(self.matcher)}")
        if self.steer is not None:
            self.steer.advance(token)

    @property
    def looping(self) -> bool:
        """A call's string repeats itself (`Steer.looping`): its repeats are taken back (`rewind`)."""
        return self.steer is not None and self.steer.looping

    @property
    def in_call_string(self) -> bool:
        """The reply is inside a string of a call's JSON, where a loop may yet be taken back."""
        return self.steer is not None and self.steer.in_call_string

    def excess(self) -> int:
        """The ids a looping string wrote past its loop's first cycle."""
        return self.steer.excess() if self.steer is not None else 0

    def rewind(self, count: int) -> None:
        """Take back the last `count` ids (0 < count); the string they were in closes at the next id."""
        if not self.matcher.rollback(count):
            raise GrammarError(f"the grammar could not take back {count} ids: {matcher_error(self.matcher)}")
        self.steer.rewind(count)

    @property
    def stopped(self) -> bool:
        """The value is complete: nothing may follow but the end of the turn."""
        return self.matcher.is_stopped()
