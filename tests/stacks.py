"""Stack files read the way every shell reads them: with every target's profile, so each cloud's rules run too.
Tests read stacks through these; a test that means to leave a cloud's rules out says so (``profiles={}``)."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.clouds.targets import PROFILES
from components.core import stackfile
from components.core.decisions import Decisions
from components.core.stackfile import STACKS_DIR, Stack

if TYPE_CHECKING:
    from components.deploy.synthesis import Synthesis


def load(stack: str, stacks_dir: Path = STACKS_DIR) -> Stack:
    return stackfile.load(stack, stacks_dir, profiles=PROFILES)


def validate(raw: Any, source: str) -> Decisions:
    return stackfile.validate(raw, source, profiles=PROFILES)


def synthesized(stack: str, stacks_dir: Path = STACKS_DIR) -> Synthesis:
    """The Pulumi program's resources for a stack file that no test writes (a committed or example stack), run once
    per test process and shared by every module that asks: a run takes seconds, and dozens of tests read the same
    few stacks. Each caller gets its own copy, so one test's edits never reach another's."""
    return copy.deepcopy(_synthesized(stack, stacks_dir))


@functools.cache
def _synthesized(stack: str, stacks_dir: Path) -> Synthesis:
    from components.deploy import synthesis  # Pulumi: only for the tests that plan

    return synthesis.synthesize(load(stack, stacks_dir))
