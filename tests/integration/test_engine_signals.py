"""vLLM's signal map against a real engine: every metric the renderers and runtime services read exists.

The shared session engines (``vllm_chat_pair``) answer ``/metrics``; every current name in vLLM's row of
``runtime.engines`` must be in it, and every engine metric a scaling trigger, prometheus-adapter rule, alert
or dashboard reads for a vLLM model must be one of those names (older aliases only beside their current
name). SGLang's and TensorRT-LLM's rows are checked against their pinned sources (cited in the table).
"""

from __future__ import annotations

import urllib.request

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from components.spec import PlatformSpec
from runtime.config import EngineKind
from runtime.engines import facts
from tests.components.helpers import OTHER_SOURCES, engine_name_of, metric_names, minimal, model_queries

pytestmark = pytest.mark.engine


def _sample_names(base_url: str) -> set[str]:
    with urllib.request.urlopen(f"{base_url}{facts(EngineKind.VLLM).metrics_path}", timeout=30) as response:
        text = response.read().decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def _exported(name: str, samples: set[str]) -> bool:
    """A table name is exported as itself (gauges, counters) or as a histogram's buckets."""
    return name in samples or f"{name}_bucket" in samples


@pytest.mark.engine
def test_every_vllm_metric_we_read_is_in_a_real_engines_exposition(vllm_chat_pair) -> None:
    base_url = vllm_chat_pair.base_urls[0]
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    client.completions.create(model=vllm_chat_pair.model, prompt="Count to three:", max_tokens=4)
    samples = _sample_names(base_url)
    table = facts(EngineKind.VLLM).metrics
    missing = [names[0] for names in table.values() if not _exported(names[0], samples)]
    assert not missing, f"vLLM exports none of {missing}; its /metrics has {sorted(samples)}"
    current = {names[0] for names in table.values()}
    aliases = {alias: names[0] for names in table.values() for alias in names[1:]}
    for autoscaler in ("keda", "hpa"):
        raw = minimal()
        raw["addons"] = {"autoscaler": autoscaler}
        spec = PlatformSpec.model_validate(raw)
        model = spec.models[0]
        for source, exprs in model_queries(spec, model).items():
            for expr in exprs:
                read = {engine_name_of(n) for n in metric_names(expr) if not OTHER_SOURCES.match(n)}
                for name in read:
                    assert name in current or aliases.get(name) in read, (
                        f"{autoscaler} {source} reads {name}, which vLLM 0.32 does not export: {expr}"
                    )
