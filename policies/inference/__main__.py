"""The CrossGuard pack: `pulumi preview --policy-pack policies/inference [--policy-pack-config FILE]`.

Building ``PolicyPack`` starts the analyzer server and blocks, so it happens only when Pulumi runs this
file; importing the module (tests, tooling) only builds the policy objects in ``POLICIES``.
"""

from __future__ import annotations

from pulumi_policy import PolicyPack

from policies.inference.pack import DEFAULT_ENFORCEMENT, PACK_DESCRIPTION, PACK_NAME, policies

POLICIES = policies()


def main() -> None:
    PolicyPack(
        name=PACK_NAME,
        policies=list(POLICIES),
        enforcement_level=DEFAULT_ENFORCEMENT,
        description=PACK_DESCRIPTION,
        tags=["inference", "gpu", "kubernetes", "aws"],
    )


if __name__ == "__main__":
    main()
