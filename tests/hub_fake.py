"""A local fake of the Hugging Face hub's HTTP API, as huggingface_hub 2.x talks to it through `HF_ENDPOINT`:
the tests of models by name never reach the real hub.

The endpoints `HfApi.model_info` and `list_repo_tree` call (`/api/models/{repo}`, `…/revision/{rev}`,
`…/tree/{rev}`) and the one `hf_hub_download` / `get_hf_file_metadata` / `http_get` call
(`HEAD|GET /{repo}/resolve/{rev}/{file}`), with the headers `file_download.py` reads: `X-Repo-Commit`,
`ETag` (the git blob id) and, every file being an LFS one here, `X-Linked-Etag` (its SHA-256) and
`X-Linked-Size`; `Content-Length`, and `Range: bytes=N-` (or `N-M`) answered 206 with `Content-Range`. Errors carry
`X-Error-Code` as the hub's do (`RepoNotFound`, `EntryNotFound`, `GatedRepo`), which is how
huggingface_hub tells them apart.

What a test can arrange: a gated repository (its files need `Authorization: Bearer TOKEN`), a
connection cut after N bytes of one file's body (`cut_after`, once, on a download to the file's end;
the hub is then `down` and answers 503 to every download until a test clears it), and a look at every
request received (`requests`; `downloads` leaves out the probes of a file's first bytes).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeHub:
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    gated: dict[str, str] = field(default_factory=dict)  # repo → the token that opens it
    cut_after: dict[str, int] = field(default_factory=dict)  # file → body bytes sent before the cut (once)
    down: bool = False  # every download answers 503
    requests: list[tuple[str, str, dict]] = field(default_factory=list)  # (method, path, headers)
    url: str = ""

    def add(self, repo: str, files: dict[str, bytes], token: str | None = None) -> None:
        self.repos[repo] = files
        if token:
            self.gated[repo] = token

    def ranges(self, file: str) -> list[str]:
        """The Range headers of the downloads of `file` (GET requests, but those of its first bytes alone)."""
        gets = [h.get("range", "") for m, p, h in self.requests if m == "GET" and p.endswith("/" + file)]
        return [r for r in gets if not re.fullmatch(r"bytes=0-\d+", r)]

    def downloads(self) -> list[str]:
        """The files downloaded (GET requests, but those of a file's first bytes alone), in order."""
        gets = [(p, h.get("range", "")) for m, p, h in self.requests if m == "GET" and "/resolve/" in p]
        return [p.rsplit("/", 1)[1] for p, r in gets if not re.fullmatch(r"bytes=0-\d+", r)]


def serve_fake_hub(hub: FakeHub):
    """Start `hub` on 127.0.0.1 (a free port) in a thread: (the server, its URL)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args) -> None:
            pass

        def do_HEAD(self) -> None:
            self.answer(head=True)

        def do_GET(self) -> None:
            self.answer(head=False)

        def answer(self, head: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path, {k.lower(): v for k, v in self.headers.items()}))
            api = re.fullmatch(r"/api/models/([^/]+/[^/]+?)(?:/revision/[^/]+)?", path)
            tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/[^/]+(?:/.*)?", path)
            resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path)
            if tree:
                self.tree(tree[1])
            elif api:
                self.info(api[1])
            elif resolve:
                self.file(resolve[1], resolve[2], head)
            else:
                self.send(404, b"not found", {"X-Error-Code": "RepoNotFound"})

        def send(self, code: int, body: bytes, headers: dict | None = None, head: bool = False) -> None:
            self.send_response(code)
            for key, value in (headers or {}).items():
                self.send_header(key, str(value))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def json(self, value) -> None:
            self.send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

        def info(self, repo: str) -> None:
            if repo not in hub.repos:
                self.send(404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                return
            siblings = [
                {
                    "rfilename": name,
                    "size": len(data),
                    "blobId": git_blob_id(data),
                    "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134},
                }
                for name, data in hub.repos[repo].items()
            ]
            gated = "manual" if repo in hub.gated else False
            self.json({"id": repo, "modelId": repo, "sha": COMMIT, "private": False, "gated": gated,
                       "siblings": siblings})  # fmt: skip

        def tree(self, repo: str) -> None:
            if repo not in hub.repos:
                self.send(404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                return
            self.json([
                {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": name,
                 "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}}
                for name, data in hub.repos[repo].items()
            ])  # fmt: skip

        def file(self, repo: str, name: str, head: bool) -> None:
            files = hub.repos.get(repo)
            if files is None:
                self.send(404, b"Repository not found", {"X-Error-Code": "RepoNotFound"}, head)
                return
            common = {"X-Repo-Commit": COMMIT}
            token = hub.gated.get(repo)
            if token and self.headers.get("Authorization") != f"Bearer {token}":
                message = f"Access to model {repo} is restricted. You must have access to it and be authenticated."
                self.send(401, message.encode(), {**common, "X-Error-Code": "GatedRepo", "X-Error-Message": message},
                          head)  # fmt: skip
                return
            if name not in files:
                self.send(404, b"Entry not found", {**common, "X-Error-Code": "EntryNotFound"}, head)
                return
            data = files[name]
            headers = {
                **common,
                "ETag": f'"{git_blob_id(data)}"',
                "X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
                "X-Linked-Size": len(data),
                "Accept-Ranges": "bytes",
            }
            if head:
                self.send_response(200)
                for key, value in {**headers, "Content-Length": len(data)}.items():
                    self.send_header(key, str(value))
                self.end_headers()
                return
            if hub.down:
                self.send(503, b"Service Unavailable", common)
                return
            start, code = 0, 200
            end = len(data)
            wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if wanted:
                start, code = int(wanted[1]), 206
                end = min(end, int(wanted[2]) + 1) if wanted[2] else end
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
            body = data[start:end]
            self.send_response(code)
            for key, value in {**headers, "Content-Length": len(body)}.items():
                self.send_header(key, str(value))
            self.end_headers()
            cut = hub.cut_after.pop(name, None) if not (wanted and wanted[2]) else None  # not a header's probe
            if cut is not None:  # the connection drops mid-body, and the hub stays down
                hub.down = True
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="fake-hub", daemon=True).start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    return server
