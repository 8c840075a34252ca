"""Named strategies as data: which scorers with which weights, behind which filters.

A configured strategy names a preset; its ``weights`` override the preset's and may add any
registered scorer (weight 0 turns one off). Only ``weighted`` differs: its configured weights are the
whole blend, written from scratch. Presets set no knobs: every knob has one default, in its record
(``Knob``, beside the scorer that reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    summary: str
    weights: Mapping[str, float]  # scorer name -> weight, in the order the scorers run
    filters: tuple[str, ...] = ()  # after the eligibility filter every strategy starts with
    replace_weights: bool = False  # configured weights replace these instead of overriding them


PRESETS: Mapping[str, Preset] = {
    "round_robin": Preset("Each eligible replica in turn.", {"rotation": 1.0}),
    "least_load": Preset("Fewest in-flight requests plus engine queue.", {"load": 1.0}),
    "least_latency": Preset(
        "Lowest moving average of time to first token; load breaks near-ties.",
        {"latency": 1.0, "load": 0.1},
    ),
    "weighted": Preset(
        "Any blend of scorers from `weights` (without weights: load 1, latency 1).",
        {"load": 1.0, "latency": 1.0},
        replace_weights=True,
    ),
    "power_of_two": Preset(
        "Two replicas sampled at random, the less loaded wins: no herd when routers see the same stale load.",
        {"load": 1.0},
        filters=("sample_two",),
    ),
    "session": Preset(
        "Requests with the same session header stay on one replica while it is under the load guard;"
        " otherwise least load, and the session follows.",
        {"session": 10.0, "load": 1.0},
    ),
    "prefix_aware": Preset(
        "Follow-ups stay on the replica holding their conversation's KV cache; new conversations on a"
        " shared prompt are spread with bounded loads; no shared prefix routes like least_load.",
        {"prefix": 2.0, "adapter_affinity": 2.0, "load": 1.0},
    ),
    "adapter_aware": Preset(
        "LoRA adapter requests go to a replica that has their adapter loaded while it is under the load"
        " guard (else the least loaded, which loads it); base-model requests route like least_load.",
        {"adapter_affinity": 2.0, "load": 1.0},
    ),
    # precise_prefix needs the engines' KV events (vLLM): the control plane turns them on for a model whose
    # blend uses it. Same 2:1 against load as prefix_aware.
    "precise_prefix": Preset(
        "Prefix affinity from the engines' own KV events (what each replica really caches, the same view in"
        " every router replica); the routed-history index for replicas without events.",
        {"precise_prefix": 2.0, "load": 1.0},
    ),
    # kv_aware counts memory, not requests: for traffic whose lengths differ widely, where two replicas
    # with as many requests in flight can be far apart in KV memory. KV usage arrives with the feed's
    # period (0.5-2 s), so it decides only when replicas are far apart (weight 2 against 1: more than
    # half the cache); in-flight counts, never stale, decide the rest. The engine's queue is in the load
    # score already: a queue scorer would count the same stale signal twice. It does not know where
    # prefixes are cached: use prefix_aware for shared-prefix traffic.
    "kv_aware": Preset(
        "Most free KV cache, then fewest requests in flight (plus the engine's queue).",
        {"kv": 2.0, "load": 1.0},
    ),
}
