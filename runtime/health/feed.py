"""``GET /v1/backends``: the health monitor's feed, as pydantic models the router imports.

The router polls this and must keep working on its own probing when the feed is gone or old, so the
feed says when it was made and how often it is refreshed: a consumer should treat a feed older than
``stale_after_s`` as absent. Values it cannot know are ``null``, never ``0``: an engine that exports
no KV metric is not at 0 % KV usage, and a window without requests has no TTFT p95.

Shape (``schema_version`` 1)::

    {
      "schema_version": 1,
      "generated_at": 1767225600.123,        # unix seconds
      "interval_ms": 5000, "stale_after_s": 15.0, "max_ejected_percent": 50.0,
      "backends": [
        {"url": "http://10.0.0.5:8000", "model": "llama", "engine": "vllm",
         "state": "healthy" | "degraded" | "ejected", "routable": true, "admitted": true,
         "reason": null | "timeout" | "connect" | "http_status" | ..., "detail": "",
         "since": 1767225500.0, "consecutive_failures": 0, "consecutive_successes": 12,
         "last_probe_at": 1767225600.0,
         "metrics": {"queued": 0.0, "running": 3.0, "kv_usage": 0.12, "prefix_hit_rate": 0.4,
                     "ttft_p50_s": 0.05, "ttft_p95_s": 0.2, "inter_token_p50_s": 0.01,
                     "inter_token_p95_s": 0.03, "preemptions_window": 0.0},
         "metrics_at": 1767225600.0, "metrics_age_s": 0.1, "metrics_stale": false}
      ],
      "models": [
        {"model": "llama", "replicas": 2, "healthy_replicas": 2, "routable_replicas": 2, "panic": false,
         "queue_depth": 0.0, "running": 3.0, "kv_usage_mean": 0.1, "kv_usage_max": 0.12,
         "ttft_p95_s": 0.2}
      ]
    }
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.health.state import Reason, State

FEED_SCHEMA_VERSION = 1


class _Feed(BaseModel):
    # Consumers ignore fields they do not know, so the feed can grow without breaking routers.
    model_config = ConfigDict(extra="ignore", frozen=True)


class ReplicaMetrics(_Feed):
    """Load and latency of one replica; ``None`` = not exported by this engine or not seen yet."""

    queued: float | None = Field(default=None, description="Requests waiting in the engine's queue.")
    running: float | None = Field(default=None, description="Requests the engine is running.")
    kv_usage: float | None = Field(default=None, description="KV cache usage, 0..1.")
    prefix_hit_rate: float | None = Field(
        default=None, description="Prefix cache hits/queries in the window, 0..1."
    )
    ttft_p50_s: float | None = Field(default=None, description="Time to first token, p50 over the window.")
    ttft_p95_s: float | None = Field(default=None, description="Time to first token, p95 over the window.")
    inter_token_p50_s: float | None = Field(
        default=None, description="Inter-token latency p50 over the window."
    )
    inter_token_p95_s: float | None = Field(
        default=None, description="Inter-token latency p95 over the window."
    )
    preemptions_window: float | None = Field(default=None, description="Preemptions during the window.")


class ReplicaStatus(_Feed):
    url: str = Field(description="Replica base URL, as discovery reports it.")
    model: str
    engine: str = Field(description="vllm, sglang or trtllm.")
    state: State
    routable: bool = Field(description="False only when ejected; degraded replicas still take traffic.")
    admitted: bool = Field(
        default=True,
        description="The replica passed a probe since it was found; in panic, front ends route to every"
        " admitted replica whatever `routable` says (one never admitted, e.g. still loading, stays out).",
    )
    reason: Reason | None = Field(default=None, description="Why degraded/ejected; a bounded code.")
    detail: str = Field(default="", description="Human text for the reason (status code, error).")
    since: float = Field(description="Unix seconds when the current state was entered.")
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    last_probe_at: float | None = Field(default=None, description="Unix seconds of the last probe round.")
    metrics: ReplicaMetrics = Field(default_factory=ReplicaMetrics)
    metrics_at: float | None = Field(default=None, description="Unix seconds of the last successful scrape.")
    metrics_age_s: float | None = Field(default=None, description="Age of `metrics` at generation time.")
    metrics_stale: bool = Field(
        default=True, description="True when the last scrape failed: `metrics` are old values, not zeros."
    )
    adapters: list[str] | None = Field(
        default=None,
        description="LoRA adapters the replica holds loaded (its engine's model list), for models with"
        " adapters; None: not read (no adapters, or the list could not be read this round).",
    )


class ModelSummary(_Feed):
    """Per-model aggregates over the replicas with fresh metrics (what autoscalers read)."""

    model: str
    replicas: int
    healthy_replicas: int = Field(description="Replicas in state healthy.")
    routable_replicas: int = Field(description="Replicas healthy or degraded.")
    panic: bool = Field(
        default=False,
        description="More than `max_ejected_percent` of the admitted replicas are ejected: front ends route"
        " to all of them, and no pod of the model is remediated.",
    )
    queue_depth: float | None = None
    running: float | None = None
    kv_usage_mean: float | None = None
    kv_usage_max: float | None = None
    ttft_p95_s: float | None = Field(default=None, description="p95 of the merged window histograms.")


class VersionWeights(_Feed):
    """A versioned model's weights as the canary controller holds them: the config's, or a rollback's."""

    model: str = Field(description="The model clients send.")
    weights: dict[str, float] = Field(description="Version -> percent of requests.")
    rolled_back: bool = Field(
        default=False, description="A canary breached its rule; weights are all on stable."
    )
    metric: str = Field(
        default="", description="The signal that decided the rollback (error_rate, ttft_p95, ...)."
    )
    reason: str = Field(default="", description="One sentence: which version, what was measured, the limit.")
    decided_at: float | None = Field(default=None, description="Unix seconds of the rollback.")
    verdicts: dict[str, str] = Field(
        default_factory=dict, description="Version -> latest verdict: hold, advance or rollback."
    )


class FleetFeed(_Feed):
    schema_version: Literal[1] = 1
    generated_at: float = Field(description="Unix seconds.")
    interval_ms: int = Field(description="Probe interval of the monitor.")
    stale_after_s: float = Field(description="Treat the feed as absent when older than this.")
    max_ejected_percent: float = Field(
        default=50, description="The panic threshold (health.max_ejected_percent) the front ends apply."
    )
    backends: list[ReplicaStatus] = Field(default_factory=list)
    models: list[ModelSummary] = Field(default_factory=list)
    versions: list[VersionWeights] = Field(
        default_factory=list,
        description="Weights of versioned models with a canary check (router: apply them).",
    )
    routing_changes: int = Field(
        default=0,
        description="Times a replica turned routable or not since the monitor started. A front end that asks"
        " `GET /v1/backends?after=N&wait_ms=W` with the count it has is answered when the count moves (a"
        " readmission reaches it at once) or after W ms, whichever is first.",
    )

    def for_model(self, model: str) -> list[ReplicaStatus]:
        return [b for b in self.backends if b.model == model]

    def is_fresh(self, now_unix_s: float) -> bool:
        return now_unix_s - self.generated_at <= self.stale_after_s
