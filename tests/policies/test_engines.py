"""Reading engines back from command lines, the way the engines' own parsers would (later flags win)."""

from __future__ import annotations

from policies.inference.rules.engines import parse_engine
from policies.inference.rules.k8s import Container, cpu_cores, memory_gib, selects
from tests.policies.helpers import ENGINE_8B_DEV, container, rendered


def _engine(command: list[str], args: list[str]):
    return parse_engine(Container("engine", False, {"command": command, "args": args}))


def test_rendered_vllm_command_line() -> None:
    deployment = next(r for r in rendered("dev") if ENGINE_8B_DEV(r))
    parsed = parse_engine(Container("engine", False, container(dict(deployment.props), "engine")))
    assert parsed is not None
    assert (parsed.kind, parsed.model, parsed.tp, parsed.max_model_len) == (
        "vllm", "meta-llama/Llama-3.1-8B-Instruct", 1, 8192,
    )  # fmt: skip


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
