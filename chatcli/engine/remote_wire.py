"""What an OpenAI-compatible server sends the remote engine, read and checked in one place: a server,
broken or hostile, can send anything, and each shape that is not OpenAI's is a `WireError` of one
line naming the field and what it held, never a TypeError three calls later.

- `events`: the `data` of each Server-Sent Event of a streamed body. A line, and an event, are at
  most `LINE_CAP` (1 MiB; a chunk is a few hundred bytes), so a line that never ends costs 1 MiB,
  not the memory. (httpx-sse's parser buffers a line without bound: not used.)
- `parse_chunk`: one `chat.completion.chunk` as a `Chunk`: each choice's text, tool-call parts,
  logprobs (`logprobs.content[]`: each token's text, logprob and `top_logprobs`, at most
  `MAX_TOP_LOGPROBS` of them kept) and finish reason, the usage, an error event. The fields OpenAI's
  API sends are checked for their type (a count is an integer ≥ 0, a logprob a number ≤ 0); the
  fields a server adds of its own are not read.
- `parse_models`: `/v1/models`' list; `error_message`: the message of an error body, whatever its shape;
  `whole`: such a body, at most `BODY_CAP` (16 MiB).
- `reply_cap`: how many events (or tokens, where they come with logprobs) and characters a reply of
  `max_tokens` may take: past them the server has not kept to `max_tokens`, and the engine stops
  reading (the turn ends `length`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from chatcli.engine.params import MAX_TOP_LOGPROBS
from chatcli.errors import clip

LINE_CAP = 1 << 20  # bytes of one event line, and of one event's data
BODY_CAP = 16 << 20  # bytes of a whole answer (/models, an error): OpenRouter's list of models is under 1 MiB
LONGEST_TOKEN = 256  # characters one token's text may hold (the longest in common vocabularies: well under)
_EOL = re.compile(rb"\r\n|\r|\n")  # the line ends of text/event-stream


class WireError(Exception):
    """What a server sent is not what OpenAI's API sends; the message is one line that names it."""


# -- Server-Sent Events ---------------------------------------------------------------------


def events(chunks: Iterable[bytes], content_type: str | None, cap: int = LINE_CAP) -> Iterator[str]:
    """The data of each event in a text/event-stream body, as its bytes arrive in `chunks` (its `data:`
    lines joined by newlines; comments and other fields skipped; an event ends at a blank line). A
    body of another `content_type`, and a line or an event over `cap` bytes, are a WireError."""
    kind = (content_type or "").partition(";")[0].strip().lower()
    if kind != "text/event-stream":
        raise WireError(f"{kind or 'an answer without a content type'}, not a stream of events (text/event-stream)")
    buffer, data, size = bytearray(), [], 0
    scanned = 0  # where the next line end is looked for (the bytes before it hold none)
    for chunk in chunks:
        buffer += chunk
        start = 0  # the line being read begins here
        while (end := _EOL.search(buffer, scanned)) is not None:
            if end.group() == b"\r" and end.end() == len(buffer):  # its \n may be in the next chunk
                break
            line, start = bytes(buffer[start : end.start()]), end.end()
            scanned = start
            if not line:  # the event is complete
                if data:
                    yield b"\n".join(data).decode("utf-8", "replace")
                data, size = [], 0
                continue
            name, _, value = line.partition(b":")
            if name == b"data":
                data.append(value[1:] if value.startswith(b" ") else value)
                size += len(value)
                if size > cap:
                    raise WireError(f"an event over {_bytes(cap)}")
        del buffer[:start]
        scanned = end.start() - start if end is not None else len(buffer)
        if len(buffer) > cap:
            raise WireError(f"an event line over {_bytes(cap)} (it never ended)")


def whole(chunks: Iterable[bytes], cap: int = BODY_CAP) -> bytes:
    """A whole body (/models, an error's), `cap` bytes at most: a WireError past them."""
    body = bytearray()
    for chunk in chunks:
        body += chunk
        if len(body) > cap:
            raise WireError(f"more than {_bytes(cap)}")
    return bytes(body)


