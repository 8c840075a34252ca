"""How each engine gets its weights from the model store, decided once with the reason plan shows.

vLLM streams safetensors straight from S3 (the Run:ai streamer, ``--load-format runai_streamer``): nothing
is written to disk and the fetch overlaps the load. Other engines (SGLang, TensorRT-LLM) read files, so they
get a node-level cache: the weights copied once per node and revision, shared by every replica there, on
the instance's local NVMe where it has some, else on the root disk (sized for it). ``weights.fetch`` in the
stack file overrides the choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from components.base import catalog
from components.spec import ModelSpec, WeightsFetch
from runtime.engines import facts

GIB = 1024**3


class FetchPath(StrEnum):
    STREAMER = "streamer"
    NODE_CACHE = "node-cache"


class CacheMedium(StrEnum):
    NVME = "instance NVMe"
    ROOT_DISK = "root disk"


@dataclass(frozen=True)
class Fetch:
    """One model's way to its weights."""

    path: FetchPath
    medium: CacheMedium | None  # where the node cache is (None: the streamer needs none)
    reason: str


def nvme_gib(instance: catalog.InstanceType | None) -> float:
    """The instance's local NVMe, in GiB (0 where it has none, or on CPU nodes)."""
    if instance is None:
        return 0.0
    return instance.store_gb * 1e9 / GIB


def cache_medium(instance: catalog.InstanceType | None) -> tuple[CacheMedium, str]:
    nvme = nvme_gib(instance)
    if instance is not None and nvme:
        return CacheMedium.NVME, f"{instance.name} has {nvme:,.0f} GiB of local NVMe"
    where = instance.name if instance is not None else "the general (CPU) nodes"
    return CacheMedium.ROOT_DISK, f"{where} has no local NVMe: the cache is on the root disk, sized for it"


def decide(model: ModelSpec, instance: catalog.InstanceType | None) -> Fetch:
    """The streamer for vLLM, a node-level cache for the others, unless the stack file says which."""
    chosen = model.weights.fetch
    engine = facts(model.engine.kind)
    if chosen is WeightsFetch.STREAMER or (chosen is WeightsFetch.AUTO and engine.can.weight_streamer):
        why = "set in the stack file" if chosen is WeightsFetch.STREAMER else "auto"
        return Fetch(
            FetchPath.STREAMER,
            None,
            f"{why}: {engine.display_name} streams safetensors from the store ({engine.cli.stream_from_s3[-1]}): "
            "no copy on disk, fetch overlaps load",
        )
    medium, where = cache_medium(instance)
    why = (
        "set in the stack file"
        if chosen is WeightsFetch.NODE_CACHE
        else f"auto: {model.engine.kind.value} loads files, not a stream"
    )
    return Fetch(
        FetchPath.NODE_CACHE,
        medium,
        f"{why}: node-level cache, filled once per node and shared by its replicas; {where}",
    )
