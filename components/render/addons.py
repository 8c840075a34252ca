"""Cluster add-ons as Helm releases: which charts, at which pinned versions, with which values. Pure.

Each add-on is a ``Release`` (repository, chart, version, namespace, values) that
``components.kubernetes.addons`` hands to ``helm.v4.Chart``. Which add-ons a stack gets follows from the
spec: GPU models need a device plugin, KEDA mode needs KEDA, HPA mode needs prometheus-adapter with
rules rendered from the models. A cloud's own controllers (on EKS the AWS Load Balancer Controller and the
Cluster Autoscaler, ``components.clouds.aws.addons``) come from its layer, through ``ClusterAccess.addons``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

from components.base.packing import Mechanism
from components.core import nodes, placement
from components.core.cloud import Cloud
from components.render import chart_hooks, common, hardening, tracing
from components.render.chart_hooks import ENVOY_GATEWAY_CERTGEN, hook_free_values, merged
from components.render.common import Manifest
from components.render.gateway import router_scales
from components.spec import (
    Autoscaler,
    Device,
    GatewayApiImplementation,
    GpuPlugin,
    IngressKind,
    PlatformSpec,
)

PROMETHEUS_STACK_RELEASE = "kube-prometheus-stack"
PROMETHEUS_PORT = 9090
GRAFANA_ADMIN_SECRET = "grafana-admin"
GRAFANA_ADMIN_USER = "admin"
GRAFANA_DASHBOARD_LABEL = "grafana_dashboard"
"""The label kube-prometheus-stack's Grafana sidecar looks for on dashboard ConfigMaps."""
KEDA_NAMESPACE = "keda"
GPU_NAMESPACE = "gpu-system"
ENVOY_GATEWAY_RELEASE = "envoy-gateway"
ENVOY_GATEWAY_NAMESPACE = "envoy-gateway-system"
"""Where Envoy Gateway runs its controller and, by default, the Envoy proxies of every Gateway."""
ENVOY_GATEWAY_CLUSTER_DOMAIN = "cluster.local"
"""The cluster DNS domain certgen names the controller's Service in (the chart's kubernetesClusterDomain default)."""
ENVOY_GATEWAY_CONTROLLER = "gateway.envoyproxy.io/gatewayclass-controller"
"""The controllerName Envoy Gateway claims GatewayClasses by (the chart's config.envoyGateway.gateway default)."""


@dataclass(frozen=True)
class Release:
    """One Helm release: everything ``helm.v4.Chart`` is given."""

    name: str
    chart: str
    repository: str
    version: str
    namespace: str
    values: dict[str, Any] = field(default_factory=dict)


def prometheus_url(spec: PlatformSpec) -> str:
    """Where scaling triggers and prometheus-adapter query Prometheus."""
    if spec.observability.prometheus_url:
        return spec.observability.prometheus_url
    # kube-prometheus-stack names the Prometheus Service '<release>-prometheus' when the release name
    # contains the chart name.
    ns = spec.observability.namespace
    return f"http://{PROMETHEUS_STACK_RELEASE}-prometheus.{ns}.svc:{PROMETHEUS_PORT}"


def uses_gpus(spec: PlatformSpec) -> bool:
    return any(m.engine.device is Device.GPU for m in spec.models)


