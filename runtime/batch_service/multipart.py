"""``multipart/form-data`` (RFC 7578), as the ``openai`` SDK's ``files.create`` sends it. Pure.

:class:`Parser` is fed the body as it arrives (an upload is never held whole) and hands back, in order,
each part's head (its ``name`` and ``filename`` from ``Content-Disposition``, its ``Content-Type``) and
then its data in pieces; it holds no more than a delimiter's length of data between calls. :func:`parse`
reads a body already in memory with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BOUNDARY = re.compile(rb'boundary=(?:"([^"]+)"|([^;\s]+))', re.IGNORECASE)
_PARAM = re.compile(rb';\s*([A-Za-z0-9_*-]+)=(?:"((?:[^"\\]|\\.)*)"|([^;\s]*))')
#: The largest header block of one part; the SDK's are ~100 bytes.
MAX_PART_HEAD_BYTES = 16 * 1024


class MultipartError(ValueError):
    """The body is not the form it says it is."""


@dataclass(frozen=True)
class PartHead:
    name: str
    filename: str | None
    content_type: str | None


@dataclass(frozen=True)
class Part:
    name: str
    filename: str | None
    content_type: str | None
    data: bytes


def boundary(content_type: bytes) -> bytes:
    """The boundary of a ``multipart/form-data`` content type."""
    if not content_type.lower().startswith(b"multipart/form-data"):
        raise MultipartError("expected a multipart/form-data body (a file upload)")
    found = _BOUNDARY.search(content_type)
    if found is None:
        raise MultipartError("multipart/form-data without a boundary")
    value = found.group(1) or found.group(2)
    if not 1 <= len(value) <= 200:
        raise MultipartError("multipart boundary must be 1-200 characters")
    return value


def _disposition(headers: dict[bytes, bytes]) -> tuple[str, str | None]:
    raw = headers.get(b"content-disposition")
    if raw is None or not raw.lower().startswith(b"form-data"):
        raise MultipartError("a part without Content-Disposition: form-data")
    params: dict[bytes, str] = {}
    for m in _PARAM.finditer(raw):
        quoted, plain = m.group(2), m.group(3)
        value = quoted.replace(b'\\"', b'"') if quoted is not None else (plain or b"")
        params[m.group(1).lower()] = value.decode("utf-8", "replace")
    name = params.get(b"name")
    if name is None:
        raise MultipartError("a form-data part without a name")
    return name, params.get(b"filename")


def _part_head(block: bytes) -> PartHead:
    headers: dict[bytes, bytes] = {}
    for line in block.split(b"\r\n"):
        if not line:
            continue
        key, sep, value = line.partition(b":")
        if not sep:
            raise MultipartError("a malformed part header")
        headers[key.strip().lower()] = value.strip()
    name, filename = _disposition(headers)
    ctype = headers.get(b"content-type")
    return PartHead(name, filename, ctype.decode("latin-1") if ctype else None)


_PREAMBLE, _AFTER_DELIMITER, _HEAD, _DATA, _DONE = range(5)


class Parser:
    """A push parser: :meth:`feed` each piece of the body, then :meth:`close` at its end."""

    def __init__(self, boundary: bytes) -> None:
        self._delimiter = b"\r\n--" + boundary
        # The first delimiter may open the body (no CRLF before it): parse as if one came first.
        self._buf = b"\r\n"
        self._state = _PREAMBLE

    def feed(self, data: bytes) -> list[PartHead | bytes]:
        """Part heads and data pieces (bytes, never empty), in the order the body carries them."""
        buf = self._buf + data if self._buf else data
        out: list[PartHead | bytes] = []
        delimiter = self._delimiter
        while True:
            state = self._state
            if state == _DATA:
                end = buf.find(delimiter)
                if end < 0:
                    keep = len(delimiter) - 1  # the start of a delimiter may end this piece
                    if len(buf) > keep:
                        out.append(buf[: len(buf) - keep])
                        buf = buf[len(buf) - keep :]
                    break
                if end:
                    out.append(buf[:end])
                buf = buf[end + len(delimiter) :]
                self._state = _AFTER_DELIMITER
            elif state == _AFTER_DELIMITER:
                if len(buf) < 2:
                    break
                if buf.startswith(b"--"):
                    self._state = _DONE  # the close delimiter; what follows is an epilogue
                    buf = b""
                    break
                if not buf.startswith(b"\r\n"):
                    raise MultipartError("malformed boundary line")
                buf = buf[2:]
                self._state = _HEAD
            elif state == _HEAD:
                if buf.startswith(b"\r\n"):
                    head_end, block = 0, b""
                else:
                    head_end = buf.find(b"\r\n\r\n")
                    if head_end < 0:
                        if len(buf) > MAX_PART_HEAD_BYTES:
                            raise MultipartError(f"a part's headers exceed {MAX_PART_HEAD_BYTES} bytes")
                        break
                    block = buf[:head_end]
                    head_end += 2
                out.append(_part_head(block))
                buf = buf[head_end + 2 :]
                self._state = _DATA
            elif state == _PREAMBLE:
                start = buf.find(delimiter)
                if start < 0:
                    buf = buf[-(len(delimiter) - 1) :]
                    break
                buf = buf[start + len(delimiter) :]
                self._state = _AFTER_DELIMITER
            else:  # _DONE
                buf = b""
                break
        self._buf = buf
        return out

    def close(self) -> None:
        """The body ended: it must have ended the form."""
        if self._state == _PREAMBLE:
            raise MultipartError("the body does not contain its boundary")
        if self._state == _HEAD:
            raise MultipartError("a part without a header end")
        if self._state != _DONE:
            raise MultipartError("a part without its closing boundary")


def parse(content_type: bytes, body: bytes) -> list[Part]:
    """Every part of a form already in memory, in order."""
    parser = Parser(boundary(content_type))
    parts: list[Part] = []
    head: PartHead | None = None
    data: list[bytes] = []
    for event in [*parser.feed(body), None]:
        if not isinstance(event, bytes):
            if head is not None:
                parts.append(Part(head.name, head.filename, head.content_type, b"".join(data)))
            head, data = event, []
        else:
            data.append(event)
    parser.close()
    return parts


def fields(parts: list[Part]) -> dict[str, Part]:
    """Parts by name (a repeated name keeps the first)."""
    out: dict[str, Part] = {}
    for part in parts:
        out.setdefault(part.name, part)
    return out
