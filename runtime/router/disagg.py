"""Prefill/decode disaggregation: one client request as two engine requests, and what to do when the second
cannot use the first.

A disaggregated model (its target has ``prefill``, ``runtime.config.PrefillStage``) has two sets of replicas:
prefill engines (vLLM ``kv_role: kv_producer``), which compute a prompt's KV cache, and the model's own
decode engines (``kv_consumer``), which pull it (NixlConnector) and generate. For one request the router

1. picks a decode replica with the model's strategy (load, KV: the admission line as for any request);
2. picks a prefill replica with the prefill target's strategy (prefix affinity) and sends it the client's
   body with ``max_tokens`` 1, ``stream`` false and ``kv_transfer_params: {"do_remote_decode": true}``
   (:func:`prefill_body`); its answer's ``kv_transfer_params`` say where the KV is (engine, host, port,
   blocks), as vLLM's P/D proxies pass it on (vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py);
3. sends the decode replica the client's body plus those ``kv_transfer_params`` (:func:`decode_body`) and
   relays its answer, streamed or not, as any answer (``proxy``).

Recovery is the point. Nothing of the prefill reaches the client, so every failure on the way ends in a
decode that computes the prompt itself (the body without ``kv_transfer_params``: a decode engine serves
plain requests too), never in a lost or hung request:

- no prefill replica can take it now (none healthy, every circuit open): decode-only at once, no waiting;
- a prefill that fails (connect error, 5xx, no ``kv_transfer_params`` in a 200) or outlasts
  ``prefill.timeout_ms``: the next prefill replica, up to ``prefill.attempts``, then decode-only; a 4xx is the
  request's own fault: decode-only at once (the decode engine answers the client with its own verdict);
- a decode that cannot load the KV (the prefill engine died or was restarted after answering, the transfer
  failed): the decode engines run ``kv_load_failure_policy: fail``, so the engine says so (a 500, or an error
  event before the first token of a stream: ``payload.stream_start``) instead of quietly recomputing, and the
  router sends the decode again without the KV, on any decode replica;
- a streamed decode whose first token does not come within ``prefill.transfer_timeout_ms`` (a transfer
  that hangs: NIXL has no deadline of its own on a posted read; a SIGSTOPped prefill engine held one for as long as
  it was stopped): cancelled, and sent again without the KV. A non-streamed decode has its first byte only with its
  whole answer, so no deadline tells a stalled transfer from a long answer: it is given up once its prefill replica
  turns unhealthy while it waits (``proxy.Forwarder._head``), else ``router.first_byte_timeout_ms`` bounds it;
- and no decode carrying the KV may answer after the KV's lease (``lease_s``, counted from the prefill's sending,
  before the engine's own count starts): past it the prefill engine may have freed the blocks and given them to
  another request, and a decode still reading them would answer from someone else's KV (vLLM logs "Potentially
  invalid KV blocks ... may have expired" on the prefill side). Its answer head is due by ``Pairing.kv_expires``;
  past it the decode is sent again without the KV (reason ``kv_lease``, the prefill replica not charged). The
  rendered lease outlasts every bound above (``runtime.config.PrefillStage.lease_for``), so in a rendered stack this
  cuts nothing the other bounds would not; it holds the line where a lease is shorter than the router's waits.

Each failure the prefill replica is to blame for opens its circuit (``runtime.breaker``) like a failed request
does, so a prefill replica whose transfers fail stops being paired even while its pod is Ready and its
``/health`` answers; it is tried again after the circuit's open period. Every P/D request counts in
``inferstack_router_pd_requests_total`` by how it was served, every fallback by its reason.

Requests the two phases cannot split (several choices, prompt logprobs: a decode that did not compute the
prompt has no prompt logits) go decode-only, counted as fallbacks with reason ``unsplittable``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from runtime.engines import facts
from runtime.router.adapters import LoadFailure
from runtime.router.metrics import RouterMetrics
from runtime.router.model_state import ModelState
from runtime.router.replicas import Replica
from runtime.upstream import Exchange, UpstreamError

log = logging.getLogger("inferstack.router")

#: The key of the prefill engine's directions in a request and in its answer (vLLM's OpenAI server).
KV_PARAMS = "kv_transfer_params"
_KV_PARAMS_KEY = b'"' + KV_PARAMS.encode() + b'":'
#: What the decode needs from a prefill's ``kv_transfer_params`` to pull the KV (NixlConnector 0.32:
#: vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py, the decode side's checks).
_KV_REQUIRED = ("do_remote_prefill", "remote_engine_id", "remote_host", "remote_port")
#: Fields of a streamed request a non-streamed prefill must not carry (vLLM refuses ``stream_options``
#: without ``stream``), or that would make it generate more than its one token.
_NOT_FOR_PREFILL = ("stream_options", "min_tokens", "min_completion_tokens", "logprobs", "top_logprobs")

# How a P/D request was served (``inferstack_router_pd_requests_total{outcome}``).
DISAGGREGATED = "disaggregated"  # the decode used the prefill's KV
DECODE_ONLY = "decode_only"  # a fallback: the decode computed the prompt itself


def lease_s(decode: ModelState) -> int:
    """How long a disaggregated model's prefill engines hold a prefill's KV (seconds): as rendered
    (``PrefillStage.kv_lease_s``), else the connector's default."""
    stage = decode.target.prefill
    if stage is not None and stage.kv_lease_s is not None:
        return stage.kv_lease_s
    kv = facts(decode.target.engine).kv_transfer
    return kv.lease_s if kv is not None else 0


