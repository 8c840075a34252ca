"""The pack as the Pulumi engine drives it: the SDK's analyzer servicer (no server), configured from the
committed config files, fed synthesized resources as protobuf requests, answering with diagnostics."""

from __future__ import annotations

from typing import Any

from google.protobuf import struct_pb2
from pulumi.runtime.proto import analyzer_pb2 as proto
from pulumi_policy import EnforcementLevel
from pulumi_policy.policy import _PolicyAnalyzerServicer

from policies.inference import config as policy_config
from policies.inference.pack import PACK_NAME, policies
from policies.inference.rules import Res
from tests.policies.helpers import BROKEN, aws, mutate, rendered

_LEVELS = {"advisory": proto.ADVISORY, "mandatory": proto.MANDATORY, "disabled": proto.DISABLED}
SECRET_SIG = "4dabf18193072939515e22adb298388d"
SECRET_VALUE_SIG = "1b47061264138c4ac30d75fd1eb44270"


def _struct(props: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(props)
    return out


def _servicer(config: dict[str, Any]) -> _PolicyAnalyzerServicer:
    """The servicer as `pulumi preview --policy-pack-config FILE` configures it: the CLI expands 'all' into
    each policy's enforcement level and passes each policy's properties."""
    servicer = _PolicyAnalyzerServicer(PACK_NAME, "0.1.0", policies(), EnforcementLevel.MANDATORY)
    request = proto.ConfigureAnalyzerRequest()
    for name, resolved in policy_config.resolve(config).items():
        request.policyConfig[name].enforcementLevel = _LEVELS[resolved.level]
        request.policyConfig[name].properties.update(resolved.settings)
    servicer.Configure(request, None)
    return servicer


def _diagnostics(servicer: _PolicyAnalyzerServicer, resources: list[Res]) -> list[Any]:
    found: list[Any] = []
    for r in resources:
        request = proto.AnalyzeRequest(type=r.type, urn=r.urn, name=r.name, properties=_struct(dict(r.props)))
        found += servicer.Analyze(request, None).diagnostics
    stack = proto.AnalyzeStackRequest(
        resources=[
            proto.AnalyzerResource(type=r.type, urn=r.urn, name=r.name, properties=_struct(dict(r.props)))
            for r in resources
        ]
    )
    found += servicer.AnalyzeStack(stack, None).diagnostics
    return found


def test_prod_config_passes_prod() -> None:
    prod = policy_config.load(policy_config.committed_path("prod"))
    assert _diagnostics(_servicer(prod), rendered("prod")) == []


def test_over_budget_is_mandatory_with_the_committed_style_config() -> None:
    resources = rendered("over-budget", BROKEN)
    config = {"all": "mandatory", "monthly-cost-within-budget": {"monthly_budget_usd": 60000}}
    found = _diagnostics(_servicer(config), resources)
    assert [(d.policyName, d.enforcementLevel) for d in found] == [
        ("monthly-cost-within-budget", _LEVELS["mandatory"])
    ]
    assert "over the budget of $60,000" in found[0].message and found[0].urn.endswith("inferstack-prod-h100")


def test_dev_config_makes_violations_advisory() -> None:
    dev = policy_config.load(policy_config.committed_path("dev"))
    broken = mutate(
        rendered("dev"), aws("nodeGroup:NodeGroup", "inferstack-dev-g6-spot"), lambda p: p.pop("taints")
    )
    found = _diagnostics(_servicer(dev), broken)
    assert "gpu-pool-has-gpu-taint" in {d.policyName for d in found}
    assert {d.enforcementLevel for d in found} == {_LEVELS["advisory"]}


def test_secrets_and_unknowns_from_the_engine() -> None:
    """Secret values arrive wrapped, preview-unknown values as sentinels; neither breaks a rule."""
    resources = rendered("prod")
    unknown = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"

    def wrap(p: dict[str, Any]) -> None:
        p["encryptionConfig"]["provider"]["keyArn"] = unknown
        p["name"] = {SECRET_SIG: SECRET_VALUE_SIG, "value": "inferstack-prod"}

    broken = mutate(resources, aws("cluster:Cluster", "inferstack-prod"), wrap)
    prod = policy_config.load(policy_config.committed_path("prod"))
    assert _diagnostics(_servicer(prod), broken) == []
