"""chatcli's digests of its own files are BLAKE3: a GGUF's identity and the record of it, a cached
file's sidecar, a GGUF folder's manifest. What an older chatcli recorded as SHA-256 is still checked
(its lean files, kernel builds and folders are not made again for it), except an identity: a record
holding only "sha256" is not used, the file is hashed again, and the folders its old identity named
are swept once the new one is known."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import blake3
import pytest

from chatcli.engine.weights import gguf_convert, identity, sidecar

DAY_AGO = 1_700_000_000  # an mtime long past: the identity index records files this old


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("CHATCLI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(identity, "_seen", {})  # this process has hashed nothing yet
    return tmp_path / "cache"


def a_file(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (DAY_AGO, DAY_AGO))
    return path


def index() -> dict:
    return json.loads(identity.index_path().read_text())


def old_record(path: Path) -> None:
    """The sidecar an older chatcli wrote: size, mtime and SHA-256."""
    st = path.stat()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    sidecar.path_of(path).write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}))


@pytest.mark.parametrize("size", [0, 1000, 17 << 20])  # empty; one piece; over THREADS_ABOVE: read ahead
def test_an_identity_is_the_files_blake3_and_recorded_as_such(cache, tmp_path, size):
    data = os.urandom(size)
    path = a_file(tmp_path / "m.gguf", data)
    want = blake3.blake3(data).hexdigest()
    assert identity.identity(path) == want and len(want) == 64
    assert index() == {identity.stat_key(path.stat()): {"blake3": want, "path": str(path.resolve())}}
    assert sidecar.file_digest(path) == want


@pytest.mark.parametrize("size", [1, 4096, 4097, 5 * 4096 + 3])
def test_a_large_files_digest_read_ahead_is_its_blake3(tmp_path, monkeypatch, size):
    monkeypatch.setattr(sidecar, "THREADS_ABOVE", 0)  # every file read ahead, in pieces of 4 KiB
    monkeypatch.setattr(sidecar, "AHEAD_PIECE", 4096)
    data = os.urandom(size)
    assert sidecar.file_digest(a_file(tmp_path / "x", data)) == blake3.blake3(data).hexdigest()
    with pytest.raises(FileNotFoundError):
        sidecar.file_digest(tmp_path / "gone")


def test_a_split_models_identity_is_the_blake3_of_its_parts(cache, tmp_path):
    parts = [a_file(tmp_path / f"m-{i:05d}-of-00002.gguf", os.urandom(5000)) for i in (1, 2)]
    own = [blake3.blake3(p.read_bytes()).hexdigest() for p in parts]
    assert identity.identity(parts[0]) == blake3.blake3(("split:" + ",".join(own)).encode()).hexdigest()


def test_an_identity_recorded_as_sha256_is_not_used(cache, tmp_path):
    data = os.urandom(4096)
    path = a_file(tmp_path / "m.gguf", data)
    key = identity.stat_key(path.stat())
    old = hashlib.sha256(data).hexdigest()
    identity.index_path().parent.mkdir(parents=True)
    identity.index_path().write_text(json.dumps({key: {"sha256": old, "path": str(path.resolve())}}))
    assert identity.known(path) is None  # nothing hashed, nothing known
    assert identity.identity(path) == blake3.blake3(data).hexdigest()
    assert index() == {key: {"blake3": blake3.blake3(data).hexdigest(), "path": str(path.resolve())}}


def test_the_folders_an_old_identity_named_are_swept_once_the_new_one_is_known(cache, tmp_path):
    data = os.urandom(4096)
    path = a_file(tmp_path / "m.gguf", data)
    old = hashlib.sha256(data).hexdigest()
    identity.index_path().parent.mkdir(parents=True)
    identity.index_path().write_text(
        json.dumps({identity.stat_key(path.stat()): {"sha256": old, "path": str(path.resolve())}})
    )
    folders = []
    for kind in ("gguf", "converted"):  # as an older chatcli left them: named by the SHA-256
        folder = cache / kind / f"m-{old[: gguf_convert.KEY]}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        st = (folder / "config.json").stat()
        files = {
            "config.json": {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": hashlib.sha256(b"{}").hexdigest()}
        }
        manifest = {"format": gguf_convert.FORMAT, "source": str(path), "sources": [str(path)], "files": files}
        (folder / gguf_convert.MANIFEST).write_text(json.dumps(manifest))
        folders.append(folder)
    assert gguf_convert.sweep() == [] and all(f.is_dir() for f in folders)  # its new identity is not known yet
    assert all(gguf_convert.is_valid(f) and gguf_convert.check_folder(f)[0][1] == "" for f in folders)
    new = gguf_convert.meta_folder_for(path)  # the start hashes it
    assert new.name == f"m-{blake3.blake3(data).hexdigest()[: gguf_convert.KEY]}"
    assert sorted(gguf_convert.sweep()) == sorted(folders) and not any(f.exists() for f in folders)


def test_a_sidecar_is_blake3_and_an_older_sha256_one_still_holds(tmp_path):
    path = a_file(tmp_path / "lean.safetensors", os.urandom(70_000))
    sidecar.record(path)
    record = json.loads(sidecar.path_of(path).read_text())
    assert (
        set(record) == {"size", "mtime_ns", "blake3"}
        and record["blake3"] == blake3.blake3(path.read_bytes()).hexdigest()
    )

    old_record(path)
    os.utime(path, (DAY_AGO + 5, DAY_AGO + 5))  # another mtime: `unchanged` rehashes, with SHA-256
    assert sidecar.unchanged(path) and sidecar.check(path) == ""
    with open(path, "r+b") as f:  # other bytes, the size kept
        f.write(b"other")
    assert not sidecar.unchanged(path)
    assert "SHA-256 differs" in sidecar.check(path)


def test_a_manifest_is_blake3_and_an_older_sha256_one_still_holds(tmp_path):
    source = a_file(tmp_path / "m.gguf", b"gguf")
    folder = tmp_path / "gguf" / "m-0123456789abcdef"

    def save(_path, out, _status):
        (out / "config.json").write_text('{"a": 1}')

    gguf_convert.convert(source, folder, save=save)
    manifest = json.loads((folder / gguf_convert.MANIFEST).read_text())
    assert manifest["files"]["config.json"]["blake3"] == blake3.blake3(b'{"a": 1}').hexdigest()

    entry = manifest["files"]["config.json"]
    entry["sha256"] = hashlib.sha256(b'{"a": 1}').hexdigest()
    del entry["blake3"]
    (folder / gguf_convert.MANIFEST).write_text(json.dumps(manifest))
    os.utime(folder / "config.json", (DAY_AGO, DAY_AGO))  # another mtime: checked by its hash
    assert gguf_convert.is_valid(folder) and gguf_convert.check_folder(folder) == [(folder / "config.json", "")]
    (folder / "config.json").write_text('{"a": 2}')
    assert not gguf_convert.is_valid(folder)
    assert "SHA-256 differs" in gguf_convert.check_folder(folder)[0][1]