def unsplittable(payload: dict[str, Any]) -> str | None:
    """Why a request cannot be served in two phases (None: it can)."""
    if _count(payload.get("n")) > 1 or _count(payload.get("best_of")) > 1:
        return "several choices"
    if payload.get("prompt_logprobs") or (payload.get("echo") and payload.get("logprobs")):
        return "prompt logprobs"
    return None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def prefill_body(payload: dict[str, Any]) -> bytes:
    """The prefill's request: the client's, generating one token, not streamed, asking the engine to keep the
    KV for a remote decode."""
    body = {k: v for k, v in payload.items() if k not in _NOT_FOR_PREFILL and k != KV_PARAMS}
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    body["stream"] = False
    body[KV_PARAMS] = {"do_remote_decode": True}
    return orjson.dumps(body)


def without_kv_params(body: bytes, payload: dict[str, Any]) -> bytes:
    """The client's body without any ``kv_transfer_params`` of its own: where a decode pulls KV from is the
    router's to say (the engine would connect to any host and port the field names)."""
    if KV_PARAMS not in payload:
        return body
    return orjson.dumps({k: v for k, v in payload.items() if k != KV_PARAMS})


def decode_body(body: bytes, params: dict[str, Any]) -> bytes:
    """The decode's request: the client's body (without its own ``kv_transfer_params``) plus the prefill's."""
    at = body.find(b"{") + 1
    return body[:at] + _KV_PARAMS_KEY + orjson.dumps(params) + b"," + body[at:]


