"""Who gets the next free slot when a model's replicas are full: priority bands, then token-weighted fair
queuing between tenants. Pure data structures, no I/O and no clock; the router's wait line
(``runtime.router.waitline``) holds its waiters in one, and the endpoint picker, which holds no line, reads the
same tenants and bands (``TenantTable``, ``lowered``) and keeps the last slots for the upper bands (``fills``,
``outside_headroom``, the router's rule for the batch service's lines too).

- **Bands.** A waiting request of a higher band (``runtime.config.Band``, highest first) always goes before one
  of a lower band.
- **Tenants, within a band.** Each tenant has a virtual token counter, as in VTC ("Fairness in Serving Large
  Language Models", Sheng et al., OSDI 2024): a request is charged its expected cost (prompt + expected output)
  divided by its tenant's weight when it is admitted, and the charge is settled to its real usage when it ends.
  The next slot goes to the waiting tenant whose counter is lowest (between equal ones, to the cheaper request);
  a tenant's own requests keep their arrival order. A tenant that starts waiting has its counter lifted to the
  lowest counter of the tenants already waiting (or, when none waits, to the highest counter: the level everyone
  served reached), so time spent idle banks no credit to spend on a burst later.
- **FIFO** (``fifo=True``): every request alike, in arrival order (the line before bands and tenants).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from runtime.config import ApiKey, Band, Tenant
from runtime.scheduling.inputs import Replica

T = TypeVar("T")

#: Bands highest first; a band's rank is its place here.
BANDS: tuple[Band, ...] = tuple(Band)
RANK: dict[Band, int] = {band: i for i, band in enumerate(BANDS)}
#: The tenant of a request without a key: tenants are key names and the tenants keys name, from the config only,
#: never from request input, so the metrics' label values stay bounded.
OTHER_TENANT = "other"
#: Output tokens a generation request is expected to produce when it sets no ``max_tokens``: what its counter is
#: charged at admission until the real usage settles it (a request's whole context would over-charge a tenant
#: for as long as the request runs).
EXPECTED_OUTPUT_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Place:
    """Where a request stands in the order: its tenant, band, the tenant's weight, and what it is charged at
    admission (tokens: prompt + expected output)."""

    tenant: str = OTHER_TENANT
    band: Band = Band.STANDARD
    weight: float = 1.0
    cost: int = 0


#: A request with no place of its own (tests, internal callers): the default band, the shared tenant.
ANYONE = Place()


def lowered(granted: Band, asked: str | None) -> Band:
    """The band a request gets: its key's (``granted``), or a lower one it asks for (a header); never higher.
    An unknown name asks for nothing."""
    if asked is None:
        return granted
    try:
        wanted = Band(asked.strip().lower())
    except ValueError:
        return granted
    return wanted if RANK[wanted] > RANK[granted] else granted


class TenantTable:
    """Who a request's tenant is, its weight and its band, from the config only (``router.tenants``, the keys):
    a key names its tenant (``ApiKey.tenant``), else is one by its own name; a tenant not listed has weight 1
    and ``default_band``; a request without a key is ``OTHER_TENANT``'s."""

    __slots__ = ("default_band", "tenants")

    def __init__(self, tenants: Iterable[Tenant] = (), default_band: Band = Band.STANDARD) -> None:
        self.tenants = {t.name: t for t in tenants}
        self.default_band = default_band

    def granted(self, key: ApiKey | None) -> tuple[str, float, Band]:
        """(tenant, weight, band) of a key's requests."""
        name = OTHER_TENANT if key is None else key.tenant or key.name
        tenant = self.tenants.get(name)
        if tenant is None:
            return name, 1.0, self.default_band
        return name, tenant.weight, tenant.band

    def place(self, key: ApiKey | None, asked: str | None, cost: int) -> Place:
        """A request's place: its key's tenant and band, or a lower band it ``asked`` for (a header)."""
        name, weight, band = self.granted(key)
        return Place(name, lowered(band, asked), weight, cost)


def fills(band: Band, headroom_share: float) -> float:
    """The share of a replica's cap a request of ``band`` may take where it cannot wait in line for a slot (the
    endpoint picker, which answers at once; the router's lane for the batch service's lines): the two upper bands
    the whole cap, the batch and best-effort bands only ``headroom_share`` of it, so the last slots of a busy
    replica stay for the upper bands."""
    return 1.0 if RANK[band] <= RANK[Band.STANDARD] else headroom_share


def outside_headroom(replicas: Iterable[Replica], share: float, now: float) -> frozenset[str] | None:
    """The replicas a request limited to ``share`` of each replica's cap must not go to (those holding that many
    already); None when no usable replica is left, and it may go nowhere now."""
    listed = list(replicas)
    full = frozenset(r.url for r in listed if r.inflight >= r.cap * share)
    room = any(r.healthy and r.breaker.allows(now) and r.url not in full for r in listed)
    return full if room else None


