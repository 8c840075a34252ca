"""``target: eks``: the cloud seam's answers for AWS. Pure; the resources themselves are ``components.clouds.aws.layer``.

Every answer reads the same decisions the layer registers (``components.clouds.aws.decisions``), so the bill, the
network policies and the GPU nodes' labels agree with what `pulumi up` creates.
"""

from __future__ import annotations

from components.base import catalog
from components.base.problems import Problem
from components.clouds.aws import decisions, prices, volumes
from components.core import nodes
from components.core.cloud import PRIVATE_CIDRS, Endpoint, IngressClass, Profile
from components.core.cost import LineItem
from components.core.nodes import Taint
from components.core.placement import Layout, PoolPlan
from components.core.weights import store
from components.render import common, ingress, weights
from components.spec import PlatformSpec, Target, eks_section
from runtime.config import S3Files

BATCH_FILES_PREFIX = "batches/"
"""The key prefix of the batch bucket (cluster.batch_bucket) that holds the batch service's files, and all it may
touch."""

POD_IDENTITY_AGENT = Endpoint(
    "169.254.170.23/32",
    80,
    "EKS Pod Identity agent: credentials for the model store (engines read it, preparation Jobs write it) "
    "(https://docs.aws.amazon.com/eks/latest/userguide/pod-id-agent-setup.html)",
)


def staging_problems(spec: PlatformSpec) -> list[Problem]:
    """The store's Jobs stage each hub checkpoint whole on a system node's root disk (``weights.staging_disks``),
    which is sized for them (``decisions.system_root_disk_gib``) up to what one gp3 volume holds; past that no
    node can run them, and each would be evicted or stay Pending until its deadline."""
    disk = decisions.system_root_disk_gib(spec)
    if disk <= decisions.GP3_MAX_GIB:
        return []
    jobs = weights.staging_disks(spec)
    return [
        Problem(
            "models",
            f"the model store's preparation Jobs stage {sum(jobs.values()):,} GiB of checkpoints on the system nodes "
            f"(largest: {max(jobs, key=lambda j: jobs[j])}, {max(jobs.values()):,} GiB), so their root disks would "
            f"need {disk:,} GiB, more than one gp3 volume holds ({decisions.GP3_MAX_GIB:,} GiB): prepare the largest "
            "weights into the store yourself (`python -m runtime.weights prepare --from DIR --to URI`) and name "
            "its s3:// prefix as the source",
        )
    ]


