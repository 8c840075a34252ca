"""``target: kubernetes``: the cloud seam's answers for a cluster you bring (kind, k3d, an existing one).

The stack creates no infrastructure there, so it bills none, and it runs the spec's pinned images through
the ambient kubeconfig (``components.kubernetes.cluster.bring_your_own``). Your GPU nodes must carry the
labels and taint the engines select and tolerate (``gpu_node_labels``, ``gpu_node_taints``).
"""

from __future__ import annotations

from components.base import catalog
from components.base.problems import Problem
from components.core import nodes
from components.core.cloud import PRIVATE_CIDRS, Endpoint, IngressClass, Profile
from components.core.cost import LineItem
from components.core.nodes import Taint
from components.core.placement import Layout, PoolPlan
from components.core.weights import store
from components.render import ingress
from components.spec import PlatformSpec, Target
from runtime.config import S3Files


class OwnCluster:
    """A cluster the stack finds rather than creates."""

    gpu_driver_preinstalled = False
    """Unknown nodes: the GPU operator (addons.gpu_plugin gpu-operator) installs the driver and toolkit."""
    managed_limit_store = False
    """No cloud account: the shared rate-limit store runs in the namespace."""

    def fixed_costs(self, spec: PlatformSpec, layout: Layout) -> tuple[LineItem, ...]:
        """None: the stack creates nothing besides what runs in the cluster (its GPU pools are billed apart)."""
        return ()

    def gpu_node_labels(self, pool: PoolPlan) -> dict[str, str]:
        """Label your GPU nodes so: engines select ``inferstack.io/pool: <pool>``."""
        return nodes.gpu_node_labels(pool)

    def gpu_node_taints(self) -> tuple[Taint, ...]:
        """Taint your GPU nodes so, or anything may fill them; engines tolerate it."""
        return (nodes.gpu_taint(),)

    def cluster_network(self, spec: PlatformSpec) -> list[str]:
        """Unknown: nodes, load balancers and the API server are somewhere in the private ranges."""
        return list(PRIVATE_CIDRS)

    def load_balancer_ingress(self, spec: PlatformSpec) -> IngressClass:
        """``ingress: alb`` on a cluster you bring means the AWS Load Balancer Controller you run there."""
        return ingress.alb_ingress(spec)

    def credential_endpoints(self, spec: PlatformSpec) -> tuple[Endpoint, ...]:
        """None: engines and preparation Jobs carry what they are given (the store's credential Secrets)."""
        return ()

    def model_reader(self, spec: PlatformSpec) -> None:
        """None: engines read the model store with the credentials you mount (model_store.reader_secret)."""
        return None

    def volume_storage_class(self, spec: PlatformSpec) -> None:
        """None: the stack creates no StorageClass here, so claims name the spec's (batch.storage_class) or get
        the cluster's default, which the plan says must exist."""
        return None

    def batch_files(self, spec: PlatformSpec) -> S3Files | None:
        """None: no object store is known here, so batch files live on the batch service's volume."""
        return None

    def image_build(self, spec: PlatformSpec) -> str | None:
        """``gateway.image_registry``, with this machine's Docker login; without it, the published images."""
        registry = spec.gateway.image_registry
        return f"(Docker with buildx on this machine) and pushes them to {registry}" if registry else None

    def model_store_problems(self, spec: PlatformSpec) -> list[Problem]:
        """The stack creates no store here: a hub model or adapter needs the existing bucket it is prepared into
        (and an S3 bucket with an owner account is the stack's account's)."""
        problems = store.account_problems(spec)
        if store.store_bucket(spec) is not None:
            return problems
        for i, model in enumerate(spec.models):
            if model.is_local_path:
                continue  # placement reports it: a local path only works with target local
            if model.is_hub:
                problems.append(
                    Problem(
                        "model_store.bucket",
                        f"models[{i}] ({model.source}) is prepared into the model store, which target "
                        f"{spec.target.value} does not create: name an existing bucket (with endpoint_url, "
                        "reader_secret and writer_secret for an S3-compatible store such as MinIO)",
                    )
                )
            for j, adapter in enumerate(model.adapters):
                if adapter.is_hub:
                    problems.append(
                        Problem(
                            "model_store.bucket",
                            f"models[{i}].adapters[{j}] ({adapter.source}) is prepared into the model store, which "
                            f"target {spec.target.value} does not create: name an existing bucket",
                        )
                    )
        return problems


OWN_CLUSTER = OwnCluster()
PROFILE = Profile(
    target=Target.KUBERNETES,
    cloud=OWN_CLUSTER,
    cluster_layer="components.kubernetes.cluster:bring_your_own",
    instances=catalog.INSTANCE_TYPES,
    prices=catalog.EC2_PRICES,
)
"""``target: kubernetes``: your GPU pools name EC2 instance types (the catalog's), and the plan prices them at
EC2's on-demand prices, the estimate of what such nodes cost wherever they run."""
