"""A fake engine with the real one's `generate()` event API: a scripted, timed token stream.

Its "tokenizer" is one id per character (plus role/end markers), and the reply's ids go
into the cache like a real engine's, so the common-prefix reuse of a real cache can be
checked through it. Stats are fixed numbers, so snapshots are deterministic.
"""

from __future__ import annotations

import re
import threading
import time
from types import SimpleNamespace

from chatcli.engine.events import Finished, FinishReason, Prefilled, Token
from chatcli.engine.kv.prefix import common_prefix
from chatcli.engine.stats import TurnStats

ROLE = {"system": 1, "user": 2, "assistant": 3}
END = 4


class FakeTokenizer:
    def encode_chat(self, messages) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += [ROLE[m["role"]], *(ord(c) + 10 for c in m["content"]), END]
        return ids + [ROLE["assistant"]]


class FakeCache:
    def __init__(self) -> None:
        self.ids: list[int] = []

    def __len__(self) -> int:
        return len(self.ids)

    def crop(self, keep: int) -> None:
        del self.ids[max(0, keep) :]

    @property
    def nbytes(self) -> int:
        return len(self.ids) * 2048


class FakeSession:
    def __init__(self) -> None:
        self.cache = FakeCache()


def split_tokens(text: str) -> list[str]:
    return re.findall(r"\s*\S+|\s+", text)


class FakeEngine:
    """`script(last_user_text) -> reply`; `tok_s` paces the stream (None: as fast as possible);
    `hold_at=N` waits after N tokens until cancelled or `release` is set."""

    keeps_cache = True

    def __init__(
        self,
        script=None,
        tok_s: float | None = None,
        hold_at: int | None = None,
        context_limit: int = 4096,
        token_s=lambda n: 1 / 42,
    ):
        self.script = script or (lambda text: f"You said: **{text}**")
        self.tok_s = tok_s
        self.token_s = token_s  # reported (not slept) seconds of decode token n, for the running rate
        self.hold_at = hold_at
        self.release = threading.Event()
        self.context_limit = context_limit
        self.name = "fake-model"
        self.runner = SimpleNamespace(device="cpu", dtype="float32")
        self.device, self.weights = "cpu", "float32"  # the header's "fake-model · cpu · float32"
        self.tokenizer = FakeTokenizer()
        self.calls: list[dict] = []  # per turn: messages, params, cached tokens
        self.finished = threading.Event()
        self.reasons: list[str] = []  # finish reason of each turn, recorded in the worker thread

    def lookup_for(self, params) -> int:
        return params.lookup

    def check_params(self, params) -> None:
        pass  # no grammar: the real engine's checks are tested with the tiny model

    backend = "fake"

    def new_session(self) -> FakeSession:
        return FakeSession()

    def models(self) -> list[str]:
        return [self.name]

    def crop_session(self, session, messages) -> int:
        session.cache.crop(common_prefix(session.cache.ids, self.tokenizer.encode_chat(messages) if messages else []))
        return len(session.cache)

    def save_session(self, session, path) -> bool:
        return False  # nothing on disk: the real engine's files are tested with the tiny model

    def restore_session(self, session, path) -> bool:
        return False

    def generate(self, messages, session, params=None, cancel=None):
        self.finished.clear()
        cache = session.cache
        target = self.tokenizer.encode_chat(messages)
        if len(target) > self.context_limit:
            raise ValueError(
                f"the message is {len(target)} tokens with the template; the model's context is {self.context_limit}"
            )
        cached = min(common_prefix(cache.ids, target), len(target) - 1)
        cache.crop(cached)
        cache.ids.extend(target[cached:])
        self.calls.append({"messages": list(messages), "params": params, "cached": cached})
        yield Prefilled(len(target), cached, len(target) - cached, 0.03, 0)  # the first token comes 20 ms later
        last_user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        pieces = split_tokens(self.script(last_user))
        reply: list[str] = []
        reason = FinishReason.STOP
        t0 = time.perf_counter()
        decode_s = 0.0  # reported time since the first token
        for i, piece in enumerate(pieces):
            if cancel is not None and cancel.is_set():
                reason = FinishReason.CANCELLED
                break
            if self.hold_at is not None and i == self.hold_at:
                while not (self.release.is_set() or (cancel is not None and cancel.is_set())):
                    time.sleep(0.005)
                if cancel is not None and cancel.is_set():
                    reason = FinishReason.CANCELLED
                    break
            if params is not None and i >= params.max_tokens:
                reason = FinishReason.LENGTH
                break
            if self.tok_s:
                delay = t0 + (i + 1) / self.tok_s - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            cache.ids.extend(ord(c) + 10 for c in piece)
            reply.append(piece)
            n = i + 1
            decode_s += self.token_s(n) if n > 1 else 0.0
            yield Token(100 + i, piece, n, (n - 1) / decode_s if n > 1 else 0.0, 0.05 + decode_s)
        stats = TurnStats(
            prompt_tokens=len(target),
            cached_tokens=cached,
            prefill_tokens=len(target) - cached,
            completion_tokens=len(reply),
            ttft_s=0.05,
            prefill_tok_s=1200.0,
            decode_tok_s=42.0,
            total_s=0.5,
            kv_cache_bytes=cache.nbytes,
            context_tokens=len(cache),
            context_limit=self.context_limit,
        )
        self.reasons.append(reason)
        self.finished.set()
        yield Finished("".join(reply), reason, stats)
