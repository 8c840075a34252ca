"""Names the generated SDKs derive from a CamelCase type name (``NodeGroup``): a module or argument name
(``node_group``), an ARN's resource type (``node-group``)."""

from __future__ import annotations

import re

_WORD_START = re.compile(r"(?<!^)(?=[A-Z])")


def camel_to(separator: str, name: str) -> str:
    """``camel_to("_", "NodeGroup") == "node_group"``; the words of ``name`` in lower case, joined by ``separator``."""
    return _WORD_START.sub(separator, name).lower()
