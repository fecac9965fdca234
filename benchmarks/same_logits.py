"""chatcli's logits against llama.cpp's on the same GGUF file: does the kernel compute what llama.cpp does?

    python benchmarks/same_logits.py FILE.gguf [FILE.gguf ...]
    python benchmarks/same_logits.py --tiny gemma3_text --type Q8_0   # a tiny random file of that family

For each file, a fixed list of token ids goes through chatcli's engine (`--quantize auto`: the file's
own blocks where the kernel reads it) and through llama.cpp (llama-cpp-python, in the interpreter
`$CHATCLI_LLAMA_PYTHON` names, every position's logits); it prints the largest difference against
the largest logit and how often the two argmaxes agree. Both sides quantize the activations their own
way (chatcli int8 per 32, llama.cpp Q8_0, or Q8_K per 256 for the K-quants), so the logits differ by
that rounding; `--reference` says which side is nearer the exact result: each against the same
weights with fp32 activations (the file dequantized, `--quantize none`).
`--tiny FAMILY` writes a random model of the tests' shapes (`tests.gguf_models`) in `--type`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

IDS = [1, 5, 17, 200, 3, 99, 42, 7, 300, 511, 2, 64, 128, 256, 33, 8]

LLAMA = """
import json, sys
import numpy as np
from llama_cpp import Llama
path, ids, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
model = Llama(model_path=path, n_ctx=256, logits_all=True, verbose=False, n_threads=2, n_batch=256)
model.eval(ids)
np.save(out, np.array(model.scores[: len(ids)], dtype=np.float32))
"""


def llama_python(tool: str) -> str | None:
    """The interpreter `$CHATCLI_LLAMA_PYTHON` names (one with llama-cpp-python), else None and a line saying so."""
    python = os.environ.get("CHATCLI_LLAMA_PYTHON")
    if not python:
        print(f"{tool}: set CHATCLI_LLAMA_PYTHON to a python with llama-cpp-python", file=sys.stderr)
    return python or None


def llama_logits(python: str, path: Path, ids: list[int]) -> np.ndarray:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "logits.npy"
        subprocess.run([python, "-c", LLAMA, str(path), json.dumps(ids), str(out)], check=True)
        return np.load(out)


def chatcli_logits(path: Path, ids: list[int], quantize: str = "auto") -> tuple[np.ndarray, str]:
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions

    runner = load_engine(str(path), LoadOptions(device="cpu", quantize=quantize)).runner
    kind = getattr(getattr(runner, "config", None), "kind", type(runner).__name__)
    return runner.verify(ids, runner.new_cache()), kind


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--tiny", action="append", default=[], help="a tiny random model of this family (repeatable)")
    ap.add_argument("--type", default="Q8_0", help="--tiny's tensor type (default Q8_0)")
    ap.add_argument("--reference", action="store_true", help="each side against fp32 activations too")
    args = ap.parse_args()
    python = llama_python("same_logits")
    if not python:
        return 2
    work = Path(tempfile.mkdtemp(prefix="same-logits-"))
    files = list(args.files)
    for family in args.tiny:
        from tests.gguf_models import tiny, uniform, write_gguf

        files.append(write_gguf(tiny(family, True), work / f"tiny-{family}-{args.type}.gguf", uniform(args.type)))
    for path in files:
        ours, kind = chatcli_logits(path, IDS)
        theirs = llama_logits(python, path, IDS)
        n = min(ours.shape[-1], theirs.shape[-1])
        diff = float(np.abs(ours[:, :n] - theirs[:, :n]).max())
        top = float(np.abs(theirs).max())
        agree = float((ours[:, :n].argmax(-1) == theirs[:, :n].argmax(-1)).mean())
        print(
            f"{path.name}: chatcli ({kind}) vs llama.cpp over {len(IDS)} positions: largest difference "
            f"{diff:.4f} ({100 * diff / top:.2f} % of the largest logit {top:.2f}), argmax agrees {100 * agree:.0f} %"
        )
        if args.reference:
            exact, _ = chatcli_logits(path, IDS, quantize="none")
            for name, logits in (("chatcli", ours), ("llama.cpp", theirs)):
                off = np.abs(logits[:, :n] - exact[:, :n])
                print(
                    f"  {name} vs fp32 activations: largest {100 * off.max() / top:.2f} %, "
                    f"mean {100 * off.mean() / top:.3f} % of the largest logit"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
