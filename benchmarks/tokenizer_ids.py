"""chatcli's GGUF tokenizer against llama.cpp's on the same file: the same ids, case by case.

    CHATCLI_LLAMA_PYTHON=/path/to/venv/bin/python python benchmarks/tokenizer_ids.py FILE.gguf [FILE.gguf ...]

chatcli's side is `gguf_meta.build_tokenizer(GGUFFile(path))`, written out as tokenizer.json and read
back (what the engine's `FolderTokenizer` reads), encoded as the engine encodes a rendered chat
(`FolderTokenizer.encode`: no BOS, special tokens written in the text matched). llama.cpp's is
llama-cpp-python's `Llama(vocab_only=True).tokenize(text, add_bos=False, special=True)` (its
`parse_special`: control and unknown tokens written in the text are matched, as `tokenizers` matches
special tokens; user-defined ones are matched either way), run in a child process with
`$CHATCLI_LLAMA_PYTHON` (else this interpreter where it has `llama_cpp`). Each case of `CASES` is
compared alone, then all of them joined by newlines; a difference prints the first differing
position with the tokens around it. Exits 1 on any difference, 2 where a side could not tokenize a
file (or there is no llama-cpp-python).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# (name, text): one case a line of the report; the whole text is them joined by "\n"
CASES = [
    ("english", "Hello, world! I'm sure you'll see they've done it; don't we? I'LL say IT'S fine."),
    ("numbers", "Pay 12345 dollars, 3.14 of them, 1,000,000 in all; 2026-12-06 at 07:45 and 0.5%."),
    ("code", "def add(a, b):\n    return a + b\n\n\tif x == 1:\n\t\ty = [i ** 2 for i in range(10)]\n"),
    ("code-braces", "for (int i = 0; i < n; ++i) {\n    sum += a[i];  // accumulate\n}\n"),
    ("french", "Ça va très bien, merci ! L'été où j'ai vu l'élève était déjà passé."),
    ("german", "Grüße aus München: Die Straße ist schön, aber der Fußgängerüberweg fehlt."),
    ("chinese", "你好，世界！我们今天学习中文，天气很好。"),
    ("japanese", "日本語のテキストです。カタカナとひらがな、漢字を混ぜます。"),
    ("russian", "Привет, мир! Как дела? Всё хорошо, спасибо."),
    ("arabic", "مرحبا بالعالم! كيف حالك؟ ١٢٣ ٤٥٦"),
    ("emoji", "Nice 😀👍🏽 work 🎉🇫🇷 ok ❤️ family 👨‍👩‍👧"),
    ("spaces", "a  b   c    d     e\t f \t g   "),
    ("newlines", "end of one\n\n\nstart of two\r\n\r\nthree \n  \n four"),
    ("special", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
    ("special-glued", "x<|im_start|>y <|endoftext|> z<|im_end|><|im_start|>"),
    ("punctuation", 'Wait... what?! (yes) -- "quoted" $100 + 5 <= 7 ^ ~x | y; a_b, c.d/e@f#g ***bold*** ```py'),
    ("contractions", "IT'S We'Re THEY'VE you'D I'm o'clock rock'n'roll 'ſ 'K"),
    ("digits", "x1 y22 333 4444 55555 666666 v1.2.3 0x1F ½ ² ١٢٣ x١٢ 一二三"),
    ("mixed", "don't  I'LL x=a_b+c;   ünïcödé émoji👍 ١٢٣ 6789012 'S 'tis"),
]
TEXT = "\n".join(text for _, text in CASES)

_LLAMA = r"""
import json, sys
from llama_cpp import Llama
job = json.load(sys.stdin)
llm = Llama(model_path=job["path"], vocab_only=True, verbose=False)
print(json.dumps([llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in job["texts"]]))
"""


def llama_ids(python: str, path: str, texts: list[str]) -> list[list[int]]:
    job = json.dumps({"path": path, "texts": texts})
    out = subprocess.run([python, "-c", _LLAMA], input=job, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"llama.cpp could not tokenize {path}: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def piece(tok, i: int) -> str:
    return repr(tok.decode([i], skip_special_tokens=False))


def report_difference(tok, ours: list[int], theirs: list[int], indent: str = "    ") -> None:
    at = next((k for k, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    print(f"{indent}first difference at token {at} (chatcli {len(ours)} tokens, llama.cpp {len(theirs)})")
    lo = max(0, at - 3)
    for name, ids in (("chatcli  ", ours), ("llama.cpp", theirs)):
        window = ids[lo : at + 5]
        shown = " ".join(f"{i}:{piece(tok, i)}" for i in window)
        print(f"{indent}{name} [{lo}:{lo + len(window)}] {shown}")


def check(path: str, python: str) -> bool | None:
    from tokenizers import Tokenizer

    from chatcli.engine.weights import gguf_meta
    from chatcli.engine.weights.gguf_file import GGUFFile

    f = GGUFFile(path)
    pre = f.fields.get("tokenizer.ggml.pre")
    print(f"{path}\n  tokenizer.ggml.model {f.fields.get('tokenizer.ggml.model')!r}, tokenizer.ggml.pre {pre!r}")
    built = gguf_meta.build_tokenizer(f)
    if built is None:
        print("  chatcli: build_tokenizer does not know this tokenizer (left to transformers)")
        return None
    tok = Tokenizer.from_str(built.to_str())
    texts = [text for _, text in CASES] + [TEXT]
    theirs = llama_ids(python, path, texts)
    ours = [tok.encode(text, add_special_tokens=False).ids for text in texts]
    same = True
    for (name, _), a, b in zip([*CASES, ("whole text", TEXT)], ours, theirs, strict=True):
        equal = a == b
        same &= equal
        print(f"  {name:14s} {'same' if equal else 'DIFFERENT'} ({len(a)} tokens{'' if equal else f' vs {len(b)}'})")
        if not equal:
            report_difference(tok, a, b)
    print(f"  => {'the same ids' if same else 'ids differ'}")
    return same


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", nargs="+", help="GGUF files to tokenize")
    args = ap.parse_args()
    from chatcli.bench.baseline import llama_python

    python = llama_python()
    if python is None:
        print("no llama-cpp-python: set CHATCLI_LLAMA_PYTHON to an interpreter that has it", file=sys.stderr)
        return 2
    results = []
    for path in args.gguf:
        try:
            results.append(check(str(Path(path)), python))
        except RuntimeError as e:
            print(f"  {e}")
            results.append(None)
    if any(r is False for r in results):
        return 1
    return 2 if any(r is None for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