def kv_params_of(answer: bytes) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` of a prefill's answer, when they say where to pull the KV from."""
    try:
        parsed = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None
    params = parsed.get(KV_PARAMS) if isinstance(parsed, dict) else None
    if not isinstance(params, dict) or not all(params.get(k) for k in _KV_REQUIRED):
        return None
    return params


def prefill_failure(status: int) -> tuple[str, bool]:
    """A prefill's non-200 answer: (fallback reason, whether the prefill replica is to blame). A 4xx is the
    request's own fault (the decode will say so to the client); anything else, the replica's."""
    if 400 <= status < 500:
        return "prefill_refused", False
    return "prefill_error", True


def decode_failure(status: int) -> tuple[str, bool]:
    """A decode that carried a prefill's KV failed before the client saw anything: (fallback reason, whether the
    prefill replica is to blame). A 500 is the decode engine's failed KV load (``kv_load_failure_policy: fail``),
    a 504 a transfer that did not arrive in time; anything else (unreachable, overloaded) is the decode
    replica's own failure, retried as any."""
    if status == 500:
        return "transfer_failed", True
    if status == 504:
        return "transfer_timeout", True
    return "decode_error", False


@dataclass(slots=True)
class Pairing:
    """One P/D request's two phases: what the decode sends without the KV, and the prefill that made it."""

    payload: dict[str, Any]
    kind: str
    adapter: str | None
    header: Callable[[str], str | None]
    tail_of: Callable[[bytes], bytes]  # a body -> the forwarded headers and body
    plain_body: bytes  # the decode's body without KV
    prefilled: bool = False  # the prefill phase ran (once per request)
    prefill_replica: Replica | None = None  # while the decode carries this replica's KV
    unjudged: Replica | None = None  # the prefill replica whose circuit waits for the decode's verdict
    transfer_deadline: float = 0.0  # a streamed decode's first token is due by then (monotonic)
    kv_expires: float = 0.0  # the prefill engine may free the KV from then on: the decode's answer is due


AdapterReady = Callable[[ModelState, Replica, str | None], Awaitable[LoadFailure | None]]


class TwoPhase:
    """Runs the prefill phase of P/D requests and decides what a failed decode does next."""

    def __init__(self, metrics: RouterMetrics, connect_timeout_s: float) -> None:
        self.metrics = metrics
        self.connect_timeout_s = connect_timeout_s

    async def prefill(
        self,
        pairing: Pairing,
        decode: ModelState,
        stage: ModelState,
        rid: bytes,
        path: bytes,
        ready: AdapterReady,
    ) -> bytes:
        """Run the prefill phase; the decode's body: with the prefill's KV, or without (the decode computes the
        prompt itself, the reason counted)."""
        pairing.prefilled = True
        settings = decode.target.prefill
        assert settings is not None
        why = unsplittable(pairing.payload)
        if why is not None:
            return self._decode_only(pairing, decode, "unsplittable", why, rid)
        body = prefill_body(pairing.payload)
        ctx = stage.context(time.monotonic(), pairing.payload, pairing.header, pairing.adapter, pairing.kind)
        tried: set[str] = set()
        reason, detail = "no_prefill_replica", f"no replica of {stage.name!r} can take a prefill now"
        for _ in range(settings.attempts):
            ctx.now = time.monotonic()
            ctx.exclude = frozenset(tried)
            replica = stage.strategy.pick(stage.awake(), ctx)
            if replica is None:
                break
            tried.add(replica.url)
            failure = await ready(stage, replica, pairing.adapter)
            if failure is not None:
                reason, detail = "prefill_adapter", failure.message
                continue
            stage.strategy.on_routed(replica, ctx)
            sent = time.monotonic()  # the engine's lease starts later, when it has computed the prefill
            params, reason, detail = await self._send(
                stage, replica, path, pairing.tail_of(body), settings.timeout_ms
            )
            if params is not None:
                pairing.prefill_replica = pairing.unjudged = replica
                pairing.kv_expires = sent + lease_s(decode)
                pairing.transfer_deadline = min(
                    time.monotonic() + settings.transfer_timeout_ms / 1000, pairing.kv_expires
                )
                return decode_body(pairing.plain_body, params)
            if reason == "prefill_refused":
                break
        return self._decode_only(pairing, decode, reason, detail, rid)

    async def _send(
        self, stage: ModelState, r: Replica, path: bytes, tail: bytes, timeout_ms: int
    ) -> tuple[dict[str, Any] | None, str, str]:
        """One prefill on one replica, within its timeout: (the KV's directions, or None with the reason)."""
        sent_at = time.monotonic()
        r.inflight += 1
        r.last_used = sent_at
        r.breaker.on_start(sent_at)
        status, blamed, verdict = 0, True, ""
        params: dict[str, Any] | None = None
        reason = "prefill_error"
        try:
            head = b"POST %b HTTP/1.1\r\nhost: %b\r\n" % (path, r.pool.host_header)
            status, _, answer = await Exchange.complete(
                r.pool, head + tail, timeout_ms / 1000, min(self.connect_timeout_s, timeout_ms / 1000)
            )
            if status == 200:
                params = kv_params_of(answer)
                if params is None:
                    reason, verdict = "prefill_error", "answered without kv_transfer_params (no KV producer?)"
            else:
                reason, blamed = prefill_failure(status)
                verdict = f"answered {status}: {answer[:200].decode('utf-8', 'replace')}"
        except TimeoutError:
            reason, verdict = "prefill_timeout", f"no answer within {timeout_ms} ms"
        except UpstreamError as err:
            reason, verdict = "prefill_error", str(err)
        finally:
            r.inflight -= 1
            now = time.monotonic()
            r.last_used = now
            if (
                params is not None
            ):  # its circuit's verdict waits for the decode: did the KV arrive? (``settle``)
                r.observe_ttft(now - sent_at, stage.ewma_alpha)
            elif blamed:
                r.breaker.on_failure(now)
            else:
                r.breaker.on_abandon()
            self.metrics.request(
                stage.name, r.url, status or (504 if reason == "prefill_timeout" else 502), now - sent_at
            )
            if stage.queue.waiters:
                stage.queue.wake_one()
        return params, reason, verdict

    def _decode_only(
        self, pairing: Pairing, decode: ModelState, reason: str, detail: str, rid: bytes
    ) -> bytes:
        self.metrics.pd_fallback(decode.name, reason)
        log.info(
            "P/D request served decode-only",
            extra={"request_id": rid.decode(), "model": decode.name, "reason": reason, "detail": detail},
        )
        return pairing.plain_body

    def decode_failed(
        self, pairing: Pairing, decode: ModelState, status: int, message: str, rid: bytes
    ) -> tuple[bytes, bool]:
        """The decode that carried a prefill's KV failed before the client saw anything: (the body it is sent
        again with, without the KV; True when the failure was the transfer's or the lease's, not the decode
        replica's, which may then take it again)."""
        replica = pairing.prefill_replica
        pairing.prefill_replica = None
        reason, blamed = decode_failure(status)
        lease = reason == "transfer_timeout" and time.monotonic() >= pairing.kv_expires
        if lease:  # the answer outlasted the KV's lease: no one's failure, the prefill replica not charged
            reason, blamed = "kv_lease", False
            message = f"{message}; the prefill's KV lease ran out before the decode answered"
        self.settle(pairing, False if blamed else None)
        detail = f"{message} (prefill replica {replica.url if replica else '?'})"
        return self._decode_only(pairing, decode, reason, detail, rid), blamed or lease

    def served(self, pairing: Pairing, decode: ModelState) -> None:
        """The client got its answer (or the decode's own error): how the request was served. A decode that
        answered with the KV had it: its prefill replica succeeded."""
        self.settle(pairing, True)
        self.metrics.pd_request(
            decode.name, DISAGGREGATED if pairing.prefill_replica is not None else DECODE_ONLY
        )

    @staticmethod
    def settle(pairing: Pairing, transferred: bool | None) -> None:
        """The prefill replica's circuit learns whether its KV reached the decode: a prefill that answered is
        judged only then, so a replica whose transfers keep failing opens its circuit though its prefills
        answer 200. None: no verdict (the client left, the decode replica failed on its own)."""
        replica, pairing.unjudged = pairing.unjudged, None
        if replica is None:
            return
        if transferred is True:
            replica.breaker.on_success()
        elif transferred is False:
            replica.breaker.on_failure(time.monotonic())
        else:
            replica.breaker.on_abandon()
