"""A model's versions as serving units, and the preparation each one needs. Pure.

A model with ``versions`` is served by one unit per version: a ModelSpec named '<model>-<version>' (the
name of its Deployment, Service, scaling and router target) that serves the model's name, runs the
version's engine and loads the version's source, or what its preparation wrote. Every renderer takes
units as it takes models, so a version gets all a model gets; the router config groups units back into
the model (``runtime.config.VersionOf``).

A preparation is one more step of the model store's preparation (``components.core.weights``): the version's
source is copied into the store at its pinned revision as any model's is, the preparation reads it from
there and writes its result into the store too, under '<prefix>/prepared/', and the version's engines load
that as they load any store prefix. Its output is addressed by the hash of its inputs (source, revision, tool
image, format, calibration, lengths, and for an engine build the GPU it is built for): the same inputs give
the same Job name and the same location, so `pulumi up` has nothing to do, and a changed input gets a new Job
and a new location, never a silently overwritten one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from components.base import catalog, sizing
from components.base.problems import Problem
from components.core import disaggregation
from components.core.placement import Layout, Placement, engine_shape
from components.core.planned import Planned, PlanRule
from components.core.weights import fetch, store
from components.spec import (
    ArchitectureSpec,
    ModelSpec,
    ModelVersionSpec,
    PlatformSpec,
    PreparationKind,
    PreparationSpec,
)
from runtime.config import version_target_name
from runtime.engines import facts

HASH_CHARS = 12
"""Hex digits of the input hash in Job names and store paths (48 bits: no collision among one model's
versions)."""


@dataclass(frozen=True)
class Preparation:
    """One preparation Job: what it makes, from what, where it writes, and on which pool it runs."""

    model: str  # the model's name
    version: str
    spec: PreparationSpec
    inputs: dict[str, Any]
    input_hash: str
    location: str  # where the prepared checkpoint lands in the store
    source_location: str  # where the preparation reads the version's source in the store
    unit: str  # the serving unit that loads it
    origin: ModelSpec  # the version before preparation: its source is copied into the store by a weights Job
    gpu: str | None  # the GPU it runs (and, for an engine build, builds) for; None on CPU

    @property
    def job_name(self) -> str:
        return f"prepare-{self.unit}-{self.input_hash[:8]}"


def preparation_inputs(model: ModelSpec, version: ModelVersionSpec, gpu: str | None) -> dict[str, Any]:
    """Everything that determines a preparation's output, canonically."""
    prep = version.preparation
    assert prep is not None
    inputs: dict[str, Any] = {
        "source": model.version_source(version),
        "revision": model.version_revision(version),
        "kind": prep.kind.value,
        "format": prep.format.value,
        "image": prep.resolved_image,
        "max_sequence_length": prep.max_sequence_length,
    }
    if prep.kind is PreparationKind.QUANTIZE:
        inputs |= {
            "calibration_dataset": prep.calibration_dataset,
            "calibration_samples": prep.calibration_samples,
        }
    else:
        engine = model.version_engine(version)
        inputs |= {
            "gpu": gpu,
            "tensor_parallel_size": engine.tensor_parallel_size,
            "max_num_seqs": engine.max_num_seqs,
        }
    return inputs


def gpu_of(placement: Placement) -> str | None:
    return placement.instance.gpu if placement.instance is not None else None


def prepared_location(spec: PlatformSpec, model: str, version: str, input_hash: str) -> str:
    """Where a version's prepared checkpoint lives in the model store: the store's prefix, then 'prepared'."""
    bucket = store.store_bucket(spec)
    return f"s3://{bucket}/{spec.model_store.prefix}/prepared/{model}/{version}/{input_hash[:HASH_CHARS]}/"


def source_unit(model: ModelSpec, version: ModelVersionSpec) -> ModelSpec:
    """The version as it is before any preparation: the model with the version's source, revision and engine,
    named '<model>-<version>'. Its store location is where the version's source is copied (and what a version
    without preparation serves)."""
    found = model.arch()  # a unit's source (a prepared location) may not be in the catalog: carry the shape
    architecture = model.architecture or (_architecture(found) if found is not None else None)
    unit = model.model_copy(
        update={
            "name": version_target_name(model.name, version.name),
            "architecture": architecture,
            "source": model.version_source(version),
            "revision": model.version_revision(version),
            "engine": model.version_engine(version),
            "versions": [],
        }
    )
    unit._served_as = model.name
    return unit


def preparation(
    spec: PlatformSpec, model: ModelSpec, version: ModelVersionSpec, gpu: str | None
) -> Preparation | None:
    """The Job a version's preparation needs on ``gpu`` (the model's GPU type; None on CPU), if any."""
    prep = version.preparation
    if prep is None:
        return None
    inputs = preparation_inputs(model, version, gpu)
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    unit = version_target_name(model.name, version.name)
    location = prepared_location(spec, model.name, version.name, digest)
    origin = source_unit(model, version)
    source = store.location(spec, origin)
    return Preparation(model.name, version.name, prep, inputs, digest, location, source, unit, origin, gpu)


