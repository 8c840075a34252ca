"""The gateway (router, health monitor, batcher, config, keys, ingress) and the namespace's network policies.

Thin components over ``components.render.gateway``, ``api_keys`` and ``network``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components.core.cloud import Cloud
from components.core.placement import Layout
from components.kubernetes.manifests import apply
from components.render import api_keys, common, gateway, ingress, network
from components.spec import GatewayApiImplementation, GatewayMode, IngressKind, PlatformSpec


def _hashed(raw: str, source: str, spec: PlatformSpec) -> str:
    try:
        return api_keys.hash_api_keys(
            raw, source, token_limits=spec.gateway.mode is not GatewayMode.INFERENCE_EXTENSION
        )
    except ValueError as err:
        # A RunError prints its message without a Python traceback (and never the key).
        raise pulumi.RunError(str(err)) from None


def _is_deployment(manifest: common.Manifest, name: str) -> bool:
    return bool(manifest["kind"] == "Deployment" and manifest["metadata"]["name"] == name)


class Gateway(pulumi.ComponentResource):
    """Everything in front of the engines; ``keys`` is the Pulumi secret with the plain API keys.

    ``images`` overrides the spec's images per runtime service: on EKS, the AWS layer's pushed ECR images
    (their references are Outputs with the digest, known once the push is done).

    The batcher is ready only once every model it batches has a replica (``runtime.batcher.app``: ``ready``), so
    it goes after those models' engines (``batched``) and `pulumi up` waits for it as long as for the slowest of
    them (``batcher_wait``, from their startup budgets: ``components.kubernetes.engine.wait_behind``); with the
    provider's default 10 minutes it gave up while a cold embedding engine was still starting.
    """

    def __init__(
        self,
        spec: PlatformSpec,
        cloud: Cloud,
        keys: pulumi.Output[str] | None,
        opts: pulumi.ResourceOptions | None = None,
        images: Mapping[str, gateway.RuntimeImage] | None = None,
        batched: Sequence[pulumi.Resource] = (),
        batcher_wait: pulumi.CustomTimeouts | None = None,
    ) -> None:
        super().__init__("inferstack:kubernetes:Gateway", f"{spec.name}-{spec.environment}", None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.manifests = gateway.render(spec, cloud, images)
        depends: list[pulumi.Resource] = []
        key = spec.gateway.api_keys_config_key
        if key and keys is not None:
            source = f"inferstack:{key}"
            hashed = keys.apply(lambda raw: _hashed(raw, source, spec))
            manifest = {**api_keys.api_keys_secret(spec), "stringData": {common.API_KEYS_FILE: hashed}}
            depends.append(apply(manifest, child, secret_fields=("stringData",)))
        depends += self._existing_gateway_class(spec)
        after = pulumi.ResourceOptions(parent=self, depends_on=depends)
        behind_engines = pulumi.ResourceOptions(
            parent=self, depends_on=[*depends, *batched], custom_timeouts=batcher_wait
        )
        batcher = common.runtime_name(spec, common.BATCHER)
        self.resources = [
            apply(m, behind_engines if _is_deployment(m, batcher) else after) for m in self.manifests
        ]
        self.router_service = common.runtime_name(spec, common.ROUTER)
        self.register_outputs({"router_service": self.router_service, "hostname": spec.gateway.hostname})

    def _existing_gateway_class(self, spec: PlatformSpec) -> list[pulumi.Resource]:
        """``gateway_api: existing``: read the GatewayClass before anything else, so `pulumi up` stops with "not
        found" there, instead of leaving a Gateway nothing serves."""
        g = spec.gateway
        if g.ingress is not IngressKind.GATEWAY_API or g.gateway_api is not GatewayApiImplementation.EXISTING:
            return []
        existing = k8s.apiextensions.CustomResource.get(
            f"gatewayclass:{g.gateway_class}",
            id=g.gateway_class,
            api_version=ingress.GATEWAY_API_VERSION,
            kind="GatewayClass",
            opts=pulumi.ResourceOptions(parent=self),
        )
        return [existing]


class NetworkPolicies(pulumi.ComponentResource):
    """Default deny in the namespace, then the flows the platform needs."""

    def __init__(
        self, spec: PlatformSpec, cloud: Cloud, layout: Layout, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        """``layout``: the stack's placement."""
        super().__init__(
            "inferstack:kubernetes:NetworkPolicies", f"{spec.name}-{spec.environment}", None, opts
        )
        child = pulumi.ResourceOptions(parent=self)
        self.manifests = network.render(spec, cloud, layout)
        self.resources = [apply(m, child) for m in self.manifests]
        self.register_outputs({"policies": [m["metadata"]["name"] for m in self.manifests]})
