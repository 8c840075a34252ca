"""Cold start as a number: seconds from a replica's start to its weights being in the engine (fetch + load), per
fetch path, from the catalog's bandwidth figures (an instance type's ``network_gbps``, ``HUB_DOWNLOAD_GBPS``, NVMe and
load rates). Image pull and the engine's own warm-up are not counted here.

``expected(fetch, ...)`` is the chosen path's first start on a fresh node (a node cache misses then): the startup
budget's weights term (``components.core.startup.weights_fetch``). ``compare(...)`` gives every path side by side for
plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.base import catalog
from components.core.weights.fetch import GIB, Fetch, FetchPath

ROOT_DISK_READ_GBPS = catalog.GPU_ROOT_DISK_THROUGHPUT_MIBPS * 2**20 / 1e9


@dataclass(frozen=True)
class ColdStart:
    path: str
    fetch_s: float
    load_s: float
    overlapped: bool = False  # the streamer loads tensors while it fetches

    @property
    def total_s(self) -> float:
        return max(self.fetch_s, self.load_s) if self.overlapped else self.fetch_s + self.load_s


def _rates(instance: catalog.InstanceType | None, gpus: int) -> tuple[float, float, float]:
    """GB/s of the node's usable network, its NVMe (0: none) and the load into the engine."""
    if instance is None:
        return catalog.CPU_NODE_NETWORK_GBPS / 8 * catalog.NETWORK_EFFICIENCY, 0.0, catalog.LOAD_GBPS_PER_GPU
    network = instance.network_gbps / 8 * catalog.NETWORK_EFFICIENCY
    disks = instance.store_disks if instance.store_gb else 0
    nvme = min(disks, catalog.NVME_DISKS_COUNTED) * catalog.NVME_READ_GBPS_PER_DISK
    return network, nvme, catalog.LOAD_GBPS_PER_GPU * max(1, gpus)


def compare(weights_gib: float, instance: catalog.InstanceType | None, gpus: int) -> list[ColdStart]:
    """Every way a replica could get ``weights_gib``: the hub download it no longer does, the node cache
    (first replica on a node, then every other), the streamer."""
    gb = weights_gib * GIB / 1e9
    network, nvme, load = _rates(instance, gpus)
    disk = nvme or ROOT_DISK_READ_GBPS
    return [
        ColdStart("hub download (per replica)", gb / catalog.HUB_DOWNLOAD_GBPS, gb / min(disk, load)),
        ColdStart("node cache, first on node", gb / min(network, disk), gb / min(disk, load)),
        ColdStart("node cache, hit", 0.0, gb / min(disk, load)),
        ColdStart("streamer", gb / network, gb / load, overlapped=True),
    ]


def expected(fetch: Fetch, weights_gib: float, instance: catalog.InstanceType | None, gpus: int) -> ColdStart:
    """The chosen path's cold start on a fresh node (the one the startup budget must allow for)."""
    paths = {c.path: c for c in compare(weights_gib, instance, gpus)}
    return paths["streamer" if fetch.path is FetchPath.STREAMER else "node cache, first on node"]
