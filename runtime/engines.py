"""What the runtime and the control plane know about each serving engine: endpoints and metric names.

Pure data. The health monitor parses engines' ``/metrics`` with these names, the router falls back to
them when it probes engines itself, and the control plane renders autoscaling queries and alerts from
them, so a renamed metric is fixed here once. Every signal lists the current name first and older
names after it; readers accept any of them and sum across the ``engine`` label.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from runtime.config import EngineKind


class Signal(StrEnum):
    """Serving signals every engine exposes under its own metric names."""

    QUEUED = "queued"
    RUNNING = "running"
    KV_USAGE = "kv_usage"  # 0..1
    PREFIX_HITS = "prefix_hits"  # counter (vLLM) ...
    PREFIX_QUERIES = "prefix_queries"  # ... over this counter gives the hit rate
    PREFIX_HIT_RATE = "prefix_hit_rate"  # gauge 0..1 (SGLang)
    TTFT = "ttft"  # histogram, seconds
    INTER_TOKEN = "inter_token"  # histogram, seconds
    PREEMPTIONS = "preemptions"  # counter
    PROMPT_TOKENS = "prompt_tokens"  # counter
    GENERATION_TOKENS = "generation_tokens"  # counter


@dataclass(frozen=True)
class EngineFacts:
    """Endpoints and metric names of one engine."""

    health_path: str
    metrics_path: str
    models_path: str
    metrics: dict[Signal, tuple[str, ...]]
    metrics_flag: tuple[str, ...] = ()  # flags the engine needs before it exports metrics

    def names(self, signal: Signal) -> tuple[str, ...]:
        return self.metrics.get(signal, ())


ENGINES: dict[EngineKind, EngineFacts] = {
    EngineKind.VLLM: EngineFacts(
        health_path="/health",
        metrics_path="/metrics",
        models_path="/v1/models",
        metrics={
            Signal.QUEUED: ("vllm:num_requests_waiting",),
            Signal.RUNNING: ("vllm:num_requests_running",),
            Signal.KV_USAGE: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            Signal.PREFIX_HITS: ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
            Signal.PREFIX_QUERIES: ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
            Signal.TTFT: ("vllm:time_to_first_token_seconds",),
            Signal.INTER_TOKEN: ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
            Signal.PREEMPTIONS: ("vllm:num_preemptions_total",),
            Signal.PROMPT_TOKENS: ("vllm:prompt_tokens_total",),
            Signal.GENERATION_TOKENS: ("vllm:generation_tokens_total",),
        },
    ),
    EngineKind.SGLANG: EngineFacts(
        health_path="/health",
        metrics_path="/metrics",
        models_path="/v1/models",
        metrics={
            Signal.QUEUED: ("sglang:num_queue_reqs",),
            Signal.RUNNING: ("sglang:num_running_reqs",),
            Signal.KV_USAGE: ("sglang:token_usage",),
            Signal.PREFIX_HIT_RATE: ("sglang:cache_hit_rate",),
            Signal.TTFT: ("sglang:time_to_first_token_seconds",),
            Signal.INTER_TOKEN: ("sglang:inter_token_latency_seconds",),
            Signal.PROMPT_TOKENS: ("sglang:prompt_tokens_total",),
            Signal.GENERATION_TOKENS: ("sglang:generation_tokens_total",),
        },
        metrics_flag=("--enable-metrics",),
    ),
    EngineKind.TRTLLM: EngineFacts(
        health_path="/health",
        metrics_path="/prometheus/metrics",  # mounted only with return_perf_metrics: true (rendered)
        models_path="/v1/models",
        metrics={
            Signal.QUEUED: ("trtllm_num_requests_waiting",),
            Signal.RUNNING: ("trtllm_num_requests_running",),
            Signal.KV_USAGE: ("trtllm_kv_cache_utilization",),
            Signal.PREFIX_HIT_RATE: ("trtllm_kv_cache_hit_rate",),
            Signal.TTFT: ("trtllm_time_to_first_token_seconds",),
            Signal.INTER_TOKEN: ("trtllm_time_per_output_token_seconds",),
            Signal.PROMPT_TOKENS: ("trtllm_prompt_tokens_total",),
            Signal.GENERATION_TOKENS: ("trtllm_generation_tokens_total",),
        },
    ),
}


def facts(kind: EngineKind) -> EngineFacts:
    return ENGINES[kind]
