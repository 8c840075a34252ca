"""The EKS control plane: KMS-encrypted Secrets, logs, endpoint access, access entries, managed add-ons,
and the Kubernetes provider every Kubernetes resource of the stack uses.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.clouds.aws import decisions, iam, identity, key_policies
from components.clouds.aws.keys import rotating_key
from components.spec import ApiAccess, ApiEndpointSpec, PlatformSpec, eks_section

API_PORT = 443


def kubeconfig(cluster_name: str, endpoint: str, ca_data: str, region: str) -> dict[str, Any]:
    """A kubeconfig that authenticates with ``aws eks get-token`` (the caller's AWS identity, no static secret)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}
        ],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
        "current-context": cluster_name,
        "users": [
            {
                "name": cluster_name,
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": "aws",
                        "args": [
                            "eks",
                            "get-token",
                            "--cluster-name",
                            cluster_name,
                            "--region",
                            region,
                            "--output",
                            "json",
                        ],
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
    }


def _role_short_name(arn: str) -> str:
    return arn.rsplit("/", 1)[-1].lower()


class Cluster(pulumi.ComponentResource):
    """``aws.eks.Cluster`` with its role, Secrets key, log group (under the logs key) and admins; ``provider``
    talks to it."""

    cluster: aws.eks.Cluster
    provider: k8s.Provider
    kubeconfig: pulumi.Output[str]

    def __init__(
        self,
        spec: PlatformSpec,
        vpc_id: pulumi.Input[str] | None,
        subnet_ids: Sequence[pulumi.Input[str]],
        account_id: pulumi.Output[str],
        logs_key_arn: pulumi.Input[str],
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        name = spec.cluster_name
        super().__init__("inferstack:aws:Cluster", name, None, opts)
        self.spec, self.tags = spec, tags
        region = eks_section(spec).region
        child = pulumi.ResourceOptions(parent=self)
        key = rotating_key(
            f"{name}-secrets",
            alias=f"alias/{name}-eks-secrets",
            description=f"Envelope encryption of Kubernetes Secrets in EKS cluster {name}",
            policy=account_id.apply(lambda a: iam.dumps(key_policies.cluster_secrets_key(region, a))),
            tags=tags,
            parent=self,
        )
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-control-plane",
            name=decisions.control_plane_log_group(spec),
            retention_in_days=eks_section(spec).control_plane_log_retention_days,
            kms_key_id=logs_key_arn,
            tags=tags,
            opts=child,
        )
        role = identity.ServiceRole(
            f"{name}-cluster",
            iam.cluster_trust(),
            region,
            tags,
            child,
            managed=iam.CLUSTER_MANAGED_POLICIES,
            inline={
                "secrets-encryption": key.arn.apply(
                    lambda arn: iam.dumps(key_policies.cluster_encryption(arn))
                )
            },
            description=f"EKS control plane of {name}",
        )
        endpoint = eks_section(spec).api_endpoint
        if endpoint is None:  # the spec requires it on target eks; never reached from a validated spec
            raise pulumi.RunError("cluster.api_endpoint is required on target eks")
        public = endpoint.access is ApiAccess.PUBLIC
        api_groups = [] if public else [self._api_security_group(endpoint, vpc_id).id]
        self.cluster = aws.eks.Cluster(
            name,
            name=name,
            role_arn=role.arn,
            version=spec.cluster.kubernetes_version,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=list(subnet_ids),
                # Nodes always reach the API privately; people and `pulumi up` the way api_endpoint says.
                endpoint_private_access=True,
                endpoint_public_access=public,
                public_access_cidrs=list(endpoint.public_cidrs) if public else None,
                security_group_ids=api_groups or None,
            ),
            # The Service range, pinned (EKS picks one of two otherwise, fixed at creation): the NetworkPolicies
            # admit the API at its first address, the `kubernetes` Service's (components.render.flows.api_service).
            kubernetes_network_config=aws.eks.ClusterKubernetesNetworkConfigArgs(
                ip_family="ipv4", service_ipv4_cidr=eks_section(spec).service_cidr
            ),
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=key.arn),
                resources=["secrets"],
            ),
            enabled_cluster_log_types=list(decisions.CONTROL_PLANE_LOG_TYPES),
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API",
                # The identity running `pulumi up` must reach the API to create the Kubernetes resources.
                bootstrap_cluster_creator_admin_permissions=True,
            ),
            # vpc-cni, kube-proxy and coredns come as managed add-ons below, versioned with the cluster.
            bootstrap_self_managed_addons=False,
            # Standard support only: extended support costs six times the control-plane price.
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type="STANDARD"),
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[log_group, role]),
        )
        self.name: pulumi.Output[str] = self.cluster.name
        admins = self._admins(spec)
        self.addons = {a: self.addon(a) for a in decisions.ADDONS_BEFORE_NODES}
        ca = self.cluster.certificate_authority.apply(lambda c: (c.data if c else None) or "")
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(self.cluster.name, self.cluster.endpoint, ca).apply(
                lambda args: json.dumps(kubeconfig(str(args[0]), str(args[1] or ""), str(args[2]), region))
            )
        )
        self.provider = k8s.Provider(
            name,
            kubeconfig=self.kubeconfig,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.cluster, *admins]),
        )
        self.register_outputs({"name": self.cluster.name, "kubeconfig": self.kubeconfig})

    def _api_security_group(
        self, endpoint: ApiEndpointSpec, vpc_id: pulumi.Input[str] | None
    ) -> aws.ec2.SecurityGroup:
        """A private endpoint's way in: a security group on the API's network interfaces that admits HTTPS from
        where `pulumi up` runs (``deployer_cidrs``, ``deployer_security_group_ids``) and nothing else. EKS adds it
        beside the cluster security group it creates for nodes and the control plane."""
        name = f"{self.spec.cluster_name}-api"
        child = pulumi.ResourceOptions(parent=self)
        group = aws.ec2.SecurityGroup(
            name,
            vpc_id=vpc_id,
            description=f"EKS API of {self.spec.cluster_name}: HTTPS from the deployers named in api_endpoint",
            tags={**self.tags, "Name": name},
            opts=child,
        )
        sources = [{"cidr_ipv4": c} for c in endpoint.deployer_cidrs] + [
            {"referenced_security_group_id": g} for g in endpoint.deployer_security_group_ids
        ]
        for index, source in enumerate(sources):
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-deployer-{index}",
                security_group_id=group.id,
                ip_protocol="tcp",
                from_port=API_PORT,
                to_port=API_PORT,
                description="pulumi up and kubectl from inside the VPC (cluster.api_endpoint)",
                tags=self.tags,
                opts=child,
                **source,
            )
        return group

    def _admins(self, spec: PlatformSpec) -> list[pulumi.Resource]:
        """Cluster-admin access entries for the spec's admin roles."""
        out: list[pulumi.Resource] = []
        policy = iam.access_policy_arn(eks_section(spec).region, iam.EKS_CLUSTER_ADMIN_POLICY)
        for arn in eks_section(spec).admin_role_arns:
            resource = f"{spec.cluster_name}-admin-{_role_short_name(arn)}"
            entry = aws.eks.AccessEntry(
                resource,
                cluster_name=self.cluster.name,
                principal_arn=arn,
                type="STANDARD",
                tags=self.tags,
                opts=pulumi.ResourceOptions(parent=self),
            )
            out.append(
                aws.eks.AccessPolicyAssociation(
                    resource,
                    cluster_name=self.cluster.name,
                    principal_arn=arn,
                    policy_arn=policy,
                    access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[entry]),
                )
            )
        return out

    def addon(
        self,
        addon: str,
        pod_identities: Sequence[aws.eks.AddonPodIdentityAssociationArgs] = (),
        depends_on: Sequence[pulumi.Resource] = (),
    ) -> aws.eks.Addon:
        """A managed add-on at EKS's default version for the cluster's Kubernetes version, configured as
        ``decisions.ADDON_CONFIGURATION`` says."""
        configuration = decisions.ADDON_CONFIGURATION.get(addon)
        return aws.eks.Addon(
            f"{self.spec.cluster_name}-{addon}",
            cluster_name=self.cluster.name,
            addon_name=addon,
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="PRESERVE",
            configuration_values=json.dumps(configuration) if configuration else None,
            pod_identity_associations=list(pod_identities) or None,
            tags=self.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(depends_on)),
        )
