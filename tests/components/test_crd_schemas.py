"""Every custom resource in the plans, checked against the upstream CRD schema of the version we install.

The schemas and validators are npm's ``@kubernetes-models`` packages, generated from each project's CRDs or
Go API types, pinned in ``tools/crd-schemas/package.json`` and installed by ``make crd-tools`` (offline
after that). ``tools/crd-schemas/validate.mjs`` checks every manifest in one node process: the package's
JSON-schema validator (types, required fields, enums, patterns) and its TypeScript declarations (unknown
fields, which the API server drops or rejects). ``CRD_SOURCES`` ties each package to the chart it checks.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from components.core.stackfile import STACKS_DIR, available_stacks
from components.spec import ChartVersionsSpec
from tests.components.helpers import write_stack
from tests.stacks import load, synthesized

ROOT = Path(__file__).resolve().parents[2]
CRD_TOOLS = ROOT / "tools" / "crd-schemas"
POLICY_STACKS = ROOT / "tests" / "policies" / "stacks"
PULUMI_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target.value != "local"]


# package -> (npm version, upstream version it was generated from, ChartVersionsSpec field, chart pin checked).
# A chart bump fails test_validators_are_pinned_to_the_charts_we_install until this table (and the npm pin)
# is looked at again. Gaps, where no package version matches our pin:
# - prometheus-operator: kube-prometheus-stack 75.6.1 installs operator v0.83.0; the packages cover v0.65.1
#   (4.x), v0.90.1 (5.0.1, generated from that release's CRDs) and later. v0.90.1 is the closest; the
#   ServiceMonitor and PrometheusRule fields we render are older than v0.65 and unchanged since.
# - karpenter: we install 1.6.0; the only package of the v1 API (2.0.0) is generated from
#   karpenter-provider-aws v1.12.1. The NodePool/EC2NodeClass fields we render are all in the v1 API of 1.0.
# - gateway-api: the package covers v1.5.1; Envoy Gateway's chart installs the Gateway API CRDs of its own
#   release (gateway_api: envoy-gateway), and an existing class brings its own. The Gateway, GatewayClass and
#   HTTPRoute fields we render are in v1 since Gateway API v1.0.
# - envoy-gateway: we install v1.4.2; the only package (2.0.0) is generated from Envoy Gateway v1.7.3. The
#   EnvoyPatchPolicy fields we render (targetRef, type JSONPatch, jsonPatches) are unchanged since v1.0.
CRD_SOURCES: dict[str, tuple[str, str, str | None, str | None]] = {
    "@kubernetes-models/keda": ("2.0.0", "2.19.0", "keda", "2.19.0"),
    "@kubernetes-models/prometheus-operator": ("5.0.1", "0.90.1", "kube_prometheus_stack", "75.6.1"),
    "@kubernetes-models/karpenter": ("2.0.0", "1.12.1", "karpenter", "1.6.0"),
    "@kubernetes-models/gateway-api": ("2.0.0", "1.5.1", None, None),
    "@kubernetes-models/envoy-gateway": ("2.0.0", "1.7.3", "envoy_gateway", "v1.4.2"),
}
#: Every custom resource kind inferstack can render; the variant stacks below make each appear in a plan.
RENDERED_KINDS = {
    "ScaledObject",
    "ServiceMonitor",
    "PrometheusRule",
    "NodePool",
    "EC2NodeClass",
    "Gateway",
    "GatewayClass",
    "HTTPRoute",
    "EnvoyPatchPolicy",
}


def _validate(manifests: list[dict[str, Any]]) -> list[list[str]]:
    """Errors per manifest (empty: it passes), from one run of validate.mjs."""
    node = shutil.which("node")
    if node is None or not (CRD_TOOLS / "node_modules" / ".installed").is_file():
        pytest.fail("the CRD schema packages are not installed: run `make crd-tools`", pytrace=False)
    items = [{"id": str(i), "manifest": m} for i, m in enumerate(manifests)]
    result = subprocess.run(
        [node, str(CRD_TOOLS / "validate.mjs")],
        input=json.dumps(items),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return [entry["errors"] for entry in json.loads(result.stdout)]


def _custom_resource_kinds(manifests: list[dict[str, Any]], version: str) -> set[tuple[str, str]]:
    """(apiVersion, kind) pairs Kubernetes itself has no schema for: the custom resources."""
    out: set[tuple[str, str]] = set()
    for api_version, kind in {(m["apiVersion"], m["kind"]) for m in manifests}:
        probe = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "probe"}}
        try:
            kubernetes_validate.validate(probe, version)
        except kubernetes_validate.SchemaNotFoundError:
            out.add((api_version, kind))
        except kubernetes_validate.ValidationError:
            pass  # a built-in kind: the probe is no valid object, but it has a schema
    return out


def _variant_stacks(directory: Path) -> list[tuple[str, Path]]:
    """Stacks that render the kinds the committed ones do not: Karpenter pools, a Gateway API ingress (of an
    existing class, and of the Envoy Gateway the stack installs)."""
    config = yaml.safe_load((STACKS_DIR / "Pulumi.kind.yaml").read_text())["config"]
    gateway_api = copy.deepcopy(config.pop("inferstack:platform"))
    gateway_api["gateway"].update({"ingress": "gateway-api", "hostname": "llm.example.com"})
    write_stack(directory, "gateway-api", gateway_api, config)  # with kind's secrets (the store's token)
    gateway_api["gateway"].update({"gateway_api": "envoy-gateway", "tls_secret_name": "llm-tls"})
    write_stack(
        directory, "envoy-gateway", gateway_api, config
    )  # installs it: a GatewayClass, a patch policy
    return [("karpenter", POLICY_STACKS), ("gateway-api", directory), ("envoy-gateway", directory)]


def _wrong_scaled_objects(rendered: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A rendered ScaledObject with one mistake each: field -> the wrong object."""
    misspelled = copy.deepcopy(rendered)
    misspelled["spec"]["cooldownPeriods"] = misspelled["spec"].pop("cooldownPeriod")
    wrong_type = copy.deepcopy(rendered)
    wrong_type["spec"]["minReplicaCount"] = str(wrong_type["spec"]["minReplicaCount"])
    misplaced = copy.deepcopy(rendered)
    misplaced["spec"]["triggers"][0]["threshold"] = misplaced["spec"]["triggers"][0]["metadata"].pop(
        "threshold"
    )
    missing = copy.deepcopy(rendered)
    del missing["spec"]["scaleTargetRef"]
    return {
        "cooldownPeriods": misspelled,
        "minReplicaCount": wrong_type,
        "threshold": misplaced,
        "scaleTargetRef": missing,
    }


