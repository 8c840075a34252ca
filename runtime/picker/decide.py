"""Which replica serves a request, or what the gateway answers instead. Pure: request in, decision out.

The pick is the router's: the same ``runtime.scheduling`` strategy, fed the same request fields
(``runtime.openai_request``), over replicas that satisfy the same ``Replica`` protocol. What differs is what
happens when nobody can take the request: the router waits in line, the picker answers at once (503 with
``Retry-After``: code ``overloaded`` when the replicas are full, ``no_healthy_backend`` when none is
ready), and the gateway, not the picker, retries, on the fallback endpoints the pick lists after the
chosen one.

Bands are the router's (``runtime.scheduling.fair_queue``: a key's tenant's band, or a lower one the request asks
for). With no line to put a higher band ahead in, the picker keeps the last slots for the upper bands instead: a
batch or best-effort request takes only a replica below ``headroom_share`` of its cap (``fills``), as the router
admits the batch service's lines, and is refused (503 ``overloaded``) when none is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from runtime.config import Band
from runtime.http import OVERLOADED, OVERLOADED_CODE, error_body
from runtime.openai_request import (
    INFERENCE_PATHS,
    BadRequest,
    choices_problem,
    models_list,
    read_request,
    visible,
)
from runtime.picker.replicas import ModelPool, Replica
from runtime.scheduling import Context
from runtime.scheduling.fair_queue import fills, outside_headroom

#: Seconds a client is told to wait after an ``overloaded`` 503 from full replicas (the router's queue deadline, halved,
#: is what it says after waiting; the picker does not wait, so it says the short end).
OVERLOAD_RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class Answer:
    """The gateway answers the client itself (an ext_proc ImmediateResponse)."""

    status: int
    body: bytes
    reason: str  # the rejections metric's label ("" for answers that are not refusals)
    model: str = ""  # only a served model's name (no client-chosen metric labels)
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class Pick:
    """The replica chosen, the ones the gateway may fall back to, and the context the strategy saw."""

    pool: ModelPool
    primary: Replica
    fallbacks: list[Replica]
    ctx: Context = field(repr=False)

    def destination(self) -> str:
        """The ``x-gateway-destination-endpoint`` value: the pick first, then its fallbacks."""
        return ",".join([self.primary.endpoint, *(r.endpoint for r in self.fallbacks)])


def refuse(
    status: int,
    message: str,
    reason: str,
    model: str = "",
    *,
    code: str | None = None,
    param: str | None = None,
    retry_after_s: int | None = None,
) -> Answer:
    headers = (("retry-after", str(retry_after_s)),) if retry_after_s is not None else ()
    return Answer(status, error_body(status, message, code=code, param=param), reason, model, headers)


def models_answer(models: Mapping[str, ModelPool], scope: frozenset[str] | None = None) -> Answer:
    """``GET /v1/models``: the models with a healthy replica, as the router lists them (those in the key's
    scope only)."""
    served = [
        (name, pool.target.max_model_len_tokens)
        for name, pool in models.items()
        if (scope is None or name in scope) and any(r.healthy for r in pool.replicas)
    ]
    return Answer(200, models_list(served), "")


def fallbacks(
    pool: ModelPool, primary: Replica, candidates: list[Replica], now: float, most: int
) -> list[Replica]:
    """Other replicas that could take the request now, least loaded first. Computed without asking the
    scorers again: a fallback is used only when the pick cannot be reached, and the strategy's memory
    (prefix index, rotation) must not count a request twice."""
    usable = [
        r
        for r in candidates
        if r is not primary and r.healthy and r.inflight < r.cap and r.breaker.allows(now)
    ]
    usable.sort(key=lambda r: (r.inflight + r.engine_queued, r.url))
    return usable[:most]


def decide(
    models: Mapping[str, ModelPool],
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    *,
    subset: frozenset[str] | None = None,
    most_fallbacks: int = 2,
    max_choices: int = 16,
    scope: frozenset[str] | None = None,
    admit: Callable[[str], Answer | None] | None = None,
    band: Band = Band.STANDARD,
    headroom_share: float = 1.0,
) -> Pick | Answer:
    """The pick for one request (the caller tells the strategy with ``on_routed`` once it is sent), or
    the answer the gateway gives instead. ``subset`` is the gateway's endpoint subset hint, if any.

    ``scope``: the models the caller's key may use (None: any), the only ones a 404 names; ``admit``: the
    key's scope and rate check on the named model, asked before anything touches the model (a 503
    ``no_backend`` is what wakes a model at zero), as the router asks it before queueing. ``band``: the
    request's; a batch or best-effort one takes only a replica below ``headroom_share`` of its cap."""
    kind = INFERENCE_PATHS.get(path)
    if kind is None:
        if path == "/v1/models" and method in ("GET", "HEAD"):
            return models_answer(models, scope)
        return refuse(404, f"no route for {path[:100]}", "no_route")
    if method != "POST":
        return refuse(405, f"{path} accepts POST", "method")
    asked = read_request(body)
    if isinstance(asked, BadRequest):
        return refuse(400, asked.message, "bad_request", code=asked.code, param=asked.param)
    too_many = choices_problem(asked.payload, max_choices)
    if too_many is not None:
        return refuse(400, too_many.message, "bad_request", code=too_many.code, param=too_many.param)
    pool = models.get(asked.model)
    if pool is None:
        served = ", ".join(visible(models, scope)) or "none"
        message = f"model {asked.model!r} is not served here; served: {served}"
        return refuse(404, message, "unknown_model", code="model_not_found", param="model")
    if admit is not None:
        denied = admit(pool.name)
        if denied is not None:
            return denied
    ctx = pool.context(now, asked.payload, headers.get, kind=kind)
    candidates = pool.replicas
    if subset is not None:
        candidates = [r for r in candidates if r.endpoint in subset]
    share = fills(band, headroom_share)
    if share < 1.0 and any(r.healthy and r.breaker.allows(now) for r in candidates):
        outside = outside_headroom(candidates, share, now)
        if outside is None:
            return refuse(
                OVERLOADED,
                f"no headroom for {band.value} requests to {pool.name!r} now",
                "low_priority",
                pool.name,
                code=OVERLOADED_CODE,
                retry_after_s=OVERLOAD_RETRY_AFTER_S,
            )
        candidates = [r for r in candidates if r.url not in outside]
    primary = pool.strategy.pick(candidates, ctx)
    if primary is not None:
        return Pick(pool, primary, fallbacks(pool, primary, candidates, now, most_fallbacks), ctx)
    if any(r.healthy and r.breaker.allows(now) for r in candidates):
        # Refused for load: 503 + Retry-After with code ``overloaded`` (runtime.http.OVERLOADED), as the router
        # answers; 429 stays for a key's own limits. The Endpoint Picker Protocol (proposal 004, v1.0.0, its
        # Destination Endpoint constraints) says the EPP MUST return an ImmediateResponse with 429 "if the
        # request should be dropped (e.g., a Sheddable request, and the servers under heavy load)", and 503
        # "if there are no ready endpoints". The gateway hands that status to the client unchanged, so a 429
        # would tell a client its own limit was hit when the service is full: we deviate on purpose, and
        # answer the status the router answers for the same condition (README, "Errors").
        return refuse(
            OVERLOADED,
            pool.busy_message(),
            "overloaded",
            pool.name,
            code=OVERLOADED_CODE,
            retry_after_s=OVERLOAD_RETRY_AFTER_S,
        )
    return refuse(
        503,
        pool.no_replica_message(),
        "no_backend",
        pool.name,
        code="no_healthy_backend",
        retry_after_s=max(1, pool.settings.breaker_open_ms // 1000),
    )
