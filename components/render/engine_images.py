"""Where each engine image writes, so that a pod rendered as a non-root user with a read-only root still runs.

The upstream images run as root and write under root's home, /tmp and /dev/shm. Engine pods run as
``common.RUNTIME_UID`` (no passwd entry in any of these images) with ``readOnlyRootFilesystem``, so every
place an image writes must be a writable mount of the pod: the model cache (``engine_args.MODEL_DIR``), /tmp
and /dev/shm, with ``HOME=/tmp`` so that every ``~/...`` default lands on the /tmp volume and
``HF_HOME`` on the model cache (``engine_args.POD_ENV``). ``unwritable`` checks a rendered container against
this table; a real vLLM serves under exactly that in tests/integration/test_engine_security_context.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from runtime.config import EngineKind


@dataclass(frozen=True)
class Write:
    """A place an engine writes by default (``~`` is HOME), and the variable that moves it, if any."""

    path: str
    moved_by: str | None = None


@dataclass(frozen=True)
class ImageFacts:
    user: str
    """The image's own user (what it would run as without our securityContext)."""
    writes: tuple[Write, ...]
    source: str
    """Where these facts come from, with versions."""


_HF_CACHE = Write("~/.cache/huggingface", "HF_HOME")
_TORCH_INDUCTOR = Write(
    "/tmp"
)  # torch._inductor: tempfile.gettempdir()/torchinductor_<user> (also IPC files)
_SHM = Write("/dev/shm")  # worker processes and NCCL exchange tensors through shared memory
_TRITON = Write("~/.triton")  # Triton's kernel cache (TRITON_CACHE_DIR defaults to ~/.triton/cache)
_FLASHINFER_JIT = (_HF_CACHE, Write("~/.cache/flashinfer"), _TRITON, _TORCH_INDUCTOR, _SHM)
"""What the CUDA images that JIT-compile FlashInfer kernels write (SGLang, TensorRT-LLM's PyTorch backend)."""

IMAGE_FACTS: Mapping[EngineKind, ImageFacts] = {
    EngineKind.VLLM: ImageFacts(
        user="root",
        writes=(_HF_CACHE, Write("~/.cache/vllm"), Write("~/.config/vllm"), _TRITON, _TORCH_INDUCTOR, _SHM),
        source=(
            "vLLM 0.32.0: docker/Dockerfile has no USER (root); docs/deployment/docker.md mounts the Hugging "
            "Face cache at /root/.cache/huggingface and asks for --ipc=host; vllm/envs.py: VLLM_CACHE_ROOT "
            "~/.cache/vllm (torch.compile cache), VLLM_CONFIG_ROOT ~/.config/vllm. The CPU build run under the "
            "rendered context wrote ~/.cache/vllm and /tmp/torchinductor_uid_10001 (tests/integration)."
        ),
    ),
    EngineKind.SGLANG: ImageFacts(
        user="root",
        writes=_FLASHINFER_JIT,
        source=(
            "SGLang 0.5.3 (lmsysorg/sglang:v0.5.3-cu126): docker/Dockerfile has no USER (root, WORKDIR "
            "/sgl-workspace); docker/compose.yaml mounts ~/.cache/huggingface at /root/.cache/huggingface with "
            "ipc: host; FlashInfer compiles kernels into ~/.cache/flashinfer (FLASHINFER_WORKSPACE_BASE "
            "defaults to the home directory)."
        ),
    ),
    EngineKind.TRTLLM: ImageFacts(
        user="root",
        writes=_FLASHINFER_JIT,
        source=(
            "TensorRT-LLM 1.0.0 (nvcr.io/nvidia/tensorrt-llm/release:1.0.0): the release stage of "
            "docker/Dockerfile.multi has no USER (root, WORKDIR /app/tensorrt_llm); the quick-start guide runs it "
            "with --ipc=host; the PyTorch backend downloads to the Hugging Face cache and JIT-compiles FlashInfer "
            "and Triton kernels under the home directory; OpenMPI keeps its session directory in TMPDIR (/tmp)."
        ),
    ),
}


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
    for write in IMAGE_FACTS[kind].writes:
        where = resolve(write, env)
        if not any(where == m or where.startswith(m + "/") for m in mounts):
            out.append(f"{write.path} -> {where}")
    return out
