"""The in-process engine: one turn of a conversation, as a generator of events.

Contract. The engine takes chat messages (role/content dicts, system prompt
included) and a `Session` that holds the conversation's KV cache and random
generator. Each turn it templates the *whole* conversation into target ids, keeps
the longest common prefix of those ids with what the cache already holds, prefills
only the rest, then runs the decode loop — sample, detokenize, feed back — until an
end-of-turn id, `max_tokens`, a stop string, the context limit, a completed structured
reply (`params.response_format`: a token mask each step, `chatcli.engine.sample.grammar`), a loop
(a reply that only the context's end would stop, repeating one short cycle: `chatcli.engine.sample.loops`),
or a cancel. A held call's string caught in such a loop is taken back to the cycle's first time and
closed there (`decode.DecodeLoop._rewind`), a few times a reply at most.

It yields the events of `chatcli.engine.events`: `Prefilled` once, a `Token` per token of the
reply (its `text` may be '' while a multi-byte character or a possible stop string is held
back; a held call's string's come when it closes, since its ids may yet be taken back:
`text.reply.ReplyText`), and `Finished` last, carrying the reply and its `TurnStats`. The
caller owns the message list: it appends the reply (also a cancelled, partial one) as the
assistant turn. The cache stays consistent whatever happens, because it records exactly
the ids it holds and the next turn starts from the common prefix.

The engine imports no UI code, nor torch: a runner hands it numpy logits, whichever
forward made them. It may run in any single thread; `cancel` is a `threading.Event` that
another thread sets and the engine checks at every step.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from chatcli.engine.decode import DecodeLoop
from chatcli.engine.events import Event, Finished, FinishReason, Prefilled, Token
from chatcli.engine.kv.cache import KVCache
from chatcli.engine.kv.prefix import common_prefix, realigned, reusable_prefix
from chatcli.engine.kv.session import Session
from chatcli.engine.runners.base import ModelRunner
from chatcli.engine.runners.batched import BatchedRunner, CallDropped
from chatcli.engine.sample.grammar import Constraint, TokenGrammar
from chatcli.engine.sample.loops import REWINDS, LoopWatch
from chatcli.engine.sample.sampling import InvalidParameter, SamplingParams
from chatcli.engine.sample.tools import held
from chatcli.engine.stats import TurnStats
from chatcli.engine.text import harmony
from chatcli.engine.text.detokenize import IncrementalDetokenizer, StopStringFilter
from chatcli.engine.text.fit import ContextOverflow, fit_conversation
from chatcli.engine.text.reply import ReplyText
from chatcli.engine.text.template import PromptCancelled
from chatcli.engine.text.tokenize import ChatTokenizer

PREFILL_CHUNK = 512  # prompt tokens per forward in prefill: bounds memory, lets cancel land


class Engine(DecodeLoop):
    keeps_cache = True  # sessions hold their KV cache in this process
    note = ""  # what the start should tell the user in one line (the loader's: a GGUF run dequantized)
    source = ""  # where the weights came from: a .gguf path, a model folder or a hub id (the loader's)

    def __init__(self, runner: ModelRunner, tokenizer: ChatTokenizer, name: str = "model") -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.name = name

    @property
    def context_limit(self) -> int:
        return self.runner.context_limit

    @property
    def device(self) -> str:
        """Where the forward runs: cpu, cuda, mps."""
        return str(getattr(self.runner.device, "type", self.runner.device))

    @property
    def weights(self) -> str:
        """The weights in use, as the header and `--json` name them: int8, q4, q8 or a GGUF's own types
        (`gguf Q4_K+Q6_K`) where quantized (`ModelRunner.weights_dtype`), else the lean file's kind
        (`float32-panels`, `bfloat16-dense`) or the dtype (transformers' runner)."""
        kind = getattr(getattr(self.runner, "config", None), "kind", None)
        if self.runner.quantized or not isinstance(kind, str):
            return self.runner.weights_dtype
        return kind

    @property
    def backend(self) -> str:
        return f"in-process ({type(self.runner).__name__})"

    @property
    def template(self) -> str:
        """The chat template that renders the turns, as the header and `--json` name it: "model's own",
        "built-in gemma" (a model without one), "file chat.jinja", "raw" (`tokenizer.template_label`)."""
        return getattr(self.tokenizer, "template_label", "model's own")

    def models(self) -> list[str]:
        return [self.name]

    def batched(self) -> Engine:
        """This model for several turns at once, each in its own thread (serve's slots): their forward
        calls run together as one batch, each reply the bits it gets alone (`runners.batched`)."""
        return Engine(BatchedRunner(self.runner), self.tokenizer, self.name)

    @functools.cached_property
    def grammar(self) -> TokenGrammar:
        """The tokenizer's side of constrained decoding, built on the first structured request."""
        return TokenGrammar(self.tokenizer)

    def check_params(self, params: SamplingParams) -> None:
        """InvalidParameter where `params.logit_bias` names an id past the vocabulary; GrammarError (one
        line) where `params.response_format` or a tool's parameters cannot constrain this model's replies."""
        vocab = self.tokenizer.vocab_size
        outside = sorted(t for t, _ in params.logit_bias if t >= vocab)
        if outside:
            raise InvalidParameter(f"logit-bias: token id {outside[0]} is past the vocabulary (ids 0 to {vocab - 1})")
        if params.response_format is not None or params.tools is not None:
            self.grammar.check_params(params)

    def constraint_for(self, params: SamplingParams, room: int | None = None) -> Constraint | None:
        """A turn's grammar state for `params.response_format` or the tool calls it may make, or None
        where the reply is free; `room`: the reply ids the context leaves (calls end within it)."""
        return self.grammar.constraint_for(params, room) if held(params) else None

    def new_session(self) -> Session:
        return Session(self.runner.new_cache())

    # -- sessions on disk and cropped ------------------------------------------

    def save_session(self, session: Session, path: Path) -> bool:
        """Write the session's KV cache to `path`, for a later start to restore (`kv.persist.save_session`:
        atomic, the folder kept within its budget; False where not worth saving; OSError in one line)."""
        from chatcli.engine.kv.persist import save_session

        return save_session(self.runner, self.name, session, path)

    def restore_session(self, session: Session, path: Path) -> bool:
        """Give `session` the KV cache saved at `path` when it was made by this model, runner and dtypes
        (`kv.persist.restore_session`: False, the session unchanged, for any other file)."""
        from chatcli.engine.kv.persist import restore_session

        return restore_session(self.runner, self.name, session, path)

    def crop_session(self, session: Session, messages: Sequence[dict]) -> int:
        """Crop the session's cache to what the (shorter) conversation `messages` still shares
        with it, after an undo; the tokens kept."""
        cache = session.cache
        try:
            target = self.tokenizer.encode_chat(messages) if messages else []
        except Exception:  # noqa: BLE001 - a template that rejects this (e.g. an empty) chat: start over
            target = []
        cache.crop(common_prefix(cache.ids, target))
        return len(cache)

    def lookup_for(self, params: SamplingParams) -> int:
        """The draft length a turn with `params` uses: `params.lookup`, or 0 where the runner's
        verification is not exact (int8; see `ModelRunner.exact_verify`)."""
        return params.lookup if self.runner.exact_verify else 0

    def embed(self, texts: list[str], dimensions: int | None = None, truncate: bool = False):
        """The texts' embeddings: their final hidden states pooled and normalised (`runners.pooling.embed`)."""
        from chatcli.engine.runners.pooling import embed

        return embed(self, texts, dimensions, truncate)

    # -- ingress --------------------------------------------------------------

    def fit_prompt(
        self, messages: Sequence[dict], params: SamplingParams, cancel: threading.Event | None = None
    ) -> tuple[list[int], int]:
        """Template the conversation (with `params.tools`); drop the oldest exchanges (never the system
        prompt) to leave room for a reply (`fit_conversation`: bounded however long the conversation,
        PromptCancelled once `cancel` is set). The ids and the number of exchanges dropped."""
        room = min(params.max_tokens, max(1, self.context_limit // 4))
        tools = None if params.tools is None else params.tools.offered()
        return fit_conversation(self.tokenizer, messages, tools, self.context_limit, room, cancel)

    def fit_raw(self, target: list[int]) -> list[int]:
        """A raw prompt's ids, when they leave room for at least one reply token (else ContextOverflow)."""
        if len(target) >= self.context_limit:
            raise ContextOverflow(f"the prompt is {len(target)} tokens; the model's context is {self.context_limit}")
        return list(target)

    @staticmethod
    def reuse(cache: KVCache, target: list[int]) -> int:
        """Crop the cache to what `target` can reuse; the positions it keeps (none where a cache cannot
        go back that far: sliding layers that have dropped the keys it would need, see `KVCache.reachable`)."""
        cache.crop(reusable_prefix(cache.ids, target))
        return len(cache.ids)

    def prefill(self, target: list[int], cache: KVCache, cancel: threading.Event | None):
        """Crop the cache to the common prefix and feed the rest of `target`; None if cancelled."""
        start = self.reuse(cache, target)
        sized = getattr(self.runner, "prefill_chunk", None)  # a BatchedRunner's: by time, beside others' steps
        logits = None
        while start < len(target):
            if cancel is not None and cancel.is_set():
                return None
            chunk = sized(cache, PREFILL_CHUNK) if sized is not None else PREFILL_CHUNK
            try:
                logits = self._call(target[start : start + chunk], cache, cancel)
            except CallDropped:
                return None
            start += chunk
        return logits

    def _call(self, ids: list[int], cache: KVCache, cancel: threading.Event | None, every: bool = False):
        """The runner's forward (`every`: verify) of `ids`; a runner that takes the turn's `cancel` (a
        BatchedRunner: its calls wait for a batch) gets it, and raises CallDropped, nothing written,
        where it is set before the call ran."""
        run = self.runner.verify if every else self.runner.forward
        if cancel is not None and isinstance(self.runner, BatchedRunner):
            return run(ids, cache, cancel)
        return run(ids, cache)

    # -- one turn -------------------------------------------------------------

    def generate(
        self,
        messages: Sequence[dict],
        session: Session,
        params: SamplingParams | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        yield from self._generate(messages, session, params or SamplingParams(), cancel)

    def complete(
        self,
        target: list[int],
        session: Session,
        params: SamplingParams | None = None,
        cancel: threading.Event | None = None,
        truncated: int = 0,
        t_submit: float | None = None,
    ) -> Iterator[Event]:
        """Continue the ids `target`, with the events and cache reuse of `generate`: a raw completion
        (a prompt without a chat template; see `ChatTokenizer.encode_prompt`), or a conversation the
        caller already templated with `fit_prompt` (`truncated`: the exchanges it dropped;
        `t_submit`: when its templating began, where TTFT counts from)."""
        params = params or SamplingParams()
        t_submit = time.perf_counter() if t_submit is None else t_submit
        yield from self._turn(self.fit_raw(target), truncated, session, params, cancel, t_submit)

    def _generate(self, messages, session: Session, params: SamplingParams, cancel) -> Iterator[Event]:
        """A turn that templates its conversation (`fit_prompt`, stopped by `cancel` too: then a cancelled
        turn with no prompt read, the cache untouched)."""
        t_submit = time.perf_counter()
        try:
            target, truncated = self.fit_prompt(messages, params, cancel)
        except PromptCancelled:
            elapsed, cache = time.perf_counter() - t_submit, session.cache
            yield Prefilled(None, None, None, elapsed, 0)
            stats = TurnStats.unread(elapsed, len(cache), cache.nbytes, self.context_limit, session.take_note())
            yield Finished("", FinishReason.CANCELLED, stats)
            return
        yield from self._turn(target, truncated, session, params, cancel, t_submit)

    def _turn(self, target: list[int], truncated: int, session: Session, params, cancel, t_submit) -> Iterator[Event]:
        cache = session.cache
        constraint = self.constraint_for(params, self.context_limit - len(target))  # a bad schema fails here
        spelled = functools.partial(self.tokenizer.decode, skip_special_tokens=False)
        target = realigned(cache.ids, target, self.tokenizer.token_bytes, spelled)  # the cache's ids, same text
        cached = self.reuse(cache, target)  # prefill's own crop then keeps it as it is
        stats = TurnStats(
            prompt_tokens=len(target),
            cached_tokens=cached,
            prefill_tokens=len(target) - cached,
            context_limit=self.context_limit,
            truncated_turns=truncated,
            note=session.take_note(),
        )
        logits = self.prefill(target, cache, cancel)
        t_prefilled = time.perf_counter()
        prefill_s = t_prefilled - t_submit
        stats.prefill_tok_s = stats.prefill_tokens / prefill_s if prefill_s > 0 else 0.0
        yield Prefilled(len(target), cached, stats.prefill_tokens, prefill_s, truncated, target)

        found = harmony.markers(self.tokenizer)  # gpt-oss: its channels read, analysis as <think>
        detok = (
            functools.partial(harmony.HarmonyDetokenizer, self.tokenizer, found)
            if found
            else functools.partial(IncrementalDetokenizer, self.tokenizer)
        )
        stop_ids = self.tokenizer.stop_ids  # a Harmony model's: <|return|> and <|call|> (harmony.reply_stops)
        stop_texts = (*params.stop, *getattr(self.tokenizer, "stop_texts", ()))
        text = ReplyText(detok, functools.partial(StopStringFilter, stop_texts))
        generator = session.generator_for(params)
        finish_reason = FinishReason.LENGTH
        t_first = t_last = t_prefilled
        n = samples = computed = rewinds = 0  # reply tokens; sampled ids kept (an end-of-turn id too); all; loops
        rate = 0.0
        # a reply that only the context's end would stop (no max_tokens short of it): cut if it loops
        watch = LoopWatch() if params.max_tokens >= self.context_limit - len(target) else None
        ids = self._decode(logits, cache, params, generator, stats, constraint, cancel)
        while True:
            if cancel is not None and cancel.is_set():
                finish_reason = FinishReason.CANCELLED
                break
            try:
                token_id, scored = next(ids, (None, None))
            except CallDropped:  # a step's call dropped for `cancel`
                token_id = None
            if token_id is None:  # prefill or a step was cancelled
                finish_reason = FinishReason.CANCELLED
                break
            t_last = time.perf_counter()
            samples, computed = samples + 1, computed + 1
            if computed == 1:
                t_first = t_last
                stats.ttft_s = t_first - t_submit
            else:
                rate = (computed - 1) / max(t_last - t_first, 1e-9)
            if token_id in stop_ids:
                finish_reason = FinishReason.STOP
                break
            n += 1
            token = Token(token_id, text.push(token_id), n, rate, t_last - t_submit, *(scored or (None, None)))
            yield from text.release(token, hold=constraint is not None and constraint.in_call_string)
            if text.stops.stopped or (constraint is not None and constraint.stopped):  # a complete value ends it too
                finish_reason = FinishReason.STOP
                break
            if n >= params.max_tokens or len(target) + samples - 1 >= self.context_limit:
                finish_reason = FinishReason.LENGTH
                break
            if constraint is not None and constraint.looping:  # a call's string in a loop: its repeats taken back
                drop = min(constraint.excess(), len(text.held))
                if rewinds == REWINDS or not drop:
                    finish_reason = FinishReason.LENGTH
                    break
                rewinds, n, samples = rewinds + 1, n - drop, samples - drop
                text.drop(drop)
                ids.close()
                watch = LoopWatch() if watch is not None else None  # the ids it held are gone from the reply
                ids = self._rewind(
                    drop, len(target) + n, text.ids[-1], cache, params, generator, stats, constraint, cancel
                )
                continue
            if watch is not None and watch.push(token_id):  # the reply in a loop, and nothing else would end it
                finish_reason = FinishReason.LENGTH
                break
        ids.close()
        yield from text.flush()
        if samples:
            # Drafting may have fed ids past the last one taken: the cache holds the prompt and
            # every sampled id but the last, whether or not a draft ran ahead.
            cache.crop(len(target) + samples - 1)

        tail = text.finish()
        if tail:
            yield Token(-1, tail, n, rate, t_last - t_submit)
        t_end = time.perf_counter()
        stats.completion_tokens = n
        stats.decode_tok_s = rate
        stats.total_s = t_end - t_submit
        stats.kv_cache_bytes = cache.nbytes
        stats.context_tokens = len(cache)
        yield Finished(text.reply, finish_reason, stats, stop=text.stops.matched)
