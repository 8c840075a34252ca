"""`inferstack plan`: run the real Pulumi program in-process under Pulumi's mock runtime.

No credentials, no Pulumi CLI, no provider plugins, no network: the SDK's mock monitor receives every
resource registration, and we keep what it receives. What comes out is exactly what ``pulumi up``
would ask the providers to create: each resource's type, name, parent and inputs (secrets redacted),
and every Kubernetes object as a manifest.

The mocks answer like AWS would, in a fixed account (``MOCK_ACCOUNT_ID``) and the region of each
resource's provider: ARNs, ECR repository URLs, the EKS endpoint and CA, image digests, and the invokes
the program makes. Inputs built from those outputs (role ARNs in node groups, key ARNs in encryption
settings, image references in Deployments) then read as they would in a real preview.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from google.protobuf import json_format
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from pulumi.runtime.settings import ROOT, SETTINGS
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from components.base.names import camel_to
from components.clouds.aws import iam
from components.core.decisions import Decisions
from components.core.redaction import REDACTED
from components.core.stackfile import CONFIG_KEY, Stack
from components.deploy import program

PROJECT = "inferstack"
_SIG = rpc._special_sig_key
_SECRET = rpc._special_secret_sig
_RESOURCE = rpc._special_resource_sig


@dataclass(frozen=True)
class Resource:
    """One registered resource as the engine would see it."""

    type: str
    name: str
    parent: str | None  # the parent's URN
    urn: str
    custom: bool
    inputs: dict[str, Any]
    timeouts: dict[str, str] | None = None
    """Custom timeouts (create, update, delete) `pulumi up` waits with, where the program sets them."""
    dependencies: tuple[str, ...] = ()
    """URNs it waits for (``depends_on`` and inputs from other resources)."""

    def as_json(self) -> dict[str, Any]:
        out = {
            "type": self.type,
            "name": self.name,
            "parent": self.parent,
            "urn": self.urn,
            "custom": self.custom,
            "inputs": self.inputs,
        }
        return out | ({"customTimeouts": self.timeouts} if self.timeouts else {})


def _plain(value: Any) -> Any:
    """Protobuf-JSON values to plain data: secrets redacted, resource refs as URNs, integral floats as ints."""
    if isinstance(value, dict):
        sig = value.get(_SIG)
        if sig == _SECRET:
            inner = value.get("value")
            # Keep the shape of secret maps (a Secret's stringData keys) so manifests still validate.
            return {k: REDACTED for k in inner} if isinstance(inner, dict) else REDACTED
        if sig == _RESOURCE:
            return value.get("urn", "")
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


MOCK_ACCOUNT_ID = "123456789012"
MOCK_REGION = "us-east-1"
"""The region of AWS resources registered without a provider that names one (the AWS provider's default)."""

# Resource types whose ARN is not ``arn:<partition>:<service>:<region>:<account>:<type>/<name>``.
_ARN_SHAPES: dict[str, str] = {
    "aws:s3/bucket:Bucket": "arn:{partition}:s3:::{name}",
    "aws:cloudwatch/logGroup:LogGroup": "arn:{partition}:logs:{region}:{account}:log-group:{name}",
    "aws:cloudwatch/eventRule:EventRule": "arn:{partition}:events:{region}:{account}:rule/{name}",
    "aws:sqs/queue:Queue": "arn:{partition}:sqs:{region}:{account}:{name}",
    "aws:kms/alias:Alias": "arn:{partition}:kms:{region}:{account}:{name}",  # the name starts with alias/
    "aws:ec2/flowLog:FlowLog": "arn:{partition}:ec2:{region}:{account}:vpc-flow-log/{name}",
}
_GLOBAL_SERVICES = frozenset({"iam"})  # ARNs without a region
_NAME_PROPERTY: dict[str, str] = {  # the physical name, where not "name"
    "aws:s3/bucket:Bucket": "bucket",
    "aws:elasticache/replicationGroup:ReplicationGroup": "replicationGroupId",
}


def mock_arn(type_: str, name: str, region: str, account_id: str = MOCK_ACCOUNT_ID) -> str:
    """The ARN AWS gives resource ``name`` of a pulumi_aws type token such as ``aws:iam/role:Role``.

    The service is the token's module (``iam``), the resource type its kind in kebab case (``role``);
    the few types AWS names differently (S3 buckets, log groups, queues, event rules, KMS aliases, flow logs)
    are in a table.
    """
    _, module, kind = type_.split(":")
    service = module.split("/", 1)[0]
    fields = {"partition": iam.partition(region), "region": region, "account": account_id, "name": name}
    shape = _ARN_SHAPES.get(type_)
    if shape is not None:
        return shape.format(**fields)
    where = "" if service in _GLOBAL_SERVICES else region
    return f"arn:{fields['partition']}:{service}:{where}:{account_id}:{camel_to('-', kind)}/{name}"


def _hex(*parts: str) -> str:
    """Stable hex per input: plans of the same stack are identical, run after run."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _aws_outputs(type_: str, name: str, inputs: dict[str, Any], region: str) -> dict[str, Any]:
    """What AWS returns beyond the inputs: the physical name (autonamed as Pulumi does), ARN, and the
    outputs the program reads from a few types."""
    out: dict[str, Any] = {}
    name_property = _NAME_PROPERTY.get(type_, "name")
    physical = inputs.get(name_property)
    if not isinstance(physical, str):
        physical = out[name_property] = f"{name}-{_hex(type_, name)[:7]}"
    if type_ == "aws:kms/key:Key":
        physical = out["keyId"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{region}/{name}"))
    out["arn"] = mock_arn(type_, physical, region)
    if type_ == "aws:ec2/launchTemplate:LaunchTemplate":
        out["latestVersion"] = 1
    elif type_ == "aws:ecr/repository:Repository":
        out["registryId"] = MOCK_ACCOUNT_ID
        out["repositoryUrl"] = f"{MOCK_ACCOUNT_ID}.dkr.ecr.{region}.{iam.dns_suffix(region)}/{physical}"
    elif type_ == "aws:eks/cluster:Cluster":
        out["endpoint"] = f"https://{_hex(name)[:32].upper()}.gr7.{region}.eks.{iam.dns_suffix(region)}"
        ca = f"-----BEGIN CERTIFICATE-----\nmock CA of {physical}\n-----END CERTIFICATE-----\n"
        out["certificateAuthority"] = {"data": base64.b64encode(ca.encode()).decode()}
    elif type_ == "aws:elasticache/replicationGroup:ReplicationGroup":  # TLS groups: master.<id>.<hash>...
        out["primaryEndpointAddress"] = (
            f"master.{physical}.{_hex(name)[:6]}.{region}.cache.{iam.dns_suffix(region)}"
        )
    return out


def mock_image_digest(name: str, tags: list[str]) -> str:
    """The manifest digest the mocks report for docker-build Image ``name`` pushed with ``tags``."""
    return f"sha256:{_hex(name, *tags)}"


def _docker_build_outputs(name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """A pushed image: its digest, and ``ref`` (the first tag with that digest), as the provider reports them."""
    tags = [t for t in inputs.get("tags") or [] if isinstance(t, str)]
    digest = mock_image_digest(name, tags)
    return {"digest": digest, "ref": f"{tags[0]}@{digest}" if tags else digest}


class _Mocks(pulumi.runtime.Mocks):
    """AWS as seen from ``MOCK_ACCOUNT_ID``; every other resource echoes its inputs."""

    def __init__(self) -> None:
        self._regions: dict[str, str] = {}  # AWS provider id -> its region

    def _region(self, provider: str | None) -> str:
        """A resource's provider reference is ``<urn>::<id>``; the id is what ``new_resource`` returned."""
        return self._regions.get((provider or "").rsplit("::", 1)[-1], MOCK_REGION)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        resource_id = f"{args.name}-id"
        outputs = dict(args.inputs)
        if args.typ == "pulumi:providers:aws":
            self._regions[resource_id] = str(args.inputs.get("region") or MOCK_REGION)
        elif args.typ.startswith("aws:"):
            outputs |= _aws_outputs(args.typ, args.name, outputs, self._region(args.provider))
        elif args.typ == "docker-build:index:Image":
            outputs |= _docker_build_outputs(args.name, outputs)
        return resource_id, outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        """The invokes the program makes; any other fails the plan rather than answer with nothing."""
        region = self._region(args.provider)
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            arn = f"arn:{iam.partition(region)}:iam::{MOCK_ACCOUNT_ID}:user/inferstack-plan"
            result = {
                "accountId": MOCK_ACCOUNT_ID,
                "arn": arn,
                "userId": "AIDAMOCKPLAN",
                "id": MOCK_ACCOUNT_ID,
            }
        elif args.token == "aws:ecr/getAuthorizationToken:getAuthorizationToken":
            registry = str(args.args.get("registryId") or MOCK_ACCOUNT_ID)
            password = _hex("ecr-token", registry, region)
            result = {
                "authorizationToken": base64.b64encode(f"AWS:{password}".encode()).decode(),
                "userName": "AWS",
                "password": password,
                "proxyEndpoint": f"https://{registry}.dkr.ecr.{region}.{iam.dns_suffix(region)}",
                "expiresAt": "2030-01-01T12:00:00Z",
                "registryId": registry,
                "id": region,
            }
        else:
            raise NotImplementedError(f"inferstack plan has no mock answer for invoke {args.token}")
        return result, []  # no check failures (the mock monitor iterates them)


class CapturingMonitor(pulumi_mocks.MockMonitor):
    """The SDK's mock monitor, keeping each registration with its parent and its secrets marked."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.captured: list[Resource] = []
        self.reads: list[Resource] = []
        """Existing resources the program reads (``Resource.get``): `pulumi up` fails if one is missing."""

    def ReadResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        response = super().ReadResource(request)  # type: ignore[no-untyped-call]
        inputs = {"id": request.id, **_plain(json_format.MessageToDict(request.properties))}
        resource = Resource(request.type, request.name, request.parent or None, response.urn, True, inputs)
        self.reads.append(resource)
        return response

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        if request.type != "pulumi:pulumi:Stack":
            inputs = _plain(json_format.MessageToDict(request.object))
            timeouts = (
                json_format.MessageToDict(request.customTimeouts)
                if request.HasField("customTimeouts")
                else {}
            )
            self.captured.append(
                Resource(
                    type=request.type,
                    name=request.name,
                    parent=request.parent or None,
                    urn=response.urn,
                    custom=bool(request.custom),
                    inputs=inputs,
                    timeouts={k: v for k, v in timeouts.items() if v} or None,
                    dependencies=tuple(request.dependencies),
                )
            )
        return response


@dataclass
class Synthesis:
    resources: list[Resource] = field(default_factory=list)
    reads: list[Resource] = field(default_factory=list)
    """What the program reads from the cloud or cluster rather than creates (it must exist)."""

    def waits_for(self, resource: Resource) -> set[str]:
        """URNs `pulumi up` finishes before it creates ``resource``: its own dependencies and its ancestors' (a
        component's ``depends_on`` holds for its children)."""
        by_urn = {r.urn: r for r in self.resources}
        out: set[str] = set()
        current: Resource | None = resource
        while current is not None:
            out.update(current.dependencies)
            current = by_urn.get(current.parent) if current.parent else None
        return out

    def kubernetes_manifests(self) -> list[dict[str, Any]]:
        out = []
        for r in self.resources:
            if r.custom and r.type.startswith("kubernetes:") and "metadata" in r.inputs:
                out.append(r.inputs)
        return out


def _mock_config(stack: Stack) -> tuple[dict[str, str], list[str]]:
    """Stack config as the Pulumi engine would pass it; encrypted values become redacted placeholders."""
    values: dict[str, str] = {}
    secret_keys: list[str] = []
    for key, value in stack.config.items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            values[key] = REDACTED
            secret_keys.append(key)
        elif isinstance(value, str):
            values[key] = value
        else:
            values[key] = json.dumps(value)
    values[CONFIG_KEY] = json.dumps(stack.config[CONFIG_KEY])
    return values, secret_keys


def _run_program(decided: Decisions | None) -> None:
    program.run(decided)


def _current_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        return None


def synthesize(stack: Stack) -> Synthesis:
    """Run the Pulumi program for ``stack`` under mocks and return every resource it registered. The program
    reads the stack's decisions (``Stack.decisions``, made when the stack file was validated against its target's
    cloud) rather than deciding again from the config it is given."""
    # A fresh event loop per synthesis, closed with its executor: the mock monitor runs in executor threads
    # that each open a loop, and those must end now, while their file descriptors are valid.
    loop = asyncio.new_event_loop()
    previous = _current_loop()
    asyncio.set_event_loop(loop)
    try:
        mocks = _Mocks()
        monitor = CapturingMonitor(mocks)
        # A new root Stack resource for this stack: set_mocks keeps the previous synthesis's otherwise, and
        # top-level resources would name another stack as their parent.
        ROOT.set(None)
        pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack.name, preview=False, monitor=monitor)
        values, secret_keys = _mock_config(stack)
        pulumi.runtime.set_all_config(values, secret_keys)
        SETTINGS.rpc_manager.clear()
        SETTINGS.outputs.clear()
        _sync_await(run_pulumi_func(lambda: _run_program(stack.decisions)))
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        asyncio.set_event_loop(previous)
    return Synthesis(resources=list(monitor.captured), reads=list(monitor.reads))


