"""The AWS layer of a ``target: eks`` stack, built before anything in Kubernetes.

KMS keys -> network (+ flow logs) -> cluster (+ add-ons that run before nodes) -> node role -> system and GPU
node groups -> add-ons that need nodes (then the persistent volumes' StorageClass, on the EBS CSI driver), node
scaling (the Cluster Autoscaler's identity, or Karpenter) ->
model bucket, engine and load-balancer identities -> registry and images. ``access()`` hands the Kubernetes
side the cluster's provider, the images the gateway runs (pushed to ECR) and the AWS controllers to install.
"""

from __future__ import annotations

from pathlib import Path

import pulumi
import pulumi_aws as aws

from components.clouds.aws import addons, controller_policies, data_policies, decisions, iam, volumes
from components.clouds.aws.autoscaler import ClusterAutoscaler
from components.clouds.aws.cloud import EKS
from components.clouds.aws.cluster import Cluster
from components.clouds.aws.identity import ServiceRole, pod_identity
from components.clouds.aws.karpenter import Karpenter
from components.clouds.aws.keys import PlatformKeys
from components.clouds.aws.limit_store import ManagedLimitStore
from components.clouds.aws.network import Network
from components.clouds.aws.nodes import NodeGroup
from components.clouds.aws.registry import Registry
from components.clouds.aws.storage import BatchStorage, ModelStorage
from components.core.cloud import ENGINE_WORKLOAD, WORKLOAD_TAG
from components.core.placement import Layout
from components.core.weights import store
from components.kubernetes.cluster import ClusterAccess
from components.kubernetes.manifests import apply
from components.kubernetes.secrets import limit_store_token
from components.render import batches
from components.spec import NodeProvisioner, PlatformSpec, eks_section


