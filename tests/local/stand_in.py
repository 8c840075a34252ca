"""A stand-in engine (fake_engine.py) where `inferstack local` expects the engine venv's python, and a model
directory for it to "load": what the fast tests of scaling start instead of vLLM."""

from __future__ import annotations

import sys
from pathlib import Path

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")


def stand_in(directory: Path) -> tuple[Path, Path]:
    """(engine python for INFERSTACK_ENGINE_PYTHON, model directory), made under ``directory``."""
    wrapper = directory / "engine-python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_ENGINE}" "$@"\n')
    wrapper.chmod(0o755)
    model = directory / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    return wrapper, model
