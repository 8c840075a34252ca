"""The pins of an image's requirement files as this CPU-only machine installs them: torch's CPU build of the
pinned version, and none of the wheels that only PyPI's CUDA build of torch needs.

    python scripts/cpu_pins.py REQUIREMENTS... > pins.txt

scripts/prepare-venv.sh (the quantize image's set, for .venv-prepare) and tests/runtime/test_images.py (each
image's set, for its throwaway venv) both install what this prints, so the two cannot drift apart.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: The CUDA runtime wheels PyPI's torch build pins (a GPU image's payload, ~3 GB) and triton: torch loads them only
#: on a GPU, and its CPU build of the same version needs none of them. nvidia-ml-py is NVML's Python binding, pure
#: Python, which the tools import on any machine.
GPU_ONLY_WHEELS = re.compile(r"^(nvidia-(?!ml-py)|cuda-|triton==)")


def cpu_pins(lines: list[str]) -> list[str]:
    """The lines, with torch's pin on its CPU build and the GPU-only wheels left out (unchanged when the set pins
    no torch)."""
    return [
        f"{line.strip()}+cpu" if line.startswith("torch==") else line
        for line in lines
        if not GPU_ONLY_WHEELS.match(line)
    ]


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: python scripts/cpu_pins.py REQUIREMENTS...", file=sys.stderr)
        return 2
    lines = [line for path in paths for line in Path(path).read_text().splitlines()]
    print("\n".join(cpu_pins(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
