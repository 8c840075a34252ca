"""Requests of a batch, sent to the router as low-priority calls over keep-alive connections.

Each carries ``x-inferstack-priority: low`` (the router admits it only while a replica has headroom and
refuses it at once otherwise), the request id of its output line (``batch_req_...``, so a line can be
followed through the router's and the engine's logs) and, when the router requires keys, the batch
service's own key with the name of the key that owns the batch (``x-inferstack-key``): the router believes
that name from the batch service's key alone and charges the line to the owner's scopes and rate limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from runtime import tracing
from runtime.http import LOW_PRIORITY, PRINCIPAL_HEADER, PRIORITY_HEADER
from runtime.upstream import Exchange, Pool


@dataclass(frozen=True)
class Answer:
    status: int
    request_id: str
    body: bytes
    retry_after_s: float | None = None  # the router's Retry-After, on a refusal


def _retry_after(raw: bytes | None) -> float | None:
    return float(raw) if raw is not None and raw.strip().isdigit() else None


class RouterClient:
    """POSTs to one router (the Service in the cluster, the local router in ``make local``)."""

    def __init__(
        self,
        url: str,
        api_key: str | None,
        request_id_header: str = "x-request-id",
        connect_timeout_s: float = 5.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http":
            raise ValueError(f"router_url {url!r}: the batch service speaks plain HTTP to the router")
        self.pool = Pool(parts.hostname or "127.0.0.1", parts.port or 80, max_idle=512)
        self.auth = b"authorization: Bearer %b\r\n" % api_key.encode() if api_key else b""
        self.rid_header = request_id_header.lower().encode()
        self.connect_timeout_s = connect_timeout_s

    def _request(self, path: str, body: bytes, request_id: str, owner: str) -> bytes:
        named = self.auth and owner and owner.isprintable()  # a name from a header never holds CR or LF
        on_behalf = PRINCIPAL_HEADER + b": " + owner.encode() + b"\r\n" if named else b""
        parent = tracing.traceparent()  # the line's span, when traced: the router's span is its child
        on_behalf += b"traceparent: %b\r\n" % parent if parent is not None else b""
        return (
            b"POST %b HTTP/1.1\r\nhost: %b\r\ncontent-type: application/json\r\n%b%b%b: %b\r\n%b: %b\r\n"
            b"content-length: %d\r\n\r\n%b"
            % (
                path.encode(),
                self.pool.host_header,
                self.auth,
                on_behalf,
                PRIORITY_HEADER,
                LOW_PRIORITY,
                self.rid_header,
                request_id.encode(),
                len(body),
                body,
            )
        )

    async def post(
        self, path: str, body: bytes, request_id: str, timeout_s: float, owner: str = ""
    ) -> Answer:
        """One call for ``owner`` (a key name; '' without keys) read to the end within ``timeout_s``; raises
        ``UpstreamError`` or ``TimeoutError`` when no complete answer came (the connection is then closed,
        which stops the work upstream)."""
        request = self._request(path, body, request_id, owner)
        status, headers, raw = await Exchange.complete(self.pool, request, timeout_s, self.connect_timeout_s)
        rid = headers.get(self.rid_header, request_id.encode()).decode("latin-1")
        return Answer(status, rid, raw, _retry_after(headers.get(b"retry-after")))

    def close(self) -> None:
        self.pool.close()
