"""Each rule passes on the committed stacks and fails on a real rendered resource with one thing broken.

Resources come from synthesizing the real stacks; each failing case copies them and changes one property,
then runs the rule through its CrossGuard policy object (proxied properties, report callback).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from policies.inference.rules import RULES, Res
from tests.policies.helpers import BROKEN, COMMITTED, aws, container, crossguard, drop, k8s, mutate, rendered

ENGINE_70B = k8s("Deployment", "llama-3-70b-engine")
ENGINE_8B = k8s("Deployment", "llama-3-8b-engine")
BGE = k8s("Deployment", "bge-large-engine")
ROUTER = k8s("Deployment", "inferstack-router")
CANARY_8B = k8s("Deployment", "llama-3-8b-w4a16-engine")
H100 = aws("nodeGroup:NodeGroup", "inferstack-prod-h100")


def _edit_adapters(props: dict[str, Any], change: Callable[[list[dict[str, Any]]], object]) -> None:
    annotations = props["spec"]["template"]["metadata"]["annotations"]
    adapters = json.loads(annotations["inferstack.io/lora-adapters"])
    change(adapters)
    annotations["inferstack.io/lora-adapters"] = json.dumps(adapters)


def _as_sglang(props: dict[str, Any]) -> None:
    engine = container(props, "engine")
    engine["command"] = ["python3"]
    engine["args"] = ["-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B-Instruct"]


def set_flag(props: dict[str, Any], flag: str, value: str) -> None:
    args = container(props, "engine")["args"]
    args[args.index(flag) + 1] = value


def gpu(props: dict[str, Any], request: str, limit: str) -> None:
    resources = container(props, "engine")["resources"]
    resources["requests"]["nvidia.com/gpu"] = request
    resources["limits"]["nvidia.com/gpu"] = limit


def runtime_config(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    import yaml

    def apply(props: dict[str, Any]) -> None:
        doc = yaml.safe_load(props["data"]["runtime.yaml"])
        change(doc)
        props["data"]["runtime.yaml"] = yaml.safe_dump(doc)

    return apply


def engine_also_reads(resource: str) -> Callable[[dict[str, Any]], None]:
    """The engines' read policy with one more s3:GetObject grant."""

    def change(props: dict[str, Any]) -> None:
        document = json.loads(props["policy"])
        grant = {"Sid": "AlsoRead", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": resource}
        document["Statement"].append(grant)
        props["policy"] = json.dumps(document)

    return change


ENGINE_READ = aws("rolePolicy:RolePolicy", "inferstack-prod-engine-read-models")


ENGINE_ROLE = aws("role:Role", "inferstack-prod-engine")
BATCH_OBJECTS = "arn:aws:s3:::inferstack-prod-us-east-1-batches/batches/*"


def engine_also_allows(statement: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """The engines' read policy with one more statement."""

    def change(props: dict[str, Any]) -> None:
        document = json.loads(props["policy"])
        document["Statement"].append(statement)
        props["policy"] = json.dumps(document)

    return change


def _engine_role_name(resources: list[Res]) -> str:
    """The engine role's physical name, from the ARN its Pod Identity association carries (as AWS names it)."""
    association = next(r for r in resources if aws("PodIdentityAssociation", "inferstack-prod-engine")(r))
    return str(association.props["roleArn"]).rsplit("/", 1)[-1]


def engine_attaches(policy_arn: str | None, *policy: Res) -> Callable[[list[Res]], list[Res]]:
    """The stack plus a RolePolicyAttachment of ``policy_arn`` (None: not known yet) to the engine role, and
    ``policy`` resources of its own."""

    def add(resources: list[Res]) -> list[Res]:
        attachment = Res(
            "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
            "engine-extra",
            "urn:pulumi:prod::inferstack::aws:iam/rolePolicyAttachment:RolePolicyAttachment::engine-extra",
            {"role": _engine_role_name(resources), "policyArn": policy_arn},
        )
        return [*resources, *policy, attachment]

    return add


EXTRA_POLICY = Res(
    "aws:iam/policy:Policy",
    "engine-extra-reads",
    "urn:pulumi:prod::inferstack::aws:iam/policy:Policy::engine-extra-reads",
    {
        "policy": json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Sid": "Extra", "Effect": "Allow", "Action": "s3:GetObject", "Resource": BATCH_OBJECTS}
                ],
            }
        )
    },
)


def untag(props: dict[str, Any]) -> None:
    props["tags"].pop("inferstack:workload")


def iam_policy(props: dict[str, Any]) -> None:
    props["policy"] = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Sid": "Admin", "Effect": "Allow", "Action": "*", "Resource": "*"}],
        }
    )


@dataclass(frozen=True)
class Case:
    id: str
    rule: str
    stack: str
    broken: Callable[[list[Res]], list[Res]]
    expect: tuple[str, ...]
    config: dict[str, Any] | None = None
    stacks_dir: Path = Path("stacks")
    """Where ``stack`` is: the committed stacks, or tests/policies/stacks (``helpers.BROKEN``)."""


def m(
    select: Callable[[Res], bool], change: Callable[[dict[str, Any]], object]
) -> Callable[[list[Res]], list[Res]]:
    return lambda resources: mutate(resources, select, change)


def d(select: Callable[[Res], bool]) -> Callable[[list[Res]], list[Res]]:
    return lambda resources: drop(resources, select)


