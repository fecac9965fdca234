"""OpenAI's legacy completions, `POST /v1/completions`: a string prompt continued without a chat template.

The request: `prompt` (a string, or token ids; one of either), `max_tokens` (OpenAI's default: 16),
`echo`, `logprobs` (N alternatives per token, the legacy layout), `stream` and the sampling fields of
chat completions. The reply is a `text_completion` object, or its chunks over Server-Sent Events. The
engine side is `Engine.complete`: the same decode loop, cache reuse and drafts as a chat turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatcli.engine import MAX_TOP_LOGPROBS, Finished, Prefilled, SamplingParams, token_entry
from chatcli.server import schema
from chatcli.server.respond import CompletionResponse
from chatcli.server.schema import bad, number
from chatcli.server.worker import Job

DEFAULT_MAX_TOKENS = 16  # OpenAI's for /v1/completions (vLLM's too)
# Fields of the legacy API that would change the reply and that this server does not do.
REFUSED = ("suffix", "tools", "response_format")


@dataclass
class TextRequest:
    prompt: str | list[int]  # the text, or the ids a client tokenized itself
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    cache_salt: str | None = None  # as chat's: requests with different salts never share cached positions


def _prompt(value) -> str | list[int]:
    """A string, [string], token ids, or [token ids]: exactly one prompt."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        if min(value) < 0:
            raise bad("prompt token ids must be >= 0", "prompt")
        return list(value)
    if isinstance(value, list) and len(value) > 1:
        raise bad("only one prompt per request is supported", "prompt")
    raise bad("prompt must be a string or an array of token ids", "prompt", "invalid_type")


def parse_completion(body, defaults: SamplingParams) -> TextRequest:
    """A decoded /v1/completions body → a validated `TextRequest`; raises `APIError` (400)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_type")
    if "prompt" not in body:
        raise bad("prompt is required", "prompt", "missing_required_parameter")
    prompt = _prompt(body["prompt"])
    for name in ("n", "best_of"):
        value = number(body, name, integer=True)
        if value is not None and value != 1:
            raise bad(f"only {name}=1 is supported", name)
    for name in REFUSED:
        if body.get(name) not in (None, ""):
            raise bad(f"{name} is not supported by /v1/completions on this server", name, "unsupported_parameter")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise bad("echo must be a boolean", "echo", "invalid_type")
    extra = {}
    top = number(body, "logprobs", integer=True)
    if top is not None:
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise bad(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}", "logprobs")
        if echo:  # the prompt's own logprobs: a forward this server does not keep
            raise bad("logprobs with echo is not supported", "echo", "unsupported_parameter")
        extra["logprobs"] = int(top)
    stream, include_usage = schema.streaming(body)
    params = schema.sampling_params(body, defaults.with_(max_tokens=DEFAULT_MAX_TOKENS), extra)
    return TextRequest(prompt, params, stream, include_usage, echo, schema.cache_salt(body))


class TextCompletionResponse(CompletionResponse):
    """A `text_completion` (or its chunks) for a `TextRequest` whose prompt ids are `ids`."""

    def __init__(self, request: TextRequest, ids: list[int], prompt_text: str, *args, **kwargs) -> None:
        super().__init__(request, *args, **kwargs)
        self.ids = ids
        self.prompt_text = prompt_text  # what echo returns
        self.cid = schema.new_id("cmpl-")
        self.offset = len(prompt_text)  # text_offset of the next token: from the prompt's start, as OpenAI's

    def _job(self, emit) -> Job:
        return Job([], self.request.params, emit, prompt=self.ids, space=self.space)

    def _entry(self, event) -> dict | None:
        found = token_entry(self.tokenizer, event)
        if found is not None:
            found["text_offset"] = self.offset
            self.offset += len(found["token"])
        return found

    @staticmethod
    def _legacy(entries: list | None) -> dict | None:
        """OpenAI's legacy logprobs: parallel lists of tokens, their logprobs, alternatives, offsets."""
        if entries is None:
            return None
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{a["token"]: a["logprob"] for a in e["top_logprobs"]} for e in entries],
            "text_offset": [e["text_offset"] for e in entries],
        }

    def _object(self, text: str, reason: str | None, scored: list | None) -> dict:
        choice = {"text": text, "index": 0, "logprobs": self._legacy(scored), "finish_reason": reason}
        return {"id": self.cid, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [choice]}  # fmt: skip

    def _whole(self, first: Prefilled, done: Finished, scored: list | None) -> dict:
        text = (self.prompt_text if self.request.echo else "") + done.reply
        out = self._object(text, schema.finish_reason(done.finish_reason), scored)
        out["usage"] = schema.usage(first, done.stats)
        return out

    def _chunk_of(self, text: str, reason: str | None = None, scored: list | None = None) -> dict:
        out = self._object(text, reason, scored)
        if self.request.include_usage:
            out["usage"] = None
        return out

    def _opening(self) -> dict | None:
        return self._chunk_of(self.prompt_text) if self.request.echo and self.prompt_text else None

    def _piece(self, text: str, scored: list | None) -> dict:
        return self._chunk_of(text, scored=scored)

    def _closing(self, reason: str) -> dict:
        return self._chunk_of("", reason)

    def _usage_chunk(self, use: dict) -> dict:
        out = self._object("", None, None)
        out["choices"], out["usage"] = [], use
        return out