def pd_units(model: ModelSpec) -> list[ModelSpec]:
    """A disaggregated model's serving units (``ModelSpec.pd_roles``): the decode role and the prefill role. Both
    carry the model's adapters: the router loads one on both engines of a request."""
    return list(model.pd_roles())


def units(spec: PlatformSpec, model: ModelSpec, gpu: str | None = None) -> list[ModelSpec]:
    """The serving units of a model: itself, one per version (``gpu``: its GPU type, which an engine build
    is for), or its decode and prefill roles."""
    if model.disaggregation is not None:
        return pd_units(model)
    if not model.versions:
        return [model]
    out = []
    for i, v in enumerate(model.versions):
        prepared = preparation(spec, model, v, gpu)
        unit = source_unit(model, v)
        if prepared is not None:
            unit = unit.model_copy(update={"source": prepared.location, "revision": None})
            unit._served_as = model.name
            unit._format_in_checkpoint = prepared.spec.kind is PreparationKind.QUANTIZE
            unit._prepared_by = prepared.job_name
        unit._version_of = (model.name, v.name, v.weight, i == 0)
        out.append(unit)
    return out


def _architecture(arch: catalog.ModelArch) -> ArchitectureSpec:
    return ArchitectureSpec(
        params_b=arch.params_b,
        layers=arch.layers,
        kv_heads=arch.kv_heads,
        head_dim=arch.head_dim,
        hidden_size=arch.hidden_size,
        max_context_tokens=arch.max_context_tokens,
        vocab_size=arch.vocab_size,
        active_params_b=arch.active_params_b,
        pooling=arch.pooling,
    )


def preparations(spec: PlatformSpec, layout: Layout) -> list[Preparation]:
    return [
        p
        for m in spec.models
        for v in m.versions
        if (p := preparation(spec, m, v, gpu_of(layout.placements[m.name]))) is not None
    ]


def expand(spec: PlatformSpec, layout: Layout) -> tuple[PlatformSpec, Layout]:
    """The spec the renderers see: every versioned model replaced by its units, each placed where the model
    is (its pool and instance; sized by its own engine in :func:`versions_fit`)."""
    if not any(m.versions or m.disaggregation for m in spec.models):
        return spec, layout
    models: list[ModelSpec] = []
    placements = dict(layout.placements)
    named: dict[str, list[str]] = {}
    for m in spec.models:
        placed = layout.placements[m.name]
        for unit in units(spec, m, gpu_of(placed)):
            models.append(unit)
            own = layout.placements.get(unit.name) if unit.name != m.name else None
            if (
                own is not None
            ):  # a prefill role in a pool of its own: placed, and a member of that pool, already
                continue
            # A unit is placed where its model is; its own engine decides its fetch path on that instance.
            placements[unit.name] = replace(
                placed, model=unit.name, fetch=fetch.decide(unit, placed.instance)
            )
            named.setdefault(m.name, []).append(unit.name)
    pools = {
        name: replace(pool, models=tuple(u for member in pool.models for u in named.get(member, [member])))
        for name, pool in layout.pools.items()
    }
    return spec.model_copy(update={"models": models}), replace(layout, placements=placements, pools=pools)


def versions_fit(planned: Planned) -> list[Problem]:
    """Each version must fit and run on its model's instance with its own (prepared) format: sizing uses the
    format the version serves, and an fp8 checkpoint needs a GPU with fp8."""
    spec, layout = planned.spec, planned.layout
    if layout is None:
        return []
    out: list[Problem] = []
    for i, m in enumerate(spec.models):
        placed = layout.placements.get(m.name)
        arch = m.arch()
        if placed is None or placed.instance is None or arch is None:
            continue
        gpu = placed.instance.gpu_spec
        for j, v in enumerate(m.versions):
            shape = engine_shape(m.model_copy(update={"engine": m.version_engine(v)}))
            field = "preparation.format" if v.preparation is not None else "engine"
            where = f"models[{i}].versions[{j}].{field}"
            why = sizing.gpu_supports(gpu, shape)
            if why is not None:
                out.append(Problem(where, f"{why} (the model runs on {placed.instance.name})"))
                continue
            fit = sizing.memory_fit(arch, shape, gpu)
            if not fit.fits:
                out.append(
                    Problem(where, f"this version does not fit on {placed.instance.name}", tuple(fit.lines()))
                )
    return out