def _bytes(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 and count % (1 << 20) == 0 else f"{count} bytes"


# -- the JSON of a chunk ---------------------------------------------------------------------

_KINDS = {
    "text": (str, "text"),
    "count": (int, "a count"),
    "number": ((int, float), "a number"),
    "object": (dict, "an object"),
    "list": (list, "a list"),
}


def _field(body: dict, name: str, kind: str, where: str = ""):
    """`body[name]` where it is of `kind` (None where it is absent or null); anything else a WireError
    that names it (`where`: the path to `body`, as `choices[0].delta.`)."""
    value = body.get(name)
    if value is None:
        return None
    python, said = _KINDS[kind]
    if not isinstance(value, python) or isinstance(value, bool) or (kind == "count" and value < 0):
        raise WireError(f"{where}{name} is {_shown(value)}, not {said}")
    return value


def _shown(value) -> str:
    return clip(json.dumps(value, ensure_ascii=False), 40)


@dataclass
class Scored:
    """One token of `logprobs.content[]`: its text, log p, and the alternatives as (text, log p)."""

    token: str
    logprob: float
    top: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class Choice:
    text: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI's parts, checked: index, id, function
    finish_reason: str | None = None
    scored: list[Scored] = field(default_factory=list)  # the logprobs of the tokens this text brings


@dataclass
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # prompt_tokens_details.cached_tokens
    accepted_tokens: int = 0  # completion_tokens_details: a server's drafts (Predicted Outputs' fields)
    rejected_tokens: int = 0
    truncated_turns: int = 0  # chatcli serve's own


@dataclass
class Chunk:
    choices: list[Choice]
    usage: Usage | None = None
    error: str | None = None  # an error event (OpenAI's `{"error": ...}` mid-stream)
    size: int = 0  # characters of text and call parts, for `reply_cap`


def parse_chunk(data: str) -> Chunk:
    """One event's data as a Chunk; a WireError if it is not JSON or not a chunk's shape."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can read
        raise WireError(f"an event that is not JSON: {clip(data, 60)!r}") from None
    if not isinstance(body, dict):
        raise WireError(f"an event that is not a JSON object: {_shown(body)}")
    listed = _field(body, "choices", "list") or []
    if body.get("error") and not listed:
        return Chunk([], error=error_message(body) or _shown(body["error"]))
    chunk = Chunk([_choice(c, f"choices[{i}]") for i, c in enumerate(listed)], _usage(body))
    chunk.size = sum(
        len(c.text) + sum(len(json.dumps(p)) for p in c.tool_calls) + sum(len(s.token) for s in c.scored)
        for c in chunk.choices
    )
    return chunk


def _choice(choice, where: str) -> Choice:
    if not isinstance(choice, dict):
        raise WireError(f"{where} is {_shown(choice)}, not an object")
    delta = _field(choice, "delta", "object", f"{where}.") or {}
    parts = _field(delta, "tool_calls", "list", f"{where}.delta.") or []
    logprobs = _field(choice, "logprobs", "object", f"{where}.") or {}
    scored = _field(logprobs, "content", "list", f"{where}.logprobs.") or []
    return Choice(
        _field(delta, "content", "text", f"{where}.delta.") or "",
        [_part(part, f"{where}.delta.tool_calls[{i}]") for i, part in enumerate(parts)],
        _field(choice, "finish_reason", "text", f"{where}."),
        [_scored(entry, f"{where}.logprobs.content[{i}]") for i, entry in enumerate(scored)],
    )


def _scored(entry, where: str, top: bool = True) -> Scored:
    """A token's logprobs entry: `token` text, `logprob` a number (≤ 0; OpenAI writes log 0 as -9999),
    `top_logprobs` entries of the same shape (their first MAX_TOP_LOGPROBS)."""
    if not isinstance(entry, dict):
        raise WireError(f"{where} is {_shown(entry)}, not an object")
    token = _field(entry, "token", "text", f"{where}.")
    if token is None:
        raise WireError(f"{where}.token is missing")
    logprob = _field(entry, "logprob", "number", f"{where}.")
    if logprob is None or not logprob <= 0:  # NaN too
        raise WireError(f"{where}.logprob is {_shown(logprob)}, not a log p (a number ≤ 0)")
    alternatives = (_field(entry, "top_logprobs", "list", f"{where}.") or []) if top else []
    listed = [_scored(e, f"{where}.top_logprobs[{i}]", False) for i, e in enumerate(alternatives[:MAX_TOP_LOGPROBS])]
    return Scored(token, float(logprob), [(a.token, a.logprob) for a in listed])


def _part(part, where: str) -> dict:
    """A streamed tool-call part: `index` (a count; missing in older ollama), `id`, `function` with
    `name` and `arguments` (text fragments, or a whole object as some servers send it)."""
    if not isinstance(part, dict):
        raise WireError(f"{where} is {_shown(part)}, not an object")
    _field(part, "index", "count", f"{where}.")
    _field(part, "id", "text", f"{where}.")
    function = _field(part, "function", "object", f"{where}.") or {}
    _field(function, "name", "text", f"{where}.function.")
    arguments = function.get("arguments")
    if arguments is not None and not isinstance(arguments, str | dict):
        raise WireError(f"{where}.function.arguments is {_shown(arguments)}, not text or an object")
    return part


def _usage(body: dict) -> Usage | None:
    usage = _field(body, "usage", "object")
    if usage is None:
        return None
    prompt = _field(usage, "prompt_tokens_details", "object", "usage.") or {}
    drafted = _field(usage, "completion_tokens_details", "object", "usage.") or {}
    return Usage(
        _field(usage, "prompt_tokens", "count", "usage."),
        _field(usage, "completion_tokens", "count", "usage."),
        _field(prompt, "cached_tokens", "count", "usage.prompt_tokens_details."),
        _field(drafted, "accepted_prediction_tokens", "count", "usage.completion_tokens_details.") or 0,
        _field(drafted, "rejected_prediction_tokens", "count", "usage.completion_tokens_details.") or 0,
        _field(usage, "truncated_turns", "count", "usage.") or 0,
    )


# -- /models and errors -------------------------------------------------------------------------


def parse_models(body) -> list[dict]:
    """`/v1/models`' entries (each an object with a text `id`; `max_model_len` a count where given)."""
    if not isinstance(body, dict):
        raise WireError(f"a list of models that is not a JSON object: {_shown(body)}")
    listed = _field(body, "data", "list") or []
    for i, entry in enumerate(listed):
        if not isinstance(entry, dict):
            raise WireError(f"data[{i}] is {_shown(entry)}, not an object")
        if not isinstance(entry.get("id"), str):
            raise WireError(f"data[{i}].id is {_shown(entry.get('id'))}, not text")
        _field(entry, "max_model_len", "count", f"data[{i}].")
    return listed


def error_message(body) -> str | None:
    """The message of an error body (`{"error": {"message": ...}}`, `{"error": "..."}`), None if it has none."""
    found = body.get("error") if isinstance(body, dict) else None
    found = found.get("message") if isinstance(found, dict) else found
    return found if isinstance(found, str) and found.strip() else None


def reply_cap(max_tokens: int) -> tuple[int, int]:
    """(events, characters) of a stream past which a reply of `max_tokens` has overrun it: a server
    sends an event a token (and a few more: the role, the finish, the usage), a token is at most
    LONGEST_TOKEN characters; the margin is a quarter, at least 64 tokens."""
    tokens = max_tokens + max(64, max_tokens // 4)
    return tokens, tokens * LONGEST_TOKEN
