"""A real vLLM-CPU engine serves under the security context, environment and mounts we render for its pod.

The engine Deployment is rendered for a CPU model in the model store (target kubernetes, an S3-compatible store:
here the s3rver on loopback), once per fetch path: vLLM streaming the weights from the store
(``runai_streamer``, with the reader's credentials file mounted as rendered) and vLLM reading the node cache's
copy (mounted read-only at a directory named after the model). The rendered init container's command runs
first, for real (``python -m runtime.weights verify`` / ``fetch``). ``pod_sandbox.py`` then runs the engine
the way the kubelet would run that container, as far as this machine allows: the rendered UID and GID (no
passwd entry), no capabilities, no privilege gain, a read-only root, the rendered environment, only the
rendered writable mounts writable (the emptyDirs are host directories, /dev/shm a tmpfs of the rendered size)
and the rendered read-only mounts read-only. What this machine adds is listed in ``MACHINE_ENV``: it keeps
everything on loopback and sizes vLLM's CPU KV cache.

One eager engine start per path, under the shared engine lock (`flock /tmp/inferstack-engines.lock`), like every
engine test; after the node-cache one, torch.compile runs in the same sandbox (``COMPILE_PROBE``), which a GPU
engine's compiled start needs and an eager start does not touch.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import openai
import pytest

from components.local.engine_process import OFFLINE_ENV, EngineProcess, cpu_model_spec
from components.local.s3_server import LOOPBACK_CREDENTIALS, LoopbackS3
from components.render import common, weights
from components.spec import PlatformSpec
from tests.components.helpers import rendered_engine_deployment
from tests.conftest import ENGINE_READY_TIMEOUT_S, LOGS_DIR, OWN_ENGINES_GROUP
from tests.runtime.weights.helpers import new_bucket
from tests.runtime.weights.helpers import weights as run_weights

# engines of its own, none shared: beside the session engines' group (tests/conftest.py)
# The store's prepare and init, then an engine start in the sandbox, count against each test's timeout.
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group(OWN_ENGINES_GROUP), pytest.mark.timeout(1500)]

SANDBOX = Path(__file__).with_name("pod_sandbox.py")
MODEL = "tiny-llama-s3"
#: What this machine adds to the rendered environment: nothing leaves it, and vLLM's CPU KV cache is sized.
MACHINE_ENV = {
    **OFFLINE_ENV,
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "0",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
}
#: What a compiled engine start does that an eager one does not: inductor generates C++, builds it and caches it
#: (by default under /tmp/torchinductor_<user>, where <user> must be found with no passwd entry). Prints where.
COMPILE_PROBE = """
import torch
from torch._inductor.runtime.cache_dir_utils import cache_dir

