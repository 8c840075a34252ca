"""What each pinned Helm chart makes only from a Helm hook, and how a stack does without it. Pure data and checks.

``helm.v4.Chart`` renders a chart as ``helm template`` would and applies the result, but never runs hooks: the
provider sets ``DisableHooks`` and applies the release manifest, which the Helm SDK keeps apart from hook resources
(pulumi/pulumi-kubernetes, provider/pkg/provider/helm/v4/chart.go: "Helm hook resources (those annotated with
`helm.sh/hook`) are separated from the regular manifest by the Helm SDK and are not applied by Pulumi"). Whatever a
chart creates only from a ``pre-install`` or ``post-install`` hook therefore never exists: a certificate Secret
that its Deployment mounts leaves that pod waiting for its volume for ever.

``CHARTS`` records, per chart, the versions whose templates were read for ``helm.sh/hook`` annotations, the hooks
whose resources something else in the chart needs (each with the values that remove the need, or what the
platform renders in its place), and the hooks nothing needs (tests, deletion, upgrades). The add-on renderers take
their hook-removing values from here (``hook_free_values``), and ``gaps`` tells a rendered chart that still
depends on a hook, or a chart version nobody checked: a version bump must come with a re-read of its templates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ENVOY_GATEWAY_CERTGEN = "envoy-gateway-certgen"
"""The Job (and its ServiceAccount, Role, RoleBinding) that runs Envoy Gateway's ``certgen`` in place of the
chart's hook (``components.render.addons.envoy_gateway_certgen``)."""


@dataclass(frozen=True)
class NeededHook:
    """A hook whose resources another object of the chart needs, and how the stack does without the hook."""

    template: str
    """The hook's template, as a path in the chart's upstream repository at the checked versions."""
    makes: str
    """What the hook creates, and what needs it (with the template that needs it)."""
    unless: Mapping[str, Any] = field(default_factory=dict)
    """Values (dotted paths) under which the chart renders nothing that needs the hook's resources."""
    instead: tuple[tuple[str, str], ...] = ()
    """Or: the (kind, name) objects the platform renders in the release's namespace in the hook's place, because
    no value turns the need off."""


@dataclass(frozen=True)
class ChartHooks:
    """One chart's hooks, as read in its upstream templates at ``checked`` versions."""

    source: str
    """The upstream repository and the chart's directory in it."""
    checked: frozenset[str]
    """Chart versions whose templates were read for ``helm.sh/hook`` (the versions a stack may pin unchallenged)."""
    needed: tuple[NeededHook, ...] = ()
    ignorable: tuple[str, ...] = ()
    """Hooks nothing else needs (tests, pre/post-delete, upgrades), with their templates and why."""


_KPS = "charts/kube-prometheus-stack"
_KPS_WEBHOOKS = f"{_KPS}/templates/prometheus-operator/admission-webhooks"
_EG = "charts/gateway-helm/templates"

