"""InferencePlatform: the whole stack from one validated spec and its layout.

A thin shell: every decision was made by ``components.placement`` and the renderers; this registers
the results in dependency order. Later layers (AWS, gateway, scaling, observability) hang off here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from components.kubernetes.engine import ModelEngine
from components.kubernetes.manifests import apply
from components.placement import Layout
from components.render import common, engine
from components.render.namespace import namespace
from components.spec import PlatformSpec


@dataclass(frozen=True)
class PlatformSecrets:
    """Secret values from Pulumi config; they only ever travel as Pulumi secrets."""

    huggingface_token: pulumi.Output[str] | None = None


def hf_token_secret(spec: PlatformSpec) -> common.Manifest:
    """The Secret engines read HF_TOKEN from; its value is filled in as a Pulumi secret."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": common.metadata(spec, engine.hf_token_secret_name(spec), "engine"),
        "type": "Opaque",
    }


class InferencePlatform(pulumi.ComponentResource):
    """Namespace, secrets and one ModelEngine per model."""

    def __init__(
        self,
        spec: PlatformSpec,
        layout: Layout,
        secrets: PlatformSecrets,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("inferstack:index:InferencePlatform", f"{spec.name}-{spec.environment}", None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.namespace = apply(namespace(spec), child)
        in_namespace = pulumi.ResourceOptions(parent=self, depends_on=[self.namespace])
        if spec.huggingface_token_config_key and secrets.huggingface_token is not None:
            manifest = {
                **hf_token_secret(spec),
                "stringData": {engine.HF_TOKEN_KEY: secrets.huggingface_token},
            }
            apply(manifest, in_namespace)
        self.engines = {
            m.name: ModelEngine(spec, m, layout.placements[m.name], in_namespace) for m in spec.models
        }
        self.register_outputs(
            {
                "namespace": spec.cluster.namespace,
                "models": sorted(self.engines),
            }
        )
