"""Reliability: probes, redundancy and disruption budgets in production, scalers that exist and point at
something, pools big enough for max replicas, startup probes patient enough for the weights, runtime images
that something builds."""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Iterator, Sequence

from components.base import sizing
from components.render import batches, common, preparation
from components.render.weights import COMPONENT as WEIGHTS_COMPONENT
from policies.inference.rules.base import (
    Category,
    Config,
    Finding,
    Res,
    Rule,
    Setting,
    Severity,
    as_list,
    as_map,
    dig,
    number,
    of_kind,
    of_type,
)
from policies.inference.rules.engines import engines, gpu_pool_of, node_pools
from policies.inference.rules.fit import POOL_SETTING
from policies.inference.rules.k8s import (
    COMPONENT_LABEL,
    containers,
    environment_of,
    pod_labels,
    pod_spec,
    replica_range,
    scalers,
    scalers_of,
    selects,
    workloads,
)
from runtime.engines import ENGINES

ENVIRONMENTS_SCHEMA = {"type": "array", "items": {"type": "string"}}


def _probes(res: Res, config: Config) -> Iterator[str]:
    pod = pod_spec(res)
    if (
        pod is None
        or res.kind in ("Job", "CronJob")
        or (res.from_chart and not config["include_chart_workloads"])
    ):
        return
    exempt = set(config["exempt_containers"])
    for c in containers(pod, init=False):
        if f"{res.namespace}/{res.k8s_name}/{c.name}" in exempt:
            continue
        missing = [p for p in ("readinessProbe", "livenessProbe") if not as_map(c.props.get(p))]
        if missing:
            yield (
                f"{res.display}: container {c.name} has no {' and no '.join(missing)}; without them a hung or "
                "still-loading replica keeps receiving traffic. Add an httpGet probe on the health endpoint "
                "(engines: /health; router, health monitor, batcher: /readyz and /healthz)"
            )


PROBES = Rule(
    name="containers-have-probes",
    category=Category.RELIABILITY,
    severity=Severity.MEDIUM,
    description="Every long-running container has a readiness and a liveness probe (init containers and Jobs "
    "excepted).",
    remediation="Add readinessProbe and livenessProbe (httpGet on the container's health path).",
    resource_check=_probes,
    settings=(
        Setting(
            "exempt_containers",
            {"type": "array", "items": {"type": "string"}},
            [],
            "Containers exempt from the rule, as 'namespace/workload/container'.",
        ),
        Setting(
            "include_chart_workloads",
            {"type": "boolean"},
            False,
            "Also check workloads a Helm chart renders during a real preview (their probes are the chart's).",
        ),
    ),
)


def _in_environments(res: Res, config: Config) -> bool:
    return environment_of(res) in set(config["environments"])


