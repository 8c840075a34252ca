"""Plan-time rules: what a spec that passed its own validation can still get wrong against the hardware catalog,
where everything landed, or its target's cloud. One function per rule, each returning every problem it finds;
``stackfile.validate`` runs them all with the spec's cross-section rules (``components.spec.rules``), so a stack
file hears of every mistake in one run.

Registered as the policy pack registers its rules: a rule lives in the module that owns its facts (the startup
estimate's rule beside the estimate, the fallbacks' beside the node sources) and is listed in that module's
``RULES``; ``RULES`` here is their report order. A rule reads a ``Planned`` spec; one that reads the layout finds
nothing where placement could not finish. The target's cloud comes from the caller: core cannot import the clouds
(contract pure-core), so the shells pass ``components.clouds.targets.PROFILES`` to ``stackfile``.

Placement is not a rule: it computes the layout the rules read, and reports what it cannot place
(``placement.plan``), first.
"""

from __future__ import annotations

from components.base.catalog import Instances
from components.base.problems import Problem
from components.core import capacity, cloud, disaggregation, endpoint, lifecycle, placement, startup
from components.core.cloud import Cloud
from components.core.decisions import Decisions, decide
from components.core.planned import Planned, PlanRule
from components.core.weights import store
from components.spec import PlatformSpec

RULES: tuple[PlanRule, ...] = (
    *placement.RULES,
    *store.RULES,
    *cloud.RULES,
    *endpoint.RULES,
    *startup.RULES,
    *capacity.RULES,
    *lifecycle.RULES,
    *disaggregation.RULES,
)


def check(
    spec: PlatformSpec, target_cloud: Cloud | None, instances: Instances
) -> tuple[Decisions | None, list[Problem]]:
    """Every decision about the spec (None where placement could not finish) and every plan-time problem:
    placement's on the target's ``instances``, then each rule's, in ``RULES`` order. The decisions are made once,
    here, and the rules read them; so does everything after validation (``stackfile.Stack.decisions``)."""
    layout, problems = placement.plan(spec, instances)
    decided = decide(spec, layout) if layout is not None else None
    planned = Planned(spec, layout, target_cloud, decided, instances)
    return decided, [*problems, *(p for rule in RULES for p in rule(planned))]
