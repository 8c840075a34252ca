"""Loading a runtime service's config for a person: one clear message per mistake, exit 2.

Shared by ``python -m runtime.health`` and ``python -m runtime.batcher``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import ValidationError

from runtime.config import RuntimeConfig

EXIT_BAD_CONFIG = 2


def _fail(message: str) -> NoReturn:
    print(message, file=sys.stderr)
    raise SystemExit(EXIT_BAD_CONFIG)


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def load_config_or_exit(path: Path) -> RuntimeConfig:
    """Read and validate ``path``; on any problem print ``FILE: field: what is wrong`` and exit 2."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        _fail(f"{path}: cannot read config: {err.strerror or err}")
    except yaml.YAMLError as err:
        _fail(f"{path}: not valid YAML: {err}")
    if not isinstance(raw, dict):
        _fail(f"{path}: expected a mapping with at least `models`, got {type(raw).__name__}")
    try:
        return RuntimeConfig.model_validate(raw)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            got = (
                f" (got {e['input']!r})"
                if e["type"] != "missing" and not isinstance(e["input"], dict)
                else ""
            )
            lines.append(f"{path}: {_where(tuple(e['loc']))}: {e['msg']}{got}")
        _fail("\n".join(lines))


def setup_logging(level: str = "INFO") -> None:
    """JSON-ish one-line logs on stderr; the level from ``LOG_LEVEL``."""
    logging.basicConfig(
        level=level.upper(),
        format='{"ts":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","msg":%(message)r}',
        stream=sys.stderr,
    )
