"""The cache pool: engine `Session`s kept between turns, under a memory budget.

A client that resends its growing conversation every turn should prefill only the
new tokens. The pool keeps the sessions of recent conversations and, for a new
request, finds the one whose cached ids share the longest prefix with the request's
templated ids (`engine.fit_prompt`). Then:

- the request extends that session's ids, or diverges only inside the reply the
  session generated last (a client's re-tokenised copy of that reply), or the
  session is the caller's own by key: it is used in place, and `Engine.generate`
  prefills only what follows the common prefix;
- the request diverges inside the session (another client with the same system
  prompt, a retry of a reply): the session is *forked* — its cache copied and
  cropped to the common prefix — so the original branch stays whole for its owner.
  A cache with its own `clone` copies only that prefix, so even a chat template's
  own header is worth it (Llama 3's date lines: 24 ids every request shares);
  one copied whole (transformers' cache) forks from `MIN_FORK_TOKENS` shared ids;
- nothing useful is shared: a new session.

Entries are keyed: by a conversation id where the caller has one (the TUI), or by
an id the pool makes up (the server's anonymous requests). Each entry belongs to a
*space* (`acquire`'s `space`; the server's: a hash of the request's API key and
`cache_salt`): a request is matched, used in place or forked only from sessions of
its own space, so what one space's prompts hold never shows in another's reuse
(`cached_tokens`, the time a prefill takes). `acquire` hands out a
`Lease`, `release` puts the session back — or drops it, when the turn failed and
its cache may not match its ids — and evicts least recently used sessions until
the sum of `session.cache.nbytes` fits the budget. A session that alone exceeds the
budget is not kept.

The pool is thread-safe (one lock); a leased session is neither matched nor evicted.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from chatcli.engine.kv.prefix import reusable_prefix
from chatcli.engine.kv.session import Session

MIN_FORK_TOKENS = 32  # a cache copied whole: a shorter shared prefix is cheaper to prefill again
MIN_CLONE_TOKENS = 8  # a cache that copies only the shared prefix (`clone`): a few ids already pay for the copy


def clones_prefix(cache) -> bool:
    """Whether `cache` copies only a prefix (a runner's own `clone`); else a fork copies it whole, then crops."""
    return hasattr(cache, "clone")


def fork_session(session: Session, keep: int) -> Session:
    """A new session whose cache holds a copy of the first `keep` ids of `session`'s cache."""
    cache = session.cache
    if clones_prefix(cache):
        clone = cache.clone(keep)
    else:
        shared = getattr(cache, "_config", None)  # the model config: shared, not copied
        memo = {id(shared): shared} if shared is not None else {}
        clone = copy.deepcopy(cache, memo)
        clone.crop(keep)
    return Session(clone)


class LeaseKind(StrEnum):
    HIT = "hit"  # a pooled session used in place
    FORK = "fork"  # a copy of a pooled session's shared prefix
    NEW = "new"  # an empty session


@dataclass
class Lease:
    key: str
    session: Session
    cached_tokens: int  # ids of the request already in the session's cache
    how: LeaseKind


@dataclass
class _Entry:
    session: Session
    anonymous: bool
    leased: bool = False
    prompt_len: int = 0  # ids the last request sent; the cache's ids past them were generated
    space: str = ""  # the requests that may share this session's positions (`acquire`'s `space`)


class SessionPool:
    def __init__(
        self,
        new_session: Callable[[], Session],
        budget_bytes: int,
        min_fork_tokens: int | None = None,
    ) -> None:
        """`min_fork_tokens`: the shared ids a fork needs, for every cache; None: `MIN_CLONE_TOKENS` where the
        cache has `clone`, else `MIN_FORK_TOKENS`."""
        if budget_bytes < 0:
            raise ValueError("the cache budget must be >= 0 bytes")
        self.new_session = new_session
        self.budget_bytes = budget_bytes
        self.min_fork_tokens = min_fork_tokens
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self.hits = self.forks = self.misses = self.evictions = 0

    # -- looking up -----------------------------------------------------------

    def acquire(self, ids: Sequence[int], key: str | None = None, space: str = "") -> Lease:
        """The session to run a request with templated `ids` on, leased until `release`: the caller's own
        under `key`, else the best of `space`'s sessions (those of another space are never matched)."""
        with self._lock:
            if key is not None and key in self._entries:
                entry = self._entries[key]
                if entry.leased:
                    raise RuntimeError(f"session {key!r} is already in use")
                entry.leased = True
                entry.prompt_len = len(ids)
                self.hits += 1
                return Lease(key, entry.session, _usable(entry.session, ids), LeaseKind.HIT)
            best_key, best = self._longest_match(ids, space)
            new_key = key if key is not None else f"anon-{next(self._ids)}"
            if best_key is not None:
                entry = self._entries[best_key]
                # In place when all the ids the client sent last time are shared (the engine always
                # re-feeds a prompt's last id, hence the -1): only a generated reply is lost.
                sent = min(entry.prompt_len - 1, len(entry.session.cache))
                in_place = entry.anonymous and key is None and best >= sent
                if in_place:
                    entry.leased = True
                    entry.prompt_len = len(ids)
                    self._entries.move_to_end(best_key)
                    self.hits += 1
                    return Lease(best_key, entry.session, best, LeaseKind.HIT)
                if best >= self._fork_threshold(entry.session):
                    session = self._fork(entry.session, best)
                    if session is not None:
                        self._entries[new_key] = _Entry(session, key is None, True, len(ids), space)
                        self.forks += 1
                        return Lease(new_key, session, best, LeaseKind.FORK)
            self._entries[new_key] = _Entry(self.new_session(), key is None, True, len(ids), space)
            self.misses += 1
            return Lease(new_key, self._entries[new_key].session, 0, LeaseKind.NEW)

    def _longest_match(self, ids: Sequence[int], space: str) -> tuple[str | None, int]:
        best_key, best = None, 0
        for k, entry in self._entries.items():
            if entry.leased or entry.space != space:
                continue
            n = _usable(entry.session, ids)
            if n > best or (n == best and n > 0):  # ties: the most recently used
                best_key, best = k, n
        return best_key, best

    def _fork_threshold(self, session: Session) -> int:
        if self.min_fork_tokens is not None:
            return self.min_fork_tokens
        return MIN_CLONE_TOKENS if clones_prefix(session.cache) else MIN_FORK_TOKENS

    def _fork(self, session: Session, keep: int) -> Session | None:
        try:
            return fork_session(session, keep)
        except Exception:  # noqa: BLE001 - a cache that cannot be copied: start afresh
            return None

    # -- handing back ---------------------------------------------------------

    def release(self, lease: Lease, ok: bool = True) -> None:
        """Put a leased session back; `ok=False` drops it (its cache may not match its ids)."""
        with self._lock:
            entry = self._entries.get(lease.key)
            if entry is None or entry.session is not lease.session:
                return
            entry.leased = False
            if not ok:
                del self._entries[lease.key]
                return
            self._entries.move_to_end(lease.key)
            self._evict()

    def _evict(self) -> None:
        for key in list(self._entries):
            if self.nbytes <= self.budget_bytes:
                return
            if not self._entries[key].leased:
                del self._entries[key]
                self.evictions += 1

    # -- keyed access (conversations) -----------------------------------------

    def get(self, key: str) -> Session | None:
        """The session kept under `key`, now the most recently used; None if there is none."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry.session

    def put(self, key: str, session: Session) -> None:
        """Keep `session` under a caller's key (a conversation id), as most recently used."""
        with self._lock:
            self._entries[key] = _Entry(session, anonymous=False, prompt_len=len(session.cache))
            self._entries.move_to_end(key)
            self._evict()

    def drop(self, key: str) -> bool:
        with self._lock:
            return self._entries.pop(key, None) is not None

    def clear(self) -> None:
        with self._lock:
            for key in [k for k, e in self._entries.items() if not e.leased]:
                del self._entries[key]

    # -- sizes ----------------------------------------------------------------

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(e.session.cache.nbytes for e in self._entries.values())

    def stats(self) -> dict:
        with self._lock:
            return {
                "sessions": len(self._entries),
                "bytes": self.nbytes,
                "budget_bytes": self.budget_bytes,
                "hits": self.hits,
                "forks": self.forks,
                "misses": self.misses,
                "evictions": self.evictions,
            }


def _usable(session: Session, ids: Sequence[int]) -> int:
    """The prefix of `ids` the engine will reuse from this session."""
    return session.cache.reachable(reusable_prefix(session.cache.ids, ids))
