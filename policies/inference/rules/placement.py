"""Placement: GPU pools are tainted, engines tolerate exactly their pool's taints, GPUs never land on the
system pool."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from components.core import nodes
from policies.inference.rules.base import Category, Config, Finding, Res, Rule, Severity, as_list, as_map
from policies.inference.rules.engines import (
    NODE_GROUP,
    NodePool,
    engines,
    is_karpenter_pool,
    node_pools,
    pools_for,
)
from policies.inference.rules.fit import POOL_SETTING
from policies.inference.rules.k8s import gpus_requested, workloads


def _tolerations(pod: object) -> list[tuple[str, str, str, str]]:
    """(key, operator, value, effect) of each toleration, for messages."""
    out = []
    for item in as_list(as_map(pod).get("tolerations")):
        t = as_map(item)
        out.append(
            (
                str(t.get("key", "")),
                str(t.get("operator") or "Equal"),
                str(t.get("value") or ""),
                str(t.get("effect") or ""),
            )
        )
    return out


def _tolerates(pod: object, taint: tuple[str, str, str]) -> bool:
    """Kubernetes' matching rule (``components.core.nodes.tolerates``) for a pool's (key, value, effect) taint."""
    key, value, effect = taint
    tolerations = [as_map(t) for t in as_list(as_map(pod).get("tolerations"))]
    return nodes.tolerates(tolerations, nodes.Taint(key, effect, value or None))


def _engine_tolerations(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    pools = node_pools(resources, config)
    for e in engines(resources):
        if not e.uses_gpu or not e.node_selector:
            continue
        selected = [p for p in pools_for(e.node_selector, pools) if p.is_gpu]
        if len(selected) != 1:
            continue
        pool = selected[0]
        tolerations = _tolerations(e.pod)
        missing = [t for t in pool.taints if not _tolerates(e.pod, t)]
        taint_keys = {t[0] for t in pool.taints}
        extra = [t for t in tolerations if t[0] not in taint_keys]
        if missing:
            names = ", ".join(f"{k}{'=' + v if v else ''}:{eff}" for k, v, eff in missing)
            yield Finding(
                f"{e.res.display}: selects pool {pool.name} but does not tolerate its taint {names}, so it can "
                f"never be scheduled there; add a toleration for {names}",
                e.res.urn,
            )
        if extra:
            names = ", ".join(f"{k or '*'} ({op})" for k, op, _, _ in extra)
            yield Finding(
                f"{e.res.display}: tolerates {names}, which pool {pool.name} does not carry; tolerate exactly the "
                "pool's taints so the pod cannot drift onto nodes meant for other work",
                e.res.urn,
            )


ENGINE_TOLERATIONS = Rule(
    name="engine-tolerates-pool-taint",
    category=Category.PLACEMENT,
    severity=Severity.HIGH,
    description="Engine pods tolerate exactly the taints of the GPU pool their nodeSelector picks: every taint "
    "of that pool, and no others.",
    remediation="Give the engine the toleration nvidia.com/gpu (Exists, NoSchedule) and select its pool with "
    "nodeSelector inferstack.io/pool; remove tolerations for taints the pool does not carry.",
    stack_check=_engine_tolerations,
    settings=(POOL_SETTING,),
)


def _pool_tainted(res: Res, config: Config) -> Iterator[str]:
    if res.type != NODE_GROUP and not is_karpenter_pool(res):
        return
    pool = next(iter(node_pools([res])), None)
    if pool is None or not pool.is_gpu:
        return
    if not any(k == nodes.GPU_TAINT_KEY and eff == nodes.GPU_TAINT_EFFECT for k, _, eff in pool.taints):
        what, effect = (
            ("node group", "NO_SCHEDULE") if res.type == NODE_GROUP else ("Karpenter NodePool", "NoSchedule")
        )
        yield (
            f"{what} {res.k8s_name if res.kind else res.name} ({pool.instance_type}) has GPUs but no "
            f"nvidia.com/gpu:{effect} taint, so ordinary pods fill its nodes and engines stay Pending; add the "
            f"taint {{key: nvidia.com/gpu, effect: {effect}}}"
        )


GPU_POOL_TAINT = Rule(
    name="gpu-pool-has-gpu-taint",
    category=Category.PLACEMENT,
    severity=Severity.HIGH,
    description="Every GPU node group (and Karpenter NodePool) carries the nvidia.com/gpu NO_SCHEDULE taint, so only pods that ask for "
    "GPUs land there.",
    remediation="Add taints: [{key: nvidia.com/gpu, effect: NO_SCHEDULE}] to the node group.",
    resource_check=_pool_tainted,
)


def _system_pool(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    pools = node_pools(resources, config)
    system: list[NodePool] = [p for p in pools if p.is_system or (p.res is not None and not p.is_gpu)]
    for res, pod in workloads(resources):
        if gpus_requested(pod) == 0:
            continue
        selector = as_map(pod.get("nodeSelector"))
        if not selector:
            yield Finding(
                f"{res.display}: asks for GPUs but has no nodeSelector, so nothing keeps it off the system pool; "
                "select its GPU pool with nodeSelector inferstack.io/pool: <pool>",
                res.urn,
            )
            continue
        landing = [p.name for p in pools_for(selector, system)]
        if landing:
            yield Finding(
                f"{res.display}: asks for GPUs but its nodeSelector {dict(selector)} matches the system pool "
                f"({', '.join(landing)}); select a GPU pool with nodeSelector inferstack.io/pool: <pool>",
                res.urn,
            )


NO_GPU_ON_SYSTEM = Rule(
    name="no-gpu-pods-on-system-pool",
    category=Category.PLACEMENT,
    severity=Severity.MEDIUM,
    description="A pod that requests nvidia.com/gpu selects a GPU pool by nodeSelector, and that selector "
    "cannot match the system (CPU) node group.",
    remediation="Set nodeSelector inferstack.io/pool: <gpu pool> on every pod that requests GPUs.",
    stack_check=_system_pool,
    settings=(POOL_SETTING,),
)

RULES = (ENGINE_TOLERATIONS, GPU_POOL_TAINT, NO_GPU_ON_SYSTEM)