UNKNOWN_KIND = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], list[str]]]:
    """id -> (manifest, errors) for every custom resource in the plans of the committed and the variant
    stacks ("<stack>/<kind>/<name>"), a rendered ScaledObject with one wrong field at a time
    ("wrong/<field>") and a kind without an upstream schema ("unknown"): all in one node process."""
    stacks = [(name, STACKS_DIR) for name in PULUMI_STACKS]
    stacks += _variant_stacks(tmp_path_factory.mktemp("stacks"))
    cases: dict[str, dict[str, Any]] = {}
    for name, directory in stacks:
        stack = load(name, directory)
        manifests = synthesized(name, directory).kubernetes_manifests()
        custom = _custom_resource_kinds(manifests, f"{stack.spec.cluster.kubernetes_version}.0")
        for m in manifests:
            # LeaderWorkerSet has no @kubernetes-models package: test_leader_worker_sets.py checks it against the
            # CRD schema the LWS project publishes, and its pod templates with kubernetes-validate.
            if (m["apiVersion"], m["kind"]) in custom and m["kind"] != "LeaderWorkerSet":
                cases[f"{name}/{m['kind']}/{m['metadata']['name']}"] = m
    rendered = next(m for key, m in cases.items() if m["kind"] == "ScaledObject")
    for field, wrong in _wrong_scaled_objects(rendered).items():
        cases[f"wrong/{field}"] = wrong
    cases["unknown"] = UNKNOWN_KIND
    errors = _validate(list(cases.values()))
    return {key: (m, errs) for (key, m), errs in zip(cases.items(), errors, strict=True)}


def test_every_custom_resource_in_the_plans_passes_its_crd_schema(verdicts) -> None:
    planned = {key: v for key, v in verdicts.items() if not key.startswith(("wrong/", "unknown"))}
    assert {m["kind"] for m, _ in planned.values()} >= RENDERED_KINDS
    failed = [f"{key}: {'; '.join(errs)}" for key, (_, errs) in planned.items() if errs]
    assert not failed, "\n".join(failed)


def test_a_wrong_field_in_a_rendered_scaled_object_fails(verdicts) -> None:
    wrong = {
        key.removeprefix("wrong/"): errs for key, (_, errs) in verdicts.items() if key.startswith("wrong/")
    }
    assert set(wrong) == {"cooldownPeriods", "minReplicaCount", "threshold", "scaleTargetRef"}
    for field, errs in wrong.items():
        assert any(field in e for e in errs), (field, errs)


def test_a_custom_resource_kind_without_an_upstream_schema_is_an_error(verdicts) -> None:
    _, errors = verdicts["unknown"]
    assert errors and "no upstream CRD schema for example.com/v1 Widget" in errors[0]


def test_validators_are_pinned_to_the_charts_we_install() -> None:
    pins = json.loads((CRD_TOOLS / "package.json").read_text())["dependencies"]
    lock = json.loads((CRD_TOOLS / "package-lock.json").read_text())["packages"]
    charts = ChartVersionsSpec()
    for package, (npm_version, _upstream, chart_field, chart_version) in CRD_SOURCES.items():
        assert pins[package] == npm_version, package
        assert lock[f"node_modules/{package}"]["version"] == npm_version, package
        if chart_field is not None:
            assert getattr(charts, chart_field) == chart_version, (
                f"chart {chart_field} moved to {getattr(charts, chart_field)}: pick the {package} version "
                "generated from its CRDs and update CRD_SOURCES"
            )
    # The KEDA package is generated from KEDA v2.19.0 and the chart installs exactly that.
    assert charts.keda == CRD_SOURCES["@kubernetes-models/keda"][1]