CASES = [
    # fit
    Case(
        "70b-fp16-on-one-l4",
        "engine-model-fits-gpus",
        "dev",
        m(
            ENGINE_8B,
            lambda p: (
                container(p, "engine")["args"].__setitem__(0, "meta-llama/Llama-3.1-70B-Instruct"),
                set_flag(p, "--dtype", "float16"),
            ),
        ),
        (
            "Llama-3.1-70B-Instruct",
            "does not fit the L4 GPUs of g6.2xlarge",
            "does NOT fit",
            "weights",
            "quantize",
        ),
    ),
    Case(
        "context-raised-in-args",
        "engine-model-fits-gpus",
        "prod",
        m(BGE, lambda p: container(p, "engine")["args"].extend(["--gpu-memory-utilization", "0.05"])),
        ("bge-large-engine", "does NOT fit"),
    ),
    Case(
        "tp-3-on-8-gpus",
        "engine-parallelism-divides-node",
        "prod",
        m(ENGINE_70B, lambda p: set_flag(p, "--tensor-parallel-size", "3")),
        ("3 x 1 = 3 GPUs does not divide the 8 GPUs of p5.48xlarge", "1, 2, 4, 8"),
    ),
    Case(
        "request-ne-limit",
        "engine-gpu-request-matches-parallelism",
        "prod",
        m(ENGINE_70B, lambda p: gpu(p, "2", "1")),
        ("requests 2 nvidia.com/gpu but limits 1", "set both to 2"),
    ),
    Case(
        "gpus-ne-tp",
        "engine-gpu-request-matches-parallelism",
        "prod",
        m(ENGINE_70B, lambda p: gpu(p, "1", "1")),
        ("gets 1 nvidia.com/gpu but runs tensor x pipeline parallel 2 x 1 = 2",),
    ),
    Case(
        "memory-over-node-share",
        "engine-requests-fit-node",
        "prod",
        m(BGE, lambda p: container(p, "engine")["resources"]["requests"].__setitem__("memory", "64Gi")),
        ("memory 64.0 GiB > 28.8 GiB", "g6.2xlarge"),
    ),
    # placement
    Case(
        "no-toleration",
        "engine-tolerates-pool-taint",
        "prod",
        m(ENGINE_70B, lambda p: p["spec"]["template"]["spec"].pop("tolerations")),
        ("does not tolerate its taint nvidia.com/gpu:NoSchedule",),
    ),
    Case(
        "extra-toleration",
        "engine-tolerates-pool-taint",
        "prod",
        m(
            ENGINE_70B,
            lambda p: p["spec"]["template"]["spec"]["tolerations"].append(
                {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
            ),
        ),
        ("tolerates dedicated (Exists), which pool h100 does not carry",),
    ),
    Case(
        "untainted-gpu-pool",
        "gpu-pool-has-gpu-taint",
        "prod",
        m(H100, lambda p: p.__setitem__("taints", [])),
        ("inferstack-prod-h100 (p5.48xlarge) has GPUs but no nvidia.com/gpu:NO_SCHEDULE taint",),
    ),
    Case(
        "gpu-pod-selects-system",
        "no-gpu-pods-on-system-pool",
        "prod",
        m(
            BGE,
            lambda p: p["spec"]["template"]["spec"].__setitem__(
                "nodeSelector", {"inferstack.io/node-role": "system"}
            ),
        ),
        ("matches the system pool (inferstack-prod-system)",),
    ),
    Case(
        "gpu-pod-without-selector",
        "no-gpu-pods-on-system-pool",
        "prod",
        m(BGE, lambda p: p["spec"]["template"]["spec"].pop("nodeSelector")),
        ("asks for GPUs but has no nodeSelector",),
    ),
    # reliability
    Case(
        "router-without-readiness",
        "containers-have-probes",
        "prod",
        m(ROUTER, lambda p: container(p, "router").pop("readinessProbe")),
        ("container router has no readinessProbe",),
    ),
    Case(
        "one-replica-in-prod",
        "engine-min-replicas",
        "prod",
        m(k8s("ScaledObject", "llama-3-8b-engine"), lambda p: p["spec"].__setitem__("minReplicaCount", 1)),
        ("runs 1 replica(s) at minimum in prod", "at least 2"),
    ),
    Case(
        "no-pdb",
        "engine-has-disruption-budget",
        "prod",
        d(k8s("PodDisruptionBudget", "llama-3-8b-engine")),
        ("llama-3-8b-engine: no PodDisruptionBudget selects its pods",),
    ),
    Case(
        "pdb-blocks-drains",
        "engine-has-disruption-budget",
        "prod",
        m(
            k8s("PodDisruptionBudget", "llama-3-8b-engine"),
            lambda p: p["spec"].__setitem__("maxUnavailable", 0),
        ),
        ("allows no voluntary disruption", "maxUnavailable: 1"),
    ),
    Case(
        "pool-too-small",
        "max-replicas-within-pool-capacity",
        "prod",
        m(H100, lambda p: p["scalingConfig"].__setitem__("maxSize", 1)),
        (
            "pool h100",
            "need 2 nodes of p5.48xlarge but the pool stops at 1",
            "raise the pool's max_nodes to 2",
        ),
    ),
    Case(
        "no-scaler",
        "engine-has-scaler",
        "prod",
        d(k8s("ScaledObject", "llama-3-8b-engine")),
        ("llama-3-8b-engine: no ScaledObject or HorizontalPodAutoscaler targets it",),
    ),
    Case(
        "dangling-scaler",
        "engine-has-scaler",
        "prod",
        m(
            k8s("ScaledObject", "bge-large-engine"),
            lambda p: p["spec"]["scaleTargetRef"].__setitem__("name", "bge-engine"),
        ),
        ("scaleTargetRef Deployment/bge-engine names nothing",),
    ),
    Case(
        "impatient-startup-probe",
        "engine-startup-probe-budget",
        "prod",
        m(ENGINE_70B, lambda p: container(p, "engine")["startupProbe"].__setitem__("failureThreshold", 3)),
        ("startupProbe gives the engine 30 s to start", "failureThreshold x periodSeconds >="),
    ),
    # weights
    Case(
        "engine-downloads-from-the-hub",
        "weights-from-pinned-store",
        "prod",
        m(
            ENGINE_8B,
            lambda p: container(p, "engine")["args"].__setitem__(0, "meta-llama/Llama-3.1-8B-Instruct"),
        ),
        ("would download from the hub at every start",),
    ),
    Case(
        "preparation-from-a-moving-branch",
        "weights-from-pinned-store",
        "prod",
        m(
            lambda r: r.kind == "Job" and r.k8s_name.startswith("llama-3-8b-weights-"),
            lambda p: (args := container(p, "prepare")["args"]).__setitem__(
                args.index("--revision") + 1, "main"
            ),
        ),
        ("at main, not a commit",),
    ),
    # security
    Case(
        "router-latest",
        "images-pinned",
        "prod",
        m(ROUTER, lambda p: container(p, "router").__setitem__("image", "ghcr.io/inferstack/router:latest")),
        ("'ghcr.io/inferstack/router:latest' uses the moving tag ':latest'", "pin it by digest"),
    ),
    Case(
        "untagged-init-image",
        "images-pinned",
        "prod",
        m(
            ENGINE_70B,
            lambda p: p["spec"]["template"]["spec"].__setitem__(
                "initContainers", [{"name": "warm", "image": "busybox"}]
            ),
        ),
        ("container warm image 'busybox' has no tag",),
    ),
    Case(
        "chart-override-latest",
        "images-pinned",
        "prod",
        m(
            aws("Chart", "dcgm-exporter"),
            lambda p: p["values"].__setitem__(
                "image", {"repository": "nvcr.io/nvidia/k8s/dcgm-exporter", "tag": "latest"}
            ),
        ),
        ("Helm chart dcgm-exporter: values.image", ":latest"),
    ),
    Case(
        "chart-range",
        "helm-charts-pinned",
        "prod",
        m(aws("Chart", "keda"), lambda p: p.__setitem__("version", "^2.17")),
        ("Helm chart keda (keda): '^2.17' is not an exact chart version",),
    ),
    Case(
        "engine-as-root",
        "no-privileged-or-root-containers",
        "prod",
        m(
            ENGINE_70B,
            lambda p: container(p, "engine")["securityContext"].update(runAsUser=0, runAsNonRoot=False),
        ),
        ("container engine runs as user 0 (root)",),
    ),
    Case(
        "router-privileged",
        "no-privileged-or-root-containers",
        "prod",
        m(ROUTER, lambda p: container(p, "router")["securityContext"].__setitem__("privileged", True)),
        ("container router is privileged",),
    ),
    Case(
        "hf-token-in-env",
        "no-plaintext-secrets",
        "prod",
        m(
            ENGINE_70B,
            lambda p: container(p, "engine")["env"].append({"name": "HF_TOKEN", "value": "hf_" + "a" * 34}),
        ),
        ("env HF_TOKEN holds a literal in the pod spec", "Kubernetes Secret"),
    ),
    Case(
        "api-key-on-command-line",
        "no-plaintext-secrets",
        "prod",
        m(ENGINE_8B, lambda p: container(p, "engine")["args"].extend(["--api-key", "s3cr3t"])),
        ("passes a secret on its command line (--api-key)",),
    ),
    Case(
        "inline-api-keys-in-configmap",
        "no-plaintext-secrets",
        "prod",
        m(
            k8s("ConfigMap", "inferstack-runtime-config"),
            runtime_config(
                lambda doc: doc["router"].__setitem__(
                    "api_keys", [{"name": "ci", "key": "k-123", "models": []}]
                )
            ),
        ),
        ("data[runtime.yaml] sets router.api_keys inline",),
    ),
    Case(
        "grafana-password-in-chart-values",
        "no-plaintext-secrets",
        "prod",
        m(
            aws("Chart", "kube-prometheus-stack"),
            lambda p: p["values"]["grafana"].__setitem__("adminPassword", "hunter2"),
        ),
        ("Helm chart kube-prometheus-stack: values.grafana.adminPassword is a credential in plain values",),
    ),
    Case(
        "no-default-deny",
        "namespaces-have-network-policy",
        "prod",
        d(k8s("NetworkPolicy", "default-deny")),
        ("namespace inference: no NetworkPolicy with an empty podSelector",),
    ),
    Case(
        "public-without-keys",
        "public-ingress-requires-api-key",
        "prod",
        m(
            k8s("ConfigMap", "inferstack-runtime-config"),
            runtime_config(lambda doc: doc["router"].__setitem__("require_api_key", False)),
        ),
        (
            "Ingress inference/inferstack-router: is public, but the router in inference does not require API keys",
        ),
    ),
    Case(
        "every-key-in-the-top-band",
        "tenants-not-all-in-top-band",
        "prod",
        m(
            k8s("ConfigMap", "inferstack-runtime-config"),
            runtime_config(
                lambda doc: doc["router"].update(
                    default_band="interactive",
                    tenants=[
                        {"name": "support-bot", "band": "interactive"},
                        {"name": "ci", "band": "interactive"},
                    ],
                )
            ),
        ),
        ("every API key is in the top band (interactive",),
    ),
    Case(
        "keys-of-no-tenant-in-the-top-band",
        "tenants-not-all-in-top-band",
        "prod",
        m(
            k8s("ConfigMap", "inferstack-runtime-config"),
            runtime_config(lambda doc: doc["router"].update(default_band="interactive", tenants=[])),
        ),
        ("put the keys that can wait in a lower band",),
    ),
    Case(
        "public-to-engine",
        "public-ingress-requires-api-key",
        "prod",
        m(
            k8s("Ingress", "inferstack-router"),
            lambda p: p["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"].__setitem__(
                "name", "llama-3-70b-engine"
            ),
        ),
        ("exposes llama-3-70b-engine publicly without the router",),
    ),
    Case(
        "bucket-unencrypted",
        "s3-buckets-encrypted-private",
        "prod",
        d(aws("BucketServerSideEncryptionConfiguration", "inferstack-prod-models")),
        ("S3 bucket inferstack-prod-models: no default encryption",),
    ),
    Case(
        "bucket-public-policy",
        "s3-buckets-encrypted-private",
        "prod",
        m(
            aws("BucketPublicAccessBlock", "inferstack-prod-models"),
            lambda p: p.__setitem__("blockPublicPolicy", False),
        ),
        ("public access block leaves blockPublicPolicy off",),
    ),
    Case(
        "star-on-star",
        "iam-no-wildcard-admin",
        "prod",
        m(aws("rolePolicy:RolePolicy", "inferstack-prod-engine-read-models"), iam_policy),
        ("statement Admin allows every action on every resource",),
    ),
    Case(
        "admin-attachment",
        "iam-no-wildcard-admin",
        "prod",
        m(
            aws("RolePolicyAttachment", "inferstack-prod-node-AmazonEKSWorkerNodePolicy"),
            lambda p: p.__setitem__("policyArn", "arn:aws:iam::aws:policy/AdministratorAccess"),
        ),
        ("attaches arn:aws:iam::aws:policy/AdministratorAccess",),
    ),
    Case(
        "engine-reads-batch-files",
        "batch-data-apart-from-engines",
        "prod",
        m(ENGINE_READ, engine_also_reads("arn:aws:s3:::inferstack-prod-us-east-1-batches/batches/*")),
        (
            "grants the engine role inferstack-prod-engine",
            "reaches the batch bucket inferstack-prod-us-east-1-batches",
        ),
    ),
    Case(
        "engine-reads-every-bucket",
        "batch-data-apart-from-engines",
        "prod",
        m(ENGINE_READ, engine_also_reads("arn:*:s3:::*")),
        ("reaches the batch bucket", "every object of the model bucket inferstack-prod-us-east-1-models"),
    ),
    Case(
        "engine-reads-the-whole-model-bucket",
        "batch-data-apart-from-engines",
        "prod",
        m(ENGINE_READ, engine_also_reads("arn:aws:s3:::inferstack-prod-us-east-1-models/*")),
        ("statement AlsoRead", "every object of the model bucket inferstack-prod-us-east-1-models"),
    ),
    Case(
        "batch-bucket-is-the-model-bucket",
        "batch-data-apart-from-engines",
        "prod",
        m(
            lambda r: r.type == "aws:s3/bucket:Bucket" and r.name == "inferstack-prod-batches",
            lambda p: p.__setitem__("bucket", "inferstack-prod-us-east-1-models"),
        ),
        ("'inferstack-prod-us-east-1-models' is both the model bucket and the batch bucket",),
    ),
    Case(
        "engine-role-attaches-s3-read-only",
        "batch-data-apart-from-engines",
        "prod",
        engine_attaches("arn:aws:iam::aws:policy/AmazonS3ReadOnlyAccess"),
        (
            "attached AWS managed policy arn:aws:iam::aws:policy/AmazonS3ReadOnlyAccess grants the engine role",
            "reaches the batch bucket inferstack-prod-us-east-1-batches",
            "every object of the model bucket inferstack-prod-us-east-1-models",
        ),
    ),
    Case(
        "engine-role-attaches-a-policy-of-the-stack",
        "batch-data-apart-from-engines",
        "prod",
        engine_attaches("arn:aws:iam::123456789012:policy/engine-extra-reads-0a1b2c3", EXTRA_POLICY),
        (
            "Policy engine-extra-reads: policy (attached by RolePolicyAttachment engine-extra) statement Extra",
        ),
    ),
    Case(
        "engine-role-attaches-a-policy-not-known-yet",
        "batch-data-apart-from-engines",
        "prod",
        engine_attaches(None, EXTRA_POLICY),
        ("its ARN is not known yet", "reaches the batch bucket inferstack-prod-us-east-1-batches"),
    ),
    Case(
        "engine-not-action",
        "batch-data-apart-from-engines",
        "prod",
        m(
            ENGINE_READ,
            engine_also_allows({"Sid": "Not", "Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}),
        ),
        (
            "statement Not grants the engine role",
            "reaches the batch bucket inferstack-prod-us-east-1-batches",
        ),
    ),
    Case(
        "engine-not-resource",
        "batch-data-apart-from-engines",
        "prod",
        m(
            ENGINE_READ,
            engine_also_allows(
                {
                    "Effect": "Allow",
                    "Action": "s3:GetObject",
                    "NotResource": "arn:aws:s3:::inferstack-prod-us-east-1-models/x/*",
                }
            ),
        ),
        ("(NotResource), which reaches the batch bucket inferstack-prod-us-east-1-batches",),
    ),
    Case(
        "engine-role-untagged",
        "batch-data-apart-from-engines",
        "prod",
        m(ENGINE_ROLE, untag),
        (
            "Role inferstack-prod-engine: the engines' service account inference/inferstack-engine",
            "lacks the tag inferstack:workload=engine",
        ),
    ),
    Case(
        "untagged-engine-role-reads-batch-files",
        "batch-data-apart-from-engines",
        "prod",
        lambda resources: mutate(
            m(ENGINE_ROLE, untag)(resources), ENGINE_READ, engine_also_reads(BATCH_OBJECTS)
        ),
        ("statement AlsoRead grants the engine role inferstack-prod-engine", "reaches the batch bucket"),
    ),
    Case(
        "no-secrets-encryption",
        "eks-secrets-encryption",
        "prod",
        m(aws("cluster:Cluster", "inferstack-prod"), lambda p: p.pop("encryptionConfig")),
        ("Secrets (API keys, HF token) are not envelope-encrypted",),
    ),
    Case(
        "public-endpoint-in-prod",
        "eks-api-endpoint-restricted",
        "prod",
        m(
            aws("cluster:Cluster", "inferstack-prod"),
            lambda p: p["vpcConfig"].update(endpointPublicAccess=True, publicAccessCidrs=["0.0.0.0/0"]),
        ),
        ("admits 0.0.0.0/0, the whole internet", "cluster.api_endpoint.public_cidrs"),
    ),
    Case(
        "public-endpoint-without-allow-list-in-prod",
        "eks-api-endpoint-restricted",
        "prod",
        m(aws("cluster:Cluster", "inferstack-prod"), lambda p: p["vpcConfig"].pop("publicAccessCidrs")),
        ("public to the whole internet (no allow-list)", "access: private"),
    ),
    Case(
        "telemetry-on",
        "engine-telemetry-off",
        "prod",
        m(
            ENGINE_8B,
            lambda p: container(p, "engine").__setitem__(
                "env", [v for v in container(p, "engine")["env"] if v["name"] != "VLLM_NO_USAGE_STATS"]
            ),
        ),
        ("llama-3-8b-engine: engine container does not opt out", "VLLM_NO_USAGE_STATS=1"),
    ),
    Case(
        "sglang-without-metrics",
        "engine-exports-metrics",
        "dev",
        m(
            k8s("Deployment", "qwen-7b-sglang-engine"),
            lambda p: container(p, "engine")["args"].remove("--enable-metrics"),
        ),
        ("SGLang exports metrics only with --enable-metrics", "scaler's Prometheus triggers"),
    ),
    # money
    Case(
        "over-budget",
        "monthly-cost-within-budget",
        "prod",
        m(H100, lambda p: p["scalingConfig"].__setitem__("maxSize", 8)),
        ("over the budget of $250,000", "Top contributors", "inferstack-prod-h100: 8 x p5.48xlarge"),
        {"monthly_budget_usd": 250_000},
    ),
    Case(
        "spot-in-prod",
        "no-spot-in-prod",
        "prod",
        m(H100, lambda p: p.__setitem__("capacityType", "SPOT")),
        ("spot capacity in prod",),
    ),
    # multi-node groups
    Case(
        "group-size-off-by-one",
        "group-gpus-match-parallelism",
        "prod-405b",
        m(
            k8s("LeaderWorkerSet", "llama-3-405b-engine"),
            lambda p: p["spec"]["leaderWorkerTemplate"].__setitem__("size", 3),
        ),
        ("a group of 3 pods x 8 GPUs = 24 GPUs, started with --nnodes 2", "set leaderWorkerTemplate.size"),
    ),
    Case(
        "group-without-efa-in-prod",
        "multi-node-needs-efa-and-placement-group",
        "prod-405b",
        m(
            aws("ec2/launchTemplate:LaunchTemplate", "inferstack-405b-h100"),
            lambda p: (p.pop("networkInterfaces"), p.pop("placement")),
        ),
        (
            "without EFA network interfaces on its nodes, a cluster placement group for its nodes",
            "pool h100 (p5.48xlarge)",
        ),
    ),
    Case(
        "group-on-spot",
        "no-multi-node-on-spot",
        "prod-405b",
        m(
            aws("eks/nodeGroup:NodeGroup", "inferstack-405b-h100"),
            lambda p: p.__setitem__("capacityType", "SPOT"),
        ),
        ("a group of 2 nodes on spot pool h100", "budget.allow_multi_node_spot"),
    ),
    # hygiene
    Case(
        "missing-cost-center",
        "aws-required-tags",
        "prod",
        m(aws("vpc:Vpc", "inferstack-prod"), lambda p: p["tags"].pop("cost-center")),
        ("Vpc inferstack-prod: missing tag(s) cost-center",),
    ),
    # names
    Case(
        "ecr-repository-named-by-environment",
        "aws-names-derive-from-cluster",
        "prod-405b",
        m(
            lambda r: r.type == "aws:ecr/repository:Repository" and r.props["name"].endswith("/router"),
            lambda p: p.__setitem__("name", "inferstack/prod/router"),
        ),
        (
            "Repository name 'inferstack/prod/router'",
            "cluster's name 'inferstack-405b'",
            "'inferstack-405b/...'",
        ),
    ),
    Case(
        "missing-part-of",
        "workload-recommended-labels",
        "prod",
        m(ROUTER, lambda p: p["metadata"]["labels"].pop("app.kubernetes.io/part-of")),
        ("metadata.labels lack app.kubernetes.io/part-of",),
    ),
    Case(
        "runtime-image-nothing-builds",
        "runtime-images-built",
        "kind",
        m(ROUTER, lambda p: container(p, "router").__setitem__("image", "ghcr.io/inferstack/router:0.1.0")),
        ("'ghcr.io/inferstack/router:0.1.0', which nothing in this stack builds", "gateway.image_registry"),
    ),
    Case(
        # the tool step's image is the version's own (in the Job's provenance); the store steps still run the build
        "preparation-upload-on-an-unbuilt-image",
        "runtime-images-built",
        "staging",
        m(
            lambda r: r.kind == "Job" and r.k8s_name.startswith("prepare-"),
            lambda p: container(p, "upload").__setitem__("image", "ghcr.io/inferstack/weights:0.1.0"),
        ),
        ("container upload runs 'ghcr.io/inferstack/weights:0.1.0', which nothing in this stack builds",),
    ),
    # lifecycle (staging serves llama-3-8b in two versions; the rules are scoped to it here)
    Case(
        "canary-jumps-to-50",
        "new-versions-start-as-bounded-canaries",
        "staging",
        m(
            CANARY_8B,
            lambda p: p["metadata"]["annotations"].update(
                {"inferstack.io/canary-steps": "50,100", "inferstack.io/version-weight": "50"}
            ),
        ),
        ("canary step 0% -> 50% moves 50 points", "at most 25 per step"),
        {"environments": ["staging"]},
    ),
    Case(
        "prepared-checkpoint-without-its-job",
        "prepared-checkpoints-have-provenance",
        "staging",
        d(lambda r: r.kind == "Job" and r.k8s_name.startswith("prepare-")),
        (
            "llama-3-8b-w4a16-engine: loads s3://inferstack-staging-us-east-1-models/models/prepared/",
            "the stack has no such Job",
        ),
        {"environments": ["staging"]},
    ),
    Case(
        "preparation-job-without-provenance",
        "prepared-checkpoints-have-provenance",
        "staging",
        m(
            lambda r: r.kind == "Job" and r.k8s_name.startswith("prepare-"),
            lambda p: p["metadata"]["annotations"].pop("inferstack.io/provenance"),
        ),
        ("no provenance",),
        {"environments": ["staging"]},
    ),
    # sharing (stacks/Pulumi.shared.yaml)
    Case(
        "two-teams-time-slice-in-prod",
        "shared-gpu-across-teams-only-with-mig",
        "shared",
        m(
            k8s("Deployment", "bge-m3-engine"),
            lambda p: p["spec"]["template"]["metadata"]["labels"].__setitem__("inferstack.io/team", "ads"),
        ),
        ("pool l40s-shared", "bge-m3-engine (ads)", "llama-3-8b-engine (search)", "MIG"),
        {"environments": ["dev"]},
    ),
    Case(
        "time-sliced-memory-over-the-gpu",
        "shared-gpu-memory-within-limits",
        "shared",
        m(k8s("Deployment", "llama-3-8b-engine"), lambda p: set_flag(p, "--gpu-memory-utilization", "0.9")),
        ("2 engines share each GPU", "1.80 of its memory", "at most 0.45"),
    ),
    Case(
        "sleep-on-an-old-vllm",
        "sleep-only-where-supported",
        "shared",
        m(
            k8s("Deployment", "qwen-7b-engine"),
            lambda p: container(p, "engine").__setitem__("image", "vllm/vllm-openai:v0.8.5"),
        ),
        ("qwen-7b-engine", "older than vLLM 0.10.1"),
    ),
    # adapters
    Case(
        "adapter-on-a-moving-revision",
        "adapter-sources-pinned",
        "prod",
        m(ENGINE_8B, lambda p: _edit_adapters(p, lambda a: a[0].update(revision="main"))),
        ("llama-3-8b-sql", "revision 'main'", "pin it to a commit"),
    ),
    Case(
        "adapter-above-max-rank",
        "adapter-ranks-within-limits",
        "prod",
        m(ENGINE_8B, lambda p: set_flag(p, "--max-lora-rank", "8")),
        ("llama-3-8b-sql has rank 16", "--max-lora-rank 8", "raise engine.lora.max_rank"),
    ),
    Case(
        "adapters-on-sglang",
        "adapters-on-lora-engines",
        "prod",
        m(ENGINE_8B, _as_sglang),
        ("declares adapters (llama-3-8b-sql, llama-3-8b-support)", "SGLang 0.5.3"),
    ),
]


PD_DECODE = k8s("Deployment", "llama-3-8b-engine")
PD_PREFILL = k8s("Deployment", "llama-3-8b-prefill-engine")


def kv_config(change: Callable[[dict[str, Any]], object]) -> Callable[[dict[str, Any]], None]:
    """An engine's ``--kv-transfer-config`` through ``change``."""

    def apply(props: dict[str, Any]) -> None:
        args = container(props, "engine")["args"]
        at = args.index("--kv-transfer-config") + 1
        config = json.loads(args[at])
        change(config)
        args[at] = json.dumps(config)

    return apply


def _sglang_prefill(props: dict[str, Any]) -> None:
    _as_sglang(props)
    container(props, "engine")["args"] += ["--disaggregation-mode", "prefill"]


CASES += [
    # prefill/decode disaggregation (tests/policies/stacks/Pulumi.pd.yaml: prod, the prefill role in its own pool)
    Case(
        "pd-on-sglang",
        "pd-engines-can-transfer-kv",
        "pd",
        m(PD_PREFILL, _sglang_prefill),
        ("asks for prefill/decode disaggregation, but SGLang", "hands no KV cache to another engine here"),
        stacks_dir=BROKEN,
    ),
    Case(
        "pd-other-connector",
        "pd-engines-can-transfer-kv",
        "pd",
        m(PD_DECODE, kv_config(lambda c: c.__setitem__("kv_connector", "LMCacheConnectorV1"))),
        ("kv_connector 'LMCacheConnectorV1': inferstack pairs NixlConnector engines only",),
        stacks_dir=BROKEN,
    ),
    Case(
        "pd-two-pools-without-efa-in-prod",
        "pd-cross-pool-fast-path",
        "pd",
        m(
            aws("ec2/launchTemplate:LaunchTemplate", "inferstack-prod-prefill"),
            lambda p: p.pop("networkInterfaces"),
        ),
        (
            "the prefill role runs in pool prefill and the decode role in pool decode, without EFA on pool prefill",
        ),
        stacks_dir=BROKEN,
    ),
    Case(
        "pd-decode-recomputes-quietly",
        "pd-roles-check-each-other",
        "pd",
        m(PD_DECODE, kv_config(lambda c: c.__setitem__("kv_load_failure_policy", "recompute"))),
        ("kv_load_failure_policy 'recompute'", "keeps pairing with it"),
        stacks_dir=BROKEN,
    ),
    Case(
        "pd-lease-shorter-than-the-routers-wait",
        "pd-roles-check-each-other",
        "pd",
        m(
            PD_PREFILL,
            kv_config(lambda c: c["kv_connector_extra_config"].__setitem__("kv_lease_duration", 30)),
        ),
        (
            "kv_lease_duration 30 s is shorter than the router's longest wait for a decode carrying its KV (150 s",
        ),
        stacks_dir=BROKEN,
    ),
    Case(
        "pd-without-the-routers-pairing",
        "pd-roles-check-each-other",
        "pd",
        m(
            k8s("ConfigMap", "inferstack-runtime-config"),
            runtime_config(lambda doc: doc["models"][0].pop("prefill")),
        ),
        ("no router pairs it with 'llama-3-8b''s prefill engines",),
        stacks_dir=BROKEN,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rule_fails_on_broken_resource(case: Case) -> None:
    resources = rendered(case.stack, case.stacks_dir)
    assert crossguard(case.rule, resources, case.config) == [], "the unbroken stack must pass"
    messages = crossguard(case.rule, case.broken(resources), case.config)
    assert messages, "the broken resource must fail"
    joined = "\n".join(messages)
    for text in case.expect:
        assert text in joined, f"{text!r} not in {joined!r}"


def test_every_rule_has_a_failing_case() -> None:
    assert {r.name for r in RULES} <= {c.rule for c in CASES}


@pytest.mark.parametrize("stack", COMMITTED)
@pytest.mark.parametrize("rule", [r.name for r in RULES])
def test_committed_stacks_pass_every_rule(stack: str, rule: str) -> None:
    from policies.inference import config as policy_config
    from tests.stacks import load

    settings = policy_config.resolve(policy_config.for_spec(load(stack).spec))[rule].settings
    assert crossguard(rule, rendered(stack), settings) == []


def test_environment_scoped_rules_leave_dev_alone() -> None:
    """dev uses spot, a public endpoint and scale-to-zero engines: the prod-only rules do not apply there."""
    resources = rendered("dev")
    for rule in (
        "no-spot-in-prod",
        "eks-api-endpoint-restricted",
        "engine-min-replicas",
        "engine-has-disruption-budget",
    ):
        assert crossguard(rule, resources) == []
    assert crossguard("engine-min-replicas", resources, {"environments": ["dev"]})


def test_spot_in_prod_when_allowed() -> None:
    broken = mutate(rendered("prod"), H100, lambda p: p.__setitem__("capacityType", "SPOT"))
    assert crossguard("no-spot-in-prod", broken, {"allow_spot": True}) == []


def test_budget_matches_plan_cost() -> None:
    """The policy prices the resources exactly as `inferstack plan` prices the spec."""
    from components.clouds import targets
    from policies.inference.rules.money import bill
    from tests.stacks import load

    for stack in ("prod", "staging", "dev"):
        loaded = load(stack)
        lines, unpriced = bill(rendered(stack))
        assert unpriced == []
        assert sum(line.usd_month for line in lines) == pytest.approx(
            targets.stack_cost(loaded.spec, loaded.layout).max_usd_month
        )


def test_references_and_pulumi_secrets_in_chart_values_are_not_plaintext() -> None:
    def refs(p: dict[str, Any]) -> None:
        p["values"]["grafana"]["admin"] = {"existingSecret": "grafana-admin", "passwordKey": "admin-password"}
        p["values"]["grafana"]["existing_secret"] = "grafana-admin"
        p["values"]["grafana"]["adminPassword"] = "[secret]"

    resources = mutate(rendered("prod"), aws("Chart", "kube-prometheus-stack"), refs)
    assert crossguard("no-plaintext-secrets", resources) == []


def test_pulumi_secret_in_env_is_still_plaintext_in_the_pod_spec() -> None:
    resources = mutate(
        rendered("prod"),
        ROUTER,
        lambda p: container(p, "router")["env"].append({"name": "API_KEY", "value": "[secret]"}),
    )
    assert (
        "env API_KEY holds a Pulumi secret in the pod spec"
        in crossguard("no-plaintext-secrets", resources)[0]
    )


def _as_chart_child(r: Res, namespace: str) -> Res:
    """How a chart's Deployment reads in a real preview: URN under the Chart, chart labels, chart namespace."""
    props = json.loads(json.dumps(r.props))
    props["metadata"] = {"name": "kps-operator", "namespace": namespace, "labels": {"app": "kps"}}
    props["spec"]["template"]["metadata"]["labels"] = {"app": "kps"}
    container(props).pop("readinessProbe")
    urn = "urn:pulumi:prod::inferstack::inferstack:index:InferencePlatform$kubernetes:helm.sh/v4:Chart$kubernetes:apps/v1:Deployment::monitoring/kps-operator"
    return Res(r.type, "monitoring/kps-operator", urn, props)


def test_chart_rendered_workloads_follow_the_chart() -> None:
    """During a real preview, Helm charts' own workloads appear; our label/probe/namespace conventions are not theirs."""
    resources = rendered("prod")
    router = next(r for r in resources if ROUTER(r))
    child = _as_chart_child(router, "monitoring")
    assert child.from_chart and not router.from_chart
    with_child = [*resources, child]
    for rule in ("workload-recommended-labels", "containers-have-probes", "namespaces-have-network-policy"):
        assert crossguard(rule, with_child) == [], rule
    assert crossguard("containers-have-probes", with_child, {"include_chart_workloads": True})
    # Security still applies to chart workloads.
    container(child.props)["securityContext"]["privileged"] = True
    assert crossguard("no-privileged-or-root-containers", [child])


KARPENTER_H100 = k8s("NodePool", "h100")


def _requirement(p: dict[str, Any], key: str, values: list[str]) -> None:
    for req in p["spec"]["template"]["spec"]["requirements"]:
        if req["key"] == key:
            req["values"] = values


KARPENTER_CASES = [
    ("gpu-pool-has-gpu-taint", lambda p: p["spec"]["template"]["spec"].__setitem__("taints", []),
     "Karpenter NodePool h100 (p5.48xlarge) has GPUs but no nvidia.com/gpu:NoSchedule taint"),
    ("no-spot-in-prod", lambda p: _requirement(p, "karpenter.sh/capacity-type", ["spot"]),
     "Karpenter NodePool h100: spot capacity in prod"),
    ("max-replicas-within-pool-capacity", lambda p: p["spec"]["limits"].__setitem__("nvidia.com/gpu", "8"),
     "need 2 nodes of p5.48xlarge but the pool stops at 1"),
    ("engine-model-fits-gpus", lambda p: _requirement(p, "node.kubernetes.io/instance-type", ["g6.2xlarge"]),
     "does not fit the L4 GPUs of g6.2xlarge (pool h100)"),
    ("engine-parallelism-divides-node", lambda p: _requirement(p, "node.kubernetes.io/instance-type", ["g6e.xlarge"]),
     "2 GPUs exceeds the 1 GPUs of g6e.xlarge"),
    ("engine-tolerates-pool-taint", lambda p: p["spec"]["template"]["spec"]["taints"].append(
        {"key": "dedicated", "value": "llm", "effect": "NoSchedule"}),
     "does not tolerate its taint dedicated=llm:NoSchedule"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "change", "expect"), KARPENTER_CASES, ids=[c[0] for c in KARPENTER_CASES])
def test_karpenter_node_pools(rule: str, change: Callable[[dict[str, Any]], object], expect: str) -> None:
    from tests.policies.helpers import BROKEN

    resources = rendered("karpenter", BROKEN)
    assert (
        crossguard(rule, resources, {"monthly_budget_usd": 100_000} if rule.startswith("monthly") else None)
        == []
    )
    messages = crossguard(rule, mutate(resources, KARPENTER_H100, change))
    assert any(expect in m for m in messages), messages


def test_karpenter_budget_counts_node_pools() -> None:
    from components.clouds import targets
    from policies.inference.rules.money import bill
    from tests.policies.helpers import BROKEN
    from tests.stacks import load

    loaded = load("karpenter", BROKEN)
    lines, _ = bill(rendered("karpenter", BROKEN))
    assert any("Karpenter NodePool h100: 2 x p5.48xlarge" in line.what for line in lines)
    total = sum(line.usd_month for line in lines)
    assert total == pytest.approx(targets.stack_cost(loaded.spec, loaded.layout).max_usd_month)


def test_pools_of_clusters_the_stack_does_not_create() -> None:
    """target kubernetes: no node groups in the stack; pool_instance_types says what the pool's nodes are."""
    from tests.policies.helpers import BROKEN

    resources = rendered("byo-cluster", BROKEN)
    assert crossguard("engine-model-fits-gpus", resources) == []  # nothing known about the nodes: no verdict
    assert (
        crossguard("engine-model-fits-gpus", resources, {"pool_instance_types": {"h100": "p5.48xlarge"}})
        == []
    )
    messages = crossguard(
        "engine-model-fits-gpus", resources, {"pool_instance_types": {"h100": "g6.12xlarge"}}
    )
    assert messages and "does not fit the L4 GPUs of g6.12xlarge (pool h100)" in messages[0]
    messages = crossguard(
        "engine-parallelism-divides-node", resources, {"pool_instance_types": {"h100": "g6e.xlarge"}}
    )
    assert messages and "exceeds the 1 GPUs of g6e.xlarge" in messages[0]


def test_a_group_on_spot_when_the_stack_accepts_it() -> None:
    broken = mutate(
        rendered("prod-405b"),
        aws("eks/nodeGroup:NodeGroup", "inferstack-405b-h100"),
        lambda p: p.__setitem__("capacityType", "SPOT"),
    )
    assert crossguard("no-multi-node-on-spot", broken, {"allow_multi_node_spot": True}) == []


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "stacks"
PICKER_CONFIG = k8s("ConfigMap", "inferstack-runtime-config")


def _picker_keys(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    return runtime_config(lambda doc: change(doc["picker"]))


@pytest.mark.parametrize(
    "change",
    [
        lambda picker: picker.__setitem__("require_api_key", False),
        lambda picker: picker.pop("api_keys_file"),
        lambda picker: picker.clear(),  # an older picker's config: nothing says it checks keys
    ],
    ids=["keys-not-required", "no-keys-file", "no-picker-settings"],
)
def test_a_public_route_to_inference_pools_needs_a_picker_that_checks_keys(
    change: Callable[[dict[str, Any]], None],
) -> None:
    """Inference-extension mode: the HTTPRoute's backends are InferencePools, not the router; the endpoint
    picker is what sees each request, so its config must require keys from a key file."""
    resources = rendered("inference-extension", EXAMPLES)
    assert crossguard("public-ingress-requires-api-key", resources) == []  # the committed example
    messages = crossguard(
        "public-ingress-requires-api-key", mutate(resources, PICKER_CONFIG, _picker_keys(change))
    )
    assert len(messages) == 1
    assert messages[0].startswith(
        "HTTPRoute inference/inferstack-inference: sends public traffic to qwen-0-5b-pool, qwen-coder-0-5b-pool, "
        "but their endpoint picker does not require API keys"
    )