def _gpu_node_affinity() -> dict[str, Any]:
    # Only nodes of inferstack's GPU pools (they carry the pool label); CPU nodes need no GPU daemons.
    term = {"matchExpressions": [{"key": nodes.POOL_LABEL, "operator": "Exists"}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


DEVICE_PLUGIN_DEFAULT_CONFIG = "default"


def device_plugin_configs(spec: PlatformSpec) -> dict[str, dict[str, Any]]:
    """The device plugin's named configs (its config file format, ``api/config/v1``): ``default`` for whole
    GPUs, and one per shared pool, which that pool's nodes select by ``nodes.DEVICE_PLUGIN_CONFIG_LABEL``.

    Time-slicing advertises each GPU ``replicas`` times, renamed ``nvidia.com/gpu.shared`` so a whole-GPU request
    never lands on a slice, and refuses a request for more than one slice (``failRequestsGreaterThanOne``: a
    second slice gives no more memory). MIG uses the mixed strategy: each instance is ``nvidia.com/mig-<profile>``.

    Sources, NVIDIA/k8s-device-plugin at the pinned chart (v0.17.1): the config file's fields and checks in
    ``api/config/v1`` (``config.go``, ``flags.go`` migStrategy none/single/mixed, ``sharing.go``, ``replicas.go``:
    timeSlicing.resources[].name/replicas > 0, devices default 'all', no strategy but the default), the README's
    'Shared Access to GPUs with CUDA Time-Slicing' (renameByDefault, failRequestsGreaterThanOne) and 'Updating
    Per-Node Configuration With a Node Label', and the chart's ``values.yaml`` (``config.map``, ``config.default``).
    tests/components/test_gpu_sharing.py checks the rendered configs against those rules.
    """
    configs: dict[str, dict[str, Any]] = {
        DEVICE_PLUGIN_DEFAULT_CONFIG: {"version": "v1", "flags": {"migStrategy": "none"}}
    }
    for pool in spec.gpu_pools:
        if pool.sharing is Mechanism.TIME_SLICING:
            configs[nodes.device_plugin_config_name(pool.name)] = {
                "version": "v1",
                "flags": {"migStrategy": "none"},
                "sharing": {
                    "timeSlicing": {
                        "renameByDefault": True,
                        "failRequestsGreaterThanOne": True,
                        "resources": [
                            {"name": nodes.GPU_RESOURCE, "replicas": placement.pool_slots(spec, pool)}
                        ],
                    }
                },
            }
        elif pool.sharing is Mechanism.MIG:
            configs[nodes.device_plugin_config_name(pool.name)] = {
                "version": "v1",
                "flags": {"migStrategy": "mixed"},
            }
    return configs


def device_plugin(spec: PlatformSpec) -> Release:
    values: dict[str, Any] = {
        "tolerations": [nodes.gpu_toleration()],
        "affinity": _gpu_node_affinity(),
        "priorityClassName": "system-node-critical",
    }
    configs = device_plugin_configs(spec)
    if len(configs) > 1:
        # The chart's integrated config map (values `config.map`, `config.default`): its config-manager sidecar
        # gives each node the config its nvidia.com/device-plugin.config label names, else the default.
        values["config"] = {
            "map": {name: yaml.safe_dump(cfg, sort_keys=False) for name, cfg in configs.items()},
            "default": DEVICE_PLUGIN_DEFAULT_CONFIG,
        }
    return Release(
        name="nvidia-device-plugin",
        chart="nvidia-device-plugin",
        repository="https://nvidia.github.io/k8s-device-plugin",
        version=spec.addons.versions.nvidia_device_plugin,
        namespace=GPU_NAMESPACE,
        values=values,
    )


def gpu_operator(spec: PlatformSpec, cloud: Cloud) -> Release:
    return Release(
        name="gpu-operator",
        chart="gpu-operator",
        repository="https://helm.ngc.nvidia.com/nvidia",
        version=spec.addons.versions.gpu_operator,
        namespace=GPU_NAMESPACE,
        values={
            # Where the nodes' image ships the driver and container toolkit (EKS AL2023 NVIDIA AMIs), not again.
            "driver": {"enabled": not cloud.gpu_driver_preinstalled},
            "toolkit": {"enabled": not cloud.gpu_driver_preinstalled},
            # DCGM exporter is its own release (observability.dcgm_exporter) so both modes match.
            "dcgmExporter": {"enabled": False},
            "daemonsets": {"tolerations": [nodes.gpu_toleration()]},
        },
    )


def dcgm_exporter(spec: PlatformSpec) -> Release:
    return Release(
        name="dcgm-exporter",
        chart="dcgm-exporter",
        repository="https://nvidia.github.io/dcgm-exporter/helm-charts",
        version=spec.addons.versions.dcgm_exporter,
        namespace=GPU_NAMESPACE,
        values={
            "tolerations": [nodes.gpu_toleration()],
            "affinity": _gpu_node_affinity(),
            # Keep the pod and namespace labels DCGM attaches (the engine pod using the GPU).
            "serviceMonitor": {
                "enabled": spec.observability.prometheus,
                "interval": "15s",
                "honorLabels": True,
            },
        },
    )


def keda(spec: PlatformSpec) -> Release:
    return Release(
        name="keda",
        chart="keda",
        repository="https://kedacore.github.io/charts",
        version=spec.addons.versions.keda,
        namespace=KEDA_NAMESPACE,
        values={
            "prometheus": {
                "operator": {"enabled": True, "serviceMonitor": {"enabled": spec.observability.prometheus}},
                "metricServer": {
                    "enabled": True,
                    "serviceMonitor": {"enabled": spec.observability.prometheus},
                },
            },
        },
    )


METRICS_SERVER_NAMESPACE = "kube-system"


def metrics_server(spec: PlatformSpec) -> Release:
    """The resource metrics API (metrics.k8s.io) for the router's CPU autoscaler. The chart creates no hook
    resources (its serving certificate is the server's own, self-signed at start: apiService.insecureSkipTLSVerify
    in its values.yaml), so a release without hooks is complete."""
    return Release(
        name="metrics-server",
        chart="metrics-server",
        repository="https://kubernetes-sigs.github.io/metrics-server/",
        version=spec.addons.versions.metrics_server,
        namespace=METRICS_SERVER_NAMESPACE,
        values={},
    )


def installs_envoy_gateway(spec: PlatformSpec) -> bool:
    g = spec.gateway
    return g.ingress is IngressKind.GATEWAY_API and g.gateway_api is GatewayApiImplementation.ENVOY_GATEWAY


ENVOY_GATEWAY_CHART = "oci://docker.io/envoyproxy/gateway-helm"
ENVOY_GATEWAY_IMAGE = "docker.io/envoyproxy/gateway"
"""The controller's image, as the chart is published with it (envoyproxy/gateway .github/workflows/release.yaml:
``IMAGE=docker.io/envoyproxy/gateway TAG=<release tag>``): the chart runs it, and so does the certgen Job."""


def envoy_gateway_image(spec: PlatformSpec) -> str:
    version = spec.addons.versions.envoy_gateway
    return f"{ENVOY_GATEWAY_IMAGE}:{version if version.startswith('v') else 'v' + version}"


def envoy_gateway(spec: PlatformSpec) -> Release:
    """Envoy Gateway from its OCI chart: the controller, and the Gateway API CRDs (standard channel) it ships in
    the chart's crds/ (https://gateway.envoyproxy.io/docs/install/install-helm/). EnvoyPatchPolicy, off by
    default, is on: the request head limits of ``ingress.head_limits_patch`` are one (Helm merges this into the
    chart's ``config.envoyGateway``, keeping its controller name and provider). Its control-plane certificates
    come from ``envoy_gateway_certgen``, not the chart's hook (``chart_hooks.CHARTS``)."""
    values: dict[str, Any] = {
        "config": {"envoyGateway": {"extensionApis": {"enableEnvoyPatchPolicy": True}}},
        # The image the certgen Job runs too (values.tmpl.yaml: global.images.envoyGateway.image).
        "global": {"images": {"envoyGateway": {"image": envoy_gateway_image(spec)}}},
    }
    return Release(
        name=ENVOY_GATEWAY_RELEASE,
        chart=ENVOY_GATEWAY_CHART,
        repository="",
        version=spec.addons.versions.envoy_gateway,
        namespace=ENVOY_GATEWAY_NAMESPACE,
        values=merged(values, hook_free_values(ENVOY_GATEWAY_CHART)),
    )


def envoy_gateway_certgen(spec: PlatformSpec) -> list[Manifest]:
    """Envoy Gateway's control-plane certificates, made before its chart as its pre-install hook would have
    (charts/gateway-helm/templates/certgen.yaml at the pinned version): ``envoy-gateway certgen`` with the chart's
    image creates the Secrets envoy-gateway, envoy, envoy-rate-limit and envoy-oidc-hmac in the controller's
    namespace (internal/cmd/certgen.go), never overwriting ones that exist; the chart's Deployment mounts
    envoy-gateway. Its API access is the hook's own (certgen-rbac.yaml: secrets get/create/update in the
    namespace); the topology injector is off (``chart_hooks``), so certgen patches no webhook. No TTL: Pulumi keeps
    the finished Job, so a later `pulumi up` neither recreates it nor regenerates the certificates."""
    namespace = ENVOY_GATEWAY_NAMESPACE

    def meta(kind_labels: str = "certgen") -> Manifest:
        out = common.metadata(spec, ENVOY_GATEWAY_CERTGEN, kind_labels)
        out["namespace"] = namespace
        return out

    token = hardening.service_account_token_volume()
    container: Manifest = {
        "name": "certgen",
        "image": envoy_gateway_image(spec),
        "imagePullPolicy": "IfNotPresent",
        "command": ["envoy-gateway", "certgen", "--disable-topology-injector"],
        "env": [
            {
                "name": "ENVOY_GATEWAY_NAMESPACE",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}},
            },
            {"name": "KUBERNETES_CLUSTER_DOMAIN", "value": ENVOY_GATEWAY_CLUSTER_DOMAIN},
        ],
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "200m", "memory": "128Mi"},
        },
        "securityContext": hardening.container_security(),
        "volumeMounts": [
            {"name": token["name"], "mountPath": hardening.SERVICE_ACCOUNT_DIR, "readOnly": True}
        ],
    }
    labels = meta()["labels"]
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": meta(),
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(),
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "update"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": ENVOY_GATEWAY_CERTGEN,
            },
            "subjects": [{"kind": "ServiceAccount", "name": ENVOY_GATEWAY_CERTGEN, "namespace": namespace}],
        },
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta(),
            "spec": {
                "backoffLimit": 3,
                "activeDeadlineSeconds": 600,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": ENVOY_GATEWAY_CERTGEN,
                        "automountServiceAccountToken": False,
                        "restartPolicy": "Never",
                        "nodeSelector": nodes.system_node_selector(),
                        "securityContext": hardening.pod_security(),
                        "containers": [container],
                        "volumes": [token],
                    },
                },
            },
        },
    ]


