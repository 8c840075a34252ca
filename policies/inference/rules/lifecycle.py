"""Model lifecycle: a new version reaches production traffic in bounded canary steps, and every prepared
checkpoint an engine loads comes from a Job that recorded its provenance.

Both read what the renderers write on the workloads (``components.core.lifecycle`` annotations) and on the
preparation Jobs (``components.render.preparation``), so they hold for any program that renders the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

from components.core import lifecycle
from components.render import groups, preparation
from policies.inference.rules.base import Category, Config, Finding, Res, Rule, Setting, Severity, of_kind
from policies.inference.rules.k8s import environment_of

ENVIRONMENTS_SCHEMA = {"type": "array", "items": {"type": "string"}}
WORKLOADS = ("Deployment", groups.KIND)
"""What serves a version: a Deployment, or a LeaderWorkerSet for a replica that spans nodes."""


def _notes(res: Res) -> dict[str, str]:
    raw = res.metadata.get("annotations")
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def _canary_steps(res: Res, config: Config) -> Iterator[str]:
    if res.kind not in WORKLOADS or environment_of(res) not in set(config["environments"]):
        return
    notes = _notes(res)
    if notes.get(lifecycle.ANNOTATION_ROLE) != "canary":
        return
    limit = int(config["max_step_percent"])
    try:
        steps = [int(s) for s in notes.get(lifecycle.ANNOTATION_STEPS, "").split(",") if s]
        weight = float(notes.get(lifecycle.ANNOTATION_WEIGHT, "0"))
    except ValueError:
        yield f"{res.display}: unreadable canary annotations {notes}; render them with inferstack"
        return
    if not steps:
        yield f"{res.display}: a canary version without canary steps; give rollout.canary.steps_percent"
        return
    for before, after in zip([0, *steps], steps, strict=False):
        if after - before > limit:
            yield (
                f"{res.display}: canary step {before}% -> {after}% moves {after - before} points of traffic at once; "
                f"this environment allows at most {limit} per step (e.g. steps "
                f"{', '.join(map(str, range(limit, 100, limit)))}, 100)"
            )
            return
    if weight and weight not in steps:
        yield f"{res.display}: canary weight {weight:g}% is not one of its steps {steps}"


CANARY_STEPS = Rule(
    name="new-versions-start-as-bounded-canaries",
    category=Category.RELIABILITY,
    severity=Severity.HIGH,
    description="In the listed environments (prod by default) a new version takes traffic only in canary steps "
    "of at most max_step_percent points each, starting from 0: never a 100% switch in one change.",
    remediation="Give the model versions with the new one as a canary, and rollout.canary.steps_percent whose "
    "steps move at most max_step_percent each (e.g. [10, 25, 50, 75, 100]).",
    resource_check=_canary_steps,
    settings=(
        Setting("environments", ENVIRONMENTS_SCHEMA, ["prod"], "Environments the rule applies to."),
        Setting(
            "max_step_percent",
            {"type": "integer", "minimum": 1, "maximum": 100},
            25,
            "Largest move of a canary's traffic share in one step, in percentage points.",
        ),
    ),
)


def _provenance(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    envs = set(config["environments"])
    jobs = {(r.namespace, r.k8s_name): r for r in of_kind(resources, "Job")}
    for res in of_kind(resources, *WORKLOADS):
        notes = _notes(res)
        job_name = notes.get(lifecycle.ANNOTATION_PREPARED_BY)
        if not job_name or environment_of(res) not in envs:
            continue
        location = notes.get(lifecycle.ANNOTATION_PREPARED_FROM, "")
        job = jobs.get((res.namespace, job_name))
        if job is None:
            yield Finding(
                f"{res.display}: loads {location or 'a prepared checkpoint'} that Job {job_name} should make, but the "
                "stack has no such Job: nothing records where those weights came from",
                res.urn,
            )
            continue
        job_notes = _notes(job)
        try:
            record = json.loads(job_notes.get(preparation.ANNOTATION_PROVENANCE, ""))
        except ValueError:
            record = None
        digest = job_notes.get(preparation.ANNOTATION_HASH, "")
        if not isinstance(record, dict) or not digest or record.get("input_hash") != digest:
            yield Finding(
                f"{job.display}: no provenance (annotations {preparation.ANNOTATION_PROVENANCE} with the inputs and "
                f"{preparation.ANNOTATION_HASH} with their hash) for the checkpoint {res.display} loads",
                job.urn,
            )
            continue
        missing = [k for k in ("source", "kind", "format", "image") if not record.get(k)]
        if missing or record.get("location") != location:
            yield Finding(
                f"{job.display}: its provenance lacks {', '.join(missing) or 'the location'} of what {res.display} "
                f"loads ({location})",
                job.urn,
            )


PROVENANCE = Rule(
    name="prepared-checkpoints-have-provenance",
    category=Category.SECURITY,
    severity=Severity.HIGH,
    description="In the listed environments (prod by default) an engine that loads a prepared checkpoint "
    "(quantized weights, a TensorRT-LLM engine) loads what a preparation Job of the stack made, and that Job "
    "records its inputs (source, revision, tool image, format, calibration) and their hash.",
    remediation="Declare the step as the version's preparation so inferstack renders the Job with its provenance; "
    "do not point engines at prepared weights made elsewhere.",
    stack_check=_provenance,
    settings=(Setting("environments", ENVIRONMENTS_SCHEMA, ["prod"], "Environments the rule applies to."),),
)

RULES = (CANARY_STEPS, PROVENANCE)
