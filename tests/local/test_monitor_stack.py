"""Scaling you can watch, for real: `make local MONITOR=1` with a model at zero replicas, real vLLM on CPU and a
real Prometheus with the stack's rendered rules. One stack run serves every assertion, in order:

1. The model is at zero: no engine runs. The `openai` client's first requests (streamed and not) are held by
   the router while the autoscaler starts an engine, and all get a 200; the logs say what happened.
2. Load through the router; then, through Prometheus' HTTP API, every scaling trigger and every dashboard
   panel's query returns data (the panels that read cluster-only exporters are named and skipped), and the
   engine's live /metrics has every vLLM metric the engine map names.
3. The engine hangs, then dies: the engine-down alert fires, the health monitor ejects the replica, and a
   request caught in between is retried and refused (5xx, retry and ejection series). The alert's `for:` is
   5 minutes in the rule file; the stack runs with `--monitor-alert-for 2` (the only change to the cluster's
   rules), and promtool's unit tests (tests/components/test_promtool.py) hold the real duration.
4. Idle for the model's idle_before_zero_s: the autoscaler takes it back to zero, and the logs say so.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from components.local import state
from components.render import alerts, dashboards, scaling
from runtime.config import EngineKind
from runtime.engines import facts
from tests.conftest import OWN_ENGINES_GROUP
from tests.local.helpers import (
    assert_nothing_left,
    detached_stack,
    free_port_block,
    port_args,
    stack_pids,
)
from tests.stacks import load

# a make-local stack of its own, sharing no engine: beside the session engines' group (tests/conftest.py)
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group(OWN_ENGINES_GROUP), pytest.mark.timeout(900)]

STACKS = Path(__file__).with_name("stacks")
STACK = "scale-from-zero"
MODEL = "tiny-llama"
START_TIMEOUT_S = 300


@dataclass
class Monitored:
    state_dir: Path
    router: str
    prometheus: str

    @property
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.router}/v1", api_key="unused", max_retries=0, timeout=300)

    def log(self, name: str) -> str:
        return (self.state_dir / "logs" / f"{name}.log").read_text(errors="replace")

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.prometheus}/api/v1/{path}", timeout=30) as response:
            return json.load(response)["data"]


def _wait(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def monitored(
    engine_python: Path, tiny_chat_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Monitored]:
    state_dir = tmp_path_factory.mktemp("monitor") / "state"
    base = free_port_block(6)
    args = " ".join(
        [
            "-s", STACK, "--stacks-dir", str(STACKS), *port_args(base, base + 4),
            "--monitor-port", str(base + 3), "--monitor-interval", "1", "--monitor-alert-for", "2",
        ]
    )  # fmt: skip
    stack = Monitored(state_dir, f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 3}")
    with detached_stack(state_dir, "MONITOR=1", f"LOCAL_ARGS={args}", timeout=START_TIMEOUT_S) as up:
        assert up.returncode == 0, f"make local MONITOR=1 failed:\n{up.stdout}\n{up.stderr}"
        assert f"Prometheus  {stack.prometheus}" in up.stdout and "at zero     tiny-llama" in up.stdout
        pids = stack_pids(state_dir)
        yield stack
        pids |= stack_pids(state_dir)  # the engines it started on demand
    assert_nothing_left(state_dir, pids)


def _engine(stack: Monitored) -> dict[str, Any] | None:
    current = state.read_state(stack.state_dir) or {}
    return next((p for p in current.get("processes", []) if p["name"] == f"{MODEL}-0"), None)


def test_a_model_at_zero_answers_its_first_requests_with_200(monitored: Monitored) -> None:
    assert _engine(monitored) is None  # nothing runs until a request comes
    assert [m.id for m in monitored.client.models.list().data] == [MODEL]
    answers: list[Any] = []

    def chat() -> str | None:
        reply = monitored.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8
        )
        return reply.choices[0].message.content

    def stream() -> str:
        chunks = monitored.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tell me"}], max_tokens=8, stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def call(ask: Callable[[], str | None]) -> None:
        try:
            answers.append(ask())
        except openai.OpenAIError as error:  # kept, so a failure says what the client got
            answers.append(error)

    callers = [threading.Thread(target=call, args=(f,)) for f in (chat, stream, chat)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(START_TIMEOUT_S)
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers), answers  # 200s, nothing lost
    log = monitored.log("supervisor")
    assert re.search(
        r"tiny-llama: [123] requests waiting in the router, .*: scaling 0 -> 1, starting engine tiny-llama-0",
        log,
    ), log
    assert re.search(
        r"engine tiny-llama-0 ready after \d+s: it takes tiny-llama requests \(and those the router holds\)",
        log,
    ), log
    assert "tiny-llama has no ready replica: holding its requests up to 120s" in monitored.log("router")


def _drive_load(stack: Monitored) -> None:
    client = stack.client
    prefix = "You are a careful assistant. Answer briefly and precisely. " * 6
    for i in range(12):
        client.completions.create(model=MODEL, prompt=f"{prefix} question {i}", max_tokens=4)
    for _ in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "stream"}], max_tokens=16, stream=True
    ):
        pass
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)  # a rejection


#: Series that exist only once something failed: a 5xx answer, a retry, an ejection (the kill makes them).
FAILURE_SERIES = ("inferstack_router_retries_total", "inferstack_health_ejections_total", 'status=~"5.."')


def _after_failures(query: str) -> bool:
    return any(series in query for series in FAILURE_SERIES)


def _panel_queries() -> tuple[list[tuple[str, str]], list[str]]:
    stack = load(STACK, STACKS)
    checked, skipped = [], []
    for panel in dashboards.panels(stack.spec, stack.decisions.models):
        if panel.cluster_only:
            skipped.append(panel.title)
        else:
            checked += [(panel.title, expr) for expr, _ in panel.targets]
    return checked, skipped


def test_every_scaling_trigger_and_dashboard_query_returns_data(monitored: Monitored) -> None:
    _drive_load(monitored)
    stack = load(STACK, STACKS)
    spec = stack.spec
    triggers = [(t.name, t.query) for u in stack.decisions.models.values() for t in scaling.triggers(spec, u)]
    checked, skipped = _panel_queries()
    assert sorted(skipped) == ["Replicas", "Router replicas and CPU"]  # kube-state-metrics, cAdvisor
    before_kill = [(n, q) for n, q in triggers + checked if not _after_failures(q)]
    _wait(lambda: all(monitored.query(q) for _, q in before_kill), 60, "every query to return data")
    loaded = {r["name"] for g in monitored.api("rules")["groups"] for r in g["rules"]}
    assert loaded == {
        a.name for a in alerts.alerts(spec, stack.decisions.models)
    }  # the rule file, every rule
    # the engine's live exposition has every metric the engine map names for vLLM (current names)
    names = {
        r["metric"]["__name__"] for r in monitored.query('{__name__=~"vllm:.+", job="tiny-llama-engine"}')
    }
    names |= {n.removesuffix("_bucket") for n in names}
    assert {names_[0] for names_ in facts(EngineKind.VLLM).metrics.values()} <= names


def test_a_hung_then_killed_engine_fires_the_engine_down_alert(monitored: Monitored) -> None:
    """The engine hangs (SIGSTOP): scrapes and health probes time out, so the engine-down alert fires and the
    health monitor ejects it; a request sent to it meanwhile waits for a first byte. Then it dies (SIGKILL):
    that request is retried (nowhere else to go) and refused with a 502. Every series a failure makes exists."""
    engine = _engine(monitored)
    assert engine is not None
    os.killpg(engine["pid"], signal.SIGSTOP)
    outcome: list[BaseException] = []

    def stuck() -> None:
        try:
            monitored.client.completions.create(model=MODEL, prompt="still there?", max_tokens=2)
        except openai.APIError as err:
            outcome.append(err)

    caller = threading.Thread(target=stuck)
    caller.start()

    def firing() -> bool:
        return any(
            a["labels"]["alertname"] == "InferenceEngineDown"
            and a["labels"]["pod"] == f"{MODEL}-0"
            and a["state"] == "firing"
            for a in monitored.api("alerts")["alerts"]
        )

    _wait(firing, 60, "InferenceEngineDown to fire")
    _wait(
        lambda: bool(monitored.query("inferstack_health_ejections_total")),
        60,
        "the health monitor to eject it",
    )
    os.killpg(engine["pid"], signal.SIGKILL)
    caller.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], openai.InternalServerError), outcome
    checked, _ = _panel_queries()
    after_kill = [(n, q) for n, q in checked if _after_failures(q)]
    assert sorted(n for n, _ in after_kill) == [
        "5xx ratio by model",
        "Healthy replicas and ejections",
        "Retries and rejections",
    ]
    _wait(lambda: all(monitored.query(q) for _, q in after_kill), 60, "5xx, retry and ejection series")
    _wait(
        lambda: "warning: engine tiny-llama-0 exited" in monitored.log("supervisor"),
        30,
        "the exit in the log",
    )


def test_idle_for_idle_before_zero_s_scales_back_to_zero(monitored: Monitored) -> None:
    _wait(
        lambda: "scaling 1 -> 0, stopping engine tiny-llama-0" in monitored.log("supervisor"),
        120,
        "scale to zero",
    )
    assert re.search(r"tiny-llama: idle for (6\d|7\d)s: scaling 1 -> 0", monitored.log("supervisor"))
    _wait(lambda: _engine(monitored) is None, 30, "the engine to leave the state file")
    assert json.loads((monitored.state_dir / "endpoints.json").read_text()) == []
