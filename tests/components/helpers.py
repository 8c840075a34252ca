"""Building blocks for spec and program tests: a minimal valid stack, a writer for stack files, and the
engine Deployments of a synthesis."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import promql_parser
import yaml

from components.core.decisions import Decisions, decide
from components.core.placement import place
from components.deploy import synthesis as plan
from components.render import alerts, common, dashboards, scaling
from components.spec import KubernetesClusterSpec, ModelSpec, PlatformSpec

#: The hub commit of meta-llama/Llama-3.1-8B-Instruct the committed stacks pin.
LLAMA_8B_COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"
#: A well-formed commit for test sources whose real history does not matter.
SOME_COMMIT = "0123456789abcdef0123456789abcdef01234567"

MINIMAL: dict[str, Any] = {
    "name": "inferstack",
    "environment": "test",
    "target": "eks",
    "cluster": {"api_endpoint": {"access": "public", "public_cidrs": ["203.0.113.0/28"]}},
    "gpu_pools": [{"name": "l40s", "instance_type": "g6e.xlarge"}],
    "models": [
        {
            "name": "llama-8b",
            "source": "meta-llama/Llama-3.1-8B-Instruct",
            "revision": LLAMA_8B_COMMIT,
            "pool": "l40s",
            "engine": {"max_model_len": 8192, "max_num_seqs": 64},
            "scaling": {"min_replicas": 1, "max_replicas": 2},
        }
    ],
}


def minimal() -> dict[str, Any]:
    return copy.deepcopy(MINIMAL)


def decided(spec: PlatformSpec) -> Decisions:
    """The decisions the program makes for a spec a test built: placed, then decided once."""
    return decide(spec, place(spec))


#: The model store of a cluster the stack does not create (target kubernetes): an S3-compatible bucket.
OWN_STORE: dict[str, Any] = {
    "bucket": "models",
    "endpoint_url": "http://minio.minio.svc:9000",
    "reader_secret": "model-store-reader",
    "writer_secret": "model-store-writer",
}


def on_own_cluster(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` as a target kubernetes stack, with its model store; its cluster keeps what every cluster has (an
    eks stack's own fields, such as MINIMAL's api_endpoint, are refused on kubernetes)."""
    common = {k: v for k, v in raw.get("cluster", {}).items() if k in KubernetesClusterSpec.model_fields}
    return {**raw, "target": "kubernetes", "cluster": common, "model_store": copy.deepcopy(OWN_STORE)}


def cluster(**fields: Any) -> dict[str, Any]:
    """MINIMAL's cluster block (its API endpoint) with ``fields`` on top."""
    return {**copy.deepcopy(MINIMAL["cluster"]), **fields}


def write_stack(
    directory: Path, name: str, platform: Any, extra_config: dict[str, Any] | None = None
) -> Path:
    path = directory / f"Pulumi.{name}.yaml"
    config = {"inferstack:platform": platform, **(extra_config or {})}
    path.write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    return path


def engine_deployments(synthesis: plan.Synthesis) -> dict[str, dict[str, Any]]:
    """Model name -> its engine Deployment manifest; fails on a model with two."""
    out: dict[str, dict[str, Any]] = {}
    for m in synthesis.kubernetes_manifests():
        if (
            m["kind"] == "Deployment"
            and m["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"
        ):
            model = m["metadata"]["labels"][common.MODEL_LABEL]
            assert model not in out, f"two engine Deployments for model {model}"
            out[model] = m
    return out


def engine_workloads(synthesis: plan.Synthesis) -> dict[str, dict[str, Any]]:
    """Model name -> its engine workload: a Deployment, or a LeaderWorkerSet (a replica that spans nodes)."""
    out: dict[str, dict[str, Any]] = {}
    for m in synthesis.kubernetes_manifests():
        if (
            m["kind"] in ("Deployment", "LeaderWorkerSet")
            and m["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"
        ):
            model = m["metadata"]["labels"][common.MODEL_LABEL]
            assert model not in out, f"two engine workloads for model {model}"
            out[model] = m
    return out


def pod_templates(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A workload's pod templates by role: "pod" for a Deployment; "leader" and "worker" for a LeaderWorkerSet."""
    if workload["kind"] == "Deployment":
        return {"pod": workload["spec"]["template"]}
    group = workload["spec"]["leaderWorkerTemplate"]
    return {"leader": group["leaderTemplate"], "worker": group["workerTemplate"]}


#: Metrics of what the platform runs besides the engines; everything else a model's queries read must be in
#: its engine's table.
OTHER_SOURCES = re.compile(r"^(inferstack_router_|inferstack_health_|kube_|DCGM_|up$)")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(expr: str) -> set[str]:
    """Every metric name a PromQL expression selects."""
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            found.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def engine_name_of(name: str) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def model_queries(spec: PlatformSpec, model: ModelSpec) -> dict[str, list[str]]:
    """What reads a model's signals: source -> PromQL expressions (adapter templates filled in)."""
    rules = [
        r["metricsQuery"].replace("<<.Series>>", r["name"]["matches"].strip("^$"))
        for r in scaling.adapter_rules(spec)
        if r["name"]["as"].startswith(f"inferstack_{model.engine.kind.value}_")
    ]
    unit = decided(spec).models[model.name]
    return {
        "trigger": [t.query for t in scaling.triggers(spec, unit)],
        "adapter rule": [
            r.replace("<<.LabelMatchers>>", 'namespace="x"').replace("<<.GroupBy>>", "pod") for r in rules
        ],
        "alert": [a.expr for a in alerts.model_alerts(spec, unit)],
        "dashboard": [q for p in dashboards.model_panels(spec, unit) for q, _ in p.targets],
    }


def rendered_engine_deployment(spec: PlatformSpec, model_name: str | None = None) -> dict[str, Any]:
    """The engine Deployment of one model (the first by default), placed and rolled out as the program does."""
    from components.core import decisions, placement
    from components.render import engine

    decided = decisions.decide(spec, placement.place(spec))
    model = next(m for m in spec.models if model_name in (None, m.name))
    return engine.deployment(spec, decided.models[model.name])