class AwsCloud:
    """EKS with managed node groups or Karpenter, in a VPC the stack creates or the subnets it is given."""

    gpu_driver_preinstalled = True
    """The EKS AL2023 NVIDIA AMIs ship the driver and container toolkit."""
    managed_limit_store = True
    """ElastiCache (components.clouds.aws.limit_store), in the private subnets."""

    def fixed_costs(self, spec: PlatformSpec, layout: Layout) -> tuple[LineItem, ...]:
        """The control plane, system nodes, NAT gateways, every node group's root disks (GPU pools' included)
        and the KMS keys, from the decisions the layer creates them by, at ``prices``."""
        month = catalog.HOURS_PER_MONTH
        eks = prices.EKS_CONTROL_PLANE_USD_PER_HOUR * month
        system = decisions.system_node_group(spec)
        node = prices.SYSTEM_INSTANCE_USD_PER_HOUR * month
        items = [
            LineItem("EKS control plane", "eks", eks, eks),
            LineItem(
                f"system nodes ({system.min_size}-{system.max_size} x {prices.SYSTEM_INSTANCE_TYPE})",
                "system-nodes",
                node * system.min_size,
                node * system.max_size,
            ),
        ]
        nats = decisions.network_plan(spec).nat_gateways
        if nats:
            nat = nats * prices.NAT_GATEWAY_USD_PER_HOUR * month
            items.append(
                LineItem(f"NAT gateways ({nats}, hourly; data processed not included)", "nat", nat, nat)
            )
        groups = decisions.node_groups(spec, layout)
        if groups:
            disks_min = sum(prices.root_disk_usd_month(g.disk) * g.min_size for g in groups)
            disks_max = sum(prices.root_disk_usd_month(g.disk) * g.max_size for g in groups)
            items.append(LineItem("node root disks (gp3)", "ebs", disks_min, disks_max))
        keys = decisions.kms_keys(spec)
        if keys:
            kms = len(keys) * prices.KMS_KEY_USD_PER_MONTH
            items.append(LineItem(f"KMS keys ({len(keys)}: {', '.join(keys)})", "kms", kms, kms))
        return tuple(items)

    def gpu_node_labels(self, pool: PoolPlan) -> dict[str, str]:
        """A managed node group's (Karpenter's NodePools leave out the Cluster Autoscaler's GPU label, which no
        engine selects)."""
        return decisions.gpu_node_labels(pool)

    def gpu_node_taints(self) -> tuple[Taint, ...]:
        return (nodes.gpu_taint(),)

    def cluster_network(self, spec: PlatformSpec) -> list[str]:
        """The VPC the stack creates; existing subnets' VPC range is not known, so the private ranges."""
        if eks_section(spec).existing_private_subnet_ids:
            return list(PRIVATE_CIDRS)
        return [eks_section(spec).vpc_cidr]

    def load_balancer_ingress(self, spec: PlatformSpec) -> IngressClass:
        return ingress.alb_ingress(spec)

    def credential_endpoints(self, spec: PlatformSpec) -> tuple[Endpoint, ...]:
        """The Pod Identity agent on every node (its IPv4 address; the cluster is IPv4)."""
        return (POD_IDENTITY_AGENT,)

    def model_reader(self, spec: PlatformSpec) -> tuple[str, str]:
        """The engines' service account: EKS Pod Identity gives it read access to the model store
        (``components.clouds.aws.layer``)."""
        return spec.cluster.namespace, common.engine_service_account_name(spec)

    def volume_storage_class(self, spec: PlatformSpec) -> str:
        """The encrypted gp3 class the layer creates (``components.clouds.aws.volumes``): EKS 1.30+ has no
        default class, so a claim naming none never binds."""
        return volumes.STORAGE_CLASS

    def batch_files(self, spec: PlatformSpec) -> S3Files:
        """The batch bucket (cluster.batch_bucket, its name handed over at deploy time) under ``batches/``, never
        the model bucket; the batch service's Pod Identity role may touch that prefix only
        (``components.clouds.aws.layer``)."""
        return S3Files(prefix=BATCH_FILES_PREFIX, region=eks_section(spec).region)

    def model_writer(self, spec: PlatformSpec) -> tuple[str, str]:
        """The preparation Jobs' service account: EKS Pod Identity lets it write the store's prefix."""
        return spec.cluster.namespace, weights.service_account_name(spec)

    def image_build(self, spec: PlatformSpec) -> str:
        """Every runtime image, into the stack's ECR repositories (``components.clouds.aws.registry``)."""
        return "into the stack's ECR"

    def model_store_problems(self, spec: PlatformSpec) -> list[Problem]:
        """The store is the bucket the stack creates, in its account, read through EKS Pod Identity: no
        store fields of a bucket you bring, and no weights or adapters in another bucket (engines read only the
        store, and a bucket outside it may belong to another account)."""
        problems = store.account_problems(spec)
        problems += staging_problems(spec)
        for name in ("bucket", "endpoint_url", "reader_secret", "writer_secret"):
            if getattr(spec.model_store, name) is not None:
                problems.append(
                    Problem(
                        f"model_store.{name}",
                        "on eks the model store is the bucket the stack creates, read and written through EKS "
                        "Pod Identity: remove it (name the bucket with cluster.model_bucket)",
                    )
                )
        bucket = store.store_bucket(spec)
        prefix = spec.model_store.prefix
        for i, model in enumerate(spec.models):
            if model.is_local_path:
                continue  # placement reports it: a local path only works with target local
            for j, adapter in enumerate(model.adapters):
                other = store.bucket_of(adapter.source) if adapter.source.startswith("s3://") else None
                if other and other != bucket:
                    problems.append(
                        Problem(
                            f"models[{i}].adapters[{j}].source",
                            f"bucket {other!r} is not the platform's model store ({bucket}): engine pods read "
                            f"only the store; prepare the adapter into s3://{bucket}/{prefix}/... "
                            "(`python -m runtime.weights prepare --from DIR --to URI`), or use a hub source with "
                            "revision",
                        )
                    )
            for j, version in enumerate(model.versions):
                if version.source is None or not version.source.startswith("s3://"):
                    continue
                other = store.bucket_of(version.source)
                if other != bucket:
                    problems.append(
                        Problem(
                            f"models[{i}].versions[{j}].source",
                            f"bucket {other!r} is not the platform's model store ({bucket}): engines read only the "
                            f"store; prepare the weights into s3://{bucket}/{prefix}/... or use a "
                            "hub source with revision",
                        )
                    )
            if model.source.startswith("s3://") and (other := store.bucket_of(model.source)) != bucket:
                problems.append(
                    Problem(
                        f"models[{i}].source",
                        f"bucket {other!r} is not the platform's model store ({bucket}): engines read only "
                        "the store, and a bucket outside it may belong to another account; prepare the weights into "
                        f"s3://{bucket}/{prefix}/... (`python -m runtime.weights prepare --from DIR "
                        "--to URI`), or use a hub source with revision",
                    )
                )
        return problems


EKS = AwsCloud()
PROFILE = Profile(
    target=Target.EKS,
    cloud=EKS,
    cluster_layer="components.clouds.aws.layer:provision",
    instances=catalog.INSTANCE_TYPES,
    prices=catalog.EC2_PRICES,
)
"""``target: eks``: EKS in the stack's account, EC2's GPU instance types at EC2's prices."""
