"""InferencePlatform: the Kubernetes side of a stack, from its decisions (a validated spec, its layout and what
follows from them) and its cloud.

A thin shell: every decision was made once (``components.core.decisions``: placement, fetch paths, startup budgets,
rollouts, scaling thresholds), by the cloud (``components.core.cloud``) and by the renderers; this registers the
results in dependency order, through the cluster access the cloud layer gave.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from components.core import startup
from components.core.cloud import Cloud
from components.core.decisions import Decisions
from components.kubernetes.addons import ClusterAddons
from components.kubernetes.batches import BatchService
from components.kubernetes.cluster import ClusterAccess
from components.kubernetes.engine import ModelEngine, ModelWeights, wait_behind
from components.kubernetes.gateway import Gateway, NetworkPolicies
from components.kubernetes.limit_store import LimitStore
from components.kubernetes.manifests import apply
from components.kubernetes.observability import Observability
from components.kubernetes.scaling import ModelScaling
from components.kubernetes.secrets import limit_store_token, secret_config
from components.render import addons, common, engine, hardening, weights
from components.render.namespace import namespace
from components.render.runtime_config import embedding_models, has_batcher
from components.spec import PlatformSpec


@dataclass(frozen=True)
class PlatformSecrets:
    """Secret values from Pulumi config; they only ever travel as Pulumi secrets."""

    huggingface_token: pulumi.Output[str] | None = None
    api_keys: pulumi.Output[str] | None = None
    """The plain API keys (YAML/JSON list of {name, key, models}); read from gateway.api_keys_config_key
    when not given."""


def _api_keys(spec: PlatformSpec, secrets: PlatformSecrets) -> pulumi.Output[str] | None:
    if secrets.api_keys is not None:
        return secrets.api_keys
    example = "'<YAML list of {name, key, models}>'"
    return secret_config("gateway.api_keys_config_key", spec.gateway.api_keys_config_key, example)


def hf_token_secret(spec: PlatformSpec) -> common.Manifest:
    """The Secret the preparation Jobs read the hub token from (never the engines); its value is filled in as a
    Pulumi secret."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": common.metadata(spec, weights.hf_token_secret_name(spec), weights.COMPONENT),
        "type": "Opaque",
    }


class InferencePlatform(pulumi.ComponentResource):
    """Namespace, secrets, add-ons, one ModelEngine per model, the gateway, scaling and observability."""

    def __init__(
        self,
        decided: Decisions,
        secrets: PlatformSecrets,
        cloud: Cloud,
        cluster: ClusterAccess,
    ) -> None:
        """``decided``: the stack's decisions; ``cluster`` says how to reach the cluster, which runtime images to
        run and which cloud controllers to install (``ClusterAccess``)."""
        # Versions are served as units ('<model>-<version>'): from here on, every renderer sees units.
        spec, layout, units = decided.served_spec, decided.served_layout, decided.units
        super().__init__(
            "inferstack:index:InferencePlatform", f"{spec.name}-{spec.environment}", None, cluster.options
        )
        child = pulumi.ResourceOptions(parent=self)
        self.namespace = apply(namespace(spec), child)
        in_namespace = pulumi.ResourceOptions(parent=self, depends_on=[self.namespace])
        if spec.huggingface_token_config_key and secrets.huggingface_token is not None:
            manifest = {
                **hf_token_secret(spec),
                "stringData": {weights.HF_TOKEN_KEY: secrets.huggingface_token},
            }
            apply(manifest, in_namespace)
        # Add-ons first: scaled objects and monitors are custom resources their charts define.
        grafana_password = secret_config(
            "observability.grafana_admin_password_config_key",
            spec.observability.grafana_admin_password_config_key,
            "'<password>'",
        )
        multi_node = any(p.multi_node for p in layout.placements.values())
        self.addons = ClusterAddons(
            spec, cloud, cluster.addons, child, grafana_admin_password=grafana_password, multi_node=multi_node
        )
        self.priority_class = apply(hardening.priority_class(spec), child)
        self.engine_identity = apply(engine.service_account(spec), in_namespace)
        self.network = NetworkPolicies(spec, cloud, layout, in_namespace)
        # The model store first: one preparation Job per model (pulumi waits for it to complete), then engines.
        self.weights = ModelWeights(
            spec,
            layout,
            cluster.images.get("weights"),
            pulumi.ResourceOptions(parent=self, depends_on=[self.namespace, self.network]),
            decided.preparations,
        )
        # Time-sliced engines that share GPUs start one after another (startup.staggered).
        after_engine = startup.staggered(spec, layout)
        self.engines: dict[str, ModelEngine] = {}
        for m in spec.models:
            before = [self.engines[after_engine[m.name]]] if m.name in after_engine else []
            self.engines[m.name] = ModelEngine(
                spec,
                units[m.name],
                pulumi.ResourceOptions(
                    parent=self,
                    depends_on=[
                        self.namespace,
                        self.priority_class,
                        self.engine_identity,
                        *self.weights.jobs[m.name],
                        *self.addons.installed(addons.LWS_RELEASE),
                        *before,
                    ],
                ),
                weights_image=self.weights.image,
                # A prepared checkpoint does not exist before its Job: the engine's own objects wait for it.
                after=self.weights.jobs[m.name] if m.prepared_by else None,
            )
        keys = _api_keys(spec, secrets)
        # The gateway after the cloud's controllers: on EKS the Load Balancer Controller's validating webhook
        # (vingress.elbv2.k8s.aws, failurePolicy Fail, not configurable) refuses the router's Ingress until the
        # controller serves.
        before_gateway: list[pulumi.Resource] = [
            self.namespace,
            *self.addons.installed(*(r.name for r in cluster.addons)),
        ]
        if spec.gateway.shared_limits:
            token = limit_store_token(spec.gateway.limit_store_auth_config_key)
            self.limit_store = LimitStore(spec, cloud, cluster.limit_store_url, token, in_namespace)
            before_gateway.append(self.limit_store)
        # With gateway_api envoy-gateway, its chart brings the Gateway API CRDs the Gateway and HTTPRoute need.
        gateway_crds = self.addons.installed(addons.ENVOY_GATEWAY_RELEASE)
        # The batcher is ready once every model it batches serves: after their engines, as long as they may take.
        batched = [m.name for m in embedding_models(spec)] if has_batcher(spec) else []
        self.gateway = Gateway(
            spec,
            cloud,
            keys,
            pulumi.ResourceOptions(parent=self, depends_on=[*before_gateway, *gateway_crds]),
            images=cluster.images,
            batched=[self.engines[name] for name in batched],
            batcher_wait=wait_behind(units[name] for name in batched),
        )
        if spec.batch.enabled:
            self.batches = BatchService(spec, cloud, keys, cluster.files_bucket, cluster.images, in_namespace)
        crds = self.addons.installed("keda", "prometheus-adapter")
        self.scaling = {
            m.name: ModelScaling(
                spec,
                units[m.name],
                pulumi.ResourceOptions(parent=self, depends_on=[self.engines[m.name], *crds]),
            )
            for m in spec.models
        }
        monitoring = self.addons.installed("kube-prometheus-stack")
        self.observability = Observability(
            spec, units, pulumi.ResourceOptions(parent=self, depends_on=[self.namespace, *monitoring])
        )
        self.register_outputs(
            {
                "namespace": spec.cluster.namespace,
                "models": sorted(self.engines),
            }
        )
