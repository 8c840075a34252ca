"""Sizing against hand-computed figures, and properties that must hold for every input."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components.base import catalog, sizing
from components.base.sizing import EngineShape, Precision

LLAMA_70B = catalog.MODELS["meta-llama/Llama-3.1-70B-Instruct"]
LLAMA_8B = catalog.MODELS["meta-llama/Llama-3.1-8B-Instruct"]


def test_llama_70b_kv_cache_is_320_kib_per_token_in_fp16() -> None:
    # 2 (K, V) x 80 layers x 8 KV heads x 128 head dim x 2 bytes = 327,680 B
    assert sizing.kv_bytes_per_token(LLAMA_70B, Precision.FP16) == 2 * 80 * 8 * 128 * 2 == 320 * 1024


def test_fp8_kv_cache_halves_it_and_tensor_parallelism_splits_it() -> None:
    assert sizing.kv_bytes_per_token(LLAMA_70B, Precision.FP8) == 160 * 1024
    assert sizing.kv_bytes_per_token(LLAMA_70B, Precision.FP16, tp=4) == 80 * 1024


def test_kv_heads_are_replicated_when_tensor_parallelism_exceeds_them() -> None:
    qwen_7b = catalog.MODELS["Qwen/Qwen2.5-7B-Instruct"]  # 4 KV heads
    assert sizing.kv_bytes_per_token(qwen_7b, Precision.FP16, tp=8) == sizing.kv_bytes_per_token(
        qwen_7b, Precision.FP16, tp=4
    )


def test_llama_70b_fp16_weights_are_about_130_gib() -> None:
    gib = sizing.weight_bytes(LLAMA_70B, Precision.FP16) / sizing.GIB
    assert gib == pytest.approx(70.6e9 * 2 / 2**30, rel=1e-9)
    assert 129 < gib < 133


def test_awq_70b_weights_are_about_a_quarter_plus_the_unquantized_embeddings() -> None:
    gib = sizing.weight_bytes(LLAMA_70B, Precision.INT4) / sizing.GIB
    embeddings = 2 * 128_256 * 8192 * 2 / 2**30  # input embeddings and LM head stay fp16
    body = (70.6e9 - 2 * 128_256 * 8192) * (0.5 + 4 / 128) / 2**30
    assert gib == pytest.approx(embeddings + body)
    assert 36 < gib < 40


def test_70b_fp16_does_not_fit_one_l4_and_the_breakdown_says_why() -> None:
    fit = sizing.memory_fit(LLAMA_70B, EngineShape(), catalog.GPUS["L4"])
    assert not fit.fits
    assert fit.weights_gib > fit.budget_gib
    assert "does NOT fit" in fit.lines()[0]


def test_8b_fits_one_l40s_with_kv_room_for_several_full_sequences() -> None:
    fit = sizing.memory_fit(LLAMA_8B, EngineShape(max_model_len=8192, max_num_seqs=64), catalog.GPUS["L40S"])
    assert fit.fits
    # budget 0.9 x 44.5 = 40.05 GiB; weights ~15 GiB; 128 KiB/token -> ~180k tokens of KV
    assert fit.budget_gib == pytest.approx(0.9 * 44.5)
    assert fit.kv_per_token_kib == 128
    assert fit.full_length_sequences >= 15


def test_size_ranks_fitting_instances_cheapest_first_and_70b_awq_needs_no_more_than_one_node() -> None:
    ranked = sizing.candidates(LLAMA_70B, EngineShape(quantization="awq"), fixed_parallelism=False)
    assert ranked
    costs = [c.usd_per_replica_month for c in ranked]
    assert costs == sorted(costs)
    assert all(c.fit.fits and c.gpus_per_replica <= c.instance.gpus for c in ranked)
    assert not any(c.instance.gpu == "T4" and c.tensor_parallel_size < 4 for c in ranked)


def test_fp8_is_only_offered_on_gpus_that_support_it() -> None:
    ranked = sizing.candidates(LLAMA_8B, EngineShape(quantization="fp8"), fixed_parallelism=False)
    assert ranked
    assert all(c.instance.gpu_spec.supports_fp8 for c in ranked)


shapes = st.builds(
    EngineShape,
    quantization=st.sampled_from(["none", "awq", "gptq", "fp8", "int8"]),
    dtype=st.sampled_from(["auto", "bfloat16", "float16", "float32"]),
    kv_cache_dtype=st.sampled_from(["auto", "fp8"]),
    tensor_parallel_size=st.sampled_from([1, 2, 4, 8]),
    max_model_len=st.integers(256, 131_072),
    max_num_seqs=st.integers(1, 1024),
    gpu_memory_utilization=st.floats(0.5, 0.98),
    enforce_eager=st.booleans(),
)
models = st.sampled_from(sorted(catalog.MODELS))
gpus = st.sampled_from(sorted(catalog.GPUS))


@given(models, shapes, gpus, st.integers(1, 512))
def test_more_sequences_never_need_less_memory(model: str, shape: EngineShape, gpu: str, extra: int) -> None:
    arch, card = catalog.MODELS[model], catalog.GPUS[gpu]
    more = EngineShape(**{**shape.__dict__, "max_num_seqs": shape.max_num_seqs + extra})
    a, b = sizing.memory_fit(arch, shape, card), sizing.memory_fit(arch, more, card)
    assert b.kv_all_sequences_gib >= a.kv_all_sequences_gib
    assert b.kv_budget_gib <= a.kv_budget_gib
    assert not (b.fits and not a.fits)


@given(models, st.sampled_from(["auto", "bfloat16", "float16", "float32"]), st.sampled_from(list(Precision)))
def test_quantization_never_increases_weight_bytes(model: str, dtype: str, precision: Precision) -> None:
    arch = catalog.MODELS[model]
    dense = sizing.weight_bytes(arch, sizing.weight_precision("none", dtype), dtype)
    assert sizing.weight_bytes(arch, precision, dtype) <= dense


@given(models, shapes, gpus)
def test_more_tensor_parallelism_never_makes_a_fitting_model_stop_fitting(
    model: str, shape: EngineShape, gpu: str
) -> None:
    arch, card = catalog.MODELS[model], catalog.GPUS[gpu]
    wider = EngineShape(**{**shape.__dict__, "tensor_parallel_size": shape.tensor_parallel_size * 2})
    assert (
        sizing.memory_fit(arch, wider, card).headroom_gib
        >= sizing.memory_fit(arch, shape, card).headroom_gib - 0.5
    )


def test_every_instance_type_names_a_known_gpu_and_a_spot_fraction() -> None:
    for instance in catalog.INSTANCE_TYPES.values():
        assert instance.gpu in catalog.GPUS
        assert 0 < instance.family_facts.spot_fraction < 1


def test_catalog_lookup_accepts_aliases_ids_and_quantized_reuploads() -> None:
    assert catalog.lookup_model("llama-3.1-70b") == ("meta-llama/Llama-3.1-70B-Instruct", LLAMA_70B)
    assert catalog.lookup_model("META-LLAMA/llama-3.1-8b-instruct") == (
        "meta-llama/Llama-3.1-8B-Instruct",
        LLAMA_8B,
    )
    found = catalog.lookup_model("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4")
    assert found is not None and found[1] == LLAMA_70B
    assert catalog.lookup_model("acme/unknown-13b") is None


def test_an_instance_type_is_one_record_and_a_missing_fact_is_refused() -> None:
    """Every per-type fact is a required field of catalog.InstanceType (it was ten string-keyed tables, where a
    forgotten entry became 0 GB of NVMe, a spot price of on-demand or a KeyError in the cold-start estimate)."""
    facts: dict[str, Any] = {
        "name": "g7.xlarge",
        "family_facts": catalog.G6,
        "gpu_spec": catalog.L4,
        "gpus": 1,
        "vcpus": 4,
    }
    with pytest.raises(TypeError, match="memory_gib"):
        catalog.InstanceType(**facts)
    for instance in catalog.INSTANCE_TYPES.values():
        assert catalog.GPUS[instance.gpu] is instance.gpu_spec
        assert instance.network_gbps > 0 and instance.store_disks >= 1