class AwsLayer(pulumi.ComponentResource):
    """Everything on AWS for one environment; see the module docstring for the order."""

    def __init__(
        self,
        spec: PlatformSpec,
        layout: Layout,
        stack: str,
        root: Path = Path(),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        name = spec.cluster_name
        super().__init__("inferstack:aws:AwsLayer", name, None, opts)
        region = eks_section(spec).region
        self.tags = tags = decisions.tags(spec, stack)
        account = spec.cluster.account_id
        provider = aws.Provider(
            name,
            region=region,
            # With cluster.account_id, credentials of any other account fail before anything is created.
            allowed_account_ids=[account] if account else None,
            opts=pulumi.ResourceOptions(parent=self),
        )
        on_aws = pulumi.ResourceOptions(parent=self, providers={"aws": provider})
        # The account the provider's credentials belong to: key policies and trust conditions name it.
        account_id = aws.get_caller_identity_output(
            opts=pulumi.InvokeOutputOptions(parent=self, provider=provider)
        ).account_id

        self.keys = PlatformKeys(spec, account_id, tags, on_aws)
        self.network = Network(spec, account_id, self.keys.logs.arn, tags, on_aws)
        self.cluster = Cluster(
            spec,
            self.network.vpc_id,
            self.network.private_subnet_ids,
            account_id,
            self.keys.logs.arn,
            tags,
            on_aws,
        )
        cluster_name = self.cluster.name

        node_role = ServiceRole(
            f"{name}-node",
            iam.node_trust(),
            region,
            tags,
            on_aws,
            managed=iam.NODE_MANAGED_POLICIES,
            description=f"EKS nodes of {name}",
            role_name=decisions.node_role_name(spec),
        )
        before_nodes = [node_role, *self.cluster.addons.values()]
        self.node_groups: dict[str, NodeGroup] = {}
        karpenter = eks_section(spec).node_provisioner is NodeProvisioner.KARPENTER
        # With Karpenter, only the system group is managed; GPU nodes come from its NodePools.
        plans = [decisions.system_node_group(spec)] if karpenter else decisions.node_groups(spec, layout)
        self.node_group_plans = plans
        efa_groups = self._efa_security_groups(spec, plans, tags, on_aws)
        self.placement_groups = {
            plan.pool: aws.ec2.PlacementGroup(
                decisions.placement_group_name(spec, plan.pool),
                name=decisions.placement_group_name(spec, plan.pool),
                strategy="cluster",
                tags=tags,
                opts=on_aws,
            )
            for plan in plans
            if plan.placement_group
        }
        for plan in plans:
            placed = self.placement_groups.get(plan.pool) if plan.placement_group else None
            self.node_groups[plan.node_group_name] = NodeGroup(
                plan,
                cluster_name,
                node_role.arn,
                self.network.subnets_in(plan.zones),
                self.keys.disks.arn,
                tags,
                pulumi.ResourceOptions(parent=self, providers={"aws": provider}, depends_on=before_nodes),
                efa_security_group_ids=efa_groups if plan.efa_interfaces else (),
                placement_group=placed.name if placed is not None else None,
            )
        system = self.node_groups[decisions.system_node_group(spec).node_group_name]

        # The persistent volumes' class encrypts with the disks key: the driver's controller may use it.
        volumes_kms = self.keys.disks.arn.apply(lambda arn: iam.dumps(volumes.ebs_csi_kms(region, str(arn))))
        ebs_role = ServiceRole(
            f"{name}-ebs-csi",
            iam.pod_identity_trust(),
            region,
            tags,
            on_aws,
            managed=iam.EBS_CSI_MANAGED_POLICIES,
            inline={"volume-key": volumes_kms},
            description=f"EBS CSI controller of {name}",
        )
        ebs_csi = self.cluster.addon(
            "aws-ebs-csi-driver",
            pod_identities=[
                aws.eks.AddonPodIdentityAssociationArgs(
                    role_arn=ebs_role.arn, service_account=decisions.EBS_CSI_SERVICE_ACCOUNT[1]
                )
            ],
            depends_on=[system, ebs_role],
        )
        self.late_addons = [self.cluster.addon("coredns", depends_on=[system]), ebs_csi]
        # The class the platform's volumes claim (Cloud.volume_storage_class): EKS 1.30+ has none by default.
        self.storage_class = apply(
            volumes.storage_class(spec, self.keys.disks.arn),
            pulumi.ResourceOptions(parent=self, provider=self.cluster.provider, depends_on=[ebs_csi]),
        )

        self.storage = ModelStorage(spec, self.keys.models.arn, tags, on_aws)
        sources: list[str] = []  # engines read the store only (placement refuses s3:// sources outside it)
        read_prefixes = store.engine_read_prefixes(spec)  # the store's prefixes, never the whole bucket
        read = pulumi.Output.all(self.storage.bucket.arn, self.keys.models.arn).apply(
            lambda arns: iam.dumps(
                data_policies.model_read(region, str(arns[0]), str(arns[1]), read_prefixes, sources)
            )
        )
        engine_role = ServiceRole(
            f"{name}-engine",
            iam.pod_identity_trust(),
            region,
            {**tags, WORKLOAD_TAG: ENGINE_WORKLOAD},
            on_aws,
            inline={"read-models": read},
            description=f"Engines of {name}: read model weights",
        )
        engine_identity = pod_identity(
            f"{name}-engine", cluster_name, EKS.model_reader(spec), engine_role, tags, on_aws
        )
        prefix = spec.model_store.prefix
        write = pulumi.Output.all(self.storage.bucket.arn, self.keys.models.arn).apply(
            lambda arns: iam.dumps(data_policies.model_prepare(region, str(arns[0]), str(arns[1]), prefix))
        )
        weights_role = ServiceRole(
            f"{name}-weights",
            iam.pod_identity_trust(),
            region,
            {**tags, WORKLOAD_TAG: "weights"},
            on_aws,
            inline={"prepare-models": write},
            description=f"Model preparation Jobs of {name}: write weights into the store",
        )
        weights_identity = pod_identity(
            f"{name}-weights", cluster_name, EKS.model_writer(spec), weights_role, tags, on_aws
        )
        identities = [engine_identity, weights_identity]
        self.batch_storage: BatchStorage | None = None
        if spec.batch.enabled:  # the batch service: its own bucket and key, nothing of the models'
            self.batch_storage = BatchStorage(spec, account_id, tags, on_aws)
            batch_key = self.batch_storage.key
            files_prefix = EKS.batch_files(spec).prefix
            files = pulumi.Output.all(self.batch_storage.bucket.arn, batch_key.arn).apply(
                lambda arns: iam.dumps(
                    data_policies.batch_files(region, str(arns[0]), str(arns[1]), files_prefix)
                )
            )
            batches_role = ServiceRole(
                f"{name}-batches",
                iam.pod_identity_trust(),
                region,
                {**tags, WORKLOAD_TAG: "batches"},
                on_aws,
                inline={"batch-files": files},
                description=f"Batch service of {name}: its files under s3://<batch bucket>/{files_prefix}",
            )
            batches_account = (spec.cluster.namespace, batches.service_account_name(spec))
            identities.append(
                pod_identity(f"{name}-batches", cluster_name, batches_account, batches_role, tags, on_aws)
            )
        lb_role = ServiceRole(
            f"{name}-lb-controller",
            iam.pod_identity_trust(),
            region,
            tags,
            on_aws,
            inline={"load-balancers": iam.dumps(controller_policies.load_balancer_controller(region))},
            description=f"AWS Load Balancer Controller of {name}",
        )
        lb_identity = pod_identity(
            f"{name}-lb-controller",
            cluster_name,
            addons.LB_CONTROLLER_SERVICE_ACCOUNT,
            lb_role,
            tags,
            on_aws,
        )
        self.registry = Registry(spec, tags, root, self.keys.images.arn, on_aws)
        self.limit_store: ManagedLimitStore | None = None
        if spec.gateway.shared_limits:
            token = limit_store_token(spec.gateway.limit_store_auth_config_key)
            assert token is not None  # the spec requires the key with shared_limits on eks
            self.limit_store = ManagedLimitStore(
                spec, self.network.vpc_id, self.network.private_subnet_ids, account_id, token, tags, on_aws
            )

        self.kubernetes_provider = self.cluster.provider
        self.karpenter: Karpenter | None = None
        self.autoscaler: ClusterAutoscaler | None = None
        if not karpenter:
            self.autoscaler = ClusterAutoscaler(
                spec, cluster_name, tags, on_aws, opts=pulumi.ResourceOptions(parent=self)
            )
        if karpenter:
            self.karpenter = Karpenter(
                spec,
                layout.pools,
                node_role,
                self.keys.disks.arn,
                cluster_name,
                self.kubernetes_provider,
                tags,
                on_aws,
                depends_on=[system, *self.late_addons],
                opts=pulumi.ResourceOptions(parent=self),
            )
        # Engines fetch weights and the controller manages load balancers from their first start.
        identities.append(lb_identity)
        self.ready: list[pulumi.Resource] = [
            *self.node_groups.values(),
            *self.late_addons,
            self.storage_class,
            *identities,
        ]
        self.ready += [c for c in (self.karpenter, self.autoscaler) if c is not None]
        self.register_outputs({"cluster_name": cluster_name})

    def _efa_security_groups(
        self,
        spec: PlatformSpec,
        plans: list[decisions.NodeGroupPlan],
        tags: dict[str, str],
        opts: pulumi.ResourceOptions,
    ) -> list[pulumi.Input[str]]:
        """The security groups of EFA interfaces: the cluster's (nodes, pods and the control plane talk through it),
        and one that lets all traffic in from and out to itself, which EFA requires ("the security group must allow
        all inbound and outbound traffic to and from the security group itself", EC2 user guide, efa-start). None
        when no node group has EFA."""
        if not any(p.efa_interfaces for p in plans):
            return []
        name = decisions.efa_security_group_name(spec)
        group = aws.ec2.SecurityGroup(
            name,
            vpc_id=self.network.vpc_id,
            description=f"EFA of {spec.cluster_name}: all traffic between the EFA interfaces of its GPU nodes",
            tags={**tags, "Name": name},
            opts=opts,
        )
        for rule, kind in (
            ("in", aws.vpc.SecurityGroupIngressRule),
            ("out", aws.vpc.SecurityGroupEgressRule),
        ):
            kind(
                f"{name}-self-{rule}",
                security_group_id=group.id,
                referenced_security_group_id=group.id,
                ip_protocol="-1",
                description="EFA: all traffic within this security group",
                tags=tags,
                opts=opts,
            )
        cluster_group = self.cluster.cluster.vpc_config.cluster_security_group_id
        return [cluster_group, group.id]

    def access(self, spec: PlatformSpec) -> ClusterAccess:
        """The cluster's provider (used once nodes and add-ons are up), the images pushed to ECR (by digest),
        and the AWS controllers (the Load Balancer Controller is told the VPC: pods on EKS reach no IMDS)."""
        return ClusterAccess(
            options=pulumi.ResourceOptions(
                providers={"kubernetes": self.kubernetes_provider}, depends_on=self.ready
            ),
            images=self.registry.runtime_images(),
            addons=tuple(
                addons.releases(
                    spec,
                    vpc_id=self.network.vpc_id,
                    priorities=decisions.autoscaler_priorities(self.node_group_plans),
                    efa=any(p.efa_interfaces for p in self.node_group_plans),
                )
            ),
            files_bucket=self.batch_storage.bucket.bucket if self.batch_storage is not None else None,
            limit_store_url=self.limit_store.url if self.limit_store is not None else None,
        )

    def export(self) -> None:
        pulumi.export("cluster_name", self.cluster.name)
        pulumi.export("vpc_id", self.network.vpc_id)
        pulumi.export("kubeconfig", self.cluster.kubeconfig)
        pulumi.export("model_bucket", self.storage.bucket.bucket)
        if self.batch_storage is not None:
            pulumi.export("batch_bucket", self.batch_storage.bucket.bucket)
        pulumi.export("node_groups", {n: g.node_group.node_group_name for n, g in self.node_groups.items()})
        if self.karpenter is not None:
            pulumi.export("node_pools", self.karpenter.node_pools)
        pulumi.export("images", {name: image.reference for name, image in self.registry.images.items()})


def provision(spec: PlatformSpec, layout: Layout, stack: str) -> ClusterAccess:
    """``target: eks``: build the AWS layer, export what it made, and hand the Kubernetes side its access."""
    layer = AwsLayer(spec, layout, stack)
    layer.export()
    return layer.access(spec)