def hook_replacements(spec: PlatformSpec, release: Release) -> list[Manifest]:
    """What the platform renders in place of ``release``'s hooks (``chart_hooks.NeededHook.instead``), applied
    before the chart."""
    if chart_hooks.chart_name(release.chart) == chart_hooks.chart_name(ENVOY_GATEWAY_CHART):
        return envoy_gateway_certgen(spec)
    return []


def grafana_admin_secret(spec: PlatformSpec) -> dict[str, Any]:
    """The Secret Grafana reads its admin login from; ``stringData`` is filled in as a Pulumi secret."""
    meta = common.metadata(spec, GRAFANA_ADMIN_SECRET, "addons")
    meta["namespace"] = spec.observability.namespace
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque"}


def _grafana_auth(spec: PlatformSpec) -> dict[str, Any]:
    if spec.observability.grafana_admin_password_config_key:
        return {
            "admin": {
                "existingSecret": GRAFANA_ADMIN_SECRET,
                "userKey": "admin-user",
                "passwordKey": "admin-password",
            }
        }
    # No password given: never the chart's well-known default. No login form, no basic auth; viewers only.
    return {
        "grafana.ini": {
            "auth": {"disable_login_form": True},
            "auth.basic": {"enabled": False},
            "auth.anonymous": {"enabled": True, "org_role": "Viewer"},
        }
    }