CHARTS: dict[str, ChartHooks] = {
    "kube-prometheus-stack": ChartHooks(
        source="github.com/prometheus-community/helm-charts, charts/kube-prometheus-stack (tag kube-prometheus-stack-<v>)",
        checked=frozenset({"75.6.1"}),
        needed=(
            NeededHook(
                template=f"{_KPS_WEBHOOKS}/job-patch/job-createSecret.yaml",
                makes=(
                    "Secret <release>-admission (pre-install Job admission-create), the operator's TLS certificate: "
                    f"{_KPS}/templates/prometheus-operator/deployment.yaml mounts it when prometheusOperator.tls"
                    ".enabled (true in values.yaml), and the admission webhooks serve with it"
                ),
                unless={
                    "prometheusOperator.tls.enabled": False,
                    "prometheusOperator.admissionWebhooks.enabled": False,
                },
            ),
            NeededHook(
                template=f"{_KPS_WEBHOOKS}/job-patch/job-patchWebhook.yaml",
                makes=(
                    "the caBundle of the Mutating/ValidatingWebhookConfigurations (post-install Job admission-patch):"
                    f" without it ({_KPS_WEBHOOKS}/mutatingWebhookConfiguration.yaml, caBundle empty) the API server "
                    "cannot call the webhook and refuses every PrometheusRule"
                ),
                unless={"prometheusOperator.admissionWebhooks.enabled": False},
            ),
        ),
        ignorable=(
            f"{_KPS}/charts/crds/templates/upgrade/job.yaml: the CRD upgrade Job (crds.upgradeJob.enabled, false in "
            "values.yaml); the CRDs come from the crds/ directory, which helm.v4.Chart applies",
            "github.com/grafana/helm-charts charts/grafana/templates/tests/* (grafana 9.2.9): `helm test` hooks",
        ),
    ),
    "gateway-helm": ChartHooks(
        source="github.com/envoyproxy/gateway, charts/gateway-helm (tag <v>)",
        checked=frozenset({"v1.4.2"}),
        needed=(
            NeededHook(
                template=f"{_EG}/certgen.yaml",
                makes=(
                    "Secrets envoy-gateway, envoy, envoy-rate-limit and envoy-oidc-hmac (pre-install Job certgen, "
                    "internal/cmd/certgen.go): envoy-gateway-deployment.yaml mounts envoy-gateway, the Envoy "
                    "proxies it creates mount envoy. No value turns the Job off (values.tmpl.yaml: certgen never "
                    "overwrites certificates made before the chart), so the platform runs the same command itself"
                ),
                instead=(
                    ("ServiceAccount", ENVOY_GATEWAY_CERTGEN),
                    ("Role", ENVOY_GATEWAY_CERTGEN),
                    ("RoleBinding", ENVOY_GATEWAY_CERTGEN),
                    ("Job", ENVOY_GATEWAY_CERTGEN),
                ),
            ),
            NeededHook(
                template=f"{_EG}/envoy-proxy-topology-injector-webhook.yaml",
                makes=(
                    "the topology injector's MutatingWebhookConfiguration (pre-install), whose caBundle certgen "
                    "patches: without it the controller's config claims an injector that no webhook calls"
                ),
                unless={"topologyInjector.enabled": False},
            ),
        ),
        ignorable=(f"{_EG}/certgen-rbac.yaml: the hook certgen Job's own ServiceAccount, Role and bindings",),
    ),
    "keda": ChartHooks(source="github.com/kedacore/charts, keda (tag v<v>)", checked=frozenset({"2.19.0"})),
    "nvidia-device-plugin": ChartHooks(
        source="github.com/NVIDIA/k8s-device-plugin, deployments/helm/nvidia-device-plugin (tag v<v>); its "
        "node-feature-discovery 0.15.3 subchart (nfd.enabled, gfd.enabled) has none either",
        checked=frozenset({"0.17.1"}),
    ),
    "gpu-operator": ChartHooks(
        source="github.com/NVIDIA/gpu-operator, deployments/gpu-operator (tag <v>)",
        checked=frozenset({"v25.3.0"}),
        ignorable=(
            "templates/cleanup_crd.yaml: pre-delete",
            "templates/upgrade_crd.yaml: pre-upgrade (CRDs come from crds/ on install)",
            "charts/node-feature-discovery/templates/post-delete-job.yaml: post-delete",
        ),
    ),
    "dcgm-exporter": ChartHooks(
        source="github.com/NVIDIA/dcgm-exporter, deployment (tag 4.2.3-4.1.1 for chart 4.1.1)",
        checked=frozenset({"4.1.1"}),
    ),
    "prometheus-adapter": ChartHooks(
        source="github.com/prometheus-community/helm-charts, charts/prometheus-adapter (tag prometheus-adapter-<v>)",
        checked=frozenset({"4.14.1"}),
    ),
    "metrics-server": ChartHooks(
        source="github.com/kubernetes-sigs/metrics-server, charts/metrics-server (tag metrics-server-helm-chart-<v>)",
        checked=frozenset({"3.12.2"}),
    ),
    "opentelemetry-collector": ChartHooks(
        source="github.com/open-telemetry/opentelemetry-helm-charts, charts/opentelemetry-collector "
        "(tag opentelemetry-collector-<v>)",
        checked=frozenset({"0.170.0"}),  # no template carries helm.sh/hook
    ),
    "lws": ChartHooks(
        source="github.com/kubernetes-sigs/lws, charts/lws (tag v<v>)", checked=frozenset({"0.8.0"})
    ),
    "aws-load-balancer-controller": ChartHooks(
        source="github.com/aws/eks-charts, stable/aws-load-balancer-controller (Chart.yaml version <v>)",
        checked=frozenset({"1.13.3"}),
    ),
    "aws-efa-k8s-device-plugin": ChartHooks(
        source="github.com/aws/eks-charts, stable/aws-efa-k8s-device-plugin (Chart.yaml version v<v>)",
        checked=frozenset({"0.5.10"}),
    ),
    "cluster-autoscaler": ChartHooks(
        source="github.com/kubernetes/autoscaler, charts/cluster-autoscaler (tag cluster-autoscaler-chart-<v>)",
        checked=frozenset({"9.46.6"}),
    ),
    "karpenter": ChartHooks(
        source="github.com/aws/karpenter-provider-aws, charts/karpenter (tag v<v>)",
        checked=frozenset({"1.6.0"}),
    ),
}


