#!/usr/bin/env bash
# What bench/routing/run.py needs beside the project venv: the engine venv (make engine-venv), the
# field's routers and matplotlib (for the chart) in the bench venv .cache/venv-bench (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash bench/router/setup.sh
.cache/venv-bench/bin/pip install --quiet "matplotlib==3.11.2"
