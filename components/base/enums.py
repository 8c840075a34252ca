"""The spec's plain enumerations, in a module without pydantic.

``components.spec`` re-exports them; they live here so that what only needs the names (the command
line's choices, sizing, cost) starts without building the spec's models, which is most of the time
`inferstack size` and `--help` would otherwise take.
"""

from __future__ import annotations

from enum import StrEnum


# Where a stack runs. The members are the targets this project ships (the schema and the docs list them);
# ``Target.add`` makes another at run time, a pseudo-member found by its value like these (``Target("x")``, so the
# spec accepts it): how a test plans a stack on a target of its own without editing this list. (No docstring: the
# stack file's JSON Schema would carry it.)
class Target(StrEnum):
    EKS = "eks"
    KUBERNETES = "kubernetes"
    LOCAL = "local"

    @classmethod
    def _missing_(cls, value: object) -> Target | None:
        return _ADDED.get(value) if isinstance(value, str) else None

    @classmethod
    def add(cls, value: str) -> Target:
        """A target beside the members, until ``remove``; its profile and section are registered apart
        (``components.clouds.targets.PROFILES``, ``components.spec.cluster.SECTIONS``)."""
        if value in cls._value2member_map_ or value in _ADDED:
            raise ValueError(f"target {value!r} exists already")
        target = str.__new__(cls, value)
        target._name_ = value.upper().replace("-", "_")
        target._value_ = value
        _ADDED[value] = target
        return target

    @classmethod
    def remove(cls, target: Target) -> None:
        """Forget a target ``add`` made (a member stays)."""
        _ADDED.pop(target.value, None)


_ADDED: dict[str, Target] = {}
"""The targets ``Target.add`` made, by value."""


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
