"""When each model's replicas are added and removed: its scaling thresholds, and the replica count they settle on.
Pure.

Every number comes from the spec: the queue per replica defaults to a tenth of ``max_num_seqs`` (a replica with
that many requests waiting is saturated for a while), the KV cache target and the TTFT target are the model's own
(``scaling.kv_cache_usage_target``, ``slo.ttft_p95_ms``), the windows are the stabilisation windows the spec sets,
and scale-to-zero waits ``idle_before_zero_s``. The scalers render these thresholds
(``components.render.scaling``), the alerts read them, and ``make local``'s autoscaler runs ``replicas_wanted``
on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components.spec import ModelSpec

QUEUE_SHARE_OF_MAX_NUM_SEQS = 0.10
"""Default waiting requests per replica before scaling up, as a share of the engine's max_num_seqs."""
SCALE_UP_SHARE_OF_MAX = 0.25
"""At most this share of max_replicas (at least one) is added per period, or the count doubles."""
ACTIVATION = 0.0
"""A trigger value above this wakes a model from zero and keeps it awake (KEDA's activationThreshold): one
request waiting in the router is enough."""


@dataclass(frozen=True)
class Thresholds:
    """A model's scaling targets, all derived from its spec."""

    min_replicas: int
    max_replicas: int
    queue_per_replica: float
    kv_cache_usage: float
    ttft_p95_s: float
    inter_token_p95_s: float
    scale_up_window_s: int
    scale_down_window_s: int
    scale_up_step_pods: int
    idle_before_zero_s: int
    activation: float
    cold_start_hold_s: float


def thresholds(model: ModelSpec) -> Thresholds:
    s = model.scaling
    queue = s.queue_per_replica
    if queue is None:
        queue = max(1.0, round(model.engine.max_num_seqs * QUEUE_SHARE_OF_MAX_NUM_SEQS, 1))
    return Thresholds(
        min_replicas=s.min_replicas,
        max_replicas=s.max_replicas,
        queue_per_replica=queue,
        kv_cache_usage=s.kv_cache_usage_target,
        ttft_p95_s=model.slo.ttft_p95_ms / 1000,
        inter_token_p95_s=model.slo.inter_token_p95_ms / 1000,
        scale_up_window_s=s.scale_up_stabilization_s,
        scale_down_window_s=s.scale_down_stabilization_s,
        scale_up_step_pods=max(1, math.ceil(s.max_replicas * SCALE_UP_SHARE_OF_MAX)),
        idle_before_zero_s=s.idle_before_zero_s,
        activation=ACTIVATION,
        cold_start_hold_s=s.cold_start_hold_ms / 1000 if s.min_replicas == 0 else 0.0,
    )


def replicas_wanted(t: Thresholds, demand: float, current: int, idle_s: float) -> int:
    """The replica count KEDA and its HPA settle on for the router-demand trigger, as one pure decision: the
    ScaledObject renders these thresholds, and ``make local``'s autoscaler calls this with what the router
    reports (``demand``: requests waiting in it plus refusals for want of a replica; ``idle_s``: how long
    demand and in-flight work have been nil).

    Demand above ``activation`` wakes a model at zero and asks ceil(demand / queue_per_replica) replicas
    (the trigger's AverageValue target), never fewer than run now. Replicas go only when the model is idle:
    after ``scale_down_window_s`` (the HPA's scale-down stabilisation) down to one, and after
    ``idle_before_zero_s`` (KEDA's cooldownPeriod, which goes straight to zero) down to none, never below
    ``min_replicas``."""
    if demand > t.activation:
        wanted = max(current, math.ceil(demand / t.queue_per_replica), 1)
    elif current and t.min_replicas == 0 and idle_s >= t.idle_before_zero_s:
        wanted = 0
    elif current and idle_s >= t.scale_down_window_s:
        wanted = 1
    else:
        wanted = current
    return min(t.max_replicas, max(t.min_replicas, wanted))
