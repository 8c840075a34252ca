"""The spec's plain enumerations, in a module without pydantic.

``components.spec`` re-exports them; they live here so that what only needs the names (the command
line's choices, sizing, cost) starts without building the spec's models, which is most of the time
`inferstack size` and `--help` would otherwise take.
"""

from __future__ import annotations

from enum import StrEnum


class Target(StrEnum):
    EKS = "eks"
    KUBERNETES = "kubernetes"
    LOCAL = "local"


class CapacityType(StrEnum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"


class NodeProvisioner(StrEnum):
    MANAGED = "managed"
    KARPENTER = "karpenter"


class Quantization(StrEnum):
    NONE = "none"
    AWQ = "awq"
    GPTQ = "gptq"
    FP8 = "fp8"
    INT8 = "int8"


class DType(StrEnum):
    AUTO = "auto"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


class KvCacheDType(StrEnum):
    AUTO = "auto"
    FP8 = "fp8"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"


class Device(StrEnum):
    GPU = "gpu"
    CPU = "cpu"
