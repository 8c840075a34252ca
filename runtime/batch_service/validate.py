"""An input file, line by line, against the batch it is for. Pure.

Each non-blank line must be a JSON object ``{"custom_id", "method": "POST", "url": <the batch's endpoint>,
"body": {"model": <a model the platform serves>, ...}}`` with a ``custom_id`` unique in the file. Any line
that is not, and a file with no requests or more than the limit, fail the batch's validation (status
``failed``) with one ``errors`` entry per problem and its line number, as the OpenAI API does; nothing runs
then. Whatever a line holds (nesting thousands deep, lone surrogates, anything else that trips a parser),
its problem is that line's error, never an exception. What only the endpoint can judge (a bad parameter)
is a per-line error in the error file later.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from runtime.batch_service.objects import BatchError
from runtime.config import RuntimeConfig

#: Errors listed on a failed batch at most; the last entry says how many more lines had problems.
MAX_ERRORS = 1000
CUSTOM_ID_MAX = 512
#: Served models named in a ``model_not_found`` message at most.
MODELS_SHOWN = 20


def served_models(config: RuntimeConfig) -> frozenset[str]:
    """The model names a request may ask for, as the router resolves them: each model's served name (a
    model served in versions by its own name, not its versions'), and each LoRA adapter."""
    return frozenset({m.served_name for m in config.models} | set(config.adapter_parents()))


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
    requests: int = 0
    """Non-blank lines read: all of them, or ``max_requests + 1`` where reading stopped (too many)."""

    @property
    def models(self) -> list[str]:
        return sorted({line.model for line in self.lines})


def _problem(number: int, code: str, message: str, param: str | None = None) -> BatchError:
    return BatchError(code=code, message=f"Line {number}: {message}", param=param, line=number)


def check_line(
    number: int, raw: bytes, endpoint: str, models: Collection[str] | None = None
) -> Line | BatchError:
    """One line of the file (without its newline); ``models``: those served (None: any)."""
    try:
        obj: Any = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return _problem(number, "invalid_json_line", f"not valid JSON ({err})")
    except RecursionError:
        return _problem(number, "invalid_json_line", "not valid JSON here: nested too deeply")
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
    if models is not None and model not in models:
        shown = ", ".join(sorted(models)[:MODELS_SHOWN]) + (", ..." if len(models) > MODELS_SHOWN else "")
        return _problem(
            number,
            "model_not_found",
            f"the model {model[:200]!r} is not served here; served: {shown or 'none'}",
            "body.model",
        )
    if body.get("stream"):
        return _problem(number, "invalid_body", "streaming is not supported in a batch", "body.stream")
    try:
        encoded = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        custom_id.encode()
    except UnicodeEncodeError:
        return _problem(number, "invalid_json_line", "holds a lone surrogate escape (\\ud800-\\udfff)")
    except RecursionError:
        return _problem(number, "invalid_json_line", "not valid JSON here: nested too deeply")
    return Line(number, custom_id, model, encoded)


def _guarded(number: int, raw: bytes, endpoint: str, models: Collection[str] | None) -> Line | BatchError:
    """``check_line``, and whatever else a line may raise is that line's error: one line never stops the
    file (or, as before, every batch after it)."""
    try:
        return check_line(number, raw, endpoint, models)
    except Exception as err:  # the boundary of one line
        return _problem(number, "invalid_json_line", f"cannot be read ({type(err).__name__})")


_NOT_BLANK = re.compile(rb"\S")


def _numbered_lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """``data``'s lines that hold more than whitespace, one at a time, with their numbers (from 1, blank
    lines counted): never the whole list (a 64 MiB file of ``{}`` lines is 22 million of them), and blank
    runs skipped by the regex engine, not a line at a time (64 MiB of newlines took 31 s that way)."""
    number, counted_to = 1, 0
    found = _NOT_BLANK.search(data)
    while found is not None:
        start = data.rfind(b"\n", 0, found.start()) + 1
        end = data.find(b"\n", found.start())
        end = len(data) if end < 0 else end
        number += data.count(b"\n", counted_to, start)
        counted_to = start
        yield number, data[start:end]
        found = _NOT_BLANK.search(data, end)


def check_file(
    data: bytes, endpoint: str, max_requests: int, models: Collection[str] | None = None
) -> Checked:
    """Every line of ``data``; errors name the line (blank lines are skipped, but counted). ``models``:
    those the platform serves (None: any). Reading stops at the first request past ``max_requests``: a
    file's size in lines costs the service no more than a batch it takes."""
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

    for number, raw in _numbered_lines(data):
        if not raw.strip():
            continue
        requests += 1
        if requests > max_requests:
            break
        checked = _guarded(number, raw.rstrip(b"\r"), endpoint, models)
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
                f"The input file has more than {max_requests:,} requests, the most a batch takes.",
            )
        )
    if problems > len(errors):
        errors.append(
            BatchError("too_many_errors", f"{problems - MAX_ERRORS + 1:,} more problems are not listed.")
        )
        errors = errors[: MAX_ERRORS - 1] + errors[-1:]
    return Checked(lines if not errors else [], errors, requests)
