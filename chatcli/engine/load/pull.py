"""Pulling a model by name: from the local cache where it is there, else from the Hugging Face hub.

Everything goes through `huggingface_hub`: its cache, its endpoint (`HF_ENDPOINT`), its token
(`HF_TOKEN`, for gated repositories). The repository is listed (`model_info` with its files' sizes and
SHA-256s), its file picked (`hub.pick`), and each part fetched: the bytes go into the cache's
`blobs/<sha256>.incomplete` and survive an interruption, the next pull resuming from there with a range
request (huggingface_hub 2.x restarts an interrupted file from zero); the whole file is checked against
the hub's SHA-256 before it is moved into place, and `hf_hub_download` links it into the snapshot.

A name on disk is used with no network at all; one that is not is pulled only where the hub answers
(`unreachable`, a quick probe): offline it is one line at once. Every failure is one `LoadError` line.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

from chatcli.engine.load.hub import Choice, Ref, catalogue, choices, local_choice, parse, pick, remember, repo_folder
from chatcli.engine.load.options import LoadError
from chatcli.engine.load.refuse import HEAD_BYTES, architecture_of, refusal
from chatcli.engine.weights import Status
from chatcli.errors import one_line


def model_file(
    name: str, status: Status, unreachable: Callable[[], str | None], runner: str = "auto"
) -> tuple[Path, str]:
    """The GGUF `name` stands for (a split model's first part) and the name it is shown by: from the
    local cache, else pulled where `unreachable()` finds no reason the hub cannot be asked (and, but
    for `--runner hf`, where its architecture runs)."""
    ref = parse(name)
    if ref is None:
        import difflib

        close = difflib.get_close_matches(name.strip().lower(), catalogue(), n=3)
        raise LoadError(
            f"{name}: not a model name chatcli knows"
            + (f" (did you mean {', '.join(close)}?)" if close else "")
            + "; names: the catalogue's (chatcli models --catalogue), hf.co/USER/REPO[:QUANT] or USER/REPO:QUANT"
        )
    found = local_choice(ref, name.strip())
    if found is None:
        why = unreachable()
        if why:
            raise LoadError(
                f"{name} is not on disk, and the hub cannot be asked for it: {why}. "
                "`chatcli models` lists the models on disk"
            )
        found = pull(ref, status, runner)
    chosen, paths = found
    shown = ref.shown(chosen.quant)
    remember(ref.repo, chosen.files[0], shown, name.strip())
    return paths[0], shown


def pull(ref: Ref, status: Status, runner: str = "auto") -> tuple[Choice, list[Path]]:
    """Pull the model `ref` names into the cache: its repository listed, its file picked, its architecture
    checked from the file's first bytes (not with `--runner hf`), each part fetched."""
    from huggingface_hub import HfApi

    status(f"Asking the hub for {ref.repo}")
    try:
        info = HfApi().model_info(ref.repo, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - one line, whatever huggingface_hub raised
        raise LoadError(hub_error(ref.repo, exc)) from None
    siblings = info.siblings or []
    chosen = pick(choices({s.rfilename: s.size or 0 for s in siblings}), ref.quant, exact=False)
    if chosen is None:
        raise LoadError(f"{ref.repo} holds no GGUF file chatcli can pick (chatcli pulls GGUF models)")
    if chosen.quant != ref.quant:
        status(f"{ref.repo} has no {ref.quant}: taking {chosen.quant or chosen.files[0]}, the nearest")
    why = refusal(chosen.files[0], remote_architecture(ref.repo, chosen.files[0])) if runner != "hf" else None
    if why:
        raise LoadError(f"{why}. Nothing was pulled")
    hashes = {s.rfilename: s.lfs.sha256 for s in siblings if s.lfs is not None}
    paths = [
        fetch(ref.repo, part, hashes.get(part), status, f" ({i}/{len(chosen.files)})" if len(chosen.files) > 1 else "")
        for i, part in enumerate(chosen.files, 1)
    ]
    return chosen, paths


def remote_architecture(repo: str, file: str) -> str | None:
    """A file's `general.architecture` from its first bytes on the hub (a range request), or None where
    they cannot be had (the pull then says why, or the loader checks the file)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    head = b""
    try:
        headers = {**build_hf_headers(), "Range": f"bytes=0-{HEAD_BYTES - 1}"}
        with get_session().stream("GET", hf_hub_url(repo, file), headers=headers, follow_redirects=True) as got:
            if got.status_code not in (200, 206):
                return None
            for chunk in got.iter_bytes():  # a server that sends the whole file: only its head is read
                head += chunk
                if len(head) >= HEAD_BYTES:
                    break
    except Exception:  # noqa: BLE001 - not known; the pull that follows reports a hub that fails
        return None
    return architecture_of(head)


def fetch(repo: str, file: str, sha256: str | None, status: Status, part: str = "") -> Path:
    """One file of `repo` into the cache, resumed from an interrupted pull's bytes, checked against the
    hub's SHA-256 (`sha256`, else the file's ETag, which is its SHA-256); its path in the snapshot."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.utils import WeakFileLock

    try:
        meta = get_hf_file_metadata(hf_hub_url(repo, file))
    except Exception as exc:  # noqa: BLE001 - one line
        raise LoadError(hub_error(repo, exc)) from None
    blob = repo_folder(repo) / "blobs" / str(meta.etag)
    if not blob.exists():
        partial = blob.with_name(blob.name + ".incomplete")
        partial.parent.mkdir(parents=True, exist_ok=True)
        with WeakFileLock(str(partial) + ".lock"):  # two pulls of one file: the second waits, then finds it
            if not blob.exists():
                _download(meta, partial, f"{file}{part}", status)
                _check(partial, sha256 or _sha256_etag(meta.etag), file, status)
                os.replace(partial, blob)
    try:  # the blob is there: huggingface_hub links it into the snapshot (and refs/main) itself
        return Path(hf_hub_download(repo, file))
    except Exception as exc:  # noqa: BLE001 - one line
        raise LoadError(hub_error(repo, exc)) from None


def _download(meta, partial: Path, file: str, status: Status) -> None:
    """The file's bytes appended to `partial` from where it ends (a range request), with progress."""
    from urllib.parse import urlsplit

    from huggingface_hub import constants
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers()
    if urlsplit(meta.location).netloc != urlsplit(constants.ENDPOINT).netloc:
        headers.pop("authorization", None)  # a CDN's signed URL: the token stays with the hub
    log = logging.getLogger("huggingface_hub.file_download")  # its retries' warnings: the status says it
    with open(partial, "ab") as f:
        have, level = f.tell(), log.level
        if meta.size is not None and have > meta.size:
            f.truncate(0)
            have = 0
        try:
            log.setLevel(logging.ERROR)
            http_get(meta.location, f, resume_size=have, headers=headers, expected_size=meta.size,
                     tqdm_class=progress(f"Pulling {file}: MiB", status))  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - the bytes so far (in 10 MiB chunks) stay for the next pull
            f.flush()
            got = partial.stat().st_size
            raise LoadError(
                f"pulling {file} stopped at {got / 2**20:,.1f} of "
                f"{(meta.size or 0) / 2**20:,.1f} MiB: {one_line(exc)}. Run it again to resume"
            ) from None
        finally:
            log.setLevel(level)


def _check(partial: Path, sha256: str | None, file: str, status: Status) -> None:
    """The whole file's SHA-256 against the hub's: a mismatch removes it (the next pull starts afresh)."""
    from chatcli.engine.weights.sidecar import file_sha256

    if not sha256:
        return
    status(f"Checking {file} against the hub's SHA-256")
    if file_sha256(partial) != sha256.lower():
        partial.unlink(missing_ok=True)
        raise LoadError(f"{file}: the bytes pulled do not match the hub's SHA-256; removed. Pull it again")


def _sha256_etag(etag: str | None) -> str | None:
    return etag if etag and re.fullmatch(r"[0-9a-fA-F]{64}", etag) else None


def progress(text: str, status: Status):
    """A progress bar class for huggingface_hub's `http_get`: each MiB goes to `status(text, done, total)`."""

    class Bar:
        def __init__(self, *, total=None, initial=0, **_kw) -> None:
            self.total, self.n, self._shown = total, initial, -1
            self._show()

        def __enter__(self):
            return self

        def __exit__(self, *_exc) -> bool:
            return False

        def update(self, n: int) -> None:
            self.n += n
            self._show()

        def _show(self) -> None:
            if self.n >> 20 != self._shown:
                self._shown = self.n >> 20
                status(text, self._shown, (self.total >> 20) if self.total else None)

    return Bar


def hub_error(repo: str, exc: BaseException) -> str:
    """What went wrong asking the hub for `repo`, in one line (a gated or private one names HF_TOKEN)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    token = " (HF_TOKEN is set: its account has no access)" if os.environ.get("HF_TOKEN") else ""
    if isinstance(exc, GatedRepoError):
        return (
            f"{repo} is gated: accept its terms at {constants.ENDPOINT}/{repo}, then set HF_TOKEN to a token "
            f"of that account{token}"
        )
    code = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, RepositoryNotFoundError) or code in (401, 403):
        return f"{repo}: no such model on the hub, or a private one (set HF_TOKEN to a token with access){token}"
    if isinstance(exc, HfHubHTTPError):
        return f"{repo}: the hub answered {code}: {one_line(exc)}"
    return f"{repo}: the hub could not be asked: {one_line(exc)}"
