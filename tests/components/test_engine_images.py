"""Engine pods as every engine image needs them: each place the image writes is a writable mount of the pod.

The images run as root; we render a non-root UID with a read-only root (components/render/engine_images.py
says where each image writes, and from which sources). A real vLLM serves under exactly this in
tests/integration/test_engine_security_context.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from components.engines import profile
from components.render import common, engine_images
from components.spec import PlatformSpec
from runtime.config import EngineKind
from tests.components.helpers import minimal, rendered_engine_deployment


def _deployment(kind: str) -> dict[str, Any]:
    raw = minimal()
    raw["models"][0]["engine"]["kind"] = kind
    spec = PlatformSpec.model_validate(raw)
    return rendered_engine_deployment(spec)


def _writable(container: dict[str, Any]) -> list[str]:
    return [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]


@pytest.mark.parametrize("kind", [k.value for k in EngineKind])
def test_every_place_the_image_writes_is_a_writable_mount_of_the_rendered_pod(kind: str) -> None:
    pod = _deployment(kind)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["runAsUser"] == common.RUNTIME_UID and security["runAsNonRoot"] is True
    assert profile(EngineKind(kind)).image.user == "root"  # so our UID has no passwd entry
    env = {e["name"]: e["value"] for e in container["env"]}
    assert engine_images.unwritable(EngineKind(kind), env, _writable(container)) == []


def test_a_write_outside_the_mounts_is_reported() -> None:
    [container] = _deployment("sglang")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    without_tmp = [m for m in _writable(container) if m != "/tmp"]
    assert "~/.cache/flashinfer -> /tmp/.cache/flashinfer" in engine_images.unwritable(
        EngineKind.SGLANG, env, without_tmp
    )
    assert "~/.triton -> /root/.triton" in engine_images.unwritable(
        EngineKind.SGLANG, {k: v for k, v in env.items() if k != "HOME"}, _writable(container)
    )
