"""IAM roles: one per job, each with its documents (``components.clouds.aws.iam`` and the ``*_policies`` modules).

``ServiceRole`` builds a role with AWS managed policies and inline documents; ``pod_identity`` adds the
EKS Pod Identity association that hands the role to one Kubernetes service account.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_aws as aws

from components.clouds.aws import iam


class ServiceRole(pulumi.ComponentResource):
    """A role trusted by one service principal, with AWS managed policies and inline JSON documents.

    A component, so ``depends_on=[role]`` waits for its policies too (a node must not boot before its
    role may join the cluster).
    """

    role: aws.iam.Role

    def __init__(
        self,
        name: str,
        trust: iam.PolicyDocument | pulumi.Output[iam.PolicyDocument],
        region: str,
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
        managed: Sequence[str] = (),
        inline: Mapping[str, pulumi.Input[str]] | None = None,
        description: str = "",
        role_name: str | None = None,
    ) -> None:
        super().__init__("inferstack:aws:ServiceRole", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role = aws.iam.Role(
            name,
            name=role_name,  # None: Pulumi's unique generated name
            assume_role_policy=pulumi.Output.from_input(trust).apply(iam.dumps),
            description=description or None,
            max_session_duration=3600,
            tags=tags,
            opts=child,
        )
        for policy in managed:
            aws.iam.RolePolicyAttachment(
                f"{name}-{policy.rsplit('/', 1)[-1]}",
                role=self.role.name,
                policy_arn=iam.managed_policy_arn(region, policy),
                opts=child,
            )
        for suffix, document in (inline or {}).items():
            aws.iam.RolePolicy(
                f"{name}-{suffix}", role=self.role.id, name=suffix, policy=document, opts=child
            )
        self.arn: pulumi.Output[str] = self.role.arn
        self.register_outputs({"arn": self.role.arn})


def pod_identity(
    name: str,
    cluster_name: pulumi.Input[str],
    service_account: tuple[str, str],
    role: ServiceRole,
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> aws.eks.PodIdentityAssociation:
    """Give ``role`` to pods running as ``service_account`` (namespace, name) through the Pod Identity agent."""
    namespace, account = service_account
    return aws.eks.PodIdentityAssociation(
        name,
        cluster_name=cluster_name,
        namespace=namespace,
        service_account=account,
        role_arn=role.arn,
        tags=tags,
        opts=opts,
    )
