"""One control-plane profile per engine kind, one module each: how its command line is written, where its images
write, and its start-up figures (``common.EngineProfile``). Its runtime facts (flags, endpoints, metric names,
capabilities) are ``runtime.engines``.

A module here that defines ``PROFILE`` is found by name (``pkgutil``), so adding an engine is: its kind in
``runtime.config.EngineKind``, its facts in ``runtime.engines``, its module here, and its tests.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Mapping

from components.engines.common import EngineProfile
from runtime.config import EngineKind


@functools.cache
def profiles() -> Mapping[EngineKind, EngineProfile]:
    """Every engine kind's profile; an engine kind without one is a programming error, named at first use."""
    found: dict[EngineKind, EngineProfile] = {}
    for module in pkgutil.iter_modules(__path__, f"{__name__}."):
        profile = getattr(importlib.import_module(module.name), "PROFILE", None)
        if isinstance(profile, EngineProfile):
            found[profile.kind] = profile
    missing = sorted(kind.value for kind in EngineKind if kind not in found)
    if missing:
        raise LookupError(f"no profile module in components/engines/ for engine kind {', '.join(missing)}")
    return found


def profile(kind: EngineKind) -> EngineProfile:
    return profiles()[kind]
