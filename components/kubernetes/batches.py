"""The batch service: its StatefulSet, volume claim, Service, identity and disruption budget, and the Secret with
its own key to the router. A thin component over ``components.render.batches``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi

from components.core.cloud import Cloud
from components.kubernetes.manifests import apply
from components.render import api_keys, batches, gateway
from components.render.runtime_config import runtime_config
from components.spec import PlatformSpec


def _named_key(raw: str, spec: PlatformSpec, source: str) -> str:
    try:
        return api_keys.named_key(raw, spec.batch.router_key_name, source, "batch.router_key_name")
    except ValueError as err:
        raise pulumi.RunError(str(err)) from None  # a message, never a traceback (or a key)


class BatchService(pulumi.ComponentResource):
    """``keys`` is the Pulumi secret with the plain API keys; ``bucket`` the name of the bucket that holds the
    files where the cloud keeps them in S3 (an Output on EKS); ``images`` overrides the spec's image."""

    def __init__(
        self,
        spec: PlatformSpec,
        cloud: Cloud,
        keys: pulumi.Output[str] | None,
        bucket: Any | None,
        images: Mapping[str, gateway.RuntimeImage],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("inferstack:kubernetes:BatchService", f"{spec.name}-{spec.environment}", None, opts)
        child = pulumi.ResourceOptions(parent=self)
        depends: list[pulumi.Resource] = []
        if batches.uses_router_key(spec):
            if keys is None:
                raise pulumi.RunError(
                    "batch.enabled with gateway.require_api_key needs gateway.api_keys_config_key: the batch "
                    f"service sends the key named {spec.batch.router_key_name!r} (batch.router_key_name) to the router"
                )
            source = f"inferstack:{spec.gateway.api_keys_config_key}"
            key = keys.apply(lambda raw: _named_key(raw, spec, source))
            secret = {**batches.router_key_secret(spec), "stringData": {batches.KEY_FILE: key}}
            depends.append(apply(secret, child, secret_fields=("stringData",)))
        image = {**gateway.spec_images(spec), **images}[batches.PART]
        config = runtime_config(spec, files=cloud.batch_files(spec))
        checksum = gateway.config_checksum(gateway.config_text(config))  # the gateway's ConfigMap's
        storage = batches.storage_class(spec, cloud)
        self.manifests = batches.render(
            spec, config, image.reference, image.version, bucket, checksum, storage
        )
        after = pulumi.ResourceOptions(parent=self, depends_on=depends)
        self.resources = [apply(m, after) for m in self.manifests]
        self.register_outputs({"service": batches.url(spec)})
