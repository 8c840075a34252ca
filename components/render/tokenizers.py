"""The router's copy of each ``precise_prefix`` model's tokenizer: an init container that fetches it. Pure.

The router turns a prompt into the engines' block hashes, so it needs the model's tokenizer and chat
template. Its pod gets them before the router starts: an init container, from the router's own image, runs
``python -m runtime.kvcache.fetch`` into an emptyDir that the router reads (``common.TOKENIZERS_DIR``), with
the Hugging Face token file when the stack has one. Only the tokenizer files are fetched, never weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components.render import common, hardening, weights
from components.render.common import Manifest
from components.spec import PlatformSpec

VOLUME = "tokenizers"


def models(spec: PlatformSpec) -> list[tuple[str, str]]:
    """(model, hub repo) of every model whose routing reads the engines' KV events."""
    return [(m.name, m.source) for m in spec.models if m.publishes_kv_events]


@dataclass(frozen=True)
class RouterTokenizers:
    """What the router's pod gains: the init container, the pod's volumes, the router's own mount."""

    init_containers: list[Manifest] = field(default_factory=list)
    volumes: list[Manifest] = field(default_factory=list)
    router_mounts: list[Manifest] = field(default_factory=list)


def router_parts(spec: PlatformSpec, image: Any) -> RouterTokenizers:
    """Nothing when no model's routing reads KV events; ``image`` is the router's (an Output on eks)."""
    wanted = models(spec)
    if not wanted:
        return RouterTokenizers()
    volumes: list[Manifest] = [{"name": VOLUME, "emptyDir": {"sizeLimit": "256Mi"}}]
    mounts: list[Manifest] = [
        {"name": VOLUME, "mountPath": common.TOKENIZERS_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    env: list[Manifest] = [
        {"name": "HF_HOME", "value": "/tmp/hf"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
    ]
    if spec.huggingface_token_config_key:  # only the init container sees the token
        volumes.append(
            {
                "name": "hf-token",
                "secret": {"secretName": weights.hf_token_secret_name(spec), "defaultMode": 0o440},
            }
        )
        mounts.append({"name": "hf-token", "mountPath": weights.HF_TOKEN_DIR, "readOnly": True})
        env.append({"name": "HF_TOKEN_PATH", "value": f"{weights.HF_TOKEN_DIR}/{weights.HF_TOKEN_KEY}"})
    init: Manifest = {
        "name": "fetch-tokenizers",
        "image": image,
        "imagePullPolicy": "Always",
        "command": ["python", "-m", "runtime.kvcache.fetch", "--out", common.TOKENIZERS_DIR],
        "args": [f"{name}={repo}" for name, repo in wanted],
        "env": env,
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"cpu": "500m", "memory": "512Mi"},
        },
        "securityContext": hardening.container_security(),
        "volumeMounts": mounts,
    }
    router = [{"name": VOLUME, "mountPath": common.TOKENIZERS_DIR, "readOnly": True}]
    return RouterTokenizers([init], volumes, router)
