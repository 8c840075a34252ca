"""Kubernetes shapes the rules share: workloads, pod templates, containers, quantities, selectors."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components.core import nodes
from policies.inference.rules.base import Props, Res, as_list, as_map, dig, number

WORKLOAD_KINDS = (
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "Job",
    "CronJob",
    "Pod",
    "LeaderWorkerSet",
)
GROUP_KIND = "LeaderWorkerSet"
"""A replica that spans nodes: its leader's pod template stands for the group (the workers run the same container
with their rank, and no probes)."""
_LEADER_TEMPLATE = ("spec", "leaderWorkerTemplate", "leaderTemplate")
SCALER_KINDS = ("ScaledObject", "HorizontalPodAutoscaler")
GPU_RESOURCE = nodes.GPU_RESOURCE
ENV_LABEL = "inferstack.io/environment"
COMPONENT_LABEL = "app.kubernetes.io/component"


def pod_spec(res: Res) -> Props | None:
    """The pod spec of a workload (Pod, CronJob's job template, or a template), None for other objects."""
    kind = res.kind
    if kind not in WORKLOAD_KINDS:
        return None
    if kind == "Pod":
        return as_map(res.props.get("spec"))
    if kind == "CronJob":
        return as_map(dig(res.props, "spec", "jobTemplate", "spec", "template", "spec"))
    if kind == GROUP_KIND:
        return as_map(dig(res.props, *_LEADER_TEMPLATE, "spec"))
    return as_map(dig(res.props, "spec", "template", "spec"))


def _pod_metadata(res: Res) -> Props:
    path: tuple[str, ...] = ("spec", "template")
    if res.kind == "CronJob":
        path = ("spec", "jobTemplate", "spec", "template")
    elif res.kind == GROUP_KIND:
        path = _LEADER_TEMPLATE
    return as_map(dig(res.props, *path, "metadata"))


def pod_labels(res: Res) -> Mapping[str, str]:
    if res.kind == "Pod":
        return res.labels
    return as_map(_pod_metadata(res).get("labels"))


def pod_annotations(res: Res) -> Mapping[str, object]:
    """The pod template's annotations (a group's: its leader's)."""
    if res.kind == "Pod":
        return as_map(dig(res.props, "metadata", "annotations"))
    return as_map(_pod_metadata(res).get("annotations"))


@dataclass(frozen=True)
class Container:
    name: str
    init: bool
    props: Props

    @property
    def image(self) -> str | None:
        image = self.props.get("image")
        return image if isinstance(image, str) else None

    def request(self, resource: str) -> Any:
        return dig(self.props, "resources", "requests", resource)

    def limit(self, resource: str) -> Any:
        return dig(self.props, "resources", "limits", resource)


def containers(spec: Props, *, init: bool = True) -> Iterator[Container]:
    groups = [("containers", False)] + (
        [("initContainers", True), ("ephemeralContainers", True)] if init else []
    )
    for key, is_init in groups:
        for item in as_list(spec.get(key)):
            c = as_map(item)
            yield Container(str(c.get("name", "?")), is_init, c)


def workloads(resources: Sequence[Res]) -> Iterator[tuple[Res, Props]]:
    for r in resources:
        spec = pod_spec(r)
        if spec is not None:
            yield r, spec


def gpus_requested(spec: Props) -> int:
    """GPUs one pod asks for (the larger of requests and limits, summed over app containers)."""
    total = 0
    for c in containers(spec, init=False):
        values = [number(c.request(GPU_RESOURCE)), number(c.limit(GPU_RESOURCE))]
        total += int(max((v for v in values if v is not None), default=0))
    return total


_CPU = re.compile(r"^(\d+(?:\.\d+)?)(m?)$")
_MEM = re.compile(r"^(\d+(?:\.\d+)?)([KMGTPE]i?|e\d+)?$")
_MEM_UNITS = {
    "": 1,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def cpu_cores(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = _CPU.match(str(value)) if isinstance(value, str) else None
    if not match:
        return None
    amount = float(match.group(1))
    return amount / 1000 if match.group(2) else amount


def memory_gib(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) / 2**30
    match = _MEM.match(str(value)) if isinstance(value, str) else None
    if not match:
        return None
    unit = match.group(2) or ""
    factor = 10 ** int(unit[1:]) if unit.startswith("e") else _MEM_UNITS[unit]
    return float(match.group(1)) * factor / 2**30


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A label selector ({matchLabels, matchExpressions} or a plain map) against labels."""
    match_labels = (
        selector.get("matchLabels")
        if "matchLabels" in selector or "matchExpressions" in selector
        else selector
    )
    for k, v in as_map(match_labels).items():
        if labels.get(k) != v:
            return False
    for item in as_list(selector.get("matchExpressions")):
        expr = as_map(item)
        key, op, values = expr.get("key"), expr.get("operator"), as_list(expr.get("values"))
        present = key in labels
        if (
            (op == "In" and labels.get(str(key)) not in values)
            or (op == "NotIn" and present and labels.get(str(key)) in values)
            or (op == "Exists" and not present)
            or (op == "DoesNotExist" and present)
        ):
            return False
    return True


def environment_of(res: Res) -> str | None:
    """The environment a resource belongs to: the inferstack label (Kubernetes) or tag (AWS)."""
    env = res.labels.get(ENV_LABEL) or as_map(res.props.get("tags")).get("inferstack:environment")
    return str(env) if env else None


def stack_environment(resources: Sequence[Res]) -> str | None:
    """The environment most of the stack's resources say they belong to."""
    counts: dict[str, int] = {}
    for r in resources:
        env = environment_of(r)
        if env:
            counts[env] = counts.get(env, 0) + 1
    return max(counts, key=lambda e: counts[e]) if counts else None


@dataclass(frozen=True)
class Scaler:
    res: Res
    target_kind: str
    target_name: str
    min_replicas: int
    max_replicas: int


def scalers(resources: Sequence[Res]) -> list[Scaler]:
    out = []
    for r in resources:
        spec = as_map(r.props.get("spec"))
        ref = as_map(spec.get("scaleTargetRef"))
        if r.kind == "ScaledObject":
            lo = number(spec.get("minReplicaCount"))
            hi = number(spec.get("maxReplicaCount"))
            out.append(
                Scaler(
                    r,
                    str(ref.get("kind") or "Deployment"),
                    str(ref.get("name", "")),
                    int(lo if lo is not None else 0),
                    int(hi if hi is not None else 100),
                )
            )
        elif r.kind == "HorizontalPodAutoscaler":
            lo = number(spec.get("minReplicas"))
            hi = number(spec.get("maxReplicas"))
            out.append(
                Scaler(
                    r,
                    str(ref.get("kind", "")),
                    str(ref.get("name", "")),
                    int(lo if lo is not None else 1),
                    int(hi if hi is not None else 1),
                )
            )
    return out


def scalers_of(workload: Res, all_scalers: Sequence[Scaler]) -> list[Scaler]:
    return [
        s
        for s in all_scalers
        if s.target_kind == workload.kind
        and s.target_name == workload.k8s_name
        and s.res.namespace == workload.namespace
    ]


def replica_range(workload: Res, all_scalers: Sequence[Scaler]) -> tuple[int, int]:
    """(min, max) replicas: a scaler's bounds when one targets the workload, else spec.replicas (default 1)."""
    own = scalers_of(workload, all_scalers)
    if own:
        return min(s.min_replicas for s in own), max(s.max_replicas for s in own)
    fixed = number(dig(workload.props, "spec", "replicas"))
    count = int(fixed) if fixed is not None else 1
    return count, count
