"""Tool calls as text: the syntax a chat template writes them in, the prompt of a template that knows
no tools, and a reply's calls read back (whole, or piece by piece as it streams).

Two call syntaxes:

- HERMES: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, a block a call: the
  templates of Qwen2.5, Qwen3 and Hermes write them so; and the fallback of a template without tools.
- LLAMA3: the reply is one JSON object `{"name": ..., "parameters": {...}}` (Llama 3.1+'s JSON tool
  calling; a leading `<|python_tag|>` is skipped).
- MISTRAL: the reply is `[TOOL_CALLS]` then a JSON list of `{"name": ..., "arguments": {...}}` (Mistral 7B
  v0.3, Nemo, Small: templates with `[AVAILABLE_TOOLS]`); `[TOOL_CALLS]` is a special token there, so the
  reply's text, decoded without special tokens, begins at the list (a leading `[TOOL_CALLS]` is skipped).
- HARMONY: gpt-oss's call, a `commentary` message to a function, `<|channel|>commentary to=functions.NAME
  <|constrain|>json<|message|>{...}<|call|>` (templates that write `<|channel|>`). `<|call|>` ends the reply, so
  a reply holds one call, its last message; `engine.text.harmony`'s detokenizer writes it as the text
  `<|channel|>commentary to=functions.NAME<|message|>{...}` (HARMONY_OPEN, the name, `<|message|>`, the
  arguments), which is what is read here.

A chat template that mentions no `tools` gets the fallback (`fallback_messages`): the tools listed as
JSON in the system prompt with the Hermes call syntax asked for, an assistant's calls written as
Hermes blocks after its text, and tool results given as a user message of `<tool_response>` blocks.

Stdlib only: the server reads calls with it, the grammar writes their literal text from it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

HERMES, LLAMA3, MISTRAL, HARMONY = "hermes", "llama3", "mistral", "harmony"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
TOOL_CALLS = "[TOOL_CALLS]"
HARMONY_OPEN, HARMONY_MESSAGE = "<|channel|>commentary to=functions.", "<|message|>"
MARKUP = (OPEN, CLOSE, PYTHON_TAG, TOOL_CALLS, "<|channel|>")  # call markup of every syntax: never a reply's text

FALLBACK = (
    "You may call functions to help with the user's request. Their signatures are given as JSON "
    "between <tools></tools>:\n<tools>\n{tools}\n</tools>\n\n"
    "To call a function, write a JSON object with its name and arguments between <tool_call></tool_call> "
    "tags, one block per call:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def takes_tools(template: str) -> bool:
    """The chat template renders `tools` itself (else the fallback)."""
    return "tools" in template


def syntax_of(template: str) -> str:
    """The call syntax a chat template's model writes: MISTRAL where it writes `[TOOL_CALLS]`, LLAMA3 where
    it asks for Llama 3.1's JSON calls, else HERMES (Qwen, Hermes, and the fallback of a template without
    tools)."""
    if takes_tools(template) and "<|channel|>" in template:
        return HARMONY
    if takes_tools(template) and OPEN not in template and TOOL_CALLS in template:
        return MISTRAL
    if takes_tools(template) and OPEN not in template and (PYTHON_TAG in template or '"parameters": ' in template):
        return LLAMA3
    return HERMES


def call_text(name: str, arguments, syntax: str = HERMES) -> str:
    """One call as the model writes it (compact JSON, as the grammar holds it)."""
    args = arguments if isinstance(arguments, dict) else _object(arguments)
    key = "parameters" if syntax == LLAMA3 else "arguments"
    call = {"name": name, key: args if args is not None else arguments}
    if syntax == MISTRAL:
        return json.dumps([call], ensure_ascii=False)
    if syntax == HARMONY:
        return f"{HARMONY_OPEN}{name}{HARMONY_MESSAGE}{json.dumps(call['arguments'], ensure_ascii=False)}"
    body = json.dumps(call, ensure_ascii=False)
    return body if syntax == LLAMA3 else f"{OPEN}\n{body}\n{CLOSE}"


def fallback_messages(messages: Sequence[dict], tools: list[dict] | None) -> list[dict]:
    """The conversation for a template without tools: the tools in the system prompt (the given one,
    with them after it), calls as Hermes blocks in the assistant's text, tool results as user text."""
    out: list[dict] = []
    rest = list(messages)
    if tools:
        listing = FALLBACK.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        system = rest.pop(0)["content"] + "\n\n" if rest and rest[0].get("role") == "system" else ""
        out.append({"role": "system", "content": system + listing})
    for message in rest:
        role, content = message.get("role"), message.get("content") or ""
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "tool_results": True})
            continue
        calls = [
            call_text(c["function"]["name"], c["function"].get("arguments")) for c in message.get("tool_calls") or ()
        ]
        out.append({"role": role, "content": "\n".join(([content] if content else []) + calls)})
    return [{k: v for k, v in m.items() if k != "tool_results"} for m in out]


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # the arguments object as compact JSON text (what OpenAI's function.arguments holds)