compiled = torch.compile(lambda x: torch.nn.functional.silu(x) * 2 + 1)
assert torch.allclose(compiled(torch.ones(8)), torch.nn.functional.silu(torch.ones(8)) * 2 + 1)
print("compiled", cache_dir())
"""
#: The host keeps the engine venv's interpreter under root's home; an image would have it in a readable place.
INTERPRETER_TREES = ["/root/.pyenv"]


def _rendered(fetch: str, s3: LoopbackS3, bucket: str) -> dict[str, Any]:
    """The engine Deployment of a CPU vLLM model in the loopback model store, on the kubernetes target."""
    spec = PlatformSpec.model_validate(
        {
            "name": "inferstack",
            "environment": "sandbox",
            "target": "kubernetes",
            "model_store": {
                "bucket": bucket,
                "endpoint_url": s3.endpoint,
                "reader_secret": "model-store-reader",
                "writer_secret": "model-store-writer",
            },
            "models": [
                {
                    "name": MODEL,
                    "source": f"s3://{bucket}/models/tiny-llama/",
                    "weights": {"fetch": fetch},
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
                        # Both starts run eager: a compiled start cost ~90 s more in a loaded CI run. That
                        # torch.compile writes its caches under the rendered mounts is proven by COMPILE_PROBE,
                        # in the same sandbox, in seconds.
                        "enforce_eager": True,
                        "cpu_cores": 1,
                        "memory_gib": 2,
                    },
                    "scaling": {"min_replicas": 1, "max_replicas": 1},
                }
            ],
        }
    )
    return rendered_engine_deployment(spec)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    for path in [root, *root.rglob("*")]:
        os.chown(path, uid, gid, follow_symlinks=False)


def _read_only_source(volume: dict[str, Any], mount: dict[str, Any], hosts: dict[str, Path]) -> str:
    """The host directory a read-only mount shows: the node cache's subPath, or a Secret's files."""
    if "hostPath" in volume:
        return str(hosts[volume["name"]] / mount["subPath"])
    assert "secret" in volume, volume
    return str(hosts[volume["name"]])


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
@pytest.mark.parametrize("fetch", ["streamer", "node-cache"])
def test_vllm_serves_under_the_rendered_uid_environment_and_mounts(
    fetch: str, tiny_chat_model: Path, engine_python: Path, loopback_s3: LoopbackS3, tmp_path: Path
) -> None:
    bucket = new_bucket(loopback_s3)
    deployment = _rendered(fetch, loopback_s3, bucket)
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    [init] = pod["initContainers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    # The preparation Job's work (the weights in the store), then the rendered init container's, for real.
    location = f"s3://{bucket}/models/tiny-llama/"
    prepared = run_weights(loopback_s3, "prepare", "--from", str(tiny_chat_model), "--to", location)
    assert prepared.code == 0, prepared.stderr
    volumes = {v["name"]: v for v in pod["volumes"]}
    hosts = {name: tmp_path / f"volume-{name}" for name in volumes}
    args = list(init["args"])
    if "--cache-root" in args:
        args[args.index("--cache-root") + 1] = str(hosts["model-cache"])
    checked = run_weights(loopback_s3, *args)
    assert checked.code == 0, checked.stderr
    uid, fs_group = security["runAsUser"], pod["securityContext"]["fsGroup"]
    if "model-cache" in hosts and hosts["model-cache"].exists():
        _chown_tree(hosts["model-cache"], uid, uid)  # the fill runs as the runtime user in the pod
    # The reader's Secret: an AWS shared-credentials file under its one key, as the kubelet projects it.
    if "store-credentials" in volumes:
        hosts["store-credentials"].mkdir()
        credentials = hosts["store-credentials"] / weights.CREDENTIALS_KEY
        credentials.write_text(
            "[default]\n"
            f"aws_access_key_id = {LOOPBACK_CREDENTIALS['AWS_ACCESS_KEY_ID']}\n"
            f"aws_secret_access_key = {LOOPBACK_CREDENTIALS['AWS_SECRET_ACCESS_KEY']}\n"
        )
        os.chown(credentials, 0, fs_group)
        credentials.chmod(volumes["store-credentials"]["secret"]["defaultMode"])
    writable: dict[str, str] = {}
    memory: dict[str, str] = {}
    read_only: dict[str, str] = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if mount.get("readOnly"):
            read_only[mount["mountPath"]] = _read_only_source(volume, mount, hosts)
            continue
        empty_dir = volume["emptyDir"]
        if empty_dir.get("medium") == "Memory":
            memory[mount["mountPath"]] = empty_dir["sizeLimit"].removesuffix("i").lower()
        else:
            host = hosts[mount["name"]]
            host.mkdir()
            writable[mount["mountPath"]] = str(host)
    model_arg = container["args"][0]
    if fetch == "streamer":
        assert model_arg == location and "--load-format" in container["args"]
        assert set(read_only) == {weights.CREDENTIALS_DIR}
    else:
        assert model_arg == f"/models/{MODEL}" and set(read_only) == {model_arg}
        assert (Path(read_only[model_arg]) / "config.json").is_file()  # the node cache's copy
    env = {e["name"]: e["value"] for e in container["env"]}
    sandbox = {
        "uid": security["runAsUser"],
        "gid": security["runAsGroup"],
        "fs_group": pod["securityContext"]["fsGroup"],
        "writable": writable,
        "memory": memory,
        "read_only": read_only,
        # The engine's venv too: the checkout may sit under a path a volume covers (a clone in /tmp).
        "expose": [*INTERPRETER_TREES, str(engine_python.parent.parent)],
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
    runner = SandboxedEngine(container["args"], wrapper, LOGS_DIR / f"vllm-sandboxed-{fetch}.log")
    with runner:
        uid_line = next(
            line
            for line in Path(f"/proc/{runner.pid}/status").read_text().splitlines()
            if line.startswith("Uid:")
        )
        assert uid_line.split()[1:] == [str(common.RUNTIME_UID)] * 4
        client = openai.OpenAI(base_url=runner.openai_base_url, api_key="unused", max_retries=0, timeout=120)
        reply = client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=4, extra_body={"ignore_eos": True}
        )
        assert reply.model == MODEL  # served under the model's name, not the store location or the copy
        assert reply.choices[0].text and reply.usage is not None and reply.usage.completion_tokens == 4
    # Caches landed on the rendered volumes (HOME=/tmp, HF_HOME under it).
    tmp_volume = Path(writable["/tmp"])
    assert (tmp_volume / ".cache" / "vllm").is_dir()
    assert os.stat(tmp_volume / ".cache").st_uid == common.RUNTIME_UID
    if fetch == "node-cache":
        # torch.compile in the same sandbox: its C++ build and its cache need no passwd entry
        # (the eager start makes inductor's directory too, but builds nothing in it)
        built_before = set(tmp_volume.glob("torchinductor_*/**/*.so"))
        probe = subprocess.run(
            [str(wrapper), "-c", COMPILE_PROBE], capture_output=True, text=True, timeout=600, check=False
        )
        assert probe.returncode == 0, probe.stderr[-3000:]
        [cache] = [p for p in tmp_volume.iterdir() if p.name.startswith("torchinductor_")]
        assert probe.stdout.split() == ["compiled", f"/tmp/{cache.name}"], probe.stdout
        assert os.stat(cache).st_uid == common.RUNTIME_UID
        assert set(cache.rglob("*.so")) - built_before, "inductor built no kernel under the rendered /tmp"
