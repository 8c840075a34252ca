"""The batch service's alerts, evaluated by Prometheus's own rule engine (`promtool test rules`, Debian's
prometheus package): the stuck-batch alert fires only after the rendered threshold plus its `for`, the expiry
alert on an expired batch, the down alert when nothing scrapes the service."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from components.render import alerts, batches
from components.stackfile import load


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool is missing: apt-get install -y prometheus (Debian's package ships it)", pytrace=False
        )
    return found


def test_batch_alerts_are_rendered_only_where_the_service_runs():
    assert [a.name for a in alerts.batch_alerts(load("prod").spec)] == [
        "InferenceBatchStuck",
        "InferenceBatchExpired",
        "InferenceBatchServiceDown",
    ]
    assert alerts.batch_alerts(load("dev").spec) == []
    groups = alerts.prometheus_rule(load("prod").spec)["spec"]["groups"]
    assert "inferstack-batches" in [g["name"] for g in groups]


def test_promtool_fires_the_batch_alerts_as_rendered(tmp_path: Path):
    spec = load("prod").spec
    ns = spec.cluster.namespace
    stuck_minutes = spec.batch.stuck_after_minutes
    [group] = [g for g in alerts.prometheus_rule(spec)["spec"]["groups"] if g["name"] == "inferstack-batches"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [group]}))
    service = batches.name(spec)
    age = f'inferstack_batches_oldest_progress_age_seconds{{namespace="{ns}",pod="{service}-0"}}'
    expired = f'inferstack_batches_finished_total{{namespace="{ns}",pod="{service}-0",status="expired"}}'
    up = f'up{{namespace="{ns}",service="{service}"}}'
    # a batch makes no progress from minute 0 (its age grows by 60 s a minute); one batch expires at 30m;
    # the service stops answering scrapes at 120m
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": age, "values": "0+60x200"},
                    {"series": expired, "values": "0x30 1x170"},
                    {"series": up, "values": "1x120 0x80"},
                ],
                "alert_rule_test": [
                    {
                        "eval_time": f"{stuck_minutes - 1}m",
                        "alertname": "InferenceBatchStuck",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": f"{stuck_minutes + 10}m",
                        "alertname": "InferenceBatchStuck",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning"},
                                "exp_annotations": {
                                    "summary": group["rules"][0]["annotations"]["summary"],
                                    "description": group["rules"][0]["annotations"]["description"],
                                },
                            }
                        ],
                    },
                    {"eval_time": "20m", "alertname": "InferenceBatchExpired", "exp_alerts": []},
                    {
                        "eval_time": "40m",
                        "alertname": "InferenceBatchExpired",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": ns,
                                    "pod": f"{service}-0",
                                    "status": "expired",
                                },
                                "exp_annotations": {
                                    "summary": group["rules"][1]["annotations"]["summary"],
                                    "description": group["rules"][1]["annotations"]["description"],
                                },
                            }
                        ],
                    },
                    {"eval_time": "125m", "alertname": "InferenceBatchServiceDown", "exp_alerts": []},
                    {
                        "eval_time": "140m",
                        "alertname": "InferenceBatchServiceDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning"},
                                "exp_annotations": {
                                    "summary": group["rules"][2]["annotations"]["summary"],
                                    "description": group["rules"][2]["annotations"]["description"],
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    checked = subprocess.run(
        [_promtool(), "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    result = subprocess.run(
        [_promtool(), "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
