"""Where each model's weights live in the platform's model store (``s3://<bucket>/<prefix>/...``)."""

from __future__ import annotations

from components.spec import AdapterSpec, ModelSpec, PlatformSpec


def store_bucket(spec: PlatformSpec) -> str | None:
    """The store's bucket, as the target's cluster section says: eks names (or defaults) the one it creates,
    target kubernetes names an existing one, `make local S3=1` has its loopback bucket."""
    return spec.cluster.model_store_bucket(spec)


def location(spec: PlatformSpec, model: ModelSpec) -> str:
    """The model's prefix in the store: an ``s3://`` source as written, a hub source at its revision, a local
    directory (``make local S3=1``) under its model name."""
    if model.source.startswith("s3://"):
        return model.source.rstrip("/") + "/"
    bucket = store_bucket(spec)
    prefix = spec.model_store.prefix
    if model.is_local_path:
        return f"s3://{bucket}/{prefix}/{model.name}/"
    return f"s3://{bucket}/{prefix}/{model.source}/{model.revision}/"


def adapter_location(spec: PlatformSpec, adapter: AdapterSpec) -> str:
    """A LoRA adapter's prefix in the store, as a model's: an ``s3://`` source as written, a hub source at its
    revision (the preparation Job copies it there; engine pods fetch it from there, never from the hub)."""
    if adapter.source.startswith("s3://"):
        return adapter.source.rstrip("/") + "/"
    return f"s3://{store_bucket(spec)}/{spec.model_store.prefix}/{adapter.source}/{adapter.revision}/"


def bucket_of(uri: str) -> str:
    return uri.removeprefix("s3://").split("/", 1)[0]
