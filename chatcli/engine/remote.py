"""A chat engine over HTTP: any OpenAI-compatible `/v1/chat/completions` that streams Server-Sent
Events (vLLM, SGLang, llama.cpp's llama-server, ollama, `chatcli serve`, OpenAI itself).

Contract: the `ChatEngine` protocol of `engine/events.py`, so the TUI and the one-shot drive it as
they drive the in-process engine. The server keeps the KV cache, so a session holds nothing and
`crop_session` / `save_session` / `restore_session` do nothing. The figures are the client's own:
TTFT from sending the request to the first text, decode tok/s over the text chunks after it (the
server's `completion_tokens` when it reports usage), and prompt and cached tokens from the final
usage (`prompt_tokens_details.cached_tokens`), None (shown as n/a) where the server says nothing.

Faults are `RemoteError`, one line each: refused connections, unknown hosts, 401, 404, 429 and
503 (with their Retry-After), timeouts, and any shape or size OpenAI's API does not send (checked in
one place, `remote_wire.py`). Once text has come, a stream cut mid-reply or a wrong shape ends the
turn with `FinishReason.ERROR` and the text so far, so nothing received is lost; a reply past
`max_tokens` (and `reply_cap`'s margin) ends `LENGTH`: the engine stops reading. A cancel closes the
stream: the server sees the client leave and stops generating.

With `SamplingParams.logprobs` the request asks for `logprobs` and N `top_logprobs`, and each token
comes as a Token with its logprob and alternatives, named by their text (`remote_turn`); a server that
refuses them (a 400 naming them) is asked again without, and from then on.

Tools (`SamplingParams.tools`, an assistant's `tool_calls`, `tool` results) go to the server as
OpenAI's fields (`chatcli.engine.remote_tools`). The server's structured calls come back in the
reply's text as Hermes `<tool_call>` blocks — one `Token` of their text when the reply finishes, and
in `Finished.reply` — so a consumer reads a reply's calls the same way from either engine:
`parse_calls(done.reply, call_syntax(engine))`, or `CallScanner(call_syntax(engine))` over the
Tokens (`call_syntax`: `chatcli.engine.events`; here it is `RemoteEngine.tool_syntax`, HERMES).
A reply of calls finishes with `FinishReason.STOP`. A 400 to a request with tools says so, one line.

httpx, imported when a remote engine is made: a local start does not pay for them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from chatcli.engine import remote_wire as wire
from chatcli.engine.events import Event, Finished, FinishReason, Prefilled
from chatcli.engine.params import SamplingParams
from chatcli.engine.remote_tools import HINT, SYNTAX, tool_fields, wire_messages
from chatcli.engine.remote_turn import StreamedTurn
from chatcli.engine.stats import TurnStats
from chatcli.errors import clip, one_line

TIMEOUT_S = 60.0  # to connect, and between two events of a stream
SSE_HEADERS = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
EXTRAS = ("top_k", "min_p", "repetition_penalty")  # sampling fields OpenAI's own API does not take


class RemoteError(Exception):
    """A server that cannot answer; the message is one line for the user."""


class RemoteCache:
    """What a remote session knows of the server's cache: the tokens of the last turn (from usage)."""

    ids: list[int] = []
    nbytes = 0

    def __init__(self) -> None:
        self.tokens = 0

    def __len__(self) -> int:
        return self.tokens


class RemoteSession:
    def __init__(self) -> None:
        self.cache = RemoteCache()