def describe(spec: PlatformSpec, layout: Layout, prepared: Sequence[Preparation]) -> list[str]:
    """The plan's account of serving units: versions (weights, the canary's step, the rollback rule, the preparation
    Jobs; ``prepared``: the stack's, ``components.core.decisions.Decisions.preparations``), and disaggregated
    models' roles (``describe_pd``)."""
    lines: list[str] = []
    jobs = {p.unit: p for p in prepared}
    for m in spec.models:
        if not m.versions or m.rollout.canary is None:
            continue
        canary, rule = m.rollout.canary, m.rollout.canary.rollback
        steps = canary.steps_percent
        parts = []
        for i, v in enumerate(m.versions):
            if i == 0:
                parts.append(f"{v.name} {v.weight}% (stable)")
            else:
                at = (
                    f"step {steps.index(v.weight) + 1} of {len(steps)}"
                    if v.weight in steps
                    else "not started"
                )
                parts.append(f"{v.name} {v.weight}% (canary, {at}: {' -> '.join(map(str, steps))})")
        slo = (
            f" or above the SLO ({m.slo.ttft_p95_ms} ms / {m.slo.inter_token_p95_ms} ms)"
            if rule.enforce_slo
            else ""
        )
        lines.append(
            f"{m.name}: versions {', '.join(parts)}; the health monitor rolls a canary back to {m.versions[0].name} "
            f"at once when, over a {canary.evaluation_interval_s} s interval, its error rate exceeds "
            f"{rule.max_error_rate:.1%} (at least {rule.min_samples} probes), or its TTFT / inter-token p95 is above "
            f"{rule.max_ttft_ratio:g}x / {rule.max_inter_token_ratio:g}x the stable version's{slo}; promotion is "
            "a change of the weights here"
        )
        for v in m.versions:
            p = jobs.get(version_target_name(m.name, v.name))
            if p is None:
                continue
            placed = layout.placements[m.name]
            where = f"pool {placed.pool} ({p.gpu})" if p.gpu and placed.pool else "the general nodes (CPU)"
            what = (
                f"quantize to {p.spec.format.value} with llm-compressor ({p.spec.calibration_samples} samples of "
                f"{p.spec.calibration_dataset})"
                if p.spec.kind is PreparationKind.QUANTIZE
                else f"TensorRT-LLM engine build for {p.gpu} ({p.spec.format.value} checkpoint)"
            )
            lines.append(
                f"{p.unit}: Job {p.job_name} runs before its engines on {where}, after the source's weights Job: "
                f"reads {p.source_location}, {what}, image {p.spec.resolved_image}; writes {p.location} with a "
                f"manifest (input hash {p.input_hash[:HASH_CHARS]}; the same inputs do nothing)"
            )
    return lines + [describe_pd(m, layout) for m in spec.models if m.disaggregation is not None]


def describe_pd(model: ModelSpec, layout: Layout) -> str:
    """The plan's account of a disaggregated model: the pairing, the transport, and the router's bounds."""
    pd = model.disaggregation
    assert pd is not None
    decode, prefill = pd_units(model)
    kv = facts(model.engine.kind).kv_transfer
    connector = kv.connector if kv is not None else "?"
    pools = {u.name: disaggregation.role_pool(layout, model, u) for u in (decode, prefill)}
    path = disaggregation.path(model, pools[prefill.name], pools[decode.name])

    def role(unit: ModelSpec) -> str:
        s, pool = unit.scaling, pools[unit.name]
        where = f", {pool.instance.name}" if pool is not None and not path.same_pool else ""
        return f"{unit.name} ({s.min_replicas}-{s.max_replicas} replicas{where}, {unit.routing.strategy} routing)"

    return (
        f"{model.name}: prefill/decode disaggregated {path.where}: prefill {role(prefill)} hands each prompt's KV "
        f"cache to decode {role(decode)} with {connector} over {model.transport().value} ({path.describe()}); "
        "the router gives a "
        f"prefill {pd.prefill_timeout_ms} ms on each of up to {pd.prefill_attempts} prefill replicas and a streamed "
        f"decode {pd.transfer_timeout_ms} ms to its first token, then the decode computes the prompt itself"
    )


RULES: tuple[PlanRule, ...] = (versions_fit,)
"""The versions' plan-time rule (``components.core.plan_rules``)."""


ANNOTATION_VERSION = "inferstack.io/version"
ANNOTATION_ROLE = "inferstack.io/version-role"
ANNOTATION_WEIGHT = "inferstack.io/version-weight"
ANNOTATION_STEPS = "inferstack.io/canary-steps"
ANNOTATION_PREPARED_BY = "inferstack.io/prepared-by"
ANNOTATION_PREPARED_FROM = "inferstack.io/prepared-location"


def workload_annotations(unit: ModelSpec) -> dict[str, str]:
    """What a version's workload says about itself (kubectl, and the policy pack's lifecycle rules)."""
    if unit.version_of is None:
        return {}
    _, version, weight, stable = unit.version_of
    out = {
        ANNOTATION_VERSION: version,
        ANNOTATION_ROLE: "stable" if stable else "canary",
        ANNOTATION_WEIGHT: str(weight),
    }
    if unit.rollout.canary is not None:
        out[ANNOTATION_STEPS] = ",".join(map(str, unit.rollout.canary.steps_percent))
    if unit.prepared_by is not None:
        out[ANNOTATION_PREPARED_BY] = unit.prepared_by
        out[ANNOTATION_PREPARED_FROM] = unit.source
    return out
