"""The store -> a node's local disk, once per node and revision, shared by every replica on the node.

Layout under the cache root (the node's NVMe, mounted into each engine pod):

    <root>/<bucket>/<prefix>/            a complete copy: the files and the manifest they were checked against
    <root>/<bucket>/<prefix>.partial/    a fill in progress (resumed by the next fill)
    <root>/<bucket>/<prefix>.lock        held while filling: a second replica waits, then finds it complete

A copy is complete only once renamed into place, after every file's SHA-256 matched the manifest. A hit
reads nothing from S3 (a prefix is pinned to one revision, so its content cannot change) and checks the
copy's sizes and safetensors headers first: a truncated file is fetched again, never loaded.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from runtime.weights.manifest import CHUNK, MANIFEST_NAME, Manifest, WeightsError, check_safetensors, inside
from runtime.weights.store import Store

LOCK_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Filled:
    path: Path
    fetched_bytes: int
    hit: bool


def cache_dir(root: Path, store: Store) -> Path:
    return root / store.where.bucket / store.where.prefix


def _local_problem(directory: Path) -> str | None:
    """Why a copy in the cache cannot be loaded as it is (None when it can)."""
    try:
        manifest = Manifest.from_json((directory / MANIFEST_NAME).read_bytes(), str(directory))
    except OSError:
        return f"{directory} has no {MANIFEST_NAME}"
    except WeightsError as exc:
        return str(exc)
    for entry in manifest.files:
        try:
            path = inside(directory, entry.path, str(directory))
        except WeightsError as exc:
            return str(exc)
        if not path.is_file() or path.stat().st_size != entry.size:
            return f"{path} is missing or not {entry.size} bytes"
        if entry.path.endswith(".safetensors"):
            try:
                check_safetensors(path, str(path))
            except WeightsError as exc:
                return str(exc)
    return None


def _fetch_file(store: Store, manifest: Manifest, path: str, target: Path) -> int:
    """Copy one object, hashing as it streams; a file already there with the right hash is kept."""
    entry = manifest.entry(path)
    if target.is_file() and target.stat().st_size == entry.size:
        digest = hashlib.sha256()
        with target.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
        if digest.hexdigest() == entry.sha256:
            return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    body = store.download(path)
    with target.open("wb") as out:
        while chunk := body.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    if size != entry.size or digest.hexdigest() != entry.sha256:
        target.unlink()
        raise WeightsError(
            f"{store.where.uri(path)}: got {size} bytes with sha256 {digest.hexdigest()[:12]}..., the manifest "
            f"says {entry.size} bytes, {entry.sha256[:12]}...: the store object is corrupt or was replaced; "
            "run the preparation again to repair it"
        )
    return size


def fill(root: Path, store: Store, wait_s: float = LOCK_TIMEOUT_S) -> Filled:
    """The local copy of ``store``'s model under ``root``, fetched only if this node has none."""
    final = cache_dir(root, store)
    final.parent.mkdir(parents=True, exist_ok=True)
    with (final.parent / f"{final.name}.lock").open("w") as lock:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise WeightsError(f"{final}: another fill held the lock for {wait_s:.0f}s") from None
                time.sleep(0.2)
        if final.is_dir() and _local_problem(final) is None:
            return Filled(final, 0, hit=True)
        manifest = store.require_manifest()
        partial = final.parent / f"{final.name}.partial"
        if final.exists():  # an earlier copy that no longer checks out (truncated, half-deleted)
            shutil.rmtree(final)
        # Every target is checked before the first byte is written: a symlink in a resumed .partial is refused.
        targets = {f.path: inside(partial, f.path, store.where.uri()) for f in manifest.files}
        fetched = sum(_fetch_file(store, manifest, path, target) for path, target in targets.items())
        (partial / MANIFEST_NAME).write_text(manifest.to_json())
        problem = _local_problem(partial)
        if problem is not None:
            raise WeightsError(problem)
        partial.rename(final)
        return Filled(final, fetched, hit=False)
