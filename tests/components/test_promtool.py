"""Every rule and scaling query the committed stacks render, evaluated by a real Prometheus (promtool 2.42).

- ``promtool check rules`` on each stack's rule file (the groups of its PrometheusRule, the file
  ``make local MONITOR=1`` loads).
- ``promtool test rules``: each alert fires when it should (after its real ``for:``), not before, and not on a
  healthy fleet nor at its threshold; each scaling query (KEDA triggers, prometheus-adapter rules) returns the
  value its threshold is compared with, also for a model at zero replicas, where the router's waiting count
  alone must wake it (behind an inference-extension gateway: the picker's refusals; the example stack).

Input series have the shape of the real expositions: engine series are built from a capture of a real
vLLM-CPU ``/metrics`` (tests/fixtures/vllm-cpu-metrics.txt: names, label sets, histogram buckets; for an SGLang
or TensorRT-LLM model the engine's own names from ``runtime.engines`` on the same shape), router and health
monitor series from their own metrics code, and each carries the target labels a ServiceMonitor attaches.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from components.core.scaling import thresholds
from components.local import monitor
from components.render import alerts, batches, common, scaling, signals
from components.spec import ModelSpec, PlatformSpec
from runtime.config import EngineKind, RuntimeConfig
from runtime.engines import Signal, facts
from runtime.health.exposition import registry_for
from runtime.health.monitor import Monitor
from runtime.picker.metrics import PickerMetrics
from runtime.router.metrics import RouterMetrics
from tests.components.helpers import decided
from tests.stacks import load

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "tests" / "fixtures" / "vllm-cpu-metrics.txt"
EXAMPLES = REPO / "examples" / "stacks"
STACKS = [
    *sorted(
        p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (REPO / "stacks").glob("Pulumi.*.yaml")
    ),
    "inference-extension",  # the picker, not the router, counts requests behind the gateway (examples/)
]


def stack_spec(stack: str) -> PlatformSpec:
    return load(stack, EXAMPLES if stack == "inference-extension" else REPO / "stacks").spec


PER_MIN = 60  # every counter grows by 60 a minute: rates are exactly 1/s
Q = 0.95


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: run `make prometheus` (Debian's package prometheus)", pytrace=False)
    return found


# --- the shapes of real expositions -------------------------------------------------------------------------
@cache
def captured() -> dict[str, list[dict[str, str]]]:
    """Sample name -> label sets, from the real vLLM-CPU capture."""
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(CAPTURE.read_text()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def vllm_name(signal: Signal) -> str:
    return facts(EngineKind.VLLM).names(signal)[0]


def engine_shape(signal: Signal, suffix: str = "") -> dict[str, str]:
    """The label set the real engine exports a signal with (the histogram's ``le`` aside)."""
    found = captured().get(vllm_name(signal) + suffix)
    assert found, f"the vLLM capture has no {vllm_name(signal) + suffix}: is the engine map out of date?"
    return {k: v for k, v in found[0].items() if k != "le"}


def buckets(signal: Signal) -> list[float]:
    les = [s["le"] for s in captured()[vllm_name(signal) + "_bucket"]]
    return [float(le) for le in les]


def series(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def target(spec: PlatformSpec, model: ModelSpec, pod: int) -> dict[str, str]:
    labels = monitor.engine_labels(spec, model, f"{common.engine_name(model.name)}-{pod}")
    labels.pop("__metrics_path__")
    return {**labels, "instance": f"10.0.0.{pod + 10}:{common.ENGINE_PORT}"}


def runtime_target(spec: PlatformSpec, part: str) -> dict[str, str]:
    (group,) = monitor.runtime_targets(spec, [(part, 8080)])
    return {**group["labels"], "instance": f"10.0.1.1:{8080}"}


@cache
def router_shape() -> dict[str, list[str]]:
    """Metric name -> label names, from the router's own metrics (the exposition it serves)."""
    metrics = RouterMetrics()
    metrics.request("m", "http://e", 200, 0.1)
    metrics.reject("no_backend", "m")
    metrics.attach_live(lambda: {"queue_depth": [(("m",), 1.0)], "limit_store_up": [((), 1.0)]})
    return {
        s.name: sorted(s.labels)
        for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in f.samples
    }


@cache
def health_shape() -> list[str]:
    """Label names of the health monitor's ejection counter, from its own collector."""
    config = RuntimeConfig.model_validate(
        {"models": [{"name": "m", "static_backends": [{"url": "http://e:1"}]}]}
    )
    health = Monitor(config, watch=lambda _: iter(()), run_loops=False)  # type: ignore[arg-type,return-value]
    health.counters.ejections[("m", "http://e:1")] += 1
    text = generate_latest(registry_for(health)).decode()
    (labels,) = [
        sorted(s.labels)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "inferstack_health_ejections_total"
    ]
    return labels


@cache
def picker_shape() -> dict[str, list[str]]:
    """Metric name -> label names, from the endpoint picker's own metrics."""
    metrics = PickerMetrics()
    metrics.finished("m", "http://e", 200, 0.1)
    metrics.rejected("no_backend", "m")
    return {
        s.name: sorted(s.labels)
        for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in f.samples
    }


def router_series(spec: PlatformSpec, suffix: str, **labels: str) -> str:
    """A series of the front that routes (the router, or behind the gateway the picker), in its own shape."""
    name = signals.front_metric(spec, suffix)
    shape = (picker_shape if signals.front(spec) == common.PICKER else router_shape)()
    assert sorted(labels) == shape[name], (name, shape[name])
    return series(name, {**runtime_target(spec, signals.front(spec)), **labels})


def routes(spec: PlatformSpec) -> bool:
    """The router runs (it holds requests in a queue; the picker holds none)."""
    return signals.front(spec) == common.ROUTER


# --- inputs ---------------------------------------------------------------------------------------------------
@dataclass
class Inputs:
    """promtool input series, keyed by series so a scenario can replace the healthy baseline's."""

    minutes: int
    values: dict[str, str] = field(default_factory=dict)

    def constant(self, name: str, value: float) -> None:
        self.values[name] = f"{value:g}x{self.minutes}"

    def counter(self, name: str, per_min: int = PER_MIN) -> None:
        self.values[name] = f"0+{per_min}x{self.minutes}"

    def engine(self, spec: PlatformSpec, model: ModelSpec, signal: Signal, pod: int, value: float) -> None:
        name = facts(model.engine.kind).names(signal)[0]
        shape = {**engine_shape(signal), "model_name": model.name}
        self.constant(series(name, {**shape, **target(spec, model, pod)}), value)

    def histogram(self, spec: PlatformSpec, model: ModelSpec, signal: Signal, pod: int, bucket: int) -> None:
        """Every observation in ``bucket`` (an index into the captured bucket bounds), 60 a minute."""
        name = facts(model.engine.kind).names(signal)[0] + "_bucket"
        shape = {**engine_shape(signal, "_bucket"), "model_name": model.name, **target(spec, model, pod)}
        for i, le in enumerate(buckets(signal)):
            key = series(name, {**shape, "le": "+Inf" if le == float("inf") else f"{le:g}"})
            if i >= bucket:
                self.counter(key)
            else:
                self.constant(key, 0)

    def drop(self, predicate: Callable[[str], bool]) -> None:
        self.values = {k: v for k, v in self.values.items() if not predicate(k)}

    def doc(self) -> list[dict[str, str]]:
        return [{"series": k, "values": v} for k, v in self.values.items()]


def quantile_of(signal: Signal, bucket: int) -> float:
    """histogram_quantile(0.95) when every observation lies in ``bucket`` (Prometheus' interpolation)."""
    bounds = buckets(signal)
    start = bounds[bucket - 1] if bucket else 0.0
    return start + (bounds[bucket] - start) * (Q * 1.0 / 1.0)


def bucket_above(signal: Signal, seconds: float) -> int:
    """The first bucket whose observations are all slower than ``seconds``."""
    bounds = buckets(signal)
    return next(i for i in range(1, len(bounds)) if bounds[i - 1] >= seconds and bounds[i] != float("inf"))


def bucket_below(signal: Signal, seconds: float) -> int:
    """The last bucket whose observations are all at most ``seconds`` (p95 inside it stays below)."""
    bounds = buckets(signal)
    return max(i for i in range(len(bounds)) if bounds[i] <= seconds)


def pods(model: ModelSpec) -> int:
    return max(1, model.scaling.min_replicas)


def hpa_labels(spec: PlatformSpec, model: ModelSpec) -> dict[str, str]:
    """kube-state-metrics' HPA series labels (its own exposition: namespace, horizontalpodautoscaler)."""
    return {
        "namespace": spec.cluster.namespace,
        "horizontalpodautoscaler": scaling.hpa_name(spec, model),
        "job": "kube-state-metrics",
        "instance": "10.0.2.1:8080",
    }


def healthy(spec: PlatformSpec, minutes: int, only: ModelSpec | None = None) -> Inputs:
    """A fleet that should raise nothing: every replica up, queues empty, latency well inside the SLOs.
    With ``only``, the other models get just their replicas' ``up`` (their other alerts need series to fire):
    promtool evaluates every rule at every step, so a case carries no more series than it needs."""
    inputs = Inputs(minutes)
    for model in spec.models:
        for pod in range(pods(model)):
            inputs.constant(series("up", target(spec, model, pod)), 1)
            if only is not None and model is not only:
                continue
            inputs.engine(spec, model, Signal.QUEUED, pod, 0)
            inputs.engine(spec, model, Signal.RUNNING, pod, 1)
            inputs.engine(spec, model, Signal.KV_USAGE, pod, 0.25)
            for signal in (Signal.TTFT, Signal.INTER_TOKEN):
                if signals.has(model, signal) and only is None:  # a case adds the histogram it is about
                    inputs.histogram(spec, model, signal, pod, 0)
        if only is not None and model is not only:
            continue
        inputs.counter(
            router_series(
                spec,
                "requests_total",
                model=model.name,
                backend="http://10.0.0.10:8000",
                status="200",
            )
        )
        if routes(spec):
            inputs.constant(router_series(spec, "queue_depth", model=model.name), 0)
        if scaling.scales(model):
            hpa = hpa_labels(spec, model)
            inputs.constant(
                series("kube_horizontalpodautoscaler_status_current_replicas", hpa),
                model.scaling.min_replicas,
            )
            inputs.constant(
                series("kube_horizontalpodautoscaler_spec_max_replicas", hpa), model.scaling.max_replicas
            )
    for part in (signals.front(spec), common.HEALTH, *batches.parts(spec)):
        inputs.constant(series("up", runtime_target(spec, part)), 1)
    if batches.enabled(spec):  # a batch service with no batch waiting
        inputs.constant(batch_series(spec, "inferstack_batches_oldest_progress_age_seconds"), 0)
    if spec.gateway.shared_limits:
        inputs.constant(router_series(spec, "limit_store_up"), 1)
    return inputs


def batch_series(spec: PlatformSpec, name: str, **labels: str) -> str:
    return series(name, {**runtime_target(spec, batches.PART), **labels})


# --- alerts ---------------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One alert scenario: inputs, and what is firing at two times (before ``for:`` ran out, and after)."""

    name: str
    alert: alerts.Alert
    inputs: Inputs
    quiet_at: str
    fires_at: str | None
    labels: dict[str, str] = field(default_factory=dict)
    value: float = 0.0


def expected(case: Case) -> list[dict[str, Any]]:
    if case.fires_at is None:
        return []
    rule = case.alert.rule()
    labels = {**case.labels, "alertname": case.alert.name, **rule["labels"]}
    value = f"{case.value:g}"
    annotations = {}
    for key, template in rule["annotations"].items():
        text = template.replace("{{ $value | humanizePercentage }}", f"{case.value * 100:.4g}%")
        text = text.replace("{{ $value }}", value)
        for label, label_value in labels.items():
            text = text.replace(f"{{{{ $labels.{label} }}}}", label_value)
        assert "{{" not in text, f"{case.name}: template this test does not expand: {text}"
        annotations[key] = text
    return [{"exp_labels": labels, "exp_annotations": annotations}]


def model_cases(spec: PlatformSpec, model: ModelSpec, by_name: dict[str, alerts.Alert]) -> Iterator[Case]:
    t = thresholds(model)
    engine = common.engine_name(model.name)
    down = healthy(spec, 40, model)
    down.values[series("up", target(spec, model, 0))] = "1x10 0x30"
    yield Case("engine down 5m", by_name["InferenceEngineDown"], down, "14m", "20m", target(spec, model, 0))
    flapping = healthy(spec, 40, model)
    flapping.values[series("up", target(spec, model, 0))] = "1x10 0x3 1x27"
    yield Case("engine down 3m only", by_name["InferenceEngineDown"], flapping, "30m", None)
    if "InferenceEngineReplicasBelowMin" in by_name:
        short = healthy(spec, 30, model)
        short.drop(lambda k: k.startswith("up{") and f'pod="{engine}-0"' in k)
        value = pods(model) - 1
        yield Case("below min", by_name["InferenceEngineReplicasBelowMin"], short, "5m", "12m", value=value)
    for per_pod, fires in ((t.queue_per_replica * 2, "12m"), (t.queue_per_replica, None)):
        backlog = healthy(spec, 30, model)
        for pod in range(pods(model)):
            backlog.engine(spec, model, Signal.QUEUED, pod, per_pod)
        yield Case(f"queue {per_pod:g}", by_name["InferenceQueueBacklog"], backlog, "5m", fires)
    for usage, fires in ((0.95, "12m"), (alerts.KV_CACHE_ALERT_RATIO, None)):
        full = healthy(spec, 30, model)
        full.engine(spec, model, Signal.KV_USAGE, 0, usage)
        yield Case(f"kv {usage}", by_name["InferenceKVCacheNearlyFull"], full, "5m", fires)
    slo_s = model.slo.ttft_p95_ms / 1000
    if signals.has(model, Signal.TTFT):
        for short_window, _, _, for_ in alerts.BURN_WINDOWS:
            name = f"InferenceTTFTSLOBurn{short_window.upper()}"
            wait = monitor.seconds(for_) // 60
            for bucket, fires in (
                (bucket_above(Signal.TTFT, slo_s), f"{wait + 10}m"),
                (bucket_below(Signal.TTFT, slo_s), None),
            ):
                slow = healthy(spec, wait + 40, model)
                for pod in range(pods(model)):
                    slow.histogram(spec, model, Signal.TTFT, pod, bucket)
                yield Case(f"ttft bucket {bucket}", by_name[name], slow, "1m", fires)
    if signals.has(model, Signal.INTER_TOKEN):
        itl_s = model.slo.inter_token_p95_ms / 1000
        for bucket, fires in (
            (bucket_above(Signal.INTER_TOKEN, itl_s), "30m"),
            (bucket_below(Signal.INTER_TOKEN, itl_s), None),
        ):
            slow = healthy(spec, 40, model)
            for pod in range(pods(model)):
                slow.histogram(spec, model, Signal.INTER_TOKEN, pod, bucket)
            yield Case(f"itl bucket {bucket}", by_name["InferenceInterTokenSLO"], slow, "10m", fires)
    if scaling.scales(model):
        pinned = healthy(spec, 50, model)
        hpa = hpa_labels(spec, model)
        pinned.constant(series("kube_horizontalpodautoscaler_status_current_replicas", hpa), t.max_replicas)
        yield Case("pinned at max", by_name["InferenceScalingPinnedAtMax"], pinned, "20m", "40m", hpa)


def gateway_cases(spec: PlatformSpec, by_name: dict[str, alerts.Alert]) -> Iterator[Case]:
    router_gone = healthy(spec, 20, spec.models[0])
    front = signals.front(spec)
    router_gone.drop(lambda k: k == series("up", runtime_target(spec, front)))
    yield Case(f"{front} down", by_name[f"Inference{front.capitalize()}Down"], router_gone, "3m", "7m")
    model = spec.models[0].name
    for bad, good, fires in ((PER_MIN, PER_MIN, "10m"), (4, 96, None)):  # 50 %, then 4 % (under 5 %)
        errors = healthy(spec, 20, spec.models[0])
        ok = router_series(
            spec,
            "requests_total",
            model=model,
            backend="http://10.0.0.10:8000",
            status="200",
        )
        errors.counter(ok, good)
        errors.counter(
            router_series(
                spec,
                "requests_total",
                model=model,
                backend="http://10.0.0.10:8000",
                status="503",
            ),
            bad,
        )
        yield Case(
            f"5xx {bad}/{bad + good}",
            by_name[f"Inference{front.capitalize()}5xxRate"],
            errors,
            "3m",
            fires,
            {"model": model},
            0.5,
        )
    ejected = healthy(spec, 30, spec.models[0])
    assert health_shape() == ["backend", "model"]
    ejections = {**runtime_target(spec, common.HEALTH), "model": model, "backend": "http://10.0.0.10:8000"}
    ejected.values[series("inferstack_health_ejections_total", ejections)] = "_x5 0+1x25"
    yield Case("ejections", by_name["InferenceHealthEjections"], ejected, "4m", "20m", {"model": model}, 15)
    if spec.gateway.shared_limits:
        up = router_series(spec, "limit_store_up")
        pod = {"pod": runtime_target(spec, common.ROUTER)["pod"]}
        for values, fires in (("1x5 0x25", "15m"), ("1x5 0x3 1x22", None)):  # down 25 min; then 3 only
            store = healthy(spec, 30, spec.models[0])
            store.values[up] = values
            yield Case(
                f"limit store {values}",
                by_name["InferenceRateLimitStoreUnreachable"],
                store,
                "8m",
                fires,
                pod,
            )


def batch_cases(spec: PlatformSpec, by_name: dict[str, alerts.Alert]) -> Iterator[Case]:
    """A batch without progress (its age grows by 60 s a minute), a batch that expires at minute 30, and the
    service failing its scrapes from minute 10."""
    if not by_name:
        return
    minutes = spec.batch.stuck_after_minutes
    stuck = healthy(spec, minutes + 15, spec.models[0])
    stuck.values[batch_series(spec, "inferstack_batches_oldest_progress_age_seconds")] = (
        f"0+60x{minutes + 15}"
    )
    yield Case("no progress", by_name["InferenceBatchStuck"], stuck, f"{minutes - 1}m", f"{minutes + 10}m")
    expired = healthy(spec, 60, spec.models[0])
    status = {"status": "expired"}
    expired.values[batch_series(spec, "inferstack_batches_finished_total", **status)] = "0x30 1x29"
    labels = {**runtime_target(spec, batches.PART), **status}
    yield Case("expired", by_name["InferenceBatchExpired"], expired, "20m", "40m", labels)
    down = healthy(spec, 40, spec.models[0])
    down.values[series("up", runtime_target(spec, batches.PART))] = "1x10 0x29"
    yield Case("down", by_name["InferenceBatchServiceDown"], down, "15m", "25m")


def alert_tests(spec: PlatformSpec) -> list[dict[str, Any]]:
    tests = []
    quiet = healthy(spec, 75)
    units = decided(spec).models
    names = sorted({a.name for a in alerts.alerts(spec, units)})
    tests.append(
        {
            "name": "a healthy fleet raises nothing",
            "interval": "1m",
            "input_series": quiet.doc(),
            "alert_rule_test": [
                {"eval_time": t, "alertname": n, "exp_alerts": []} for n in names for t in ("30m", "70m")
            ],
        }
    )
    cases: list[Case] = []
    for model in spec.models:
        by_name = {a.name: a for a in alerts.model_alerts(spec, units[model.name])}
        cases += model_cases(spec, model, by_name)
    cases += gateway_cases(spec, {a.name: a for a in alerts.gateway_alerts(spec)})
    cases += batch_cases(spec, {a.name: a for a in alerts.batch_alerts(spec)})
    covered = {c.alert.name + (c.alert.model or "") for c in cases if c.fires_at}
    every = {a.name + (a.model or "") for a in alerts.alerts(spec, units)}
    assert covered == every, f"alerts without a firing case: {sorted(every - covered)}"
    for case in cases:
        checks = [{"eval_time": case.quiet_at, "alertname": case.alert.name, "exp_alerts": []}]
        later = case.fires_at or f"{case.inputs.minutes - 1}m"
        if case.fires_at is None:
            checks.append({"eval_time": later, "alertname": case.alert.name, "exp_alerts": []})
        else:
            checks.append({"eval_time": later, "alertname": case.alert.name, "exp_alerts": expected(case)})
        tests.append(
            {
                "name": f"{case.alert.name} {case.alert.model or ''}: {case.name}",
                "interval": "1m",
                "input_series": case.inputs.doc(),
                "alert_rule_test": checks,
            }
        )
    return tests


# --- scaling queries ------------------------------------------------------------------------------------------
def scaling_tests(spec: PlatformSpec) -> list[dict[str, Any]]:
    """Each model with two busy replicas, and each model at zero replicas with requests held in the router."""
    busy = Inputs(10)
    for model in spec.models:
        for pod, (queued, kv) in enumerate(((2, 0.25), (3, 0.75))):
            busy.constant(series("up", target(spec, model, pod)), 1)
            busy.engine(spec, model, Signal.QUEUED, pod, queued)
            busy.engine(spec, model, Signal.KV_USAGE, pod, kv)
            if signals.has(model, Signal.TTFT):
                busy.histogram(spec, model, Signal.TTFT, pod, 8)
        if routes(spec):
            busy.constant(router_series(spec, "queue_depth", model=model.name), 4)
        busy.counter(router_series(spec, "rejections_total", model=model.name, reason="no_backend"))
    zero = Inputs(10)
    for model in spec.models:  # the router holds 3 requests; the picker holds none and refuses 1 a second
        if routes(spec):
            zero.constant(router_series(spec, "queue_depth", model=model.name), 3)
        else:
            zero.counter(router_series(spec, "rejections_total", model=model.name, reason="no_backend"))
    demand_busy, demand_zero = (5.0, 3.0) if routes(spec) else (1.0, 1.0)
    want_busy = {
        "queued": 5.0,
        "router-queue": demand_busy,
        "kv-cache": 0.5,
        "ttft-p95": quantile_of(Signal.TTFT, 8),
    }
    want_zero = {"queued": None, "router-queue": demand_zero, "kv-cache": None, "ttft-p95": 0.0}
    busy_checks, zero_checks = [], []
    units = decided(spec).models
    for model in spec.models:
        for trigger in scaling.triggers(spec, units[model.name]):
            for checks, want in ((busy_checks, want_busy), (zero_checks, want_zero)):
                value = want[trigger.name]
                samples = [] if value is None else [{"labels": "{}", "value": value}]
                checks.append({"expr": trigger.query, "eval_time": "5m", "exp_samples": samples})
        for rule in scaling.adapter_rules(spec):
            metric = rule["name"]["matches"].strip("^$")
            if metric != facts(model.engine.kind).names(Signal.QUEUED)[0]:
                continue
            query = (
                rule["metricsQuery"]
                .replace("<<.Series>>", metric)
                .replace(
                    "<<.LabelMatchers>>",
                    f'namespace="{spec.cluster.namespace}",service="{common.engine_name(model.name)}"',
                )
                .replace("<<.GroupBy>>", "pod")
            )
            per_pod = [
                {"labels": f'{{pod="{common.engine_name(model.name)}-{p}"}}', "value": v}
                for p, v in ((0, 2), (1, 3))
            ]
            busy_checks.append({"expr": query, "eval_time": "5m", "exp_samples": per_pod})
    return [
        {
            "name": "scaling queries, two busy replicas",
            "interval": "1m",
            "input_series": busy.doc(),
            "promql_expr_test": busy_checks,
        },
        {
            "name": "scaling queries, at zero",
            "interval": "1m",
            "input_series": zero.doc(),
            "promql_expr_test": zero_checks,
        },
    ]


# --- the tests ------------------------------------------------------------------------------------------------
def write_rules(spec: PlatformSpec, directory: Path) -> Path:
    path = directory / "rules.yml"
    path.write_text(yaml.safe_dump(monitor.rule_file(spec, decided(spec).models), sort_keys=False))
    return path


@pytest.mark.parametrize("stack", STACKS)
def test_promtool_checks_the_rule_file(stack: str, tmp_path: Path) -> None:
    spec = stack_spec(stack)
    rules = write_rules(spec, tmp_path)
    result = subprocess.run(
        [promtool(), "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts.alerts(spec, decided(spec).models))} rules found" in result.stdout


@pytest.mark.parametrize("stack", STACKS)
def test_every_alert_and_scaling_query_under_promtool(stack: str, tmp_path: Path) -> None:
    spec = stack_spec(stack)
    write_rules(spec, tmp_path)
    doc = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": alert_tests(spec) + scaling_tests(spec),
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = subprocess.run(
        [promtool(), "test", "rules", "tests.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]


def test_the_engine_map_names_what_vllm_exports() -> None:
    """Every vLLM signal the triggers, alerts and dashboards read is in the real engine's exposition (its
    current name; the older names after it are fallbacks for older engines)."""
    exported = {name.removesuffix("_bucket") for name in captured()}
    for signal, names in facts(EngineKind.VLLM).metrics.items():
        assert names[0] in exported, f"vLLM-CPU exports no {names[0]} ({signal.value})"
    assert (
        json.dumps(engine_shape(Signal.QUEUED), sort_keys=True)
        == '{"engine": "0", "model_name": "tiny-llama"}'
    )


def test_the_engine_map_names_what_sglang_0_5_3_registers() -> None:
    """SGLang runs on GPUs only, so its names are checked against the pinned release's own source (the metric
    names its collector registers, listed with their provenance); a trigger reading a name it lacks fails."""
    listed = REPO / "tests" / "fixtures" / "sglang-0.5.3-metric-names.txt"
    registered = {line for line in listed.read_text().splitlines() if line and not line.startswith("#")}
    for signal, names in facts(EngineKind.SGLANG).metrics.items():
        assert names[0] in registered, f"SGLang 0.5.3 registers no {names[0]} ({signal.value})"
