"""Where each model's weights live in the platform's model store (``s3://<bucket>/<prefix>/...``), and what may go
in: a hub source only at a pinned commit (``hub_sources_pinned``, a plan-time rule). Which buckets a target's store
accepts are its cloud's rules (``Cloud.model_store_problems``)."""

from __future__ import annotations

from collections.abc import Iterator

from components.base.problems import Problem
from components.core.planned import Planned, PlanRule
from components.spec import AdapterSpec, ModelSpec, PlatformSpec, is_pinned_source

LOCAL_BUCKET = "inferstack-local"
"""The loopback store of `make local S3=1`."""
LOCAL_BATCH_BUCKET = "inferstack-local-batches"
"""The batch service's files with `make local S3=1`: a bucket of their own beside the loopback store, as on EKS."""
LOOPBACK_REGION = "us-east-1"


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


def engine_read_prefixes(spec: PlatformSpec) -> list[str]:
    """The key prefixes of the store's bucket engines read ('dir', no slashes at the ends): the store's prefix,
    and each ``s3://`` source in the bucket outside it (a model's, an adapter's, a version's). Never the whole
    bucket: engines read weights, nothing else that may ever be put beside them."""
    bucket = store_bucket(spec)
    store_prefix = spec.model_store.prefix.strip("/")
    sources = [m.source for m in spec.models]
    sources += [a.source for m in spec.models for a in m.adapters]
    sources += [v.source for m in spec.models for v in m.versions if v.source is not None]
    prefixes = {store_prefix}
    for source in sources:
        if not source.startswith("s3://") or bucket_of(source) != bucket:
            continue
        key = source.removeprefix(f"s3://{bucket}").strip("/")
        if key and key != store_prefix and not key.startswith(f"{store_prefix}/"):
            prefixes.add(key)
    return sorted(prefixes)


def hub_sources_pinned(planned: Planned) -> Iterator[Problem]:
    """A hub source is copied into the store at its revision, which must be a commit (``is_pinned_source``): a
    model's, an adapter's, a version's with a source of its own. The spec refuses a revision that is not a commit;
    this refuses none on a cluster (target local serves from disk)."""
    spec = planned.spec
    if spec.cluster.on_this_machine:
        return
    for i, model in enumerate(spec.models):
        if model.is_local_path:
            continue
        if not is_pinned_source(model.source, model.revision):
            yield Problem(
                f"models[{i}].revision",
                f"{model.source!r} is a Hugging Face source without a pinned revision, so what it serves could "
                "change under you: set revision to the exact hub commit (40 hex digits, from the repository's "
                "commit history), or prepare the weights into the model store and use its s3:// prefix",
            )
        for j, adapter in enumerate(model.adapters):
            if not is_pinned_source(adapter.source, adapter.revision):
                yield Problem(
                    f"models[{i}].adapters[{j}].revision",
                    f"{adapter.source!r} is copied into the model store at a pinned commit (engine pods never "
                    "fetch from the hub), and it has no revision: set revision to the exact hub commit "
                    "(40 hex digits), or use the adapter's s3:// prefix in the store",
                )
        for j, version in enumerate(model.versions):
            if version.source is not None and not is_pinned_source(
                version.source, model.version_revision(version)
            ):
                yield Problem(
                    f"models[{i}].versions[{j}].revision",
                    f"{version.source!r} is a Hugging Face source without a pinned revision: set revision to "
                    "the exact hub commit (40 hex digits), as the model's",
                )


def account_problems(spec: PlatformSpec) -> list[Problem]:
    """The store's bucket in the stack's account: what the clouds with AWS accounts check (EKS, and a cluster you
    bring with an S3 store), each in its ``model_store_problems``."""
    ms, cluster = spec.model_store, spec.cluster
    if not (ms.account_id and cluster.account_id and ms.account_id != cluster.account_id):
        return []
    return [
        Problem(
            "model_store.account_id",
            f"the model store bucket belongs to account {ms.account_id}, but the stack deploys into "
            f"{cluster.account_id} (cluster.account_id): engines and preparation Jobs would read and write "
            f"weights across accounts; use a store bucket of {cluster.account_id}, or remove "
            "model_store.account_id on eks (the stack creates the bucket in its own account)",
        )
    ]


RULES: tuple[PlanRule, ...] = (hub_sources_pinned,)
"""The model store's plan-time rules (``components.core.plan_rules``)."""
