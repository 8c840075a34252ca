"""Hub or directory -> the store, once per model and revision: idempotent, resumable, verified.

1. Get the files: a local directory as it is, or a hub repository at an exact commit (``huggingface_hub``
   downloads into a staging directory and resumes its own partial downloads).
2. Hash them (``manifest.scan``): the content id.
3. The store already holds that content, whole: nothing to do. It holds other content at this prefix:
   refuse (a revision's prefix never changes).
4. Upload each file whose object is not already there with its size and hash (a killed run resumes
   here), then check every object, then write the manifest: the commit point. Until the manifest is
   written nothing reads the prefix, so a half-prepared model is never served.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from runtime.revision import is_pinned_revision
from runtime.weights.manifest import Manifest, WeightsError, scan
from runtime.weights.store import Store

#: Files a hub download takes: configs, tokenizers, templates and safetensors weights; no pickles.
HUB_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken", "*/*.json")
#: Fault injection for the resumability test: exit as if killed after this many uploads.
STOP_AFTER_ENV = "INFERSTACK_WEIGHTS_STOP_AFTER_UPLOADS"


@dataclass(frozen=True)
class Prepared:
    manifest: Manifest
    uploaded: tuple[str, ...]
    uploaded_bytes: int
    already_there: bool


def from_hub(repo: str, revision: str, staging: Path, token_file: str | None = None) -> Path:
    """Download ``repo`` at commit ``revision`` into ``staging`` (resuming what an earlier run left)."""
    if not is_pinned_revision(revision):
        raise WeightsError(
            f"revision {revision!r} is not a commit hash (40 hex digits): pin the exact commit"
        )
    from huggingface_hub import snapshot_download  # noqa: PLC0415 - the weights image carries it

    token = Path(token_file).read_text().strip() if token_file else None
    path = snapshot_download(
        repo_id=repo,
        revision=revision,
        local_dir=str(staging),
        allow_patterns=list(HUB_PATTERNS),
        token=token,
    )
    return Path(path)


def prepare(root: Path, store: Store, source: str) -> Prepared:
    """Put the model in ``root`` into ``store`` (see the module docstring)."""
    local = scan(root, source)
    held = store.manifest()
    if held is not None:
        if held.content_id != local.content_id:
            raise WeightsError(
                f"{store.where.uri()} already holds other weights ({held.content_id}, from {held.source or '?'}); "
                f"this is {local.content_id}: a prepared prefix never changes, prepare into a new one"
            )
        store.verify()
        return Prepared(held, (), 0, already_there=True)
    stop_after = int(os.environ.get(STOP_AFTER_ENV, "0") or 0)
    uploaded: list[str] = []
    for entry in local.files:
        if store.object_problem(local, entry.path, store.head(entry.path)) is None:
            continue  # uploaded by an earlier, interrupted run
        store.upload(str(root / entry.path), entry.path, entry.sha256)
        uploaded.append(entry.path)
        if stop_after and len(uploaded) >= stop_after:
            os._exit(137)  # as if killed: no manifest, no cleanup
    etags: dict[str, str] = {}
    for entry in local.files:
        head = store.head(entry.path)
        problem = store.object_problem(local, entry.path, head)
        if problem is not None or head is None:
            raise WeightsError(f"after upload, {problem}")
        etags[entry.path] = str(head["ETag"])
    committed = Manifest(local.files, source, etags)
    store.put_manifest(committed)
    size = sum(local.entry(p).size for p in uploaded)
    return Prepared(committed, tuple(uploaded), size, already_there=False)


def prepare_labelled(root: Path, store: Store, source: str) -> Prepared:
    """A directory made from ``source`` (a preparation Job's checkpoint, named by its input hash): when the store
    already holds what that source made, it stays (a re-run need not make the same bytes again)."""
    held = store.manifest()
    if held is not None and held.source == source:
        store.verify()
        return Prepared(held, (), 0, already_there=True)
    return prepare(root, store, source)


def prepare_from_hub(
    repo: str, revision: str, store: Store, staging: Path | None = None, token_file: str | None = None
) -> Prepared:
    """The preparation Job: skip the download when the store already holds this revision."""
    held = store.manifest()
    source = f"hub:{repo}@{revision}"
    if held is not None and held.source == source:
        store.verify()
        return Prepared(held, (), 0, already_there=True)
    with tempfile.TemporaryDirectory(prefix="inferstack-weights-") as tmp:
        root = from_hub(repo, revision, staging or Path(tmp), token_file)
        return prepare(root, store, source)
