"""`make local` runs the cluster's vLLM command line: one function builds both, and they differ only in
where the engine runs (the model directory, host, port, and no download directory). No engine starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from components.core.stackfile import Stack
from components.local.engine_process import EngineProcess, cpu_list
from components.local.plan import HOST, EngineLaunch, LocalOptions, build_plan
from components.local.supervisor import engine_process
from components.render.engine_args import LEADER_RANK, GroupMember, engine_command
from runtime.config import EngineKind
from runtime.engines import TELEMETRY_OFF_ENV, facts
from tests.stacks import load, validate

REPO = Path(__file__).resolve().parents[2]
CLI = facts(EngineKind.VLLM).cli


def _with_value(args: list[str], flag: str, value: str | None) -> list[str]:
    """``args`` with ``flag``'s value replaced, or the flag and its value removed when ``value`` is None."""
    at = args.index(flag)
    return args[:at] + ([flag, value] if value is not None else []) + args[at + 2 :]


def _cluster_args_run_here(launch: EngineLaunch) -> list[str]:
    """The cluster's command line with exactly the named overrides of a local engine applied."""
    args = list(engine_command(launch.spec).args)
    assert args[0] == launch.spec.source  # the positional model: the stack's source in the cluster ...
    args[0] = str(launch.path.absolute())  # ... its directory on this machine
    args = _with_value(args, CLI.host.name, HOST)
    assert CLI.download_dir is not None and CLI.download_dir.name not in args  # nothing downloads, anywhere
    return _with_value(args, CLI.port.name, str(launch.port))


def _local_stack_with(**engine: object) -> Stack:
    """The committed local stack, with extra engine knobs turned on every model."""
    doc = yaml.safe_load((REPO / "stacks" / "Pulumi.local.yaml").read_text())["config"]["inferstack:platform"]
    for model in doc["models"]:
        model["engine"] = {**model["engine"], **engine}
    return Stack(
        name="test",
        source="stacks/Pulumi.test.yaml",
        decisions=validate(doc, "stacks/Pulumi.test.yaml"),
        config={},
    )


@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {
            "quantization": "fp8",
            "kv_cache_dtype": "fp8",
            "max_num_batched_tokens": 4096,
            "enable_prefix_caching": False,
            "enable_chunked_prefill": False,
            "enforce_eager": True,
            "trust_remote_code": True,
            "extra_args": ["--max-log-len", "100"],
        },
    ],
    ids=["committed", "every-knob-turned"],
)
def test_local_engines_run_the_cluster_command_line_except_where(
    knobs: dict[str, object], tmp_path: Path
) -> None:
    stack = _local_stack_with(**knobs) if knobs else load("local", REPO / "stacks")
    plan = build_plan(stack, LocalOptions(cpus=(0, 1), engine_port=9100), REPO)
    assert plan.engines
    for launch in plan.engines:
        local = engine_process(launch, tmp_path, "tag").argv
        assert local == _cluster_args_run_here(launch), launch.name


def test_local_engines_keep_the_clusters_telemetry_opt_out_and_get_their_own_core(tmp_path: Path) -> None:
    plan = build_plan(load("local", REPO / "stacks"), LocalOptions(cpus=(0, 1)), REPO)
    for launch in plan.engines:
        env = engine_process(launch, tmp_path, "tag").environment()
        assert TELEMETRY_OFF_ENV.items() <= env.items()
        assert TELEMETRY_OFF_ENV.items() <= engine_command(launch.spec).env.items()
        assert env["VLLM_CPU_OMP_THREADS_BIND"] == launch.cpu_cores
        assert (env["HF_HUB_OFFLINE"], env["VLLM_HOST_IP"]) == ("1", "127.0.0.1")


def test_a_one_process_engine_runs_its_worker_in_the_engine_core_with_openmp_sized_to_its_cores(
    tmp_path: Path,
) -> None:
    """A third fewer imports of torch and vLLM per start; the OpenMP sizing vLLM's worker launcher would do, done
    here (two engines of two threads each on two cores would spin against each other)."""
    plan = build_plan(load("local", REPO / "stacks"), LocalOptions(cpus=(0, 1)), REPO)
    for launch in plan.engines:
        env = engine_process(launch, tmp_path, "tag").environment()
        assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        assert env["OMP_NUM_THREADS"] == str(len(cpu_list(launch.cpu_cores)))
    grouped = EngineProcess(plan.engines[0].spec, group=GroupMember(2, LEADER_RANK, "localhost"))
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in grouped.environment()  # a group keeps vLLM's own topology
    assert cpu_list("0") == [0] and cpu_list("0-3") == [0, 1, 2, 3] and cpu_list("0,2-3") == [0, 2, 3]
