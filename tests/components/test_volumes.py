"""Persistent volumes bind: EKS 1.30+ clusters have no default StorageClass, so on eks every claim names the
encrypted gp3 class the cloud layer creates (or the spec's), Prometheus keeps its samples on one, and on a cluster
you bring the claims take the cluster's default, which the plan says must exist."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from components.clouds.aws import volumes
from components.clouds.aws.cloud import EKS
from components.clouds.own_cluster import OWN_CLUSTER
from components.clouds.targets import cloud_for
from components.core.stackfile import STACKS_DIR, available_stacks
from components.deploy import synthesis as plan
from components.render import addons, batches
from components.spec import PlatformSpec
from tests.components.helpers import minimal
from tests.stacks import load, synthesized

HELM = "kubernetes:helm.sh/v4:Chart"
STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "stacks"
STACKS = [
    *((s, STACKS_DIR) for s in available_stacks(STACKS_DIR) if load(s).spec.target.value != "local"),
    *((s, EXAMPLES) for s in available_stacks(EXAMPLES)),
]


def _claims(synthesis: plan.Synthesis) -> dict[str, dict[str, Any]]:
    """Every claim the plan makes: StatefulSets' claim templates and Prometheus's (kube-prometheus-stack's
    storageSpec, which its operator turns into the Prometheus StatefulSet's claim template)."""
    out: dict[str, dict[str, Any]] = {}
    for m in synthesis.kubernetes_manifests():
        if m["kind"] == "StatefulSet":
            for claim in m["spec"].get("volumeClaimTemplates", []):
                out[f"{m['metadata']['name']}/{claim['metadata']['name']}"] = claim["spec"]
    for chart in (
        r for r in synthesis.resources if r.type == HELM and r.name == addons.PROMETHEUS_STACK_RELEASE
    ):
        storage = chart.inputs["values"]["prometheus"]["prometheusSpec"].get("storageSpec", {})
        if "volumeClaimTemplate" in storage:
            out["prometheus"] = storage["volumeClaimTemplate"]["spec"]
    return out


@pytest.mark.parametrize(("name", "directory"), STACKS, ids=[s for s, _ in STACKS])
def test_every_claim_names_a_class_that_exists_where_the_cluster_has_no_default(
    name: str, directory: Path
) -> None:
    stack = load(name, directory)
    synthesis = synthesized(name, directory)
    claims = _claims(synthesis)
    rendered = {r.inputs["metadata"]["name"] for r in synthesis.resources if r.type == STORAGE_CLASS}
    named = {stack.spec.batch.storage_class} - {None}
    if stack.spec.batch.enabled:
        assert any(k.endswith(f"/{batches.DATA_VOLUME}") for k in claims), claims
    if stack.spec.observability.prometheus and stack.spec.addons.install_prometheus_stack:
        assert "prometheus" in claims
    for claim_name, claim in claims.items():
        if stack.spec.target.value == "eks":
            assert claim.get("storageClassName") in rendered | named, (claim_name, claim, rendered)
        else:  # a cluster you bring: the spec's class, else its default (the stack creates none)
            assert rendered == set()
            assert claim.get("storageClassName") in named | {None}, (claim_name, claim)


def test_the_eks_class_is_encrypted_gp3_on_the_ebs_driver_bound_where_the_pod_lands() -> None:
    synthesis = synthesized("prod")
    [made] = [r for r in synthesis.resources if r.type == STORAGE_CLASS]
    assert (
        made.inputs["metadata"]["name"]
        == volumes.STORAGE_CLASS
        == EKS.volume_storage_class(load("prod").spec)
    )
    assert made.inputs["provisioner"] == "ebs.csi.aws.com"
    assert made.inputs["volumeBindingMode"] == "WaitForFirstConsumer"
    assert made.inputs["allowVolumeExpansion"] is True
    parameters = made.inputs["parameters"]
    assert parameters["type"] == "gp3" and parameters["encrypted"] == "true"
    # Encrypted with the disks key (the nodes' root volumes' key), after the driver that provisions it.
    [disks] = [r for r in synthesis.resources if r.type == "aws:kms/key:Key" and r.name.endswith("-disks")]
    [driver] = [r for r in synthesis.resources if r.type == "aws:eks/addon:Addon" and "ebs-csi" in r.name]
    assert parameters["kmsKeyId"].startswith("arn:aws:kms:")
    assert disks.urn in made.dependencies and driver.urn in made.dependencies
    # The driver's controller may use that key, through EC2 only.
    [policy] = [
        r
        for r in synthesis.resources
        if r.type == "aws:iam/rolePolicy:RolePolicy" and r.name.endswith("-ebs-csi-volume-key")
    ]
    statements = json.loads(policy.inputs["policy"])["Statement"]
    assert {s["Resource"] for s in statements} == {parameters["kmsKeyId"]}
    assert all(
        s["Condition"]["StringEquals"]["kms:ViaService"] == "ec2.us-east-1.amazonaws.com" for s in statements
    )
    # Everything in Kubernetes (the claims among it) waits for the class.
    [batch_set] = [
        r
        for r in synthesis.resources
        if r.type == "kubernetes:apps/v1:StatefulSet"
        and r.inputs["metadata"]["name"] == batches.name(load("prod").spec)
    ]
    by_urn = {r.urn: r for r in synthesis.resources}
    waits: set[str] = set()
    parent: str | None = batch_set.urn
    while parent is not None:
        waits.update(by_urn[parent].dependencies)
        parent = by_urn[parent].parent if by_urn[parent].parent in by_urn else None
    assert made.urn in waits


def test_prometheus_keeps_its_retention_on_a_volume_of_the_stacks_class_sized_for_it() -> None:
    """It ran on an emptyDir on the system node's root disk: 15 days of samples there, lost on every restart."""
    synthesis = synthesized("prod")
    [chart] = [r for r in synthesis.resources if r.type == HELM and r.name == addons.PROMETHEUS_STACK_RELEASE]
    prometheus = chart.inputs["values"]["prometheus"]["prometheusSpec"]
    claim = prometheus["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim["storageClassName"] == volumes.STORAGE_CLASS
    assert claim["accessModes"] == ["ReadWriteOnce"]
    volume_gib = int(claim["resources"]["requests"]["storage"].removesuffix("Gi"))
    retained_gib = int(prometheus["retentionSize"].removesuffix("GB"))  # Prometheus's GB is 2^30 bytes
    assert prometheus["retention"] == f"{addons.PROMETHEUS_RETENTION_DAYS}d"
    # The retention's samples at the planned ingestion fit under retentionSize, which leaves the WAL room.
    needed = addons.PROMETHEUS_RETENTION_DAYS * 86_400 * addons.PROMETHEUS_SAMPLES_PER_S * 2
    assert needed <= retained_gib * 2**30 < volume_gib * 2**30 * 0.85


def test_a_storage_class_the_spec_names_wins_over_the_layers() -> None:
    raw = minimal()
    raw["batch"] = {"enabled": True, "storage_class": "io2-fast"}
    spec = PlatformSpec.model_validate(raw)
    assert batches.storage_class(spec, EKS) == "io2-fast"
    raw["batch"] = {"enabled": True}
    assert batches.storage_class(PlatformSpec.model_validate(raw), EKS) == volumes.STORAGE_CLASS
    assert batches.storage_class(PlatformSpec.model_validate(raw), OWN_CLUSTER) is None


def test_the_plan_says_which_class_the_volumes_claim() -> None:
    prod, kind = load("prod").spec, load("kind").spec
    eks_note = addons.volumes_note(prod, cloud_for(prod))
    assert eks_note is not None and volumes.STORAGE_CLASS in eks_note and "Prometheus" in eks_note
    own_note = addons.volumes_note(kind, cloud_for(kind))
    assert own_note is not None and "default StorageClass" in own_note
    assert addons.volumes_note(prod, None) is None  # target local: no cluster
