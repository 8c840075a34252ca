"""The Pulumi program: stack config -> validated spec -> InferencePlatform.

``__main__.py`` calls ``run()`` under ``pulumi up``; ``inferstack plan`` calls the same ``run()``
in-process under Pulumi's mock runtime, so both see exactly the same resources.
"""

from __future__ import annotations

import pulumi

from components.aws.layer import AwsLayer
from components.platform import InferencePlatform, PlatformSecrets
from components.problems import SpecError
from components.render import gateway
from components.spec import Target
from components.stackfile import stack_path, validate


def run() -> InferencePlatform:
    source = str(stack_path(pulumi.get_stack()))
    config = pulumi.Config("inferstack")
    try:
        spec, layout = validate(config.require_object("platform"), source)
    except SpecError as err:
        # A RunError prints its message without a Python traceback: the user sees only the problems.
        raise pulumi.RunError(err.render()) from None
    if spec.target is Target.LOCAL:
        raise pulumi.RunError(
            f"{source}: target local runs on this machine with `make local`, not with pulumi"
        )
    token_key = spec.huggingface_token_config_key
    secrets = PlatformSecrets(huggingface_token=config.require_secret(token_key) if token_key else None)
    kubernetes: pulumi.ResourceOptions | None = None
    vpc_id: pulumi.Input[str] | None = None
    images: dict[str, gateway.RuntimeImage] = {}
    if spec.target is Target.EKS:
        # AWS first; every Kubernetes resource then goes to the new cluster through its provider.
        aws_layer = AwsLayer(spec, layout, pulumi.get_stack())
        aws_layer.export()
        kubernetes = aws_layer.kubernetes_options()
        vpc_id = aws_layer.network.vpc_id
        # The gateway runs the images just pushed to ECR, by digest; other targets run the spec's images.
        images = aws_layer.registry.runtime_images()
    platform = InferencePlatform(spec, layout, secrets, kubernetes, vpc_id=vpc_id, images=images)
    pulumi.export("gateway_url", gateway.public_url(spec))
    pulumi.export("namespace", spec.cluster.namespace)
    pulumi.export("models", [m.name for m in spec.models])
    return platform
