"""Where file contents live: a directory (``make local``, a cluster you bring) or an S3 prefix (EKS).

Both write whole objects atomically (a temporary file renamed into place, fsynced; an S3 PUT or a
completed multipart upload), so a crash leaves an object either absent or complete, and writing the same
key twice leaves the second copy. An upload is written as it arrives (:meth:`Blobs.writer`): no more than
:data:`CHUNK_BYTES` (a file) or :data:`PART_BYTES` (S3) of it is held in memory. Blocking calls run in
threads; the event loop never waits on the disk or on S3.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

from runtime.config import BATCH_BUCKET_ENV, S3Files

CHUNK_BYTES = 1 << 20
#: One part of an S3 multipart upload (S3 takes 5 MiB at least, but for the last).
PART_BYTES = 8 << 20


class BlobError(Exception):
    """The store could not be reached or refused; the message says which object and why."""


class BlobWriter(Protocol):
    """One object written piece by piece: it exists once :meth:`commit` returns, never after :meth:`abort`."""

    async def write(self, data: bytes) -> None: ...
    async def commit(self) -> None: ...
    async def abort(self) -> None: ...


class Blobs(Protocol):
    def writer(self, key: str) -> BlobWriter: ...
    async def put_bytes(self, key: str, data: bytes) -> None: ...
    async def put_file(self, key: str, path: Path) -> None: ...
    async def read(self, key: str) -> bytes: ...
    def chunks(self, key: str) -> AsyncIterator[bytes]: ...
    async def size(self, key: str) -> int: ...
    async def delete(self, key: str) -> None: ...
    async def check(self) -> None: ...


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Pieces:
    """Pieces written to a blob, handed on in batches of ``size`` bytes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.parts: list[bytes] = []
        self.held = 0

    def add(self, data: bytes) -> bytes | None:
        self.parts.append(data)
        self.held += len(data)
        return self.take() if self.held >= self.size else None

    def take(self) -> bytes:
        data = b"".join(self.parts)
        self.parts, self.held = [], 0
        return data


