"""The forward stage: token ids → logits, appending to a KV cache (`base.ModelRunner`).

`native` (the compiled kernel, `kernels/`, its team's width learned in `team`), `lean` (the same
lean files on torch, with its cache in `lean_cache`), `hf` (transformers' own model, the
reference) and `threads` (letting go of the OpenMP teams a thread used)."""
