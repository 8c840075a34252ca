"""The router never crashes on its config: a mistake at start is one line and exit 2; a change that does
not check out on reload is logged and counted while the last good config keeps serving; a plug-in scorer
is used through config alone."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from runtime.scheduling import registered_scorers
from tests.runtime.router.harness import RouterFromFile

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = "tests.runtime.router.example_scorer"
CHAT = {"messages": [{"role": "user", "content": "hello"}]}


def _config(urls: list[str], **router: Any) -> dict[str, Any]:
    return {
        "models": [{"name": "m", "static_backends": [{"url": u} for u in urls]}],
        "router": {
            "host": "127.0.0.1",
            "probe_interval_ms": 60_000,
            "config_reload_interval_ms": 100,
            **router,
        },
    }


def _write(path: Path, config: dict[str, Any]) -> None:
    """Replace the file atomically: the watch must never read it half-written (that is a failure too)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config))
    os.replace(tmp, path)


def _start_router_process(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime.router", "--config", str(path), "--port", "0", "--metrics-port", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def _wait(cond: Any, timeout_s: float = 10.0) -> bool:
    for _ in range(int(timeout_s / 0.05)):
        if cond():
            return True
        threading.Event().wait(0.05)
    return False


def _reload_failures(router: RouterFromFile) -> float:
    text = router.metrics()
    for family in text_string_to_metric_families(text):
        if family.name == "inferstack_router_config_reload_failures":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("no inferstack_router_config_reload_failures_total in /metrics")


def test_a_router_started_with_an_unknown_scorer_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(
        yaml.safe_dump(_config(["http://127.0.0.1:1"], default_strategy={"weights": {"prefx": 1}}))
    )
    proc = _start_router_process(path)
    assert proc.returncode == 2
    known = ", ".join(sorted(registered_scorers()))
    assert proc.stderr.splitlines() == [
        f"{path}: router.default_strategy.weights.prefx: unknown scorer 'prefx'; known: {known}"
    ]


def test_a_router_started_with_a_plugin_it_cannot_import_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(_config(["http://127.0.0.1:1"], plugins=["no_such.plugin"])))
    proc = _start_router_process(path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"{path}: router.plugins[0]: cannot import 'no_such.plugin': ModuleNotFoundError: No module named 'no_such'"
    ]


def test_a_reload_with_an_unknown_scorer_keeps_the_old_config_serving_and_counts_it(
    doubles: Any, lt: Any, tmp_path: Path
) -> None:
    a, b = doubles(2)
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(_config([a.url])))
    router = RouterFromFile(lt, path).start()
    try:
        typo = _config([a.url], default_strategy={"name": "weighted", "weights": {"prefx": 1}})
        typo["models"].append({"name": "m2", "static_backends": [{"url": b.url}]})
        _write(path, typo)
        assert _wait(lambda: _reload_failures(router) == 1)
        assert router.request("POST", "/v1/chat/completions", {"model": "m", **CHAT})[0] == 200
        assert router.request("POST", "/v1/chat/completions", {"model": "m2", **CHAT})[0] == 404
        # the watch lives on: the corrected file is applied
        typo["router"]["default_strategy"]["weights"] = {"load": 1}
        _write(path, typo)
        assert _wait(
            lambda: router.request("POST", "/v1/chat/completions", {"model": "m2", **CHAT})[0] == 200
        )
        assert _reload_failures(router) == 1
    finally:
        router.stop()


def test_a_reload_the_router_fails_to_apply_keeps_serving_and_watching(
    doubles: Any, lt: Any, tmp_path: Path
) -> None:
    (a,) = doubles(1)
    path = tmp_path / "router.yaml"
    config = _config([a.url])
    path.write_text(yaml.safe_dump(config))
    router = RouterFromFile(lt, path).start()
    fleet = router.router.fleet
    apply = fleet.apply

    def apply_fails_once(cfg: Any) -> None:
        fleet.apply = apply  # type: ignore[method-assign]
        raise RuntimeError("simulated failure while applying")

    fleet.apply = apply_fails_once  # type: ignore[method-assign]
    try:
        config["models"].append({"name": "m2", "static_backends": [{"url": a.url}]})
        _write(path, config)
        assert _wait(lambda: _reload_failures(router) == 1)
        assert router.request("POST", "/v1/chat/completions", {"model": "m", **CHAT})[0] == 200
        config["router"]["retries_max"] = 1  # any further change: the watch is still running
        _write(path, config)
        assert _wait(
            lambda: router.request("POST", "/v1/chat/completions", {"model": "m2", **CHAT})[0] == 200
        )
    finally:
        router.stop()


def test_a_scorer_from_a_plugin_module_routes_through_config_alone(
    doubles: Any, lt: Any, tmp_path: Path
) -> None:
    replicas = doubles(3)
    path = tmp_path / "router.yaml"
    config = _config(
        [d.url for d in replicas],
        plugins=[PLUGIN],
        default_strategy={"name": "weighted", "weights": {"first_url": 1}},
    )
    path.write_text(yaml.safe_dump(config))
    router = RouterFromFile(lt, path).start()
    try:
        for _ in range(9):
            assert router.request("POST", "/v1/chat/completions", {"model": "m", **CHAT})[0] == 200
        first = min(replicas, key=lambda d: d.url)
        assert [len(d.requests) for d in replicas] == [9 if d is first else 0 for d in replicas]
    finally:
        router.stop()
