"""A runtime config file, read for a person: every mistake is one line, ``FILE: field.path: what is wrong``.

Shared by every runtime service, at start (print the lines, exit 2) and on reload (log them, keep the
running config). Never a traceback for a mistake in a file someone edited.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from runtime.config import RuntimeConfig
from runtime.scheduling import Problem, load_plugins, problems

#: pydantic's marker for "the key itself" in a mapping's location; the key alone names the field.
_KEY_MARKER = "[key]"


class ConfigError(Exception):
    """A config file that cannot be used; ``lines`` holds one line per mistake."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__("\n".join(lines))


def field_path(loc: Iterable[int | str]) -> str:
    """``("router", "routes", 0, "strategy")`` -> ``router.routes[0].strategy``."""
    out = ""
    for part in loc:
        if part == _KEY_MARKER:
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _line(path: Path, field: str, message: str) -> str:
    return f"{path}: {field}: {message}" if field else f"{path}: {message}"


def validation_lines(path: Path, err: ValidationError) -> list[str]:
    lines = []
    for e in err.errors(include_url=False):
        message = str(e["msg"]).removeprefix("Value error, ")
        shown: Any = e["input"]
        if e["type"] not in ("missing", "value_error", "assertion_error") and not isinstance(
            shown, dict | list
        ):
            message += f" (got {shown!r})"
        lines.append(_line(path, field_path(e["loc"]), message))
    return lines


def problem_lines(path: Path, problems: Iterable[Problem], under: str = "") -> list[str]:
    """Lines for problems found after structural validation (``under`` is where their fields sit)."""
    return [_line(path, f"{under}.{p.field}" if under else p.field, p.message) for p in problems]


def read_yaml(path: Path, what: str = "config") -> Any:
    """The YAML document in ``path``; ``ConfigError`` when it cannot be read or parsed."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError([f"{path}: cannot read {what}: {err.strerror or err}"]) from None
    except yaml.YAMLError as err:
        raise ConfigError([f"{path}: not valid YAML: {' '.join(str(err).split())}"]) from None


def read_config(path: Path) -> RuntimeConfig:
    """Read and validate ``path``; ``ConfigError`` with one line per mistake."""
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError([f"{path}: expected a mapping with at least `models`, got {type(raw).__name__}"])
    try:
        return RuntimeConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(validation_lines(path, err)) from None


def routing_lines(path: Path, cfg: RuntimeConfig) -> list[str]:
    """The routing section's mistakes, for every front end that routes with it (the router, the endpoint
    picker): plug-ins that do not import, strategies and scorers that are not registered, with where."""
    lines = problem_lines(path, load_plugins(cfg.router.plugins), "router")
    placed = [("router.default_strategy", cfg.router.default_strategy)] + [
        (f"router.routes[{i}].strategy", route.strategy) for i, route in enumerate(cfg.router.routes)
    ]
    for where, strategy in placed:
        lines += problem_lines(path, problems(strategy.name, strategy.weights), where)
    return lines
