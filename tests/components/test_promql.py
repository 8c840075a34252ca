"""Every PromQL expression we render parses with promql-parser (scaling triggers, adapter rules, alerts, dashboards)."""

from __future__ import annotations

import promql_parser
import pytest

from components.core.stackfile import STACKS_DIR, available_stacks
from components.render import observability, scaling
from components.spec import PlatformSpec
from tests.components.helpers import decided, minimal
from tests.stacks import load


def _specs() -> list[tuple[str, PlatformSpec]]:
    out = [(name, load(name).spec) for name in available_stacks(STACKS_DIR)]
    # TensorRT-LLM 1.0.0 exports no load metric for an HPA (a plan error): it scales with KEDA.
    for kind, autoscaler in (("sglang", "hpa"), ("trtllm", "keda")):
        raw = minimal()
        raw["models"][0]["engine"]["kind"] = kind
        raw["addons"] = {"autoscaler": autoscaler}
        out.append((f"minimal-{kind}-{autoscaler}", PlatformSpec.model_validate(raw)))
    return out


@pytest.mark.parametrize(("name", "spec"), _specs(), ids=[n for n, _ in _specs()])
def test_every_rendered_expression_parses(name: str, spec: PlatformSpec) -> None:
    units = decided(spec).models
    expressions = scaling.promql(spec, units) + observability.promql(spec, units)
    assert len(expressions) > 10
    for expr in expressions:
        try:
            promql_parser.parse(expr)
        except Exception as err:  # the parser raises its own error types
            pytest.fail(f"{name}: {expr!r} does not parse: {err}")
