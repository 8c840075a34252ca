"""The OpenAI Files and Batches API's objects, as this service keeps and returns them. Pure.

Shapes follow the API reference (the ``openai`` SDK's ``FileObject``, ``Batch``, ``BatchError`` and the
batch output/error line): ids ``file-...`` and ``batch_...``, Unix seconds, ``request_counts``, and one
JSON line per request in the output and error files (``{"id", "custom_id", "response", "error"}``).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

import orjson

#: Endpoints a batch may target (the ones the platform's engines serve).
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
#: The only completion window the API accepts, and what it means.
COMPLETION_WINDOW = "24h"
COMPLETION_WINDOW_S = 24 * 3600
#: Purposes: uploads must be ``batch``; the files the service writes are ``batch_output``.
PURPOSE_INPUT = "batch"
PURPOSE_OUTPUT = "batch_output"
#: Metadata limits of the API: 16 pairs, keys up to 64 characters, values up to 512.
METADATA_MAX_PAIRS = 16
METADATA_MAX_KEY = 64
METADATA_MAX_VALUE = 512
#: List pages: batches default to 20 (1-100); files to 10,000 (1-10,000).
BATCHES_PAGE = (20, 100)
FILES_PAGE = (10_000, 10_000)


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


def result_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's ``output`` or ``error`` file: derived from the batch, so finishing a batch twice
    (after a crash half-way) writes the same file under the same id."""
    return "file-" + hashlib.sha256(f"{batch_id}/{kind}".encode()).hexdigest()[:24]


def request_id(batch_id: str, line: int) -> str:
    """The ``id`` of one output line (``batch_req_...``), stable for a batch and line."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}/{line}".encode()).hexdigest()[:24]


@dataclass(frozen=True)
class FileRecord:
    """A stored file. ``owner`` is the API key's name ('' without keys); files are visible only to it."""

    id: str
    owner: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int | None

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


@dataclass(frozen=True)
class BatchError:
    """One entry of a batch's ``errors``: why validation failed, with the input line when there is one."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None

    def to_api(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(frozen=True)
class BatchRecord:
    """A batch as the store holds it; ``to_api`` is the API's ``batch`` object."""

    id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    metadata: dict[str, str] | None = None
    allowed_models: tuple[str, ...] = ()  # the owner's key scopes when it was created; () = all
    model: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: tuple[BatchError, ...] = ()
    total: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    last_progress_at: float = 0.0  # wall clock of the last recorded result (the stuck-batch signal)

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "model": self.model,
            "errors": {"object": "list", "data": [e.to_api() for e in self.errors]} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "usage": {
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.input_tokens + self.output_tokens,
            },
            "metadata": self.metadata,
        }


def page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A list answer: ``{"object": "list", "data", "first_id", "last_id", "has_more"}``."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def _line(payload: dict[str, Any]) -> bytes:
    return orjson.dumps(payload) + b"\n"


def response_line(
    batch_id: str, line: int, custom_id: str, status_code: int, request_id_: str, body: Any
) -> bytes:
    """An output (2xx) or error-file (other status) line for a request the endpoint answered."""
    return _line(
        {
            "id": request_id(batch_id, line),
            "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": request_id_, "body": body},
            "error": None,
        }
    )


def error_line(batch_id: str, line: int, custom_id: str, code: str, message: str) -> bytes:
    """An error-file line for a request that got no HTTP answer (expired, cancelled, unreachable)."""
    return _line(
        {
            "id": request_id(batch_id, line),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    )
