#!/usr/bin/env bash
# The field's routers, in their own venv under .cache/ (git-ignored), for bench/router/run.py.
# wrk comes from Debian: apt-get install -y wrk
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.cache/venv-bench
test -x "$VENV/bin/python" || python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade "vllm-router==0.1.17" "sglang-router==0.3.2"
command -v wrk >/dev/null || echo "note: wrk is missing; apt-get install -y wrk" >&2
