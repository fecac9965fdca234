"""What a model folder's tokenizer files say, read without transformers: its JSON settings, its chat
template (`chat_template.jinja`, else tokenizer_config.json's; None where it has none), the end ids a
config lists; and GPT-2's byte-level alphabet, which a byte-level BPE's pieces are spelled in."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path


class UnsupportedTokenizer(ValueError):
    """The folder's tokenizer needs transformers (the message says why)."""


def byte_level() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character → byte (the printable bytes as themselves, the rest from U+0100)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def read_json(path: Path) -> dict:
    """A JSON file's object ({} where the file is not there); UnsupportedTokenizer where it does not parse."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UnsupportedTokenizer(f"{path.name} does not parse: {exc}") from None
    return data if isinstance(data, dict) else {}


def content(token) -> str:
    """A special token's text, as tokenizer_config.json writes it (a string, or an AddedToken's dict)."""
    return token.get("content", "") if isinstance(token, dict) else str(token)


def chat_template(folder: Path, settings: dict) -> str | None:
    """The folder's chat template: `chat_template.jinja`, else tokenizer_config.json's (a string, or a
    list of named templates, of which 'default'); None where it has none (a base model)."""
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = settings.get("chat_template")
    if isinstance(template, list):
        template = next(
            (t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None
        )
    return template if isinstance(template, str) and template else None


def as_ids(value) -> Iterable[int]:
    """A config's `eos_token_id`: one id, a list of them, or none."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
