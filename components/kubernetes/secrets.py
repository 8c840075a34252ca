"""Secret values a stack reads from its Pulumi config: they only ever travel as Pulumi secrets."""

from __future__ import annotations

import pulumi


def secret_config(field: str, key: str | None, example: str) -> pulumi.Output[str] | None:
    """The Pulumi secret a spec field names, or a message (not a traceback) when it is not set."""
    if not key:
        return None
    value = pulumi.Config("inferstack").get_secret(key)
    if value is None:
        raise pulumi.RunError(
            f"{field} names 'inferstack:{key}', which is not set; run `pulumi config set --secret {key} {example}`"
        )
    return value


def limit_store_token(key: str | None) -> pulumi.Output[str] | None:
    """The shared rate-limit store's AUTH token (``gateway.limit_store_auth_config_key``)."""
    return secret_config("gateway.limit_store_auth_config_key", key, "'<16-128 characters>'")
