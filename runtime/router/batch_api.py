"""The router's two hooks for the batch service.

1. ``/v1/files`` and ``/v1/batches``: the client's API key, its rate limits and (per line, in the batch
   service) its model scopes apply as to inference calls; the call is then passed to the batch service
   with who made it (``x-inferstack-key``) and what the key may use (``x-inferstack-models``). Headers
   of those names from a client are dropped, never passed on.
2. A line's owner: the batch service sends each line of a batch with its own key and the name of the key
   that owns the batch (``x-inferstack-key``). That name is believed from the batch service's key
   (``batches.router_key_name``) only, never from anyone else, and the line is then admitted and charged
   as the owner's: its scopes, its request and token limits (``on_behalf``).
3. Low priority: a request marked ``x-inferstack-priority: low`` by the batch service's key (anyone else's
   mark is dropped: ``may_lower_priority``) is in the batch band (``runtime.scheduling.fair_queue``), charged
   to its batch's owner's tenant; it is admitted only while nobody of its band or a higher one waits in the
   model's line and
   some replica holds fewer requests than ``share`` of its cap; it then goes only to such a replica. Otherwise it is refused at once (503 ``overloaded``),
   never queued ahead of, or beside, interactive requests, and before any rate limit is charged (the
   batch service sends a refused line again: were each refusal charged, a batch would eat its owner's
   limit).

An upload (``POST /v1/files``, exactly) may be as large as a batch input file. Its key is checked at the
request head (the router's ``head``), and its body is passed on as it arrives, never held whole: the
router holds at most the server's stream buffer and one socket buffer of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from runtime.api_keys import Denied, KeyTable, Principal
from runtime.config import Band, BatchesSettings, RuntimeConfig
from runtime.http import PRINCIPAL_HEADER, SCOPES_HEADER, error_body, passed_retry_after
from runtime.router.proxy import HOP_BY_HOP
from runtime.scheduling.fair_queue import outside_headroom
from runtime.server import Body, BodyError, Connection, Headers, Request
from runtime.upstream import Exchange, Pool, UpstreamError

if TYPE_CHECKING:
    from runtime.router.model_state import ModelState

PATHS = (b"/v1/files", b"/v1/batches")
UPLOAD = (b"POST", b"/v1/files")
#: Multipart framing on top of the largest batch input file an upload may carry.
UPLOAD_SLACK_BYTES = 64 * 1024
_DROPPED = HOP_BY_HOP | {PRINCIPAL_HEADER, SCOPES_HEADER}


def is_batch_api(path: bytes) -> bool:
    return any(path == p or path.startswith(p + b"/") for p in PATHS)


def api_call_model(principal: Principal) -> str:
    """The model a Files or Batches call is admitted for by the key's rate limits. It names none (the lines
    do: the batch service holds them to the key's scopes), so the scope check is given one the key may use."""
    scopes = principal.key.models
    return scopes[0] if scopes else ""


def low_priority_avoid(state: ModelState, share: float, now: float) -> frozenset[str] | None:
    """Replicas a low-priority request must not go to, or None when it may not go anywhere now."""
    if state.queue.waiters.waiting_above(Band.BATCH):
        return None  # requests of the batch band or above are waiting: they get every slot that frees
    return outside_headroom(state.replicas, share, now)


