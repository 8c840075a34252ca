"""What a plan-time rule reads, and what a rule is (``components.core.plan_rules`` runs them in report order)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from components.base.problems import Problem

if TYPE_CHECKING:  # annotations only: the rules' modules import this one, and these import them
    from components.base.catalog import Instances
    from components.core.cloud import Cloud
    from components.core.decisions import Decisions
    from components.core.placement import Layout
    from components.spec import PlatformSpec


@dataclass(frozen=True)
class Planned:
    """What a plan-time rule reads (``components.core.plan_rules``): a spec that passed its own validation, where
    everything landed, and the target's cloud."""

    spec: PlatformSpec
    layout: Layout | None = None
    """None where placement could not finish (its own problems say why): a rule that reads it finds nothing."""
    cloud: Cloud | None = None
    """The target's cloud; None on target local, which has none."""
    decisions: Decisions | None = None
    """Everything decided about the spec on ``layout`` (``components.core.decisions``), made once before the rules
    run (``plan_rules.check``): a rule reads what was decided rather than deciding again. None with ``layout``, and
    for placement's own rules (``placement.place``), which read the layout only."""
    instances: Instances | None = None
    """The target's GPU instance types (``Profile.instances``), which placement planned on; None (a ``Planned``
    made by hand): EC2's, ``catalog.INSTANCE_TYPES``."""


PlanRule = Callable[[Planned], Iterable[Problem]]
"""A plan-time rule: every problem it finds in a ``Planned`` spec, at the spec's field paths."""
