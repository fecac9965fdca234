"""The OpenAI chat-completions wire format: request JSON in, response and chunk JSON out.

`parse_request` validates a decoded body and maps its fields onto `SamplingParams`
(over the server's defaults): the request fields each SamplingParams field declares
(`Setting.api`), read by its declared kind. Anything wrong raises `APIError`, which the app turns
into an OpenAI-style `{"error": {"message", "type", "param", "code"}}` body.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

from chatcli.engine import (
    BIAS,
    FLOAT,
    MAX_TOP_LOGPROBS,
    SEED,
    STRINGS,
    FinishReason,
    InvalidParameter,
    ResponseFormat,
    SamplingParams,
    settings,
)
from chatcli.server.tools import ToolError, named_results, parse_tools, tool_message

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_STOPS = 4

# SamplingParams' names in its messages ("top-k must be ...") → its field; the message is rewritten
# with the request field that set it (top_k), which `Setting.api` declares.
FIELD_OF = {setting.name: name for name, setting in settings()}


# serve's max_tokens where neither --max-tokens nor the config file's [sampling] sets one: a request that
# sends none runs to the context limit (the engine stops there), as OpenAI's and llama-server's do
TO_CONTEXT = 2**31 - 1
RETRY_AFTER = "2"  # seconds a 503 asks the client to wait (the model loading, a full queue)


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:  # noqa: A002 - the OpenAI field name
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,  # noqa: A002
    code: str | None = None,
) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass
class ChatRequest:
    messages: list[dict]  # role/content dicts, as the chat template takes them
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    truncate: bool = True  # drop the oldest exchanges to fit the context; `"truncation": "disabled"`: a 400
    cache_salt: str | None = None  # requests with different salts never share cached positions (vLLM's field)


def _truncation(value) -> bool:
    """`truncation` (the Responses API's field): "auto" drops the oldest exchanges to fit the
    context (this server's default), "disabled" answers a conversation that does not fit with a 400."""
    if value in (None, "auto"):
        return True
    if value == "disabled":
        return False
    raise bad(f"truncation must be auto or disabled, got {value!r}", "truncation")


# Request fields that change what the reply is and that this server does not do (yet): a request
# that sends one, other than as its no-op value, gets a 400 naming it instead of a reply that ignores it.
REFUSED = {
    "modalities": lambda v: v == ["text"],
    "audio": lambda _v: False,
    "prediction": lambda _v: False,
    "web_search_options": lambda _v: False,
    "reasoning_effort": lambda _v: False,
}


def bad(message: str, param: str | None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param, code)


def number(body: dict, name: str, integer: bool = False):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise bad(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}", name, "invalid_type")
    if not integer and not math.isfinite(value):
        raise bad(f"{name} must be a finite number, got {value!r}", name)
    return value


def _content(value, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: only text is understood
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"{where}.content: only text parts are supported", f"{where}.content")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"{where}.content must be a string or a list of text parts", f"{where}.content", "invalid_type")


def parse_messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise bad(
            "messages must be a non-empty array",
            "messages",
            "invalid_type" if not isinstance(value, list) else "invalid_value",
        )
    out = []
    for i, msg in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad(f"{where} must be an object", where, "invalid_type")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role")
        try:
            out.append(tool_message(msg, ROLES[role], _content(msg.get("content"), where), where))
        except ToolError as exc:
            raise bad(str(exc), exc.param, exc.code) from None
    return named_results(out)


def _stops(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise bad("stop must be a string or an array of strings", "stop", "invalid_type")
    if len(value) > MAX_STOPS:
        raise bad(f"stop takes at most {MAX_STOPS} strings, got {len(value)}", "stop")
    return tuple(value)


def _value(body: dict, key: str, kind: str):
    """The request field `key` as a value of the declared kind; None when absent (or an empty stop list)."""
    if kind == STRINGS:
        return _stops(body.get(key)) or None
    if kind == BIAS:
        value = body.get(key)
        if value is not None and not isinstance(value, dict):
            raise bad(f"{key} must be an object of token ids to biases", key, "invalid_type")
        return value or None
    value = number(body, key, integer=kind != FLOAT)
    if value is None:
        return None
    if kind == SEED:
        if not -(2**63) <= value < 2**64:
            raise bad(f"{key} must fit in 64 bits, got {value}", key)
        return value % 2**64  # OpenAI's seeds are signed: a negative one names its two's complement
    return float(value) if kind == FLOAT else int(value)


def _sampling(body: dict) -> tuple[dict, dict]:
    """The SamplingParams changes a request asks for, and the request field that set each one."""
    changes, sent = {}, {}
    for name, setting in settings():
        for key in setting.api:  # newest name first: the first one sent wins
            value = _value(body, key, setting.kind)
            if value is not None:
                changes[name], sent[name] = value, key
                break
    return changes, sent


def _logprobs(body: dict) -> dict:
    """OpenAI's `logprobs` (a boolean) and `top_logprobs` (0-20, only with logprobs) as `SamplingParams.logprobs`."""
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise bad("logprobs must be a boolean", "logprobs", "invalid_type")
    top = number(body, "top_logprobs", integer=True)
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise bad(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}", "top_logprobs")
    if top is not None and not wanted:
        raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    return {"logprobs": int(top or 0)} if wanted else {}


def _response_format(value) -> ResponseFormat | None:
    """OpenAI's `response_format`: text (the default), json_object, or json_schema with its `schema`
    (`strict` or not, the reply is held to it: constrained decoding does not guess)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("response_format must be an object", "response_format", "invalid_type")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":  # with a `schema`, llama-server's form (instructor's JSON_SCHEMA mode): held to it
        schema = value.get("schema")
        if schema is not None and not isinstance(schema, (dict, bool)):
            raise bad("response_format.schema must be a JSON schema object", "response_format.schema", "invalid_type")
        return ResponseFormat("json_object") if schema is None else ResponseFormat.json_schema(schema)
    if kind != "json_schema":
        raise bad(
            f"response_format.type must be text, json_object or json_schema, got {kind!r}", "response_format.type"
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
        raise bad(
            "response_format.json_schema must be an object with a schema object",
            "response_format.json_schema",
            "invalid_type",
        )
    name = spec.get("name", "")
    strict = spec.get("strict") is True
    return ResponseFormat.json_schema(spec.get("schema", {}), name if isinstance(name, str) else "", strict)


def parse_request(body, defaults: SamplingParams) -> ChatRequest:
    """A decoded JSON body → a validated `ChatRequest`; raises `APIError` (400)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_type")
    messages = parse_messages(body.get("messages"))
    n = number(body, "n", integer=True)
    if n is not None and n != 1:
        raise bad("only n=1 is supported", "n")
    try:
        tools = parse_tools(body)
    except ToolError as exc:
        raise bad(str(exc), exc.param, exc.code) from None
    for field, accepted in REFUSED.items():  # fields that would change the reply, not built yet
        value = body.get(field)
        if value is not None and not accepted(value):
            raise bad(f"{field} is not supported by this server", field, "unsupported_parameter")
    stream, include_usage = streaming(body)
    extra = _logprobs(body)
    fmt = _response_format(body.get("response_format"))
    if fmt is not None:
        extra["response_format"] = fmt
    if tools is not None:
        extra["tools"] = tools
    params = sampling_params(body, defaults, extra)
    truncate = _truncation(body.get("truncation"))
    return ChatRequest(messages, params, stream, include_usage, truncate, cache_salt(body))


def cache_salt(body: dict) -> str | None:
    """vLLM's `cache_salt`: a non-empty string that keeps this request's cached prefixes apart from those of
    requests with another salt (or none), within its API key's."""
    value = body.get("cache_salt")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise bad("cache_salt must be a non-empty string", "cache_salt", "invalid_type")
    return value


def streaming(body: dict) -> tuple[bool, bool]:
    """`stream` and `stream_options.include_usage`, checked."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad("stream must be a boolean", "stream", "invalid_type")
    options = body.get("stream_options")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise bad("stream_options must be an object", "stream_options", "invalid_type")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise bad("stream_options.include_usage must be a boolean", "stream_options.include_usage", "invalid_type")
    return stream, include_usage


def sampling_params(body: dict, defaults: SamplingParams, extra: dict) -> SamplingParams:
    """The request's sampling fields (and `extra` changes) over `defaults`; a value out of range is a
    400 that names the request field that sent it."""
    changes, sent = _sampling(body)
    changes.update(extra)
    try:
        return defaults.with_(**changes)
    except InvalidParameter as exc:
        message = str(exc)
        name = next((n for n in FIELD_OF if message.startswith(n + " ")), None)
        param = sent.get(FIELD_OF.get(name))
        if param is not None:
            message = param + message[len(name) :]
        raise bad(message, param) from None


# -- responses ----------------------------------------------------------------


def new_id(prefix: str = "chatcmpl-") -> str:
    return prefix + uuid.uuid4().hex[:24]


def usage(first, stats) -> dict:
    """OpenAI's usage object from a turn's `Prefilled` event and `TurnStats`: prompt tokens read
    from the KV cache as `cached_tokens`, and prompt-lookup drafts as the prediction tokens
    kept and rejected (the fields OpenAI's Predicted Outputs report)."""
    return {
        "truncated_turns": first.truncated_turns,  # ours: earlier exchanges dropped to fit the context
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": first.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": stats.accepted_tokens,
            "rejected_prediction_tokens": stats.draft_tokens - stats.accepted_tokens,
        },
    }


def finish_reason(reason: FinishReason, calls: bool = False) -> str:
    """OpenAI's finish reason: "tool_calls" for a reply that gives calls (`calls`: whole ones, though the
    turn may have ended at max_tokens: a call it cut is dropped), else "length", else "stop" (a
    cancelled turn only reaches a client that left)."""
    return "tool_calls" if calls else "length" if reason == FinishReason.LENGTH else "stop"


def completion(
    cid: str, model: str, text: str, reason: str, use: dict, logprobs: list | None = None, calls: list | None = None
) -> dict:
    """A chat.completion; `reason`: its finish reason (`finish_reason`)."""
    message = {"role": "assistant", "content": text or None} if calls else {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": reason,
                "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
            }
        ],
        "usage": use,
    }


def chunk(
    cid: str,
    model: str,
    created: int,
    delta: dict | None,
    reason: str | None = None,
    use: dict | None = None,
    with_usage: bool = False,
    logprobs: list | None = None,
) -> dict:
    """One `chat.completion.chunk`; `delta=None` gives the usage-only chunk (no choices); `logprobs`:
    the entries of the tokens whose text this chunk carries."""
    out: dict = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
    if delta is None:
        out["choices"] = []
    else:
        scored = None if logprobs is None else {"content": logprobs, "refusal": None}
        out["choices"] = [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": scored}]
    if with_usage:
        out["usage"] = use
    return out


def models_list(model: str, created: int, context_limit: int | None = None) -> dict:
    """OpenAI's model list, plus vLLM's `max_model_len` (the context in tokens) that clients read."""
    entry = {"id": model, "object": "model", "created": created, "owned_by": "chatcli"}
    if context_limit:
        entry["max_model_len"] = context_limit
    return {"object": "list", "data": [entry]}
