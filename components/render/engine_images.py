"""Where each engine image writes, so that a pod rendered as a non-root user with a read-only root still runs.

The upstream images run as root and write under root's home, /tmp and /dev/shm. Engine pods run as
``common.RUNTIME_UID`` (no passwd entry in any of these images) with ``readOnlyRootFilesystem``, so every
place an image writes must be a writable mount of the pod: the model cache (``engine_args.MODEL_DIR``), /tmp
and /dev/shm, with ``HOME=/tmp`` so that every ``~/...`` default lands on the /tmp volume and
``HF_HOME`` on the model cache (``engine_args.POD_ENV``). ``unwritable`` checks a rendered container against
its profile's image facts (``components.engines``); a real vLLM serves under exactly that in tests/integration/test_engine_security_context.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from components.engines import profile
from components.engines.common import Write
from runtime.config import EngineKind


def resolve(write: Write, env: Mapping[str, str]) -> str:
    """The directory a write lands in under ``env`` (its moving variable, else ``~`` as HOME)."""
    if write.moved_by and write.moved_by in env:
        return env[write.moved_by]
    if write.path.startswith("~/"):
        return env.get("HOME", "/root") + write.path[1:]
    return write.path


def unwritable(kind: EngineKind, env: Mapping[str, str], writable: Iterable[str]) -> list[str]:
    """The places the engine writes that no writable mount holds, given the container's environment."""
    mounts = [m.rstrip("/") for m in writable]
    out = []
    for write in profile(kind).image.writes:
        where = resolve(write, env)
        if not any(where == m or where.startswith(m + "/") for m in mounts):
            out.append(f"{write.path} -> {where}")
    return out
