"""Reading engines back from command lines, the way the engines' own parsers would (later flags win)."""

from __future__ import annotations

import pytest

from components.render.engine_args import engine_command
from components.spec import EngineSpec, ModelSpec
from policies.inference.rules.engines import parse_engine
from policies.inference.rules.k8s import Container, cpu_cores, memory_gib, selects
from tests.policies.helpers import ENGINE_8B_DEV, container, rendered


def _engine(command: list[str], args: list[str]):
    return parse_engine(Container("engine", False, {"command": command, "args": args}))


def test_rendered_vllm_command_line() -> None:
    deployment = next(r for r in rendered("dev") if ENGINE_8B_DEV(r))
    parsed = parse_engine(Container("engine", False, container(dict(deployment.props), "engine")))
    assert parsed is not None
    assert (parsed.kind, parsed.tp, parsed.max_model_len) == ("vllm", 1, 8192)
    assert parsed.model == (
        "s3://inferstack-dev-us-west-2-models/models/meta-llama/Llama-3.1-8B-Instruct/"
        "0e9e39f249a16976918f6564b8830bc894c89659/"
    )  # streamed from the model store at the pinned revision


def test_equals_form_short_flags_and_last_wins() -> None:
    parsed = _engine(
        ["vllm", "serve"],
        ["org/Model-AWQ", "-tp=4", "--max-model-len", "4096", "--max-model-len=32768", "--enforce-eager"],
    )
    assert parsed is not None
    assert (parsed.tp, parsed.max_model_len, parsed.enforce_eager, parsed.quantization) == (
        4,
        32768,
        True,
        "awq",
    )


def test_sglang_and_trtllm() -> None:
    sglang = _engine(["python3"], ["-m", "sglang.launch_server", "--model-path", "m/x", "--tp-size", "2"])
    assert sglang is not None and (sglang.kind, sglang.model, sglang.tp) == ("sglang", "m/x", 2)
    trt = _engine(["trtllm-serve"], ["serve", "m/y-FP8", "--tp_size", "8", "--max_seq_len", "2048"])
    assert trt is not None and (trt.kind, trt.model, trt.tp, trt.quantization) == (
        "trtllm",
        "m/y-FP8",
        8,
        "fp8",
    )
    assert _engine(["python", "-m", "runtime.router"], []) is None


def test_quantities_and_selectors() -> None:
    assert cpu_cores("47000m") == 47 and cpu_cores("2") == 2 and cpu_cores("x") is None
    assert memory_gib("471040Mi") == 460 and memory_gib("1G") == 1e9 / 2**30 and memory_gib("?") is None
    assert selects({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"})
    assert not selects({"matchExpressions": [{"key": "a", "operator": "In", "values": ["2"]}]}, {"a": "1"})
    assert selects({"matchExpressions": [{"key": "c", "operator": "DoesNotExist"}]}, {"a": "1"})


@pytest.mark.parametrize("kind", ["vllm", "sglang", "trtllm"])
def test_reads_back_every_knob_the_renderer_wrote(kind: str) -> None:
    """Rendering and reading go through one engine table, so what one writes the other reads."""
    model = ModelSpec.model_validate(
        {
            "name": "m",
            "source": "org/Model",
            "engine": {
                "kind": kind,
                "tensor_parallel_size": 4,
                "pipeline_parallel_size": 2,
                "dtype": "float16",
                "quantization": "fp8",
                "max_model_len": 32768,
                "max_num_seqs": 48,
                "max_num_batched_tokens": 32768,
                "enable_chunked_prefill": False,
                "gpu_memory_utilization": 0.85,
                "enforce_eager": True,
            },
        }
    )
    cmd = engine_command(model)
    parsed = _engine(cmd.command, cmd.args)
    e = model.engine
    assert parsed is not None and parsed.kind == kind
    assert (parsed.model, parsed.tp, parsed.pp) == ("org/Model", 4, 2)
    assert (parsed.max_model_len, parsed.max_num_seqs, parsed.max_num_batched_tokens) == (32768, 48, 32768)
    assert parsed.gpu_memory_utilization == e.gpu_memory_utilization
    assert parsed.dtype == ("float16" if kind != "trtllm" else "auto")  # trtllm-serve takes the checkpoint's
    assert parsed.quantization == ("fp8" if kind != "trtllm" else "none")
    assert parsed.enforce_eager is (kind != "trtllm")  # trtllm-serve: cuda_graph_config in its options file
    assert parsed.served_name == ("m" if kind != "trtllm" else None)


def test_a_command_line_without_max_num_seqs_reads_as_the_spec_default() -> None:
    parsed = _engine(["vllm", "serve"], ["org/Model"])
    assert parsed is not None and parsed.max_num_seqs == EngineSpec().max_num_seqs
