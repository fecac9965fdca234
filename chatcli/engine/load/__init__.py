"""The load stage: a model name and `LoadOptions` → a ready `Engine` (`build.load_engine`).

`options` (what to load, checked), `sources` (where the files are), `lean` (an engine on a lean
runner, converting lean files where they are missing), `hf` (through transformers), `verify`
(`chatcli pull --verify`: every cached file a start reads, rehashed)."""
