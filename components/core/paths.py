"""Where the project keeps its files, in a module that imports nothing: the command line shows these as
option defaults before it loads the spec."""

from __future__ import annotations

from pathlib import Path

STACKS_DIR = Path("stacks")
