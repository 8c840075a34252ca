"""What pins a hub source: an exact commit, never a branch or tag that moves, so every replica (and every
preparation Job) gets the same bytes. The one definition: the spec (``components.spec``), the plan-time rules,
the policy pack and the weights image (``runtime.weights``) all ask it. Plain ``re``: the weights image carries
this module beside its own package.
"""

from __future__ import annotations

import re

HUB_COMMIT = re.compile(r"^[0-9a-f]{40}$")
"""A Hugging Face commit hash: 40 lowercase hex digits, as the hub's commit history shows it."""


def is_pinned_revision(revision: object) -> bool:
    """``revision`` is a hub commit (40 hex digits): what a model, a version or an adapter from the hub needs."""
    return isinstance(revision, str) and HUB_COMMIT.match(revision) is not None