def top_band_only(tenant_bands: Iterable[Band], default_band: Band) -> bool:
    """Every key's requests are in the top band (the keys of no listed tenant take ``default_band``): bands then
    order nothing, and a burst of anyone's is as urgent as anyone's chat. The policy pack refuses it in prod
    (``policies.inference.rules.fairness``)."""
    return default_band is BANDS[0] and all(band is BANDS[0] for band in tenant_bands)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def request_cost(prompt_tokens: int, payload: Mapping[str, Any], kind: str) -> int:
    """What a request is charged at admission: its prompt (the front end's estimate) plus, for generation, the
    output it asks for (``max_completion_tokens``/``max_tokens``, else ``EXPECTED_OUTPUT_TOKENS``) for each of
    its ``n``/``best_of`` choices."""
    if kind == "embeddings":
        return prompt_tokens
    asked = _count(payload.get("max_completion_tokens")) or _count(payload.get("max_tokens"))
    choices = max(_count(payload.get("n")) or 1, _count(payload.get("best_of")) or 1)
    return prompt_tokens + min(asked or EXPECTED_OUTPUT_TOKENS, 1 << 20) * choices


class Share:
    """The tenants' virtual token counters (tokens served / weight)."""

    __slots__ = ("counters",)

    def __init__(self) -> None:
        self.counters: dict[str, float] = {}

    def counter(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0)

    def charge(self, place: Place, tokens: float) -> None:
        """Count ``tokens`` served to ``place``'s tenant (negative: give back what a charge took beyond the
        real usage), divided by its weight."""
        if tokens:
            self.counters[place.tenant] = self.counter(place.tenant) + tokens / place.weight

    def lift(self, tenant: str, floor: float) -> None:
        if self.counter(tenant) < floor:
            self.counters[tenant] = floor

    def highest(self) -> float:
        return max(self.counters.values(), default=0.0)


@dataclass(eq=False, slots=True)
class Entry(Generic[T]):
    """One waiting item; ``seq`` is its arrival, kept when it is put back after losing a slot."""

    item: T
    place: Place
    seq: int
    key: tuple[int, str] = field(init=False)

    def __post_init__(self) -> None:
        self.key = (RANK[self.place.band], self.place.tenant)


class FairQueue(Generic[T]):
    """Waiting items in the order of the module's docstring; ``pop`` hands out the next one."""

    def __init__(self, fifo: bool = False) -> None:
        self.fifo = fifo
        self.share = Share()
        self._lines: dict[tuple[int, str], deque[Entry[T]]] = {}
        self._tenants: dict[str, int] = {}  # tenant -> entries waiting, any band
        self._seq = 0
        self._front = 0  # put-backs without an entry go before every arrival, latest first
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def push(self, item: T, place: Place, again: Entry[T] | None = None, *, front: bool = False) -> Entry[T]:
        """Put ``item`` in line; ``again``: its entry from before, when it was handed a slot and lost it (it
        goes back to its own place, ahead of later arrivals); ``front`` without one: ahead of everyone of its
        band and tenant."""
        if self.fifo:
            place = ANYONE
        if again is not None:
            entry = Entry(item, place, again.seq)
        elif front:
            self._front -= 1
            entry = Entry(item, place, self._front)
        else:
            self._seq += 1
            entry = Entry(item, place, self._seq)
        if not self._tenants.get(place.tenant):  # newly active: no credit banked while away
            waiting = [self.share.counter(t) for t, n in self._tenants.items() if n]
            self.share.lift(place.tenant, min(waiting) if waiting else self.share.highest())
        line = self._lines.setdefault(entry.key, deque())
        if not line or line[-1].seq < entry.seq:
            line.append(entry)
        else:  # put back: before the first later arrival
            at = next(i for i, e in enumerate(line) if e.seq > entry.seq)
            line.insert(at, entry)
        self._tenants[place.tenant] = self._tenants.get(place.tenant, 0) + 1
        self._len += 1
        return entry

    def peek(self) -> Entry[T] | None:
        """The entry ``pop`` would hand out: the highest band's waiting tenant with the lowest counter; between
        equal counters (a tenant that just came back is lifted to the lowest), the cheaper request, which delays
        the other less; then the earliest arrival."""
        best: Entry[T] | None = None
        best_order: tuple[int, float, int, int] | None = None
        for (rank, tenant), line in self._lines.items():
            head = line[0]
            order = (rank, self.share.counter(tenant), head.place.cost, head.seq)
            if best_order is None or order < best_order:
                best, best_order = line[0], order
        return best

    def pop(self) -> Entry[T] | None:
        entry = self.peek()
        if entry is not None:
            self._take(entry)
        return entry

    def remove(self, entry: Entry[T]) -> bool:
        """Take ``entry`` out of line (it left: its deadline, or its client); False if it was not waiting."""
        line = self._lines.get(entry.key)
        if line is None or entry not in line:
            return False
        self._take(entry)
        return True

    def _take(self, entry: Entry[T]) -> None:
        line = self._lines[entry.key]
        if line[0] is entry:
            line.popleft()
        else:
            line.remove(entry)
        if not line:
            del self._lines[entry.key]
        self._tenants[entry.place.tenant] -= 1
        if not self._tenants[entry.place.tenant]:
            del self._tenants[entry.place.tenant]
        self._len -= 1

    def waiting_above(self, band: Band) -> int:
        """Items waiting in ``band`` or a higher one."""
        rank = RANK[band]
        return sum(len(line) for (r, _), line in self._lines.items() if r <= rank)

    def waiting(self) -> Iterator[tuple[str, Band, int]]:
        """(tenant, band, items waiting) for each non-empty line: the per-tenant wait gauges."""
        for (rank, tenant), line in self._lines.items():
            yield tenant, BANDS[rank], len(line)

    def __iter__(self) -> Iterator[Entry[T]]:
        for line in self._lines.values():
            yield from line