class LocalWriter:
    """A temporary file beside the object, renamed into place (fsynced) on commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp")
        self._file: Any = None
        self._pieces = _Pieces(CHUNK_BYTES)

    def _append(self, data: bytes) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.tmp.open("wb")
        self._file.write(data)

    async def write(self, data: bytes) -> None:
        batch = self._pieces.add(data)
        if batch is not None:
            await asyncio.to_thread(self._append, batch)

    def _commit(self, rest: bytes) -> None:
        self._append(rest)
        f, self._file = self._file, None
        with f:
            f.flush()
            os.fsync(f.fileno())
        self.tmp.replace(self.path)
        _fsync_dir(self.path.parent)

    async def commit(self) -> None:
        await asyncio.to_thread(self._commit, self._pieces.take())

    def _abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.tmp.unlink(missing_ok=True)

    async def abort(self) -> None:
        self._pieces.take()
        await asyncio.to_thread(self._abort)


class LocalBlobs:
    """Objects as files under ``root`` (key ``a/b`` -> ``root/a/b``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise BlobError(f"key {key!r} leaves the store")
        return path

    def _put(self, key: str, write: Any) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with tmp.open("wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
        _fsync_dir(path.parent)

    def writer(self, key: str) -> LocalWriter:
        return LocalWriter(self._path(key))

    async def put_bytes(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._put, key, lambda f: f.write(data))

    async def put_file(self, key: str, path: Path) -> None:
        def copy(f: Any) -> None:
            with path.open("rb") as src:
                while chunk := src.read(CHUNK_BYTES):
                    f.write(chunk)

        await asyncio.to_thread(self._put, key, copy)

    async def read(self, key: str) -> bytes:
        try:
            return await asyncio.to_thread(self._path(key).read_bytes)
        except FileNotFoundError:
            raise BlobError(f"{key}: no such object") from None

    async def chunks(self, key: str) -> AsyncIterator[bytes]:
        try:
            f = await asyncio.to_thread(self._path(key).open, "rb")
        except FileNotFoundError:
            raise BlobError(f"{key}: no such object") from None
        try:
            while chunk := await asyncio.to_thread(f.read, CHUNK_BYTES):
                yield chunk
        finally:
            f.close()

    async def size(self, key: str) -> int:
        try:
            return (await asyncio.to_thread(self._path(key).stat)).st_size
        except FileNotFoundError:
            raise BlobError(f"{key}: no such object") from None

    async def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(self._path(key).unlink)

    async def check(self) -> None:
        if not os.access(self.root, os.W_OK):
            raise BlobError(f"{self.root} is not writable")


class S3Blobs:
    """Objects under ``s3://bucket/prefix``, through boto3 (credentials from the pod's identity: EKS Pod
    Identity, or the usual environment)."""

    def __init__(self, files: S3Files) -> None:
        import boto3  # noqa: PLC0415 - only the S3 store needs it
        from botocore.config import Config  # noqa: PLC0415

        bucket = files.bucket or os.environ.get(BATCH_BUCKET_ENV, "")
        if not bucket:
            raise BlobError(f"batches.s3.bucket is not set and neither is ${BATCH_BUCKET_ENV}")
        self.bucket = bucket
        self.prefix = files.prefix
        self.client: Any = boto3.client(
            "s3",
            region_name=files.region,
            endpoint_url=str(files.endpoint_url) if files.endpoint_url else None,
            config=Config(
                retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=5, read_timeout=60
            ),
        )

    def _key(self, key: str) -> str:
        return self.prefix + key

    async def _call(self, what: str, key: str, fn: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        try:
            return await asyncio.to_thread(fn, **kwargs)
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise BlobError(f"{key}: no such object") from None
            raise BlobError(f"S3 {what} s3://{self.bucket}/{self._key(key)}: {err}") from None
        except BotoCoreError as err:
            raise BlobError(f"S3 {what} s3://{self.bucket}/{self._key(key)}: {err}") from None

    def writer(self, key: str) -> S3Writer:
        return S3Writer(self, key)

    async def put_bytes(self, key: str, data: bytes) -> None:
        await self._call(
            "put", key, self.client.put_object, Bucket=self.bucket, Key=self._key(key), Body=data
        )

    async def put_file(self, key: str, path: Path) -> None:
        await self._call(
            "upload", key, self.client.upload_file, Filename=str(path), Bucket=self.bucket, Key=self._key(key)
        )

    async def read(self, key: str) -> bytes:
        answer = await self._call("get", key, self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        data: bytes = await asyncio.to_thread(answer["Body"].read)
        return data

    async def chunks(self, key: str) -> AsyncIterator[bytes]:
        answer = await self._call("get", key, self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        body = answer["Body"]
        try:
            while chunk := await asyncio.to_thread(body.read, CHUNK_BYTES):
                yield chunk
        finally:
            body.close()

    async def size(self, key: str) -> int:
        head = await self._call("head", key, self.client.head_object, Bucket=self.bucket, Key=self._key(key))
        return int(head["ContentLength"])

    async def delete(self, key: str) -> None:
        await self._call("delete", key, self.client.delete_object, Bucket=self.bucket, Key=self._key(key))

    async def check(self) -> None:
        """Listing one key of the prefix proves the bucket, the credentials and the policy."""
        await self._call(
            "list", "", self.client.list_objects_v2, Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1
        )


class S3Writer:
    """An S3 multipart upload of :data:`PART_BYTES` parts, or one PUT when the object is smaller."""

    def __init__(self, blobs: S3Blobs, key: str) -> None:
        self.blobs = blobs
        self.key = key
        self._pieces = _Pieces(PART_BYTES)
        self._upload_id: str | None = None
        self._etags: list[dict[str, Any]] = []

    def _where(self) -> dict[str, str]:
        return {"Bucket": self.blobs.bucket, "Key": self.blobs._key(self.key)}

    async def _part(self, data: bytes) -> None:
        client = self.blobs.client
        if self._upload_id is None:
            started = await self.blobs._call(
                "upload", self.key, client.create_multipart_upload, **self._where()
            )
            self._upload_id = started["UploadId"]
        number = len(self._etags) + 1
        done = await self.blobs._call(
            "upload",
            self.key,
            client.upload_part,
            UploadId=self._upload_id,
            PartNumber=number,
            Body=data,
            **self._where(),
        )
        self._etags.append({"PartNumber": number, "ETag": done["ETag"]})

    async def write(self, data: bytes) -> None:
        part = self._pieces.add(data)
        if part is not None:
            await self._part(part)

    async def commit(self) -> None:
        rest = self._pieces.take()
        if self._upload_id is None:
            await self.blobs.put_bytes(self.key, rest)
            return
        if rest:
            await self._part(rest)
        await self.blobs._call(
            "upload",
            self.key,
            self.blobs.client.complete_multipart_upload,
            UploadId=self._upload_id,
            MultipartUpload={"Parts": self._etags},
            **self._where(),
        )

    async def abort(self) -> None:
        self._pieces.take()
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            await self.blobs._call(
                "abort",
                self.key,
                self.blobs.client.abort_multipart_upload,
                UploadId=upload_id,
                **self._where(),
            )


def open_blobs(s3: S3Files | None, state_dir: Path) -> Blobs:
    """The configured store: S3 when ``s3`` is set, else ``state_dir/files``."""
    if s3 is not None:
        return S3Blobs(s3)
    return LocalBlobs(state_dir / "files")
