"""The batch service's alerts exist only where it runs. Prometheus' own rule engine evaluates them with every
other alert (tests/components/test_promtool.py: the stuck-batch alert after the rendered threshold plus its
`for`, the expiry alert on an expired batch, the down alert when the service fails its scrapes)."""

from __future__ import annotations

from components.render import alerts
from tests.stacks import load


def test_batch_alerts_are_rendered_only_where_the_service_runs():
    assert [a.name for a in alerts.batch_alerts(load("prod").spec)] == [
        "InferenceBatchStuck",
        "InferenceBatchExpired",
        "InferenceBatchServiceDown",
    ]
    assert alerts.batch_alerts(load("dev").spec) == []
    prod = load("prod")
    groups = alerts.prometheus_rule(prod.spec, prod.decisions.models)["spec"]["groups"]
    assert "inferstack-batches" in [g["name"] for g in groups]