class RemoteEngine:
    keeps_cache = False  # the server holds it: no bytes to show, nothing to save
    tool_syntax = SYNTAX  # how a reply's calls are written into its text (`call_syntax`)

    def __init__(self, url: str, api_key: str | None = None, model: str | None = None, timeout: float = TIMEOUT_S):
        import httpx

        self.url = url.rstrip("/")
        if not self.url.endswith("/v1"):
            self.url += "/v1"  # `http://host:8000` and `http://host:8000/v1` both work
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout))
        self.timeout = timeout
        self.send_extras = True  # dropped once a server refuses them (OpenAI's own API does)
        self.send_logprobs = True  # likewise `logprobs` (a server that has no tokens to score)
        self.listed: list[dict] = []
        self.name = model or ""
        self.context_limit = 0  # unknown (n/a) unless the server lists it

    @property
    def backend(self) -> str:
        return self.url

    # -- connecting --------------------------------------------------------------

    def connect(self) -> RemoteEngine:
        """Ask the server for its models (checks the URL and the key): the first unless named, else one it lists."""
        self.listed = self._models()
        ids = [m["id"] for m in self.listed]
        if not self.name:
            if not ids:
                raise RemoteError(f"{self.url}/models lists no model: name one with --model")
            self.name = ids[0]
        elif ids and self.name not in ids:  # a server that lists its models answers only to those
            raise RemoteError(f"{self.url}/models lists no model {self.name!r}: it has {', '.join(ids[:8])}")
        info = next((m for m in self.listed if m.get("id") == self.name), {})
        # vLLM's field (chatcli serve sends it too); llama-server's `meta.n_ctx_train` is the model's
        # training context, not the server's, so it is not taken: an unknown limit shows as n/a
        limit = info.get("max_model_len")
        self.context_limit = limit if isinstance(limit, int) and limit > 0 else 0
        return self

    def models(self) -> list[str]:
        """The ids the server lists now."""
        return [m["id"] for m in self._models()]

    def _models(self) -> list[dict]:
        try:
            return wire.parse_models(self._get("/models"))
        except wire.WireError as exc:
            raise RemoteError(f"{self.url}/models answered {exc}: is it an OpenAI-compatible server?") from None

    def _get(self, path: str):
        import httpx

        try:
            with self.client.stream("GET", self.url + path) as response:
                body = self._whole(response)
        except httpx.HTTPError as exc:
            raise RemoteError(self._transport(exc)) from None
        if response.status_code >= 400:
            raise RemoteError(self._status(response, body))
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise RemoteError(f"{self.url}{path} did not answer JSON: is it an OpenAI-compatible server?") from None

    # -- the ChatEngine protocol -------------------------------------------------------

    def new_session(self) -> RemoteSession:
        return RemoteSession()

    def lookup_for(self, params: SamplingParams) -> int:
        return 0  # drafting is the server's business

    def check_params(self, params: SamplingParams) -> None:
        """Nothing to check here: the server knows its vocabulary and holds the reply to `response_format`
        (and says so if it cannot)."""

    def crop_session(self, session, messages: Sequence[dict]) -> int:
        session.cache.tokens = 0  # the server keeps (and crops) its own cache
        return 0

    def save_session(self, session, path: Path) -> bool:
        return False

    def restore_session(self, session, path: Path) -> bool:
        return False

    def generate(
        self,
        messages: Sequence[dict],
        session: RemoteSession,
        params: SamplingParams | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        params = params or SamplingParams()
        cancel = cancel or threading.Event()
        t_submit = time.perf_counter()
        while True:  # each optional field is dropped at most once: at most three tries
            try:
                yield from self._stream(messages, session, params, cancel, t_submit)
                return
            except _Refused as refused:
                setattr(self, refused.flag, False)

    def body(self, messages: Sequence[dict], params: SamplingParams) -> dict:
        body = {
            "model": self.name,
            "messages": wire_messages(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
        }
        if params.seed is not None:
            seed = params.seed  # signed on the wire (OpenAI's): the upper half as its two's complement
            body["seed"] = seed - 2**64 if seed >= 2**63 else seed
        if params.stop:
            body["stop"] = list(params.stop)
        for name in ("presence_penalty", "frequency_penalty"):  # OpenAI's own fields: sent where set
            if getattr(params, name):
                body[name] = getattr(params, name)
        if params.logit_bias:
            body["logit_bias"] = {str(token): bias for token, bias in params.logit_bias}
        if params.response_format is not None:
            body["response_format"] = params.response_format.to_openai()
        if params.tools is not None:
            body.update(tool_fields(params.tools))
        if self.send_extras:
            body.update(top_k=params.top_k, min_p=params.min_p, repetition_penalty=params.repeat_penalty)
        if params.logprobs is not None and self.send_logprobs:  # each token's, and N alternatives
            body.update(logprobs=True, top_logprobs=params.logprobs)
        return body

    # -- one streamed turn ---------------------------------------------------------------

    def _stream(self, messages, session, params, cancel, t_submit) -> Iterator[Event]:
        import httpx

        turn = StreamedTurn(t_submit, params.max_tokens)
        url = self.url + "/chat/completions"
        body = self.body(messages, params)
        try:
            with self.client.stream("POST", url, json=body, headers=SSE_HEADERS) as response:
                if response.status_code >= 400:
                    answer = self._whole(response)
                    refused = self._refused(answer, body) if response.status_code == 400 else None
                    if refused is not None:
                        raise _Refused(refused)
                    hint = HINT if response.status_code == 400 and "tools" in body else ""
                    raise RemoteError(self._status(response, answer) + hint)
                closer = _close_on(cancel, response)
                try:
                    for data in wire.events(response.iter_bytes(), response.headers.get("content-type")):
                        if data.strip() == "[DONE]":
                            break
                        yield from turn.take(data)
                        if turn.error or turn.over:
                            break
                except wire.WireError as exc:  # not a stream of events, a line that never ends
                    turn.fail(f"the server sent {exc}")
                finally:
                    closer.set()
        except (RemoteError, _Refused):
            raise
        except (httpx.HTTPError, httpx.StreamError) as exc:
            if not cancel.is_set():
                if not turn.started:
                    raise RemoteError(self._transport(exc)) from None
                turn.fail(f"the server's stream ended mid-reply ({one_line(exc)})")
        if turn.error and not turn.started and not cancel.is_set():  # nothing received: the turn did not happen
            raise RemoteError(f"{self.url}: {turn.error}")
        if cancel.is_set() and not turn.error:
            turn.reason = FinishReason.CANCELLED
        yield from turn.calls_out()  # those of a stream that ended without a finish_reason
        t_end = time.perf_counter()
        if not turn.started:
            yield Prefilled(None, None, None, t_end - t_submit, 0)
        stats = self._stats(turn.usage, turn.chunks, t_submit, turn.t_first, t_end, session)
        yield Finished("".join(turn.reply), turn.reason, stats, turn.error)

    def _stats(self, usage: wire.Usage, chunks: int, t_submit: float, t_first: float | None, t_end: float, session):
        prompt, cached = usage.prompt_tokens, usage.cached_tokens
        completion = usage.completion_tokens or chunks
        decode_s = t_end - t_first if t_first is not None else 0.0
        if prompt is not None:
            session.cache.tokens = prompt + completion
        return TurnStats(
            prompt_tokens=prompt,
            cached_tokens=cached,
            prefill_tokens=prompt - cached if prompt is not None and cached is not None else None,
            completion_tokens=completion,
            ttft_s=(t_first - t_submit) if t_first is not None else 0.0,
            prefill_tok_s=None,
            decode_tok_s=(completion - 1) / decode_s if completion > 1 and decode_s > 0 else 0.0,
            total_s=t_end - t_submit,
            kv_cache_bytes=None,
            context_tokens=session.cache.tokens,
            context_limit=self.context_limit,
            truncated_turns=usage.truncated_turns,
            draft_tokens=usage.accepted_tokens + usage.rejected_tokens,
            accepted_tokens=usage.accepted_tokens,
        )

    # -- errors in one line ----------------------------------------------------------

    def _refused(self, answer: bytes, body: dict) -> str | None:
        """The switch of the optional fields a 400 names, where the request sent them: EXTRAS
        (`send_extras`), then `logprobs` (`send_logprobs`); None where it names neither."""
        text = answer.decode("utf-8", "replace").lower()
        if self.send_extras and any(name in text for name in EXTRAS):
            return "send_extras"
        return "send_logprobs" if "logprobs" in body and "logprobs" in text else None

    def _whole(self, response) -> bytes:
        try:
            return wire.whole(response.iter_bytes())
        except wire.WireError as exc:
            raise RemoteError(f"{response.url} answered {exc}: is it an OpenAI-compatible server?") from None

    def _transport(self, exc: BaseException) -> str:
        import httpx

        if isinstance(exc, httpx.TimeoutException):
            return f"{self.url}: no answer within {self.timeout:g} s"
        if isinstance(exc, httpx.ConnectError):
            return f"cannot connect to {self.url}: {one_line(exc)}"
        return f"{self.url}: {one_line(exc)}"

    def _status(self, response, body: bytes) -> str:
        code = response.status_code
        try:
            detail = wire.error_message(json.loads(body))
        except (ValueError, RecursionError):
            detail = None
        detail = clip(one_line(Exception(detail or response.reason_phrase or "no reason given")), 300)
        line = f"{self.url} answered {code}: {detail}"
        if code == 401:
            return line + " (check --api-key or $CHATCLI_API_KEY)"
        if code == 404:
            return line + f" (model {self.name!r}: /models lists the server's)"
        retry = response.headers.get("retry-after")
        if code in (429, 503):
            return line + (f"; retry after {clip(retry, 20)} s" if retry else "; retry later")
        return line


class _Refused(Exception):
    """A 400 that names optional fields the request sent (`flag`: the engine's switch for them): the
    request goes again without them."""

    def __init__(self, flag: str) -> None:
        self.flag = flag


def _close_on(cancel: threading.Event, response) -> threading.Event:
    """Close `response` from a watcher thread when `cancel` is set (a read blocked on a slow server
    wakes up); set the returned event when the stream is over, to let the watcher go."""
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if cancel.wait(0.05):
                response.close()
                return

    threading.Thread(target=watch, name="chatcli-remote-cancel", daemon=True).start()
    return done
