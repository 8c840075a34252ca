"""One model as the router routes it: the shared model view (``runtime.model_view``: strategy, replicas,
context) plus what only the router has: a wait line, an embeddings batcher, sleep mode, versions, LoRA
adapters and the engines' KV-event view. No I/O here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.config import ModelRoute, ModelTarget, QueueOrder, RouterSettings, Task
from runtime.engines import SleepMode, facts
from runtime.model_view import ModelView
from runtime.router.replicas import Replica
from runtime.router.waitline import WaitQueue
from runtime.scheduling import Context, Need
from runtime.scheduling.scorers.prefix import PREFIX_MAX_BLOCKS

if TYPE_CHECKING:  # imported when a model follows KV events: tokenizers, jinja2 and zmq cost ~10 MiB of RSS
    from runtime.router.cache_view import ModelCacheView


class ModelState(ModelView[Replica]):
    """Everything the router needs to route one model (or one version of it)."""

    def __init__(self, target: ModelTarget, route: ModelRoute, settings: RouterSettings) -> None:
        super().__init__(target, route, settings)
        # A version has a name of its own ('<model>-<version>'), which its metrics, scaling and alerts carry;
        # ``served`` is what clients send, shared by the versions of a model.
        self.served = target.served_name
        self.version = target.version_of.version if target.version_of is not None else ""
        #: (model, version) for the per-version metrics, None for a model without versions
        self.versioned: tuple[str, str] | None = (self.served, self.version) if self.version else None
        #: a version that is not the stable one: its failures are retried on the stable version
        self.canary = target.version_of is not None and not target.version_of.stable
        self.adapters = {a.name: a.path for a in target.adapters}  # name -> what a replica loads
        self.queue = WaitQueue(settings.queue_max_requests, fifo=settings.queue_order is QueueOrder.FIFO)
        self.batcher: Replica | None = None
        if route.batcher_url is not None and target.task is Task.EMBED:
            self.batcher = self._replica(str(route.batcher_url).rstrip("/"), cap=1 << 30)
        # sleep mode: the engine's endpoints when the model sleeps when idle; the fleet wakes replicas
        self.sleep: SleepMode | None = facts(target.engine).sleep if route.sleep_after_idle_ms else None
        self.request_wake: Callable[[], None] = lambda: None
        self.waking: asyncio.Task[None] | None = None
        # the engines' KV events, for a strategy that reads them (set by the fleet: kept across reloads)
        self.needs_blocks = Need.PROMPT_BLOCKS in self.strategy.needs and target.kv_events is not None
        self.max_blocks = PREFIX_MAX_BLOCKS.read(route.strategy)
        self.kv: ModelCacheView | None = None
        # prefill/decode disaggregation (set by the fleet): the state of the replicas that compute this model's
        # prompts; for those, the model they compute them for
        self.prefill: ModelState | None = None
        self.prefill_for = ""

    def _replica(self, url: str, cap: int) -> Replica:
        return Replica(url, cap, self.new_breaker(), self.weights.get(url, 1.0))

    def new_replica(self, url: str, cap: int) -> Replica:
        return self._replica(url, cap)

    def retire(self, replica: Replica) -> None:
        replica.pool.close()  # in-use connections close when their requests are done

    def replicas_changed(self) -> None:
        if self.kv is not None:
            self.kv.followers.sync([r.url for r in self.replicas])
        self.queue.wake_all()  # new capacity, or nothing left: waiters re-decide

    def health_changed(self, replica: Replica) -> None:
        self.queue.wake_all()  # one more replica to use, or one fewer: waiters re-decide

    def warm_for(self, adapter: str) -> frozenset[str]:
        return frozenset(r.url for r in self.replicas if r.adapters.holds(adapter))

    def add_context(self, ctx: Context, payload: dict[str, Any]) -> None:
        if self.kv is not None:
            ctx.prompt_blocks = self.kv.prompt_blocks(str(ctx.notes["kind"]), payload, self.max_blocks)
            ctx.cache = self.kv.index

    def awake(self) -> list[Replica]:
        """Replicas a request may go to now (a sleeping one first has to wake)."""
        return [r for r in self.replicas if not r.asleep] if self.sleep is not None else self.replicas

    def sleepers(self) -> list[Replica]:
        """Healthy replicas that sleep: what a waiting request can wake."""
        return [r for r in self.replicas if r.asleep and r.healthy] if self.sleep is not None else []

    def servable(self) -> bool:
        """A request for the model can be answered: a healthy replica, a batcher, or (scaled to zero) a
        replica the activator holds requests for while it starts."""
        return bool(self.healthy_count() or self.batcher is not None or self.route.cold_start_hold_ms)