PROMETHEUS_RETENTION_DAYS = 15
PROMETHEUS_SAMPLES_PER_S = 10_000
"""The ingestion Prometheus's volume is sized for: about 300k active series at the chart's 30 s scrape interval
(prometheusSpec.scrapeInterval, "Defaults to 30s" in kube-prometheus-stack's values.yaml), far above what the
cluster's exporters, the engines and the runtime services of these stacks export. Past it, ``retentionSize``
drops the oldest blocks first, never the newest samples, and the volume never fills."""
PROMETHEUS_BYTES_PER_SAMPLE = 2
"""The top of Prometheus's own figure (docs/storage.md, "Operational aspects": "an average of only 1-2 bytes per
sample"; needed_disk_space = retention_time_seconds * ingested_samples_per_second * bytes_per_sample)."""
PROMETHEUS_VOLUME_HEADROOM = 0.8
"""The TSDB's share of the volume: the rest for the write-ahead log and compaction's temporary blocks."""


def prometheus_storage() -> tuple[int, int]:
    """(retentionSize in GiB, the volume's size in GiB) for ``PROMETHEUS_RETENTION_DAYS`` days of
    ``PROMETHEUS_SAMPLES_PER_S``."""
    tsdb = PROMETHEUS_RETENTION_DAYS * 86_400 * PROMETHEUS_SAMPLES_PER_S * PROMETHEUS_BYTES_PER_SAMPLE
    tsdb_gib = math.ceil(tsdb / 2**30)
    return tsdb_gib, math.ceil(tsdb_gib / PROMETHEUS_VOLUME_HEADROOM)


