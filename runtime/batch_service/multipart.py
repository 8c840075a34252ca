"""``multipart/form-data`` (RFC 7578), as the ``openai`` SDK's ``files.create`` sends it. Pure.

The body is already in memory (the server bounds it); parts are found by their boundary delimiters and
handed back as views of the body's bytes, with the ``name`` and ``filename`` of their
``Content-Disposition``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BOUNDARY = re.compile(rb'boundary=(?:"([^"]+)"|([^;\s]+))', re.IGNORECASE)
_PARAM = re.compile(rb';\s*([A-Za-z0-9_*-]+)=(?:"((?:[^"\\]|\\.)*)"|([^;\s]*))')


class MultipartError(ValueError):
    """The body is not the form it says it is."""


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


def parse(content_type: bytes, body: bytes) -> list[Part]:
    """Every part of the form, in order."""
    delimiter = b"--" + boundary(content_type)
    start = body.find(delimiter)
    if start < 0:
        raise MultipartError("the body does not contain its boundary")
    parts: list[Part] = []
    pos = start + len(delimiter)
    while True:
        if body.startswith(b"--", pos):
            return parts  # the close delimiter
        if not body.startswith(b"\r\n", pos):
            raise MultipartError("malformed boundary line")
        head_end = body.find(b"\r\n\r\n", pos + 2)
        if head_end < 0:
            raise MultipartError("a part without a header end")
        headers: dict[bytes, bytes] = {}
        for line in body[pos + 2 : head_end].split(b"\r\n"):
            if not line:
                continue
            key, sep, value = line.partition(b":")
            if not sep:
                raise MultipartError("a malformed part header")
            headers[key.strip().lower()] = value.strip()
        data_start = head_end + 4
        end = body.find(b"\r\n" + delimiter, data_start)
        if end < 0:
            raise MultipartError("a part without its closing boundary")
        name, filename = _disposition(headers)
        ctype = headers.get(b"content-type")
        parts.append(Part(name, filename, ctype.decode("latin-1") if ctype else None, body[data_start:end]))
        pos = end + 2 + len(delimiter)


def fields(parts: list[Part]) -> dict[str, Part]:
    """Parts by name (a repeated name keeps the first)."""
    out: dict[str, Part] = {}
    for part in parts:
        out.setdefault(part.name, part)
    return out
