"""The AWS controllers an EKS stack installs in its cluster, as the cluster sees them. Pure.

- The AWS Load Balancer Controller (``gateway.ingress: alb``): its Helm release, the service account EKS Pod
  Identity gives its AWS role, and the Ingress class and annotations that make it put an ALB in front of
  the router.
- The Cluster Autoscaler (managed node groups): its Helm release and service account.

Each service account is one constant, read both by the Helm values that create it and by the Pod Identity
association that hands it AWS credentials (``components.clouds.aws.layer``, ``components.clouds.aws.autoscaler``): renaming
it cannot leave a controller without its role.
"""

from __future__ import annotations

import json
from typing import Any

from components.core import nodes
from components.render.addons import Release
from components.spec import IngressKind, NodeProvisioner, PlatformSpec, eks_section

LB_CONTROLLER_SERVICE_ACCOUNT = ("kube-system", "aws-load-balancer-controller")
CLUSTER_AUTOSCALER_SERVICE_ACCOUNT = ("kube-system", "cluster-autoscaler")
# GPU nodes are slow to come back: wait before removing an idle one.
CLUSTER_AUTOSCALER_SCALE_DOWN_UNNEEDED = "15m"


def aws_load_balancer_controller(spec: PlatformSpec, vpc_id: Any = None) -> Release:
    """``vpc_id`` (a string or a Pulumi Output) is the stack's VPC: pods on EKS cannot ask IMDS for it."""
    namespace, account = LB_CONTROLLER_SERVICE_ACCOUNT
    values: dict[str, Any] = {
        "clusterName": spec.cluster_name,
        "region": eks_section(spec).region,
        "serviceAccount": {"create": True, "name": account},
        # The chart's mutating webhook mservice.elbv2.k8s.aws (templates/webhook.yaml: ``failurePolicy: {{
        # .Values.serviceMutatorWebhookConfig.failurePolicy }}``, Fail in its values.yaml) sees every Service
        # created, and refuses it while the controller is not serving yet: the engines' and the runtime services'
        # Services, created beside the chart, failed the first `pulumi up` (Pulumi does not retry). It only
        # defaults the class of LoadBalancer Services, which this platform does not create.
        "serviceMutatorWebhookConfig": {"failurePolicy": "Ignore"},
    }
    if vpc_id is not None:
        values["vpcId"] = vpc_id
    return Release(
        name="aws-load-balancer-controller",
        chart="aws-load-balancer-controller",
        repository="https://aws.github.io/eks-charts",
        version=spec.addons.versions.aws_load_balancer_controller,
        namespace=namespace,
        values=values,
    )


def cluster_autoscaler(spec: PlatformSpec, priorities: dict[int, list[str]] | None = None) -> Release:
    """Grows managed GPU node groups when engine pods are pending, within each group's min/max.

    With ``priorities`` (``decisions.autoscaler_priorities``: a pool's capacity reservation first) the priority
    expander picks among the groups that could take the pods, least-waste among equals. Its AWS identity (scaling
    only this cluster's groups) comes from ``components.clouds.aws.autoscaler``.
    """
    namespace, account = CLUSTER_AUTOSCALER_SERVICE_ACCOUNT
    ordered = bool(priorities)
    extra: dict[str, Any] = {"expanderPriorities": _priorities_yaml(priorities)} if ordered else {}
    return Release(
        name="cluster-autoscaler",
        chart="cluster-autoscaler",
        repository="https://kubernetes.github.io/autoscaler",
        version=spec.addons.versions.cluster_autoscaler,
        namespace=namespace,
        values={
            "autoDiscovery": {"clusterName": spec.cluster_name},
            "awsRegion": eks_section(spec).region,
            "cloudProvider": "aws",
            # The autoscaler's minor version must match the cluster's.
            "image": {"tag": f"v{spec.cluster.kubernetes_version}.0"},
            "rbac": {"serviceAccount": {"create": True, "name": account}},
            "nodeSelector": nodes.system_node_selector(),
            "extraArgs": {
                "balance-similar-node-groups": True,
                "skip-nodes-with-system-pods": False,
                "expander": "priority,least-waste" if ordered else "least-waste",
                "scale-down-unneeded-time": CLUSTER_AUTOSCALER_SCALE_DOWN_UNNEEDED,
            },
            **extra,
        },
    )


def _priorities_yaml(priorities: dict[int, list[str]] | None) -> str:
    """The priority expander's ConfigMap body as YAML text: integer keys (JSON would make them strings, which the
    expander cannot read); the chart takes a string as is."""
    lines: list[str] = []
    for priority, patterns in (priorities or {}).items():
        lines.append(f"{priority}:")
        lines += [f"  - {json.dumps(p)}" for p in patterns]
    return "\n".join(lines) + "\n"


EFA_DEVICE_PLUGIN_NAMESPACE = "kube-system"


def efa_device_plugin(spec: PlatformSpec) -> Release:
    """The EFA device plugin: advertises each node's EFA interfaces as ``vpc.amazonaws.com/efa``, which engine pods
    of multi-node groups request (docs.aws.amazon.com/eks/latest/userguide/node-efa.html). The chart runs it only on
    instance types with EFA (its supportedInstanceLabels); GPU nodes are tainted, so it tolerates that taint."""
    return Release(
        name="aws-efa-k8s-device-plugin",
        chart="aws-efa-k8s-device-plugin",
        repository="https://aws.github.io/eks-charts",
        version=spec.addons.versions.aws_efa_k8s_device_plugin,
        namespace=EFA_DEVICE_PLUGIN_NAMESPACE,
        values={"tolerations": [nodes.gpu_toleration()]},
    )


def releases(
    spec: PlatformSpec,
    vpc_id: Any = None,
    priorities: dict[int, list[str]] | None = None,
    efa: bool = False,
) -> list[Release]:
    """The controllers this EKS stack installs, in install order (after the cloud-neutral add-ons); ``efa``: a GPU
    node group has EFA interfaces."""
    addons = spec.addons
    out: list[Release] = [efa_device_plugin(spec)] if efa else []
    if spec.gateway.ingress is IngressKind.ALB and addons.install_aws_load_balancer_controller:
        out.append(aws_load_balancer_controller(spec, vpc_id))
    if (
        eks_section(spec).node_provisioner is NodeProvisioner.MANAGED
        and spec.gpu_pools
        and addons.install_cluster_autoscaler
    ):
        out.append(cluster_autoscaler(spec, priorities))
    return out
