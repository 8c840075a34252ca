"""The shared rate-limit store, as the router sees it (a Secret with its address and token), and on a cluster
you bring, the store itself (a Redis StatefulSet). Thin: ``components.render.limit_store`` renders."""

from __future__ import annotations

import pulumi

from components.core.cloud import Cloud
from components.kubernetes.manifests import apply
from components.render import limit_store as render
from components.spec import PlatformSpec


class LimitStore(pulumi.ComponentResource):
    """``managed_url``: the cloud's store (ElastiCache); None on a cloud that has none: one in the namespace."""

    def __init__(
        self,
        spec: PlatformSpec,
        cloud: Cloud,
        managed_url: pulumi.Output[str] | None,
        token: pulumi.Output[str] | None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("inferstack:kubernetes:LimitStore", f"{spec.name}-{spec.environment}", None, opts)
        if token is None:
            raise pulumi.RunError("gateway.shared_limits needs gateway.limit_store_auth_config_key")
        child = pulumi.ResourceOptions(parent=self)
        url: pulumi.Input[str]
        if cloud.managed_limit_store:
            if managed_url is None:
                raise pulumi.RunError("gateway.shared_limits: the cloud layer made no rate-limit store")
            url = managed_url
        else:
            auth = {
                **render.auth_secret(spec),
                "stringData": {render.AUTH_CONF_KEY: token.apply(render.auth_conf)},
            }
            after = pulumi.ResourceOptions(
                parent=self, depends_on=[apply(auth, child, secret_fields=("stringData",))]
            )
            self.store = [apply(m, after) for m in render.in_cluster(spec)]
            url = render.in_cluster_url(spec)
        secret = {**render.router_secret(spec), "stringData": {render.URL_KEY: url, render.TOKEN_KEY: token}}
        self.secret = apply(secret, child, secret_fields=("stringData",))
        self.register_outputs({"secret": render.secret_name(spec)})