_TOP_LEVEL_ORDER = ("apiVersion", "kind", "metadata")


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def canonical(manifest: dict[str, Any]) -> dict[str, Any]:
    """apiVersion, kind, metadata first, then the rest; keys sorted below that, so plans diff cleanly."""
    head = {k: _sorted(manifest[k]) for k in _TOP_LEVEL_ORDER if k in manifest}
    return head | {k: _sorted(manifest[k]) for k in sorted(manifest) if k not in head}


def manifest_filename(manifest: dict[str, Any]) -> str:
    meta = manifest["metadata"]
    scope = f"{meta['namespace']}-" if meta.get("namespace") else ""
    return f"{manifest['kind'].lower()}-{scope}{meta['name']}.yaml"


def write(synthesis: Synthesis, out: Path, summary: str) -> None:
    """DIR/manifests/*.yaml (one object each), DIR/resources.json, DIR/summary.md."""
    manifests_dir = out / "manifests"
    manifests_dir.mkdir(parents=True, exist_ok=True)
    for old in manifests_dir.glob("*.yaml"):
        old.unlink()
    for manifest in synthesis.kubernetes_manifests():
        path = manifests_dir / manifest_filename(manifest)
        path.write_text(yaml.safe_dump(canonical(manifest), sort_keys=False))
    # Registration order varies with the async runtime; URN order is stable, so plans diff cleanly.
    resources = [r.as_json() for r in sorted(synthesis.resources, key=lambda r: r.urn)]
    (out / "resources.json").write_text(json.dumps(resources, indent=2, sort_keys=False) + "\n")
    (out / "summary.md").write_text(summary)
