"""The Pulumi program: stack config -> validated spec -> its decisions -> the target's cluster layer -> InferencePlatform.

``__main__.py`` calls ``run()`` under ``pulumi up``; ``inferstack plan`` calls the same ``run()``
in-process under Pulumi's mock runtime, so both see exactly the same resources. The plan has validated the same
stack file and made its decisions already (``Stack.decisions``): it passes them in, so a plan decides once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import cast

import pulumi

from components.base.problems import SpecError
from components.clouds.targets import PROFILES
from components.core.cloud import Profile
from components.core.decisions import Decisions
from components.core.placement import Layout
from components.core.stackfile import stack_path, validate
from components.deploy import sdk_modules
from components.deploy.platform import InferencePlatform, PlatformSecrets
from components.kubernetes.cluster import ClusterAccess
from components.render import ingress
from components.spec import PlatformSpec

ClusterLayer = Callable[[PlatformSpec, Layout, str], ClusterAccess]
"""What a target builds before anything in Kubernetes, and how the Kubernetes side reaches the result (on EKS
the cluster, then every Kubernetes resource goes to it through its provider; a cluster you bring: the kubeconfig's)."""


def cluster_layer(profile: Profile) -> ClusterLayer:
    """The profile's cluster layer, imported here (the profile names it: the bill and the report load no Pulumi)."""
    module, _, name = profile.cluster_layer.partition(":")
    layer = getattr(importlib.import_module(module), name)
    if not callable(layer):
        raise TypeError(
            f"{profile.cluster_layer} (the cluster layer of target {profile.target.value}) is not a function"
        )
    return cast(ClusterLayer, layer)


def run(decided: Decisions | None = None) -> InferencePlatform:
    """``decided``: the stack's decisions, when the caller made them from the same stack config (`inferstack
    plan`); without them (`pulumi up`), the config is validated and decided here."""
    source = str(stack_path(pulumi.get_stack()))
    config = pulumi.Config("inferstack")
    if decided is None:
        try:
            decided = validate(config.require_object("platform"), source, profiles=PROFILES)
        except SpecError as err:
            # A RunError prints its message without a Python traceback: the user sees only the problems.
            raise pulumi.RunError(err.render()) from None
    spec, layout = decided.spec, decided.layout
    profile = PROFILES.get(spec.target)
    if profile is None:
        raise pulumi.RunError(
            f"{source}: target {spec.target.value} runs on this machine with `make local`, not with pulumi"
        )
    token_key = spec.huggingface_token_config_key
    secrets = PlatformSecrets(huggingface_token=config.require_secret(token_key) if token_key else None)
    for warning in decided.warnings:
        pulumi.log.warn(warning)  # `pulumi preview` and `up` show what `inferstack plan` does
    layer = cluster_layer(profile)
    sdk_modules.thin("pulumi_aws", "pulumi_kubernetes")  # the SDKs imported by now load only what is used
    cluster = layer(spec, layout, pulumi.get_stack())
    platform = InferencePlatform(decided, secrets, profile.cloud, cluster)
    pulumi.export("gateway_url", ingress.public_url(spec))
    pulumi.export("namespace", spec.cluster.namespace)
    pulumi.export("models", [m.name for m in spec.models])
    return platform
