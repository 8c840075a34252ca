"""An input file, line by line, against the batch it is for. Pure.

Each non-blank line must be a JSON object ``{"custom_id", "method": "POST", "url": <the batch's endpoint>,
"body": {"model": ..., ...}}`` with a ``custom_id`` unique in the file. Any line that is not, and a file
with no requests or more than the limit, fail the batch's validation (status ``failed``) with one
``errors`` entry per problem and its line number, as the OpenAI API does; nothing runs then. What only the
endpoint can judge (an unknown model, a bad parameter) is a per-line error in the error file later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runtime.batch_service.objects import BatchError

#: Errors listed on a failed batch at most; the last entry says how many more lines had problems.
MAX_ERRORS = 1000
CUSTOM_ID_MAX = 512


@dataclass(frozen=True)
class Line:
    """A valid request line: its 1-based number in the file, its id, model and body (JSON bytes)."""

    number: int
    custom_id: str
    model: str
    body: bytes


@dataclass(frozen=True)
class Checked:
    lines: list[Line]
    errors: list[BatchError]

    @property
    def models(self) -> list[str]:
        return sorted({line.model for line in self.lines})


def _problem(number: int, code: str, message: str, param: str | None = None) -> BatchError:
    return BatchError(code=code, message=f"Line {number}: {message}", param=param, line=number)


def check_line(number: int, raw: bytes, endpoint: str) -> Line | BatchError:
    """One line of the file (without its newline)."""
    try:
        obj: Any = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return _problem(number, "invalid_json_line", f"not valid JSON ({err})")
    if not isinstance(obj, dict):
        return _problem(number, "invalid_json_line", "each line must be a JSON object")
    custom_id = obj.get("custom_id")
    if custom_id is None:
        return _problem(number, "missing_required_parameter", "`custom_id` is required", "custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > CUSTOM_ID_MAX:
        return _problem(
            number,
            "invalid_custom_id",
            f"`custom_id` must be a non-empty string of at most {CUSTOM_ID_MAX} characters",
            "custom_id",
        )
    method = obj.get("method")
    if method != "POST":
        return _problem(number, "invalid_method", f"`method` must be 'POST', not {method!r}", "method")
    url = obj.get("url")
    if url != endpoint:
        return _problem(
            number,
            "mismatched_endpoint",
            f"`url` {url!r} does not match the batch's endpoint {endpoint!r}",
            "url",
        )
    body = obj.get("body")
    if not isinstance(body, dict):
        return _problem(number, "invalid_body", "`body` must be a JSON object (the request)", "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return _problem(number, "missing_required_parameter", "`body.model` is required", "body.model")
    if body.get("stream"):
        return _problem(number, "invalid_body", "streaming is not supported in a batch", "body.stream")
    encoded = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return Line(number, custom_id, model, encoded)


def check_file(data: bytes, endpoint: str, max_requests: int) -> Checked:
    """Every line of ``data``; errors name the line (blank lines are skipped, but counted)."""
    lines: list[Line] = []
    errors: list[BatchError] = []
    problems = 0
    seen: dict[str, int] = {}
    requests = 0

    def report(error: BatchError) -> None:
        nonlocal problems
        problems += 1
        if len(errors) < MAX_ERRORS:
            errors.append(error)

    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        requests += 1
        checked = check_line(number, raw.rstrip(b"\r"), endpoint)
        if isinstance(checked, BatchError):
            report(checked)
            continue
        first = seen.get(checked.custom_id)
        if first is not None:
            report(
                _problem(
                    number,
                    "duplicate_custom_id",
                    f"`custom_id` {checked.custom_id!r} is used on line {first} already",
                    "custom_id",
                )
            )
            continue
        seen[checked.custom_id] = number
        lines.append(checked)
    if requests == 0:
        report(BatchError("empty_file", "The input file has no requests."))
    elif requests > max_requests:
        report(
            BatchError(
                "too_many_requests",
                f"The input file has {requests:,} requests; a batch takes at most {max_requests:,}.",
            )
        )
    if problems > len(errors):
        errors.append(
            BatchError("too_many_errors", f"{problems - MAX_ERRORS + 1:,} more problems are not listed.")
        )
        errors = errors[: MAX_ERRORS - 1] + errors[-1:]
    return Checked(lines if not errors else [], errors)
