"""The gpu_pools section: groups of identical GPU nodes, their reserved capacity and how their GPUs are shared."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from components.base.enums import CapacityType
from components.base.packing import MAX_TIME_SLICES, Mechanism
from components.spec.base import AUTO, DnsLabel, _Spec


class ReservationKind(StrEnum):
    CAPACITY_BLOCK = "capacity-block"
    ON_DEMAND = "on-demand"


CAPACITY_RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{17}$")
AVAILABILITY_ZONE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")


class CapacityReservationSpec(_Spec):
    """Reserved capacity a GPU pool launches into before anything else (target eks)."""

    id: str
    """The reservation's id, e.g. 'cr-0123456789abcdef0' (`aws ec2 describe-capacity-reservations`)."""
    kind: ReservationKind = ReservationKind.CAPACITY_BLOCK
    """capacity-block (EC2 Capacity Blocks for ML: nodes only while its window is active) or on-demand (an On-Demand
    Capacity Reservation)."""
    availability_zone: str
    """The reservation's zone, e.g. 'us-east-1a': its nodes launch only there, so list it in
    cluster.availability_zones too."""

    @field_validator("id")
    @classmethod
    def _reservation_id(cls, value: str) -> str:
        if not CAPACITY_RESERVATION_ID.match(value):
            raise ValueError(
                f"{value!r} is not a capacity reservation id; write 'cr-' and 17 hex digits, e.g. "
                "'cr-0123456789abcdef0'"
            )
        return value

    @field_validator("availability_zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        if not AVAILABILITY_ZONE.match(value):
            raise ValueError(f"{value!r} is not an availability zone; write e.g. 'us-east-1a'")
        return value


GpuSharing = Mechanism
"""How a pool's GPUs are shared between engines: none, time-slicing or mig (``components.base.packing``)."""


class GpuPoolSpec(_Spec):
    """A group of identical GPU nodes that engines are placed on."""

    name: DnsLabel
    """Pool name, referenced by models' `pool`."""
    instance_type: str = AUTO
    """One of the target's GPU instance types (on eks an EC2 type, e.g. 'p5.48xlarge'), or 'auto' for the
    cheapest of them that fits its models."""
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    """on-demand or spot."""
    min_nodes: Annotated[int, Field(ge=0)] = 0
    """Nodes kept even when no engine needs them."""
    max_nodes: Annotated[int, Field(ge=1)] | None = None
    """Upper bound on nodes; defaults to what the models' max replicas need."""
    root_disk_gib: Annotated[int, Field(ge=20, le=16_384)] | None = None
    """Root volume per node; defaults to images plus, where the node cache has no local NVMe, one copy of the
    weights of each of the pool's models that use it."""
    model_cache_gib: Annotated[int, Field(ge=1)] | None = None
    """Node-level model cache per node (one copy of each model's weights, shared by every replica on the node);
    defaults to those weights plus 10%. Must fit the instance's local NVMe where the cache is on it."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra node labels."""
    capacity_reservation: CapacityReservationSpec | None = None
    """Reserved capacity for instance_type (a Capacity Block or an On-Demand Capacity Reservation) that nodes
    launch into first; the pool's own capacity_type comes after it (target eks)."""
    efa: bool | None = None
    """Elastic Fabric Adapter interfaces on the pool's nodes (as many as the instance type has) and EFA device
    requests on its engines; None: on when a model spans nodes and the instance type has EFA."""
    placement_group: bool | None = None
    """Launch the pool's nodes into one cluster placement group (one zone, lowest latency between nodes);
    None: on when a model spans nodes."""
    fallback_instance_types: list[str] = Field(default_factory=list)
    """Instance types tried in this order when instance_type has no capacity (e.g. ['p5en.48xlarge']); each must
    have its GPU count, vCPUs and memory (the autoscaler sizes the pool by one node shape) and fit every model on
    the pool (target eks)."""
    sharing: GpuSharing = GpuSharing.NONE
    """none: each engine takes whole GPUs. time-slicing: the NVIDIA device plugin advertises each GPU several
    times and engines share it with no memory isolation (each engine's gpu_memory_utilization is derived so
    they fit together); for dev and cheap sharing. mig: the GPUs are cut into MIG instances (A100, H100, H200,
    B200), isolated in memory and faults; each engine names its instance profile. Every model on a shared pool
    sets gpu_share."""
    engines_per_gpu: Annotated[int, Field(ge=2, le=MAX_TIME_SLICES)] | None = None
    """sharing time-slicing: engines one GPU takes (the device plugin's replicas per GPU). Defaults to what the
    largest gpu_share.fraction on the pool allows (1 / fraction, rounded down); more is refused, because
    Kubernetes may put any of them together."""

    @field_validator("fallback_instance_types")
    @classmethod
    def _fallbacks_once(cls, value: list[str]) -> list[str]:
        """Each once; whether the target knows them is placement's (``placement.plan``: the target's table)."""
        if len(set(value)) != len(value):
            raise ValueError("an instance type is listed twice")
        return value

    @model_validator(mode="after")
    def _reserved_type(self) -> GpuPoolSpec:
        if self.capacity_reservation is not None and self.instance_type == AUTO:
            raise ValueError(
                "capacity_reservation reserves one instance type: set instance_type to the reservation's "
                "(e.g. 'p5.48xlarge') instead of auto"
            )
        if self.instance_type in self.fallback_instance_types:
            raise ValueError(f"fallback_instance_types repeats instance_type {self.instance_type!r}")
        if self.engines_per_gpu is not None and self.sharing is not GpuSharing.TIME_SLICING:
            raise ValueError(
                f"engines_per_gpu counts time-sliced engines; with sharing {self.sharing.value} remove it "
                "(or set sharing: time-slicing)"
            )
        return self
