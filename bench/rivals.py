"""The field's routers (vllm-router, sglang-router) as the benchmarks launch them: loopback only,
quiet logging (sglang-router logs every request at info, which slows it ~15%)."""

from __future__ import annotations

from pathlib import Path

RIVALS = ("vllm-router", "sglang-router")


def rival_argv(python: Path, target: str, port: int, workers: list[str], policy: str) -> list[str]:
    """Command line of a rival router on 127.0.0.1:``port`` (its Prometheus exporter on ``port + 1``)."""
    module = "vllm_router.launch_router" if target == "vllm-router" else "sglang_router.launch_router"
    return [
        str(python),
        "-m",
        module,
        "--host",
        "127.0.0.1",  # sglang-router binds 0.0.0.0 unless told otherwise
        "--port",
        str(port),
        "--worker-urls",
        *workers,
        "--policy",
        policy,
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(port + 1),
        "--log-level",
        "warning" if target == "vllm-router" else "warn",
    ]