def _min_replicas(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    minimum = int(config["min_replicas"])
    all_scalers = scalers(resources)
    for e in engines(resources):
        if not _in_environments(e.res, config):
            continue
        lo, _ = replica_range(e.res, all_scalers)
        if lo < minimum:
            yield Finding(
                f"{e.res.display}: runs {lo} replica(s) at minimum in {environment_of(e.res)}; one node drain or "
                f"engine crash takes the model offline. Set scaling.min_replicas to at least {minimum}",
                e.res.urn,
            )


MIN_REPLICAS = Rule(
    name="engine-min-replicas",
    category=Category.RELIABILITY,
    severity=Severity.HIGH,
    description="In the listed environments (prod by default) every engine keeps at least min_replicas "
    "replicas (the scaler's minimum, or spec.replicas).",
    remediation="Raise the model's scaling.min_replicas to 2 or more.",
    stack_check=_min_replicas,
    settings=(
        Setting("min_replicas", {"type": "integer", "minimum": 1}, 2, "Fewest replicas an engine may run."),
        Setting("environments", ENVIRONMENTS_SCHEMA, ["prod"], "Environments the rule applies to."),
    ),
)


def _pdb(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    budgets = of_kind(resources, "PodDisruptionBudget")
    all_scalers = scalers(resources)
    for e in engines(resources):
        if not _in_environments(e.res, config):
            continue
        labels = pod_labels(e.res)
        mine = [
            b
            for b in budgets
            if b.namespace == e.res.namespace and selects(as_map(dig(b.props, "spec", "selector")), labels)
        ]
        if not mine:
            yield Finding(
                f"{e.res.display}: no PodDisruptionBudget selects its pods, so a node upgrade may evict every "
                "replica at once; add one with maxUnavailable: 1 and the engine's selector labels",
                e.res.urn,
            )
            continue
        lo, _ = replica_range(e.res, all_scalers)
        for b in mine:
            min_available = number(dig(b.props, "spec", "minAvailable"))
            max_unavailable = dig(b.props, "spec", "maxUnavailable")
            if (min_available is not None and min_available >= lo) or number(max_unavailable) == 0:
                yield Finding(
                    f"{b.display}: allows no voluntary disruption of {e.res.k8s_name} ({lo} replica(s) at "
                    "minimum), so node drains and upgrades hang; use maxUnavailable: 1",
                    b.urn,
                )


PDB = Rule(
    name="engine-has-disruption-budget",
    category=Category.RELIABILITY,
    severity=Severity.MEDIUM,
    description="In the listed environments every engine has a PodDisruptionBudget selecting its pods, and the "
    "budget still lets node drains proceed.",
    remediation="Add a PodDisruptionBudget with maxUnavailable: 1 and the engine's selector labels.",
    stack_check=_pdb,
    settings=(Setting("environments", ENVIRONMENTS_SCHEMA, ["prod"], "Environments the rule applies to."),),
)


def _capacity(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    pools = node_pools(resources, config)
    all_scalers = scalers(resources)
    demand: dict[str, list[tuple[str, int, int]]] = {}
    for e in engines(resources):
        pool = gpu_pool_of(e, pools)
        if pool is None or pool.instance is None or e.gpus == 0:
            continue
        _, hi = replica_range(e.res, all_scalers)
        demand.setdefault(pool.name, []).append((e.res.k8s_name, hi, e.gpus))
    for pool in pools:
        members = demand.get(pool.name)
        if not members or pool.instance is None or pool.max_size is None:
            continue
        per_node = pool.instance.gpus
        # Replicas do not span nodes: each node holds floor(GPUs / GPUs per replica) of one shape.
        nodes = sum(math.ceil(hi / max(1, per_node // gpus)) for _, hi, gpus in members)
        if nodes > pool.max_size:
            detail = ", ".join(f"{name} {hi} x {gpus} GPU" for name, hi, gpus in members)
            yield Finding(
                f"pool {pool.name}: max replicas ({detail}) need {nodes} nodes of {pool.instance.name} but the pool "
                f"stops at {pool.max_size} (node group maxSize or NodePool GPU limit); raise the pool's max_nodes "
                f"to {nodes} or lower max_replicas",
                pool.res.urn if pool.res else None,
            )


CAPACITY = Rule(
    name="max-replicas-within-pool-capacity",
    category=Category.RELIABILITY,
    severity=Severity.HIGH,
    description="The engines on each GPU pool can all reach their max replicas within the node group's maxSize.",
    remediation="Raise gpu_pools[].max_nodes or lower the models' scaling.max_replicas.",
    stack_check=_capacity,
    settings=(POOL_SETTING,),
)


def _scaled(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    all_scalers = scalers(resources)
    targets = {(r.kind, r.namespace, r.k8s_name) for r in resources if r.kind}
    for s in all_scalers:
        if (s.target_kind, s.res.namespace, s.target_name) not in targets:
            yield Finding(
                f"{s.res.display}: scaleTargetRef {s.target_kind}/{s.target_name} names nothing in this stack, so "
                "it scales nothing; point it at the engine Deployment",
                s.res.urn,
            )
    for e in engines(resources):
        mine = scalers_of(e.res, all_scalers)
        fixed = number(dig(e.res.props, "spec", "replicas"))
        if len(mine) > 1:
            yield Finding(
                f"{e.res.display}: {len(mine)} scalers target it ({', '.join(s.res.display for s in mine)}); they "
                "fight over the replica count. Keep one",
                e.res.urn,
            )
        elif not mine and (fixed is None or config["require_scaler_for_fixed"]):
            what = "sets no replica count" if fixed is None else f"is fixed at {fixed:g} replicas"
            yield Finding(
                f"{e.res.display}: no ScaledObject or HorizontalPodAutoscaler targets it and it {what}; give the "
                "model scaling.max_replicas above min_replicas so a scaler is rendered, or fix replicas",
                e.res.urn,
            )


SCALED = Rule(
    name="engine-has-scaler",
    category=Category.RELIABILITY,
    severity=Severity.MEDIUM,
    description="Every engine whose replica count is not fixed is the target of exactly one scaler "
    "(KEDA ScaledObject or HPA), and every scaler's scaleTargetRef names a workload of the stack.",
    remediation="Render one ScaledObject/HPA per engine with scaleTargetRef pointing at the engine Deployment.",
    stack_check=_scaled,
    settings=(
        Setting(
            "require_scaler_for_fixed",
            {"type": "boolean"},
            False,
            "Also require a scaler for engines with a fixed spec.replicas.",
        ),
    ),
)


def _startup(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    base = float(config["base_seconds"])
    for e in engines(resources):
        found = e.arch()
        if found is None:
            continue
        repo, arch = found
        precision = sizing.weight_precision(e.args.quantization, e.args.dtype)
        # Each node of a multi-node group loads its own share (its pipeline stage, its tensor shards).
        weights = sizing.weight_bytes(arch, precision, e.args.dtype) / sizing.GIB / e.args.nnodes
        how = "streamed_seconds_per_gib" if e.args.streamed else "seconds_per_gib"
        per_gib = float(config[how])
        need = base + per_gib * weights
        probe = as_map(e.container.props.get("startupProbe"))
        name = "startupProbe"
        if not probe:
            probe, name = as_map(e.container.props.get("livenessProbe")), "livenessProbe (no startupProbe)"
        period = number(probe.get("periodSeconds")) or 10.0
        failures = number(probe.get("failureThreshold")) or 3.0
        delay = number(probe.get("initialDelaySeconds")) or 0.0
        budget = delay + period * failures
        if budget < need:
            share = f" (this node's 1/{e.args.nnodes})" if e.args.nnodes > 1 else ""
            yield Finding(
                f"{e.res.display}: {name} gives the engine {budget:.0f} s to start, but loading {weights:.1f} GiB "
                f"of {repo}{share} needs about {need:.0f} s ({base:.0f} s + {per_gib:g} s/GiB, {how}); the "
                f"kubelet would kill it mid-load forever. Set a startupProbe with failureThreshold x periodSeconds "
                f">= {math.ceil(need)}",
                e.res.urn,
            )


STARTUP = Rule(
    name="engine-startup-probe-budget",
    category=Category.RELIABILITY,
    severity=Severity.HIGH,
    description="An engine's startup probe allows at least base_seconds + seconds_per_gib x the weights it loads "
    "(streamed_seconds_per_gib where it streams them from the model store; a multi-node group's node loads its "
    "share) before the kubelet restarts it.",
    remediation="Raise startupProbe.failureThreshold (or periodSeconds) so it covers downloading and loading "
    "the weights.",
    stack_check=_startup,
    settings=(
        Setting(
            "base_seconds", {"type": "number", "minimum": 0}, 120, "Start-up time besides loading weights."
        ),
        Setting(
            "seconds_per_gib",
            {"type": "number", "minimum": 0},
            5,
            "Seconds to fetch and load one GiB of weights from a disk copy (about 200 MiB/s).",
        ),
        Setting(
            "streamed_seconds_per_gib",
            {"type": "number", "minimum": 0},
            1,
            "Seconds to stream one GiB of weights from S3 into GPU memory (about 1 GiB/s).",
        ),
    ),
)


def _metrics(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    all_scalers = scalers(resources)
    for e in engines(resources):
        argv = [str(a) for a in e.container.props.get("args") or []]
        engine = ENGINES[e.args.kind]
        needed = " ".join(engine.metrics_flag)
        if any(flag not in argv for flag in engine.metrics_flag):
            scaled = (
                " Its scaler's Prometheus triggers would never see a value."
                if scalers_of(e.res, all_scalers)
                else ""
            )
            yield Finding(
                f"{e.res.display}: {engine.display_name} exports metrics only with {needed}, so queue, KV-cache "
                f"and latency signals are missing.{scaled} Add {needed} to the engine's arguments",
                e.res.urn,
            )


_METRICS_FLAGS = "; ".join(
    f"{engine.display_name} only with {' '.join(engine.metrics_flag)}"
    for engine in ENGINES.values()
    if engine.metrics_flag
)

METRICS = Rule(
    name="engine-exports-metrics",
    category=Category.RELIABILITY,
    severity=Severity.MEDIUM,
    description="Every engine exports the metrics that autoscaling, alerts and the router's health feed read "
    f"({_METRICS_FLAGS}).",
    remediation=f"Start engines with the flags they need to export metrics ({_METRICS_FLAGS}).",
    stack_check=_metrics,
)

DOCKER_IMAGE = "docker-build:index:Image"
RUNTIME_COMPONENTS = [
    common.ROUTER,
    common.HEALTH,
    common.BATCHER,
    batches.PART,
    common.PICKER,
    WEIGHTS_COMPONENT,
]


def _built_repositories(resources: Sequence[Res]) -> set[str]:
    """The repositories the stack's image builds push to (a tag is '<repository>:<tag>')."""
    return {
        tag.rsplit(":", 1)[0]
        for r in of_type(resources, DOCKER_IMAGE)
        for tag in as_list(r.props.get("tags"))
        if isinstance(tag, str) and ":" in tag.rsplit("/", 1)[-1]
    }


def _tool_image(res: Res) -> str | None:
    """A preparation Job's tool image (llm-compressor, TensorRT-LLM): the version's pinned choice, as an engine's
    image is, recorded in the Job's provenance; not a runtime image the stack builds."""
    notes = res.metadata.get("annotations")
    raw = notes.get(preparation.ANNOTATION_PROVENANCE) if isinstance(notes, dict) else None
    try:
        record = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    image = record.get("image") if isinstance(record, dict) else None
    return image if isinstance(image, str) else None


def _runtime_images(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    built = _built_repositories(resources)
    components = set(config["runtime_components"])
    prebuilt = list(config["prebuilt_images"])
    for res, pod in workloads(resources):
        labels = res.labels
        if res.from_chart or labels.get("app.kubernetes.io/part-of") != common.PART_OF:
            continue
        if labels.get(COMPONENT_LABEL) not in components:
            continue
        tool = _tool_image(res)
        for c in containers(pod):
            image = c.image
            if image is None:
                continue  # computed in a real preview: the reference of the stack's own push
            if image == tool:
                continue
            repository, by_digest = image.split("@", 1)[0], "@" in image
            if (by_digest and repository in built) or any(fnmatch.fnmatchcase(image, p) for p in prebuilt):
                continue
            yield Finding(
                f"{res.display}: container {c.name} runs {image!r}, which nothing in this stack builds, so its "
                "pods cannot start unless someone published it; set gateway.image_registry (target kubernetes) "
                "so the stack builds and pushes it and runs it by digest, or list the published image in this "
                "rule's prebuilt_images",
                res.urn,
            )


RUNTIME_IMAGES_BUILT = Rule(
    name="runtime-images-built",
    category=Category.RELIABILITY,
    severity=Severity.HIGH,
    description="The router, health monitor, batcher, batch service, endpoint picker and model store Jobs run "
    "images the stack builds and pushes (by digest), or images listed as published (prebuilt_images): never a "
    "reference nothing builds. A preparation Job's tool step (llm-compressor, TensorRT-LLM) runs the version's "
    "pinned tool image, recorded in the Job's provenance, as an engine runs its own.",
    remediation="Set gateway.image_registry on target kubernetes (eks builds into its ECR), or allow the "
    "published image in prebuilt_images.",
    stack_check=_runtime_images,
    settings=(
        Setting(
            "prebuilt_images",
            {"type": "array", "items": {"type": "string"}},
            [],
            "Published runtime images the stack may run without building them ('repo/image@sha256:...' glob "
            "patterns, e.g. the release workflow's images by digest).",
        ),
        Setting(
            "runtime_components",
            {"type": "array", "items": {"type": "string"}},
            RUNTIME_COMPONENTS,
            "app.kubernetes.io/component values of the workloads whose images the stack builds.",
        ),
    ),
)

RULES = (PROBES, MIN_REPLICAS, PDB, CAPACITY, SCALED, STARTUP, METRICS, RUNTIME_IMAGES_BUILT)