def kube_prometheus_stack(spec: PlatformSpec, cloud: Cloud) -> Release:
    """Prometheus, its operator, Grafana and the cluster's exporters. Without the hooks helm.v4.Chart never runs
    (``chart_hooks.CHARTS``): no admission webhooks and no operator TLS, whose certificate only a hook made.

    Prometheus keeps its TSDB on a volume of the class ``cloud.volume_storage_class`` names (on EKS the layer's
    encrypted gp3 class; elsewhere the cluster's default), not on an emptyDir on the node's root disk: a restart
    or a rescheduled pod kept nothing, and 15 days of samples filled the system nodes' disks."""
    retained_gib, volume_gib = prometheus_storage()
    claim: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": f"{volume_gib}Gi"}},
    }
    if (storage_class := cloud.volume_storage_class(spec)) is not None:
        claim["storageClassName"] = storage_class
    values: dict[str, Any] = {
        "prometheus": {
            "prometheusSpec": {
                # Select every ServiceMonitor/PodMonitor/PrometheusRule, not only this release's.
                "serviceMonitorSelectorNilUsesHelmValues": False,
                "podMonitorSelectorNilUsesHelmValues": False,
                "ruleSelectorNilUsesHelmValues": False,
                "retention": f"{PROMETHEUS_RETENTION_DAYS}d",
                # Prometheus's units are powers of two (GB = GiB): the TSDB stays within its share of the volume.
                "retentionSize": f"{retained_gib}GB",
                # The chart's storageSpec becomes the Prometheus resource's storage (templates/prometheus/
                # prometheus.yaml); the operator gives the StatefulSet this claim template.
                "storageSpec": {"volumeClaimTemplate": {"spec": claim}},
            }
        },
        "grafana": {
            "enabled": spec.observability.grafana_dashboards,
            **_grafana_auth(spec),
            "sidecar": {
                "dashboards": {
                    "enabled": True,
                    "label": GRAFANA_DASHBOARD_LABEL,
                    "labelValue": "1",
                    "searchNamespace": "ALL",
                    "folderAnnotation": "grafana_folder",
                    "provider": {"foldersFromFilesStructure": True},
                }
            },
        },
    }
    return Release(
        name=PROMETHEUS_STACK_RELEASE,
        chart="kube-prometheus-stack",
        repository="https://prometheus-community.github.io/helm-charts",
        version=spec.addons.versions.kube_prometheus_stack,
        namespace=spec.observability.namespace,
        values=merged(values, hook_free_values("kube-prometheus-stack")),
    )


def installs_prometheus(spec: PlatformSpec) -> bool:
    return spec.observability.prometheus and spec.addons.install_prometheus_stack