def _object(text) -> dict | None:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _call(text: str, syntax: str) -> Call | None:
    """A call's JSON object, or None where it is not one."""
    return _call_of(_object(text.strip()), syntax)


def _call_of(found: dict | None, syntax: str) -> Call | None:
    """The call a parsed JSON object is, or None where it is not one."""
    if found is None or not isinstance(found.get("name"), str):
        return None
    keys = ("parameters", "arguments") if syntax == LLAMA3 else ("arguments", "parameters")
    args = next((found[key] for key in keys if key in found), {})
    if isinstance(args, str):
        args = _object(args)
    if not isinstance(args, dict):
        return None
    return Call(found["name"], json.dumps(args, ensure_ascii=False))


def parse_calls(text: str, syntax: str = HERMES) -> tuple[str, list[Call]]:
    """A reply's text outside its calls, and the calls (a block that does not parse is dropped)."""
    scanner = CallScanner(syntax)
    pieces = scanner.push(text) + scanner.finish()
    return "".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, Call)]


class CallScanner:
    """A streamed reply's text → its pieces: text (str) as soon as it cannot be part of a call, and each
    `Call` once its block is complete. Text that may open a call is held back; so is whitespace, until
    more text follows (at the end, whitespace is dropped where there were calls). A block that never
    becomes a call is dropped, never text (`dropped` counts them); `cut`: the reply ended inside one
    (a call the model did not finish)."""

    def __init__(self, syntax: str = HERMES) -> None:
        self.syntax = syntax
        self.buffer = ""
        self.blank = ""  # whitespace held back
        self.tried = len(OPEN)  # where in a block (the buffer) the next `</tool_call>` to try may start
        self.calls = 0
        self.dropped = 0
        self.cut = False
        self.started = False  # LLAMA3, MISTRAL: the reply's first text decided whether it is a call

    def push(self, text: str) -> list:
        self.buffer += text
        return self._read(final=False)

    def finish(self) -> list:
        out = self._read(final=True)
        if self.blank and not self.calls:
            out.append(self.blank)
        self.blank = ""
        return out

    def _read(self, final: bool) -> list:
        if self.syntax == HERMES:
            return self._hermes(final)
        return self._harmony(final) if self.syntax == HARMONY else self._whole(final)

    def _text(self, text: str, out: list) -> None:
        if not text:
            return
        stripped = text.rstrip()
        if not stripped:
            self.blank += text
            return
        out.append(self.blank + stripped)
        self.blank = text[len(stripped) :]

    def _hermes(self, final: bool) -> list:
        """A block's end is the first `</tool_call>` before which its text is a call (the JSON's own
        strings may hold the tag); a block that never becomes one is dropped (told at the end)."""
        out: list = []
        while True:
            start = self.buffer.find(OPEN)
            if start < 0:
                keep = _partial(self.buffer, OPEN)
                if final and keep and (keep > 1 or self.calls):  # the reply ended opening a call
                    self.cut = True
                elif final:
                    keep = 0
                self._text(self.buffer[: len(self.buffer) - keep], out)
                self.buffer = "" if final else self.buffer[len(self.buffer) - keep :]
                return out
            if start:
                self._text(self.buffer[:start], out)
                self.buffer, self.tried = self.buffer[start:], len(OPEN)
            call, end = None, -1
            while call is None:
                end = self.buffer.find(CLOSE, self.tried)
                if end < 0:
                    break
                call, self.tried = _call(self.buffer[len(OPEN) : end], HERMES), end + 1
            if call is None and final:
                call, end = self._unclosed()
            if call is None:
                if not final:
                    return out
                self._drop()
                continue
            self.buffer, self.tried = self.buffer[end + len(CLOSE) :], len(OPEN)
            self.blank = ""
            self.calls += 1
            out.append(call)

    def _unclosed(self) -> tuple[Call | None, int]:
        """At the end: the block as a call whose closing tag was cut (its JSON whole), and where that
        tag would begin; else (None, -1)."""
        if self.buffer.find(OPEN, 1) >= 0:
            return None, -1
        partial = _partial(self.buffer, CLOSE)
        end = len(self.buffer) - partial
        call = _call(self.buffer[len(OPEN) : end], HERMES)
        return (call, end) if call is not None else (None, -1)

    def _drop(self) -> None:
        """A block that is not a call, dropped up to its closing tag or the next block; one that runs to
        the end of the reply was cut."""
        after = self.buffer.find(OPEN, 1)
        close = self.buffer.find(CLOSE)
        if close >= 0 and (after < 0 or close < after):
            after = close + len(CLOSE)
        elif after < 0:
            after, self.cut = len(self.buffer), True
        self.dropped += 1
        self.buffer, self.tried = self.buffer[after:], len(OPEN)

    def _whole(self, final: bool = False) -> list:
        """LLAMA3 and MISTRAL: a reply that begins as a call (`{`, `[{`) is held to its end and read whole
        (dropped where it does not parse); one that does not is text as it comes."""
        out: list = []
        llama = self.syntax == LLAMA3
        head = self.buffer.lstrip().removeprefix(PYTHON_TAG if llama else TOOL_CALLS).lstrip()
        if not self.started and head and not _may_open(head, llama):
            self.started = True  # text: as it comes
        if self.started:
            self._text(self.buffer, out)
            self.buffer = ""
        elif final:
            calls = ([_call(head, LLAMA3)] if llama else _mistral_calls(head)) if head else None
            if not head:
                self._text(self.buffer, out)
            elif not calls or None in calls:
                self.dropped, self.cut = self.dropped + 1, True
            else:
                self.calls += len(calls)
                out.extend(calls)
            self.buffer = ""
        return out

    def _harmony(self, final: bool) -> list:
        """HARMONY: text up to a call's opening; the call, the reply's last message, read at its end (its
        arguments' JSON whole, else dropped as cut)."""
        out: list = []
        start = self.buffer.find(HARMONY_OPEN)
        if start < 0:
            keep = 0 if final else _partial(self.buffer, HARMONY_OPEN)
            self._text(self.buffer[: len(self.buffer) - keep], out)
            self.buffer = self.buffer[len(self.buffer) - keep :]
            return out
        self._text(self.buffer[:start], out)
        self.buffer = self.buffer[start:]
        if not final:
            return out
        name, found, arguments = self.buffer[len(HARMONY_OPEN) :].partition(HARMONY_MESSAGE)
        args = _object(arguments.strip().removesuffix("<|call|>")) if found else None
        if args is None or not name.strip():
            self.dropped, self.cut = self.dropped + 1, True
        else:
            self.calls += 1
            out.append(Call(name.strip(), json.dumps(args, ensure_ascii=False)))
        self.buffer = ""
        return out


def _may_open(head: str, llama: bool) -> bool:
    """The reply's first text (`head`, stripped) is, or may yet be, a call's opening: `{` (LLAMA3),
    `[` then `{` (MISTRAL), or the start of the tag before one (`<|python_tag|>`, `[TOOL_CALLS]`)."""
    if (PYTHON_TAG if llama else TOOL_CALLS).startswith(head):
        return True
    if llama:
        return head.startswith("{")
    return head.startswith("[") and head[1:].lstrip()[:1] in ("", "{")


def _mistral_calls(text: str) -> list | None:
    """MISTRAL: the calls of a JSON list of call objects (None where it is not one)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or not value:
        return None
    return [_call_of(item, MISTRAL) if isinstance(item, dict) else None for item in value]


def _partial(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def new_call_id(syntax: str | None) -> str:
    """A new call's id: OpenAI's shape (`call_` and 24 hex digits), or 9 letters and digits for Mistral's
    syntax, whose templates refuse any other id."""
    return uuid.uuid4().hex[:9] if syntax == MISTRAL else "call_" + uuid.uuid4().hex[:24]
