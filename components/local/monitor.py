"""`make local MONITOR=1`: a real Prometheus on 127.0.0.1 scraping the local stack, with the stack's own
rendered alert rules loaded. Pure: what to write and how to start it; the supervisor does it.

Every target carries the labels the Prometheus operator's ServiceMonitors attach in a cluster (``namespace``,
``service``, ``pod``, ``endpoint``, ``job``), so the rule file, the dashboards' queries and the scaling
triggers run unchanged against it. Engines are found through a file in Prometheus' file_sd format that the
supervisor rewrites as replicas start and stop (a stopped replica leaves it, as a scaled-down pod leaves its
Service; a crashed one stays, and its ``up`` reads 0, as for a crashlooping pod). The rule file is the
cluster's (``components.render.alerts.rule_groups``); only ``--monitor-alert-for`` may shorten its ``for:``
durations, to watch an alert fire on a laptop (promtool's unit tests hold the real durations).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core.decisions import ModelDecisions
from components.local.defaults import DEFAULT_MONITOR_PORT
from components.render import alerts, common, signals
from components.spec import ModelSpec, PlatformSpec
from runtime.engines import facts

PROMETHEUS = "prometheus"
"""The server's executable (Debian's package `prometheus`, installed by `make prometheus`)."""
MONITOR_DIR = "monitor"
RUNTIME_METRICS_PATH = "/metrics"
_DURATION = re.compile(r"^(\d+)([smh])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600}


@dataclass(frozen=True)
class Monitor:
    """Prometheus for one local stack: its port, scrape and evaluation interval and the rules' ``for:`` cap."""

    port: int = DEFAULT_MONITOR_PORT
    interval_s: int = int(signals.SCRAPE_INTERVAL.removesuffix("s"))
    alert_for_cap_s: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def engine_labels(spec: PlatformSpec, model: ModelSpec, pod: str) -> dict[str, str]:
    """What a ServiceMonitor's target of one engine replica is labelled with (and where its metrics are)."""
    service = common.engine_name(model.name)
    return {
        "namespace": spec.cluster.namespace,
        "service": service,
        "job": service,
        "pod": pod,
        "endpoint": "http",
        "__metrics_path__": facts(model.engine.kind).metrics_path,
    }


def target_groups(targets: Sequence[tuple[str, dict[str, str]]]) -> list[dict[str, Any]]:
    """file_sd groups, one per ``(host:port, labels)``: read by Prometheus and by the runtime's file discovery."""
    return [{"targets": [address], "labels": labels} for address, labels in targets]


def runtime_targets(spec: PlatformSpec, services: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    """The runtime services (``(part, port)``: router, health monitor, batcher, batch service), labelled like their
    cluster Services."""
    out = []
    replicas: dict[str, int] = {}
    for part, port in services:
        service = common.runtime_name(spec, part)
        replica = replicas[part] = replicas.get(part, -1) + 1  # several routers: one pod each
        labels = {
            "namespace": spec.cluster.namespace,
            "service": service,
            "job": service,
            "pod": f"{service}-{replica}",
        }
        endpoint = (
            "metrics" if part == common.ROUTER else "http"
        )  # the router's: its metrics listener, as in a cluster
        out.append({"targets": [f"127.0.0.1:{port}"], "labels": {**labels, "endpoint": endpoint}})
    return out


def prometheus_config(
    monitor: Monitor, runtime: list[dict[str, Any]], engines_file: Path, rules_file: Path
) -> dict[str, Any]:
    """prometheus.yml: the runtime services at fixed addresses, the engines from ``engines_file``."""
    interval = f"{monitor.interval_s}s"
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": f"{min(10, monitor.interval_s)}s",
            "evaluation_interval": interval,
        },
        "rule_files": [str(rules_file)],
        "scrape_configs": [
            {
                "job_name": "inferstack-runtime",
                "metrics_path": RUNTIME_METRICS_PATH,
                "static_configs": runtime,
            },
            {
                "job_name": "inferstack-engines",
                "file_sd_configs": [{"files": [str(engines_file)], "refresh_interval": interval}],
            },
        ],
    }


def seconds(duration: str) -> int:
    """A rule's ``for:`` (``5m``) in seconds."""
    match = _DURATION.match(duration)
    if match is None:
        raise ValueError(f"unsupported duration {duration!r}")
    return int(match.group(1)) * _SECONDS[match.group(2)]


def rule_file(
    spec: PlatformSpec, units: Mapping[str, ModelDecisions], alert_for_cap_s: int | None = None
) -> dict[str, Any]:
    """The cluster's rule groups as a Prometheus rule file (``units``: the models' decisions); ``alert_for_cap_s``
    shortens longer ``for:``s."""
    groups = alerts.rule_groups(spec, units)
    if alert_for_cap_s is not None:
        for group in groups:
            for rule in group["rules"]:
                if "for" in rule and seconds(rule["for"]) > alert_for_cap_s:
                    rule["for"] = f"{alert_for_cap_s}s"
    return {"groups": groups}


def argv(binary: str, config_file: Path, data_dir: Path, port: int) -> list[str]:
    """The server on loopback only, its data in the state directory (wiped at each start), no admin API."""
    return [
        binary,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={data_dir}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1d",
        "--log.level=warn",
    ]
