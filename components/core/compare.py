"""Self-hosting against pay-per-token APIs: what the platform costs for a monthly token volume, what comparable
APIs would charge for it, and the volume above which the platform is cheaper. Pure arithmetic over
``components.core.cost`` (the platform's prices and throughput estimate) and ``components.base.catalog`` (API prices).

The model, stated with every answer (``Assumptions.lines``):

- A replica's capacity is the cost estimate's generated tokens per second (decode-bound roofline) at the
  expected utilisation; prompt tokens ride along at the stated share of all tokens (prefill is compute-bound
  and fast beside decoding), so a replica serves ``tps x utilisation x seconds / (1 - input share)`` tokens a
  month.
- Replicas follow the volume (the autoscaler) between the model's min and max; each is billed its share of a
  node all month. Below the break-even volume the API is cheaper: ``max(1, min replicas) x replica cost /
  API price per token``; when one replica at the expected utilisation costs more per token than the API, the
  platform never breaks even.
- An API's price per token blends its input and output prices by the same input share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components.base import catalog, sizing
from components.core import cost
from components.core.placement import Layout
from components.spec import ModelSpec, PlatformSpec

SECONDS_PER_MONTH = catalog.HOURS_PER_MONTH * 3600


@dataclass(frozen=True)
class Assumptions:
    utilisation: float
    input_share: float = cost.DEFAULT_INPUT_SHARE

    def lines(self) -> list[str]:
        return [
            f"utilisation {self.utilisation:.0%}: the share of a running replica's token capacity used on average",
            f"token mix: {self.input_share:.0%} prompt tokens, {1 - self.input_share:.0%} generated; API prices"
            " blended by it",
            f"tokens/s per replica: {cost.THROUGHPUT_ASSUMPTION}; prompt tokens ride along",
            "replicas follow the volume between the model's min and max, each billed its share of a node all month"
            " (on-demand unless its pool is spot); fixed infrastructure is shown apart",
            f"API prices: standard tier, read {catalog.API_PRICES_READ_ON}; OpenAI's Batch API bills"
            f" {catalog.OPENAI_BATCH_DISCOUNT:.0%} of them",
        ]


@dataclass(frozen=True)
class SelfHosted:
    """What one replica of a model costs and serves."""

    model: str
    where: str  # the instance type, for the reader
    usd_per_replica_month: float
    tokens_per_second_per_replica: float | None  # generated tokens; None: no estimate (embeddings, CPU)
    min_replicas: int
    max_replicas: int

    def capacity_tokens_month(self, a: Assumptions) -> float | None:
        """Tokens (prompt and generated) one replica serves a month at the expected utilisation."""
        if not self.tokens_per_second_per_replica:
            return None
        return self.tokens_per_second_per_replica * a.utilisation * SECONDS_PER_MONTH / (1 - a.input_share)


def blended_usd_per_m(price: catalog.ApiPrice, input_share: float) -> float:
    return price.usd_per_m_input * input_share + price.usd_per_m_output * (1 - input_share)


def replicas_for(volume: float, hosted: SelfHosted, a: Assumptions) -> int | None:
    """Replicas serving ``volume`` tokens a month; None when even the maximum cannot."""
    capacity = hosted.capacity_tokens_month(a)
    if capacity is None:
        return None
    needed = max(hosted.min_replicas, math.ceil(volume / capacity))
    return needed if needed <= hosted.max_replicas else None


def break_even_tokens(hosted: SelfHosted, usd_per_token: float, a: Assumptions) -> float | None:
    """The monthly volume above which self-hosting is cheaper than ``usd_per_token``; None: never, at this
    utilisation (a full replica costs more per token than the API)."""
    capacity = hosted.capacity_tokens_month(a)
    if capacity is None or usd_per_token <= 0:
        return None
    if hosted.usd_per_replica_month / capacity > usd_per_token:
        return None
    return max(1, hosted.min_replicas) * hosted.usd_per_replica_month / usd_per_token


@dataclass(frozen=True)
class ApiSide:
    price: catalog.ApiPrice
    usd_per_m: float  # blended
    usd_month: float | None  # for the volume
    break_even_tokens_month: float | None


@dataclass(frozen=True)
class Comparison:
    hosted: SelfHosted
    volume_tokens_month: float | None  # None: no estimate of what it serves
    replicas: int | None
    platform_usd_month: float | None
    apis: tuple[ApiSide, ...]

    @property
    def platform_usd_per_m(self) -> float | None:
        if not self.volume_tokens_month or self.platform_usd_month is None:
            return None
        return self.platform_usd_month / self.volume_tokens_month * 1e6


def compare(
    hosted: SelfHosted, arch: catalog.ModelArch, a: Assumptions, volume: float | None = None
) -> Comparison:
    """The model at ``volume`` tokens a month, or (None) at what its max replicas serve at the utilisation."""
    capacity = hosted.capacity_tokens_month(a)
    if volume is None and capacity is not None:
        volume = capacity * hosted.max_replicas
    replicas = replicas_for(volume, hosted, a) if volume is not None else None
    platform = replicas * hosted.usd_per_replica_month if replicas is not None else None
    sides = []
    for price in catalog.comparable_api_prices(arch):
        per_m = blended_usd_per_m(price, a.input_share)
        sides.append(
            ApiSide(
                price,
                per_m,
                volume * per_m / 1e6 if volume is not None else None,
                break_even_tokens(hosted, per_m / 1e6, a),
            )
        )
    return Comparison(hosted, volume, replicas, platform, tuple(sides))


# --- where the numbers come from --------------------------------------------------------------------------
def hosted_in_stack(
    spec: PlatformSpec, layout: Layout, model: ModelSpec, prices: cost.PriceList
) -> SelfHosted:
    placement = layout.placements[model.name]
    c = cost.model_cost(spec, layout, model.name, prices)
    where = placement.instance.name if placement.instance else "cpu"
    return SelfHosted(
        model.name,
        where,
        c.usd_per_replica_month,
        c.tokens_per_second_per_replica,
        model.scaling.min_replicas,
        model.scaling.max_replicas,
    )


def cheapest_host(
    name: str, arch: catalog.ModelArch, shape: sizing.EngineShape, max_replicas: int
) -> SelfHosted | None:
    """The instance type (and tensor-parallel size) with the lowest on-demand cost per generated token."""
    best: tuple[float, SelfHosted] | None = None
    for candidate in sizing.candidates(arch, shape, fixed_parallelism=False):
        tps = cost.roofline_tokens_per_second(arch, candidate.instance, candidate.fit)
        hosted = SelfHosted(
            name, candidate.instance.name, candidate.usd_per_replica_month, tps, 0, max_replicas
        )
        per_token = candidate.usd_per_replica_month / tps if tps else math.inf
        if best is None or per_token < best[0]:
            best = (per_token, hosted)
    return best[1] if best is not None else None