def volumes_note(spec: PlatformSpec, cloud: Cloud | None) -> str | None:
    """What the plan says about the stack's persistent volumes and the StorageClass they claim; nothing where the
    stack has none, or runs in no cluster (target local)."""
    if cloud is None:
        return None
    made = cloud.volume_storage_class(spec)
    claims: list[str] = []
    if installs_prometheus(spec):
        retained, volume = prometheus_storage()
        claims.append(
            f"Prometheus {volume} GiB ({PROMETHEUS_RETENTION_DAYS} days, at most {retained} GiB of samples)"
        )
    if spec.batch.enabled:
        named = f" on {spec.batch.storage_class} (batch.storage_class)" if spec.batch.storage_class else ""
        claims.append(f"the batch service {spec.batch.storage_gib} GiB{named}")
    if not claims:
        return None
    if made is not None:
        where = (
            f"StorageClass {made}, which `pulumi up` creates (gp3 on the EBS CSI driver, encrypted with the "
            "stack's disks key, bound in the zone the pod lands in)"
        )
    else:
        where = (
            "the cluster's default StorageClass (the stack creates none on a cluster you bring: `kubectl get "
            "storageclass` must show one marked (default), or the claims stay Pending)"
        )
    return f"persistent volumes: {'; '.join(claims)}; they claim {where}"


def prometheus_adapter(spec: PlatformSpec, rules: list[dict[str, Any]]) -> Release:
    url = urlsplit(prometheus_url(spec))
    port = url.port or (443 if url.scheme == "https" else 80)
    return Release(
        name="prometheus-adapter",
        chart="prometheus-adapter",
        repository="https://prometheus-community.github.io/helm-charts",
        version=spec.addons.versions.prometheus_adapter,
        namespace=spec.observability.namespace,
        values={
            "prometheus": {"url": f"{url.scheme}://{url.hostname}{url.path}", "port": port},
            "rules": {"default": False, "custom": rules},
        },
    )


LWS_RELEASE = "lws"
LWS_NAMESPACE = "lws-system"


def leader_worker_set(spec: PlatformSpec) -> Release:
    """The LeaderWorkerSet controller, its CRD and webhooks (models whose replica spans nodes), from its OCI chart
    (https://lws.sigs.k8s.io/docs/installation/: `helm install lws oci://registry.k8s.io/lws/charts/lws`)."""
    return Release(
        name=LWS_RELEASE,
        chart="oci://registry.k8s.io/lws/charts/lws",
        repository="",
        version=spec.addons.versions.lws,
        namespace=LWS_NAMESPACE,
        values={"nodeSelector": nodes.system_node_selector()},
    )


def otel_collector(spec: PlatformSpec) -> Release:
    """The OpenTelemetry Collector the stack's spans go through (observability.tracing; ``render.tracing``)."""
    return Release(
        name=tracing.RELEASE,
        chart=tracing.CHART,
        repository=tracing.REPOSITORY,
        version=spec.addons.versions.opentelemetry_collector,
        namespace=tracing.namespace(spec),
        values=tracing.collector_values(spec),
    )


def releases(
    spec: PlatformSpec, adapter_rules: list[dict[str, Any]], cloud: Cloud, multi_node: bool = False
) -> list[Release]:
    """The cloud-neutral add-ons this stack needs, in install order; ``multi_node``: a model's replica spans nodes
    (the LeaderWorkerSet controller first: the engines are its custom resources)."""
    addons = spec.addons
    out: list[Release] = [leader_worker_set(spec)] if multi_node else []
    if uses_gpus(spec) and addons.gpu_plugin is GpuPlugin.DEVICE_PLUGIN:
        out.append(device_plugin(spec))
    if uses_gpus(spec) and addons.gpu_plugin is GpuPlugin.GPU_OPERATOR:
        out.append(gpu_operator(spec, cloud))
    if installs_prometheus(spec):
        out.append(kube_prometheus_stack(spec, cloud))
    if uses_gpus(spec) and spec.observability.dcgm_exporter:
        out.append(dcgm_exporter(spec))
    if addons.autoscaler is Autoscaler.KEDA and addons.install_keda:
        out.append(keda(spec))
    if addons.autoscaler is Autoscaler.HPA and addons.install_prometheus_adapter:
        out.append(prometheus_adapter(spec, adapter_rules))
    if installs_envoy_gateway(spec):
        out.append(envoy_gateway(spec))
    if router_scales(spec) and addons.install_metrics_server:
        out.append(metrics_server(spec))
    if tracing.enabled(spec):
        out.append(otel_collector(spec))
    return out
