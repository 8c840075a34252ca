"""Cluster add-ons as ``helm.v4.Chart`` releases: a thin component over ``components.render.addons`` and
the cloud's own controllers (``ClusterAccess.addons``)."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as k8s

from components.core.cloud import Cloud
from components.kubernetes.manifests import apply
from components.render import addons, common, scaling
from components.render.common import Manifest
from components.spec import PlatformSpec

# Namespaces whose workloads need host access (device plugin, node exporter) keep the privileged level.
_PRIVILEGED = {addons.GPU_NAMESPACE}
_EXISTING = {"kube-system", "default"}


def namespace(spec: PlatformSpec, name: str) -> Manifest:
    meta = common.metadata(spec, name, "addons")
    meta.pop("namespace")
    level = "privileged" if name in _PRIVILEGED or name == spec.observability.namespace else "baseline"
    meta["labels"]["pod-security.kubernetes.io/enforce"] = level
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


class ClusterAddons(pulumi.ComponentResource):
    """Every add-on the stack needs (``addons.releases``, then ``cloud_releases``), each a pinned Helm chart
    in its namespace."""

    def __init__(
        self,
        spec: PlatformSpec,
        cloud: Cloud,
        cloud_releases: Sequence[addons.Release] = (),
        opts: pulumi.ResourceOptions | None = None,
        grafana_admin_password: pulumi.Output[str] | None = None,
        multi_node: bool = False,
    ) -> None:
        super().__init__(
            "inferstack:kubernetes:ClusterAddons", f"{spec.name}-{spec.environment}-addons", None, opts
        )
        self.releases = [
            *addons.releases(spec, scaling.adapter_rules(spec), cloud, multi_node),
            *cloud_releases,
        ]
        names = sorted({r.namespace for r in self.releases} - _EXISTING - {spec.cluster.namespace})
        self.namespaces = {n: apply(namespace(spec, n), pulumi.ResourceOptions(parent=self)) for n in names}
        self.charts: dict[str, k8s.helm.v4.Chart] = {}
        for release in self.releases:
            depends = [self.namespaces[release.namespace]] if release.namespace in self.namespaces else []
            if release.name == addons.PROMETHEUS_STACK_RELEASE and grafana_admin_password is not None:
                login = {"admin-user": addons.GRAFANA_ADMIN_USER, "admin-password": grafana_admin_password}
                secret = {**addons.grafana_admin_secret(spec), "stringData": login}
                after_namespace = pulumi.ResourceOptions(parent=self, depends_on=list(depends))
                depends.append(apply(secret, after_namespace, secret_fields=("stringData",)))
            # What the chart would make from hooks, which helm.v4.Chart never runs (chart_hooks.CHARTS): first,
            # each after the one before (a Job after the access it runs with).
            for manifest in addons.hook_replacements(spec, release):
                depends.append(apply(manifest, pulumi.ResourceOptions(parent=self, depends_on=list(depends))))
            self.charts[release.name] = k8s.helm.v4.Chart(
                release.name,
                chart=release.chart,
                version=release.version,
                namespace=release.namespace,
                # An OCI chart (oci://...) names its registry itself; a classic one comes from its repository.
                repository_opts=k8s.helm.v4.RepositoryOptsArgs(repo=release.repository)
                if release.repository
                else None,
                values=release.values,
                skip_await=False,
                opts=pulumi.ResourceOptions(parent=self, depends_on=depends),
            )
        self.register_outputs({"releases": {r.name: r.version for r in self.releases}})

    def installed(self, *names: str) -> list[pulumi.Resource]:
        """The charts among ``names`` this stack installs (custom resources depend on their CRDs)."""
        return [self.charts[n] for n in names if n in self.charts]
