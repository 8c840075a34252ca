"""A model hub on loopback, answering the way the Hugging Face hub does for one pinned revision.

There is no hub here (nothing may leave the machine), so the cold-start benchmark's "hub download" path
downloads from this: ``huggingface_hub`` (``HF_ENDPOINT=http://127.0.0.1:PORT``) asks
``GET /api/models/{repo}/revision/{rev}`` for the file list, then ``HEAD`` and ``GET``
``/{repo}/resolve/{rev}/{file}`` for each file, reading ``X-Repo-Commit``, ``ETag`` and ``Content-Length``
as it does from the real hub. Bytes sent are counted. Plain HTTP on 127.0.0.1: the real hub's TLS, CDN and
rate limits are not modelled, which makes this path look better than it is.

    python -m bench.coldstart.hub_server --port P --repo org/name --revision <40 hex> --dir MODEL_DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

CHUNK = 1 << 20


class Hub:
    def __init__(self, repo: str, revision: str, root: Path) -> None:
        self.repo, self.revision, self.root = repo, revision, root
        self.files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        self.sent = 0
        self.lock = threading.Lock()
        self._ids = {name: self._ids_of(root / name) for name in self.files}

    @staticmethod
    def _ids_of(path: Path) -> tuple[str, str | None]:
        """(git blob id, LFS sha256 for weights): the hub's ETag is the LFS hash for LFS files, else the blob id."""
        data = path.read_bytes()
        blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data, usedforsecurity=False).hexdigest()
        lfs = hashlib.sha256(data).hexdigest() if path.suffix == ".safetensors" else None
        return blob, lfs

    def etag(self, name: str) -> str:
        blob, lfs = self._ids[name]
        return lfs or blob

    def tree(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for name in self.files:
            blob, lfs = self._ids[name]
            size = (self.root / name).stat().st_size
            entry: dict[str, object] = {"type": "file", "path": name, "size": size, "oid": blob}
            if lfs:
                entry["lfs"] = {"oid": lfs, "size": size, "pointerSize": 134}
            out.append(entry)
        return out

    def info(self) -> dict[str, object]:
        return {
            "id": self.repo,
            "modelId": self.repo,
            "sha": self.revision,
            "private": False,
            "gated": False,
            "disabled": False,
            "siblings": [{"rfilename": f} for f in self.files],
        }


def handler(hubs: Sequence[Hub]) -> type[BaseHTTPRequestHandler]:
    """Requests for each repository go to its ``Hub`` (``huggingface_hub`` reads HF_ENDPOINT once per process,
    so every repository a benchmark downloads is served from one address)."""

    def find(path: str) -> Hub | None:
        return next((h for h in hubs if path.startswith((f"/{h.repo}/", f"/api/models/{h.repo}/"))), None)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def _file(self) -> tuple[Hub, str] | None:
            path = unquote(urlparse(self.path).path)
            hub = find(path)
            if hub is None:
                return None
            prefix = f"/{hub.repo}/resolve/{hub.revision}/"
            name = path.removeprefix(prefix)
            return (hub, name) if path.startswith(prefix) and name in hub.files else None

        def _headers(self, hub: Hub, name: str) -> None:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Length", str((hub.root / name).stat().st_size))
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("ETag", f'"{hub.etag(name)}"')
            self.send_header("X-Repo-Commit", hub.revision)
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()

        def do_HEAD(self) -> None:
            found = self._file()
            if found is None:
                self.send_error(HTTPStatus.NOT_FOUND)
                return
            self._headers(*found)

        def do_GET(self) -> None:
            path = urlparse(self.path).path
            hub = find(path)
            api = f"/api/models/{hub.repo}/" if hub else ""
            if hub is not None and path.startswith((f"{api}revision/", f"{api}tree/")):
                body = json.dumps(hub.info() if "/revision/" in path else hub.tree()).encode()
                self.send_response(HTTPStatus.OK)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            found = self._file()
            if found is None:
                self.send_error(HTTPStatus.NOT_FOUND)
                return
            hub, name = found
            self._headers(hub, name)
            with (hub.root / name).open("rb") as fh:
                while chunk := fh.read(CHUNK):
                    self.wfile.write(chunk)
                    with hub.lock:
                        hub.sent += len(chunk)

    return Handler


def serve(port: int, *hubs: Hub) -> ThreadingHTTPServer:
    """Serve ``hubs`` (one repository each) in a thread; ``shutdown()`` stops it."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler(hubs))
    threading.Thread(target=server.serve_forever, name="hub", daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args()
    server = serve(args.port, Hub(args.repo, args.revision, args.dir))
    threading.Event().wait()
    server.shutdown()


if __name__ == "__main__":
    main()
