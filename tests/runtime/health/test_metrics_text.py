"""The Prometheus text reader: wanted names only, old names too, garbage and size never fatal."""

from __future__ import annotations

import math

from runtime.config import EngineKind
from runtime.health.tracker import wanted_for
from runtime.metrics_text import parse, wanted_sample_names
from tests.runtime.health.doubles import vllm_metrics

WANTED = wanted_for(EngineKind.VLLM)


def test_sums_across_engine_label_and_reads_histograms():
    text = (
        'vllm:num_requests_running{engine="0"} 2\n'
        'vllm:num_requests_running{engine="1"} 3\n'
        + vllm_metrics(ttft_fast=4, ttft_total=10).split("\n", 3)[3]
    )
    parsed = parse(text, WANTED)
    assert parsed.total("vllm:num_requests_running") == 5 + 0  # the canned block has running 0
    assert parsed.buckets("vllm:time_to_first_token_seconds") == {0.1: 4.0, 1.0: 10.0, math.inf: 10.0}


def test_old_vllm_names_are_read():
    text = "vllm:gpu_cache_usage_perc 0.25\nvllm:gpu_prefix_cache_hits_total 3\n"
    parsed = parse(text, WANTED)
    assert parsed.first_total(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")) == 0.25


def test_unknown_is_none_not_zero():
    parsed = parse("vllm:num_requests_running 0\n", WANTED)
    assert parsed.total("vllm:num_requests_running") == 0
    assert parsed.total("vllm:num_requests_waiting") is None


def test_one_bad_line_costs_only_itself():
    text = "vllm:num_requests_running 2\nvllm:num_requests_waiting not-a-number\n"
    parsed = parse(text, WANTED)
    assert parsed.total("vllm:num_requests_running") == 2
    assert parsed.bad_lines == 1


def test_garbage_yields_nothing_and_does_not_raise():
    for garbage in ("<html>oops</html>", "\x00\xff{{{", "}" * 10_000, "vllm:num_requests_running{" * 1000):
        parsed = parse(garbage, WANTED)
        assert parsed.total("vllm:num_requests_running") is None


def test_long_lines_and_sample_floods_are_bounded():
    hostile = "vllm:num_requests_running{" + ",".join(f'l{i}="v"' for i in range(50_000)) + "} 1\n"
    parsed = parse(hostile, WANTED)
    assert parsed.skipped_long_lines == 1 and not parsed.samples
    flood = "".join(f'vllm:num_requests_running{{engine="{i}"}} 1\n' for i in range(100))
    parsed = parse(flood, WANTED, max_samples=10)  # refused whole: a sum of the first ten would be a lie
    assert parsed.total("vllm:num_requests_running") is None
    assert parsed.refused == "more than 10 wanted samples"
    parsed = parse(flood, WANTED, max_series=99)
    assert not parsed.samples and parsed.refused == "more than 99 series of vllm:num_requests_running"
    assert parse(flood, WANTED).total("vllm:num_requests_running") == 100


def test_a_histogram_with_more_buckets_than_an_engine_has_is_refused_whole():
    name = "vllm:time_to_first_token_seconds"
    buckets = "".join(f'{name}_bucket{{le="{i / 1000}"}} {i}\n' for i in range(1, 201))
    page = f'{buckets}{name}_bucket{{le="+Inf"}} 200\nvllm:num_requests_running 3\n'
    parsed = parse(page, WANTED, max_buckets=128)
    assert parsed.refused == f"more than 128 buckets of {name}" and not parsed.samples
    assert len(parse(page, WANTED, max_buckets=201).buckets(name) or {}) == 201


def test_nan_and_inf_are_not_values():
    parsed = parse("vllm:num_requests_running NaN\nvllm:num_requests_waiting +Inf\n", WANTED)
    assert parsed.total("vllm:num_requests_running") is None
    assert parsed.total("vllm:num_requests_waiting") is None


def test_unwanted_families_never_reach_the_parser():
    parsed = parse("python_gc_objects_collected_total 5\nfoo{bar=\n", wanted_sample_names(["x"]))
    assert parsed.samples == {} and parsed.bad_lines == 0


def test_sglang_names_and_none_for_trtllm():
    sg = parse(
        "sglang:num_queue_reqs 4\nsglang:token_usage 0.5\nsglang:cache_hit_rate 0.9\n",
        wanted_for(EngineKind.SGLANG),
    )
    assert sg.total("sglang:num_queue_reqs") == 4 and sg.total("sglang:cache_hit_rate") == 0.9
    # trtllm-serve 1.0.0 exports no Prometheus serving metric (runtime/engines.py): nothing is wanted.
    trt = parse("trtllm_num_requests_waiting 7\n", wanted_for(EngineKind.TRTLLM))
    assert trt.samples == {}
