"""What a routing decision reads: the replicas (as a view any front end can satisfy), the request, the
configured strategy.

The scheduling library owns no replica state. A front end (the router, an Envoy endpoint picker)
keeps its own records and hands them over; anything with these attributes will do, which is why they
are Protocols with read-only members: the front ends' records (``runtime.replica.ReplicaState``)
satisfy them as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class BreakerView(Protocol):
    """A replica's circuit breaker, as far as a decision cares: may a request go there now?"""

    def allows(self, now: float) -> bool: ...


class Replica(Protocol):
    """One replica as filters and scorers see it."""

    @property
    def url(self) -> str: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def inflight(self) -> int:
        """Requests this front end has in flight there."""
        ...

    @property
    def cap(self) -> int:
        """Requests it may have in flight there (the engine's max_num_seqs)."""
        ...

    @property
    def engine_queued(self) -> float:
        """Requests waiting in the engine's own queue (engine stats; 0 when unknown)."""
        ...

    @property
    def kv_usage(self) -> float | None:
        """KV cache usage 0-1 (engine stats); None when unknown."""
        ...

    @property
    def ttft_ewma_s(self) -> float | None:
        """Moving average of time to first token measured by the front end; None before a sample."""
        ...

    @property
    def weight(self) -> float:
        """Static share from the config (``static_backends[].weight``)."""
        ...

    @property
    def breaker(self) -> BreakerView: ...


class CacheView(Protocol):
    """What each replica's engine holds in its prefix cache, as its own KV events say (kept by the front
    end; ``runtime.kvcache.view.CacheIndex`` is one)."""

    def depths(self, hashes: Sequence[int], urls: Iterable[str]) -> dict[str, int]:
        """Leading blocks of ``hashes`` each replica holds; only replicas whose events are followed."""
        ...


@dataclass(slots=True)
class Context:
    """One request, as far as a decision looks at it; the front end fills what the scorers need."""

    model: str
    prompt: str = ""  # filled when a scorer needs Need.PROMPT
    session: str | None = None  # filled when a scorer needs Need.SESSION
    adapter: str | None = None  # the LoRA adapter asked for (the request's model names it), if any
    warm: frozenset[str] = frozenset()  # replicas holding that adapter loaded (filled for Need.ADAPTER)
    prompt_blocks: Sequence[int] = ()  # Need.PROMPT_BLOCKS: the engines' hashes of the prompt's full blocks
    cache: CacheView | None = None  # Need.PROMPT_BLOCKS: the engines' cached blocks
    now: float = 0.0
    exclude: frozenset[str] = frozenset()  # replicas already tried by this request
    notes: dict[str, object] = field(default_factory=dict)  # scorers leave state for on_routed


class StrategySettings(Protocol):
    """A configured strategy (``runtime.config.StrategyConfig`` is one): a preset's name, weights that
    override or extend it, and an attribute per knob its scorers declared, which each reads with
    ``Knob.read``."""

    @property
    def name(self) -> str: ...

    @property
    def weights(self) -> Mapping[str, float]: ...