def chart_name(chart: str) -> str:
    """The chart's name: an OCI reference's last path segment (oci://docker.io/envoyproxy/gateway-helm)."""
    return chart.rstrip("/").rsplit("/", 1)[-1]


def _nested(dotted: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in dotted.items():
        *parents, leaf = path.split(".")
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def hook_free_values(chart: str) -> dict[str, Any]:
    """The values under which the chart needs no hook's resources (every ``NeededHook.unless``), nested as Helm
    reads them; empty for a chart with none. Applied whatever the version: a version nobody checked is ``gaps``'."""
    hooks = CHARTS.get(chart_name(chart))
    dotted: dict[str, Any] = {}
    for hook in hooks.needed if hooks is not None else ():
        dotted.update(hook.unless)
    return _nested(dotted)


def merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in, maps key by key (as Helm merges values)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


_MISSING = object()


def _value(values: Mapping[str, Any], dotted: str) -> Any:
    node: Any = values
    for key in dotted.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return _MISSING
        node = node[key]
    return node


def gaps(
    chart: str,
    version: str,
    values: Mapping[str, Any],
    namespace: str,
    rendered: Iterable[tuple[str, str, str]],
) -> list[str]:
    """Why this chart, rendered with ``values`` into ``namespace``, would still depend on a hook that never runs;
    ``rendered`` is every (kind, namespace, name) the plan applies besides the chart. Empty: nothing."""
    name = chart_name(chart)
    hooks = CHARTS.get(name)
    if hooks is None:
        return [
            f"chart {name}: no record of its Helm hooks; read its templates and add it to chart_hooks.CHARTS"
        ]
    if version not in hooks.checked:
        return [
            f"chart {name} {version}: its hooks were read at {', '.join(sorted(hooks.checked))} only; read this "
            f"version's templates ({hooks.source}) and update chart_hooks.CHARTS"
        ]
    present = set(rendered)
    out: list[str] = []
    for hook in hooks.needed:
        if hook.unless:
            wrong = {k: v for k, v in hook.unless.items() if _value(values, k) != v}
            if wrong:
                out.append(f"chart {name}: {hook.template} never runs, and {hook.makes}; set {wrong}")
        missing = [(kind, n) for kind, n in hook.instead if (kind, namespace, n) not in present]
        if missing:
            out.append(f"chart {name}: {hook.template} never runs, and {hook.makes}; not rendered: {missing}")
    return out
