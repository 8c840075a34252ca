"""`inferstack plan`: run the real Pulumi program in-process under Pulumi's mock runtime.

No credentials, no Pulumi CLI, no provider plugins, no network: the SDK's mock monitor receives every
resource registration, and we keep what it receives. What comes out is exactly what ``pulumi up``
would ask the providers to create: each resource's type, name, parent and inputs (secrets redacted),
and every Kubernetes object as a manifest.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from google.protobuf import json_format
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from pulumi.runtime.settings import SETTINGS
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from components import program
from components.stackfile import CONFIG_KEY, Stack

PROJECT = "inferstack"
REDACTED = "[secret]"
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

    def as_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "name": self.name,
            "parent": self.parent,
            "urn": self.urn,
            "custom": self.custom,
            "inputs": self.inputs,
        }


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


class _Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return {}, []  # no check failures (the mock monitor iterates them)


class CapturingMonitor(pulumi_mocks.MockMonitor):
    """The SDK's mock monitor, keeping each registration with its parent and its secrets marked."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.captured: list[Resource] = []

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        if request.type != "pulumi:pulumi:Stack":
            inputs = _plain(json_format.MessageToDict(request.object))
            self.captured.append(
                Resource(
                    type=request.type,
                    name=request.name,
                    parent=request.parent or None,
                    urn=response.urn,
                    custom=bool(request.custom),
                    inputs=inputs,
                )
            )
        return response


@dataclass
class Synthesis:
    resources: list[Resource] = field(default_factory=list)

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


def _run_program() -> None:
    program.run()


def _current_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        return None


def synthesize(stack: Stack) -> Synthesis:
    """Run the Pulumi program for ``stack`` under mocks and return every resource it registered."""
    # A fresh event loop per synthesis, closed with its executor: the mock monitor runs in executor threads
    # that each open a loop, and those must end now, while their file descriptors are valid.
    loop = asyncio.new_event_loop()
    previous = _current_loop()
    asyncio.set_event_loop(loop)
    try:
        monitor = CapturingMonitor(_Mocks())
        pulumi.runtime.set_mocks(_Mocks(), project=PROJECT, stack=stack.name, preview=False, monitor=monitor)
        values, secret_keys = _mock_config(stack)
        pulumi.runtime.set_all_config(values, secret_keys)
        SETTINGS.rpc_manager.clear()
        SETTINGS.outputs.clear()
        _sync_await(run_pulumi_func(_run_program))
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        asyncio.set_event_loop(previous)
    return Synthesis(resources=list(monitor.captured))


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
    resources = [r.as_json() for r in synthesis.resources]
    (out / "resources.json").write_text(json.dumps(resources, indent=2, sort_keys=False) + "\n")
    (out / "summary.md").write_text(summary)
