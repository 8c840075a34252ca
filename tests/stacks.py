"""Stack files read the way every shell reads them: with every target's profile, so each cloud's rules run too.
Tests read stacks through these; a test that means to leave a cloud's rules out says so (``profiles={}``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.clouds.targets import PROFILES
from components.core import stackfile
from components.core.decisions import Decisions
from components.core.stackfile import STACKS_DIR, Stack


def load(stack: str, stacks_dir: Path = STACKS_DIR) -> Stack:
    return stackfile.load(stack, stacks_dir, profiles=PROFILES)


def validate(raw: Any, source: str) -> Decisions:
    return stackfile.validate(raw, source, profiles=PROFILES)