class BatchApiForwarder:
    """Passes Files and Batches calls to the batch service and its answers back, as they are."""

    def __init__(self, url: str, connect_timeout_s: float, timeout_s: float) -> None:
        parts = urlsplit(url)
        self.url = url
        self.pool = Pool(parts.hostname or "127.0.0.1", parts.port or 80, max_idle=32)
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s

    def request(self, req: Request, principal: Principal | None, rid_header: bytes, rid: bytes) -> bytes:
        """The whole request, for a body already read."""
        framing = b"content-length: %d\r\n" % len(req.body)
        return self.request_head(req, principal, rid_header, rid, framing) + req.body

    def request_head(
        self, req: Request, principal: Principal | None, rid_header: bytes, rid: bytes, framing: bytes
    ) -> bytes:
        target = req.path + (b"?" + req.query if req.query else b"")
        lines = [b"%b %b HTTP/1.1\r\nhost: %b\r\n" % (req.method, target, self.pool.host_header)]
        lines += [
            n + b": " + v + b"\r\n" for n, v in req.headers.items() if n not in _DROPPED and n != rid_header
        ]
        lines.append(rid_header + b": " + rid + b"\r\n")
        if principal is not None:
            lines.append(PRINCIPAL_HEADER + b": " + principal.name.encode() + b"\r\n")
            lines.append(SCOPES_HEADER + b": " + ",".join(principal.key.models).encode() + b"\r\n")
        lines.append(framing + b"\r\n")
        return b"".join(lines)

    async def _upload(
        self, req: Request, body: Body, principal: Principal | None, rid_header: bytes, rid: bytes
    ) -> Exchange:
        """Open the exchange and pass the client's body on piece by piece, as fast as the batch service
        takes it; it stops early when the batch service has answered already (a refusal)."""
        length = req.headers.get(b"content-length", b"")
        chunked = not length.isdigit()
        framing = b"transfer-encoding: chunked\r\n" if chunked else b"content-length: %b\r\n" % length
        head = self.request_head(req, principal, rid_header, rid, framing)
        ex = await Exchange.open_streaming(self.pool, head, self.connect_timeout_s)
        try:
            async for piece in body:
                if not await ex.send(
                    b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece, self.timeout_s
                ):
                    return ex
            if chunked:
                await ex.send(b"0\r\n\r\n", self.timeout_s)
        except BaseException:
            ex.abort()
            raise
        return ex

    async def forward(
        self, req: Request, conn: Connection, principal: Principal | None, rid_header: bytes, rid: bytes
    ) -> int:
        """Relay one call; returns the status the client got. A large answer (a file's content) is
        passed on piece by piece, never held whole."""
        ex: Exchange | None = None
        started = False
        try:
            if req.stream is None:
                ex = await Exchange.open(
                    self.pool, self.request(req, principal, rid_header, rid), self.connect_timeout_s
                )
            else:
                ex = await self._upload(req, req.stream, principal, rid_header, rid)
            await ex.head(self.timeout_s)
            ctype = ex.headers.get(b"content-type", b"application/json")
            first = await ex.next_chunk(self.timeout_s) or b""
            length = ex.headers.get(b"content-length", b"")
            if ex.drained or not length.isdigit():
                body = first if ex.drained else first + await ex.read_all(self.timeout_s)
                conn.send(ex.status, body, ctype, [(rid_header, rid), *passed_retry_after(ex.headers)])
                return ex.status
            conn.start_sized(ex.status, [(b"content-type", ctype), (rid_header, rid)], int(length), first)
            started = True
            while (piece := await ex.next_chunk(self.timeout_s)) is not None:
                await conn.write(piece)
            conn.end_sized()
            return ex.status
        except BodyError as err:  # the client's upload is over the limit, or malformed
            conn.send(err.status, err.body())
            return err.status
        except UpstreamError as err:
            if ex is not None:
                ex.abort()
            if started:  # the client has part of the answer: only closing tells it the rest is missing
                conn.close()
                return 502
            status = 504 if err.kind == "timeout" else 502
            conn.send(
                status, error_body(status, f"the batch service failed: {err}", code="batch_service_error")
            )
            return status
        except BaseException:
            if ex is not None:
                ex.abort()
            raise

    def close(self) -> None:
        self.pool.close()


class BatchApiHooks:
    """What the router needs of the batch section of its config, rebuilt on reload."""

    def __init__(self) -> None:
        self.forwarder: BatchApiForwarder | None = None
        self.low_priority_share: float = BatchesSettings.model_fields["headroom_share"].default
        self.upload_max_bytes = 0
        self.service_key: str | None = None  # the batch service's key name (batches.router_key_name)

    def on_behalf(self, who: Principal | None, headers: Headers, keys: KeyTable) -> Principal | Denied | None:
        """Whose scopes and limits a request is charged to: the caller's, except that the batch service's key
        may name the batch's owner in ``x-inferstack-key``: then the owner's (401 when that key is gone)."""
        owner = headers.get(PRINCIPAL_HEADER)
        if who is None or owner is None or self.service_key is None or who.name != self.service_key:
            return who
        name = owner.decode("utf-8", "replace")
        found = keys.by_name.get(name)
        if found is None:
            return Denied(401, f"the key {name!r} that owns this batch is no longer valid", "invalid_api_key")
        return found

    def may_lower_priority(self, caller: Principal | Denied | None) -> bool:
        """Whether ``x-inferstack-priority: low`` from this caller (the key it authenticated with, before
        ``on_behalf``) is honoured: a low-priority refusal costs no rate limit, so only the batch service's
        key may ask for one. A router without that key (``router_key_name`` None: keys are not required)
        honours it from callers without a key, who have no limits to spare."""
        if isinstance(caller, Principal):
            return self.service_key is not None and caller.name == self.service_key
        return caller is None and self.service_key is None

    def configure(self, cfg: RuntimeConfig) -> None:
        s, batches = cfg.router, cfg.batches
        url = str(s.batches_url).rstrip("/") if s.batches_url else None
        if self.forwarder is not None and self.forwarder.url != url:
            self.forwarder.close()
            self.forwarder = None
        if url is not None and self.forwarder is None:
            self.forwarder = BatchApiForwarder(
                url, s.connect_timeout_ms / 1000, s.first_byte_timeout_ms / 1000
            )
        if batches is not None:
            self.low_priority_share = batches.headroom_share
        self.service_key = batches.router_key_name if batches else None
        self.upload_max_bytes = batches.max_file_bytes + UPLOAD_SLACK_BYTES if batches else 0

    def on_head(self, req: Request) -> None:
        """An upload may be as large as a batch input file, and is streamed to the batch service."""
        if req.path == UPLOAD[1] and req.method == UPLOAD[0] and self.forwarder is not None:
            req.max_body = max(req.max_body, self.upload_max_bytes)
            req.streamed = True
