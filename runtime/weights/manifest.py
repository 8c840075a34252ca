"""What identifies a model's weights: every file with its size and SHA-256, and one content id over them.

Two copies with the same content id are the same model, byte for byte; that is what makes a cache hit
provably right. The safetensors index (``model.safetensors.index.json``) is one of the files, and every
shard it names must be there. Pickle formats (``.bin``, ``.pt``, ...) are left out: engines load
safetensors, and a pickle runs code when loaded.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

MANIFEST_NAME = "inferstack-weights.json"
FORMAT = 1
INDEX_NAME = "model.safetensors.index.json"
#: Weight formats that are not safetensors: never copied into the store (engines load safetensors).
SKIPPED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx", ".pkl")
CHUNK = 8 << 20
TRTLLM_ENGINE_SUFFIX = ".engine"
"""A TensorRT-LLM engine (trtllm-build's rank<N>.engine files): what a version's trtllm-build preparation stores."""


class WeightsError(Exception):
    """Weights that are missing, incomplete or not what the manifest says: one line for a person."""


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, '/'-separated
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """A prepared model: its files, where they came from, and (in the store) each object's ETag."""

    files: tuple[FileEntry, ...]
    source: str = ""
    etags: dict[str, str] = field(default_factory=dict)

    @property
    def content_id(self) -> str:
        return content_id(self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def entry(self, path: str) -> FileEntry:
        return next(f for f in self.files if f.path == path)

    def to_json(self) -> str:
        return (
            json.dumps(
                {
                    "format": FORMAT,
                    "content_id": self.content_id,
                    "source": self.source,
                    "total_bytes": self.total_bytes,
                    "files": [asdict(f) for f in self.files],
                    "etags": dict(sorted(self.etags.items())),
                },
                indent=2,
            )
            + "\n"
        )

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Manifest:
        try:
            doc: dict[str, Any] = json.loads(text)
            files = tuple(FileEntry(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in doc["files"])
            manifest = cls(
                files, str(doc.get("source", "")), {str(k): str(v) for k, v in doc["etags"].items()}
            )
            stated = doc["content_id"]
        except (ValueError, KeyError, TypeError) as exc:
            raise WeightsError(f"{where}: not an inferstack weights manifest ({exc})") from None
        if stated != manifest.content_id:
            raise WeightsError(
                f"{where}: its content id {stated} does not match its file list; it was edited"
            )
        for entry in manifest.files:
            check_relative(entry.path, where)
        return manifest


def check_relative(path: str, where: str) -> None:
    """A manifest path names a file under the model directory: the manifest comes from the store, and whoever
    can write there must not make a node cache fill write (or a hit read) anywhere else on the node."""
    parts = PurePosixPath(path).parts
    if (
        not path
        or path.startswith("/")
        or "\\" in path
        or "\0" in path
        or any(part in ("..", ".") for part in parts)
        or path != "/".join(parts)
    ):
        raise WeightsError(
            f"{where}: file path {path!r} is not a plain relative path inside the model directory (no '..', "
            "'.', leading '/', backslash or empty part): the manifest was not written by the weights "
            "preparation; prepare the model again"
        )


def inside(directory: Path, path: str, where: str) -> Path:
    """``directory / path`` once it is certain to stay in ``directory`` with every symlink followed: a symlink
    left in a cache directory must not carry a write out of it."""
    check_relative(path, where)
    base = directory.resolve()
    target = (directory / path).resolve()
    if not target.is_relative_to(base):
        raise WeightsError(
            f"{where}: file path {path!r} resolves to {target}, outside {base} (a symlink on the way): "
            f"remove {directory} and fetch again"
        )
    return directory / path


def content_id(files: Iterable[FileEntry]) -> str:
    """sha256 over every file's path, size and hash, in path order."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        digest.update(f"{f.path}\0{f.size}\0{f.sha256}\n".encode())
    return f"sha256:{digest.hexdigest()}"


def sha256_of(stream: BinaryIO) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def model_files(root: Path) -> list[Path]:
    """The files of a model directory that go into the store: no hidden files, no pickles, no manifest."""
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or any(part.startswith(".") for part in rel.parts):
            continue
        if path.name == MANIFEST_NAME or path.suffix in SKIPPED_SUFFIXES:
            continue
        out.append(path)
    return out


def scan(root: Path, source: str = "") -> Manifest:
    """Hash every model file under ``root``; refuse a directory that holds no complete safetensors model."""
    if not root.is_dir():
        raise WeightsError(f"{root}: not a directory")
    entries = []
    for path in model_files(root):
        with path.open("rb") as fh:
            sha, size = sha256_of(fh)
        rel = path.relative_to(root).as_posix()
        if rel.endswith(".safetensors"):
            check_safetensors(path, f"{root}/{rel}")
        entries.append(FileEntry(rel, size, sha))
    manifest = Manifest(tuple(entries), source)
    check_complete(manifest, str(root))
    if (root / INDEX_NAME).is_file():
        check_index((root / INDEX_NAME).read_bytes(), {f.path for f in entries}, str(root))
    return manifest


def check_complete(manifest: Manifest, where: str) -> None:
    """A model (or a LoRA adapter) has safetensors weights (or, built by a preparation Job, TensorRT-LLM engine
    files), and every shard its index names is among its files."""
    names = {f.path for f in manifest.files}
    if not any(n.endswith((".safetensors", TRTLLM_ENGINE_SUFFIX)) for n in names):
        raise WeightsError(
            f"{where}: no .safetensors weights (engines load safetensors only; a TensorRT-LLM engine build "
            f"leaves rank<N>{TRTLLM_ENGINE_SUFFIX} files)"
        )
    if "config.json" not in names and "adapter_config.json" not in names:
        raise WeightsError(
            f"{where}: no config.json (nor a LoRA adapter's adapter_config.json): not a model directory"
        )


def check_index(index_text: bytes, names: set[str], where: str) -> None:
    """Every shard ``model.safetensors.index.json`` maps a tensor to is present."""
    try:
        shards = set(json.loads(index_text)["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WeightsError(f"{where}/{INDEX_NAME}: not a safetensors index ({exc})") from None
    missing = sorted(shards - names)
    if missing:
        raise WeightsError(f"{where}: {INDEX_NAME} names shards that are missing: {', '.join(missing)}")


def check_safetensors(path: Path, where: str) -> None:
    """A safetensors file's header accounts for exactly its size: a truncated or padded file fails."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise WeightsError(f"{where}: {size} bytes is too short for a safetensors file (truncated)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(size - 8, 100 << 20):
            raise WeightsError(
                f"{where}: its header length {header_len} exceeds the file (truncated or not safetensors)"
            )
        try:
            header = json.loads(fh.read(header_len))
        except ValueError:
            raise WeightsError(f"{where}: its safetensors header is not JSON (corrupt)") from None
    ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
    expected = 8 + header_len + max(ends, default=0)
    if expected != size:
        raise WeightsError(
            f"{where}: the header describes {expected} bytes but the file has {size} (truncated or corrupt)"
        )
