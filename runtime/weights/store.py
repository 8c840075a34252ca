"""One model revision in the S3 store: its objects, its manifest, and the checks that it is whole.

Every request goes through boto3, which reads credentials and ``AWS_ENDPOINT_URL`` the usual way (EKS Pod
Identity in a cluster, the loopback S3 server in tests and ``make local``). ``expected_owner`` (the store
bucket's account) goes on every request as S3's ``ExpectedBucketOwner``: a bucket of the same name in
another account is refused by S3 itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from runtime.weights.manifest import MANIFEST_NAME, Manifest, WeightsError

_S3_URI = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(.+?)/?$")
SHA_METADATA = "sha256"  # x-amz-meta-sha256: the file's hash, set at upload


@dataclass(frozen=True)
class Location:
    """``s3://bucket/prefix/``: one model revision."""

    bucket: str
    prefix: str  # no trailing '/'

    @classmethod
    def parse(cls, uri: str) -> Location:
        match = _S3_URI.match(uri)
        if not match:
            raise WeightsError(f"{uri!r} is not a store location; write 's3://<bucket>/<prefix>/'")
        return cls(match.group(1), match.group(2))

    def key(self, path: str) -> str:
        return f"{self.prefix}/{path}"

    def uri(self, path: str = "") -> str:
        return f"s3://{self.bucket}/{self.prefix}/{path}"


def client() -> Any:
    """An S3 client configured from the environment (credentials, region, ``AWS_ENDPOINT_URL``)."""
    import boto3  # noqa: PLC0415 - only the weights image and the dev venv carry boto3

    return boto3.client("s3")


class Store:
    """Reads and writes one location; ``owner`` is the bucket's expected account (or None)."""

    def __init__(self, s3: Any, where: Location, owner: str | None = None) -> None:
        self.s3 = s3
        self.where = where
        self._owner = {"ExpectedBucketOwner": owner} if owner else {}

    def _missing(self, exc: Exception) -> bool:
        code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
        return code in {"404", "NoSuchKey", "NotFound"}

    def head(self, path: str) -> dict[str, Any] | None:
        """The object's size, ETag and metadata, or None when it is not there."""
        from botocore.exceptions import ClientError  # noqa: PLC0415

        try:
            out: dict[str, Any] = self.s3.head_object(
                Bucket=self.where.bucket, Key=self.where.key(path), **self._owner
            )
        except ClientError as exc:
            if self._missing(exc):
                return None
            raise
        return out

    def manifest(self) -> Manifest | None:
        """The committed manifest, or None when the prefix is not (yet) prepared."""
        from botocore.exceptions import ClientError  # noqa: PLC0415

        try:
            body = self.s3.get_object(
                Bucket=self.where.bucket, Key=self.where.key(MANIFEST_NAME), **self._owner
            )["Body"].read()
        except ClientError as exc:
            if self._missing(exc):
                return None
            raise
        return Manifest.from_json(body, self.where.uri(MANIFEST_NAME))

    def require_manifest(self) -> Manifest:
        manifest = self.manifest()
        if manifest is None:
            raise WeightsError(
                f"{self.where.uri()} is not prepared (no {MANIFEST_NAME}): run the model's preparation Job, or "
                f"`python -m runtime.weights prepare --from DIR --to {self.where.uri()}`"
            )
        return manifest

    def upload(self, local: str, path: str, sha256: str) -> None:
        """One file; S3 makes the object visible only once complete (multipart included)."""
        extra = {"Metadata": {SHA_METADATA: sha256}, **self._owner}
        self.s3.upload_file(local, self.where.bucket, self.where.key(path), ExtraArgs=extra)

    def put_manifest(self, manifest: Manifest) -> None:
        self.s3.put_object(
            Bucket=self.where.bucket,
            Key=self.where.key(MANIFEST_NAME),
            Body=manifest.to_json().encode(),
            ContentType="application/json",
            **self._owner,
        )

    def download(self, path: str) -> Any:
        """A streaming body of one object."""
        return self.s3.get_object(Bucket=self.where.bucket, Key=self.where.key(path), **self._owner)["Body"]

    def object_problem(self, manifest: Manifest, path: str, head: dict[str, Any] | None) -> str | None:
        """Why the object at ``path`` is not the manifest's file (None when it is)."""
        entry = manifest.entry(path)
        uri = self.where.uri(path)
        if head is None:
            return f"{uri} is missing"
        size = int(head["ContentLength"])
        if size != entry.size:
            return f"{uri} has {size} bytes, the manifest says {entry.size} (truncated or replaced)"
        if head.get("Metadata", {}).get(SHA_METADATA) != entry.sha256:
            return f"{uri} carries another sha256 than the manifest's (replaced)"
        etag = manifest.etags.get(path)
        if etag is not None and head.get("ETag") != etag:
            return f"{uri} was rewritten after it was prepared (ETag {head.get('ETag')}, manifest {etag})"
        return None

    def verify(self) -> Manifest:
        """Every object of the manifest is there, of its size, hash and ETag; one clear error otherwise.

        Reads metadata only (a HEAD per file): what the streamer is about to load was written by the
        preparation step and not changed since. The node cache also hashes every byte it copies.
        """
        manifest = self.require_manifest()
        problems = [
            p for f in manifest.files if (p := self.object_problem(manifest, f.path, self.head(f.path)))
        ]
        if problems:
            raise WeightsError("; ".join(problems) + ": run the preparation again to repair it")
        return manifest
