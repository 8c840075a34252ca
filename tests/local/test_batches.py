"""The OpenAI Batch API against `make local`, for real: one vLLM-CPU engine serving the tiny Llama behind the
health monitor, the batch service and the router, driven with the ``openai`` SDK. The stack is
tests/local/stacks/Pulumi.batches.yaml, brought up the way the README says (`make local`, detached, on its own
ports and state dir) and down with `make local-down`.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from components.local import state
from tests.conftest import OWN_ENGINES_GROUP
from tests.local.helpers import REPO, detached_stack, free_port_block, port_args

# a make-local stack of its own, sharing no engine: beside the session engines' group (tests/conftest.py)
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group(OWN_ENGINES_GROUP), pytest.mark.timeout(1200)]

MODEL = "tiny-llama"
STACKS = REPO / "tests" / "local" / "stacks"
START_TIMEOUT_S = 900


@dataclass
class BatchStack:
    state_dir: Path
    router_url: str

    @property
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.router_url}/v1", api_key="unused", max_retries=0, timeout=60)

    def batches_pid(self) -> int:
        current = state.read_state(self.state_dir) or {}
        return next(int(p["pid"]) for p in current.get("processes", []) if p["name"] == "batches")


@pytest.fixture(scope="module")
def stack(tiny_chat_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BatchStack]:
    state_dir = tmp_path_factory.mktemp("batches") / "state"
    base = free_port_block(5)
    args = ["-s", "batches", "--stacks-dir", str(STACKS), *port_args(base, base + 4)]
    args += ["--timeout", str(START_TIMEOUT_S - 30)]
    with detached_stack(state_dir, f"LOCAL_ARGS={' '.join(args)}", timeout=START_TIMEOUT_S) as up:
        assert up.returncode == 0, f"make local failed:\n{up.stdout}\n{up.stderr}"
        assert "Batch API" in up.stdout, up.stdout  # the banner names it
        yield BatchStack(state_dir, f"http://127.0.0.1:{base}")


def _line(custom_id: str, model: str = MODEL, **body: Any) -> str:
    request = {"model": model, "messages": [{"role": "user", "content": f"Tell me about {custom_id}"}]}
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {**request, "max_tokens": 2, **body},
        }
    )


def _submit(client: openai.OpenAI, lines: list[str]) -> str:
    data = ("\n".join(lines) + "\n").encode()
    file = client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id


def _wait(client: openai.OpenAI, batch_id: str, statuses: set[str], timeout_s: float = 300) -> Any:
    deadline = time.monotonic() + timeout_s
    while (batch := client.batches.retrieve(batch_id)).status not in statuses:
        assert time.monotonic() < deadline, f"{batch_id} still {batch.status}: {batch.request_counts}"
        time.sleep(0.25)
    return batch


def _jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines() if x.strip()]


def test_a_1000_line_batch_completes_with_1000_results(stack: BatchStack) -> None:
    client = stack.client
    ids = [f"doc-{i:04d}" for i in range(1000)]
    started = time.monotonic()
    batch_id = _submit(client, [_line(i) for i in ids])
    batch = _wait(client, batch_id, {"completed", "failed", "expired", "cancelled"})
    took = time.monotonic() - started
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        1000,
        1000,
        0,
    )
    assert batch.error_file_id is None and batch.model == MODEL
    assert batch_id in [b.id for b in client.batches.list(limit=100).data]
    out = _jsonl(client, batch.output_file_id)
    assert [line["custom_id"] for line in out] == ids  # each once, in input order
    for line in out:
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and body["model"] == MODEL
        assert body["usage"]["completion_tokens"] >= 1 and isinstance(
            body["choices"][0]["message"]["content"], str
        )
    assert batch.usage is not None and batch.usage.output_tokens == sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in out
    )
    print(f"1,000-line batch through make local: {took:.1f}s")


def test_kill_9_mid_batch_and_the_restarted_service_finishes_every_line_exactly_once(
    stack: BatchStack,
) -> None:
    client = stack.client
    ids = [f"k-{i:03d}" for i in range(600)]
    batch_id = _submit(client, [_line(i, max_tokens=24, ignore_eos=True) for i in ids])
    while client.batches.retrieve(batch_id).request_counts.completed < 100:
        time.sleep(0.05)
    killed = stack.batches_pid()
    os.kill(killed, signal.SIGKILL)  # requests in flight, results not yet committed: all of it
    # the supervisor starts it again (as a StatefulSet would); it resumes from its state on disk
    deadline = time.monotonic() + 120
    while (pid := _pid_or_none(stack)) in (None, killed) or not _answers(stack):
        assert time.monotonic() < deadline, "the batch service was not started again"
        time.sleep(0.2)
    batch = _wait(client, batch_id, {"completed", "failed"})
    assert batch.status == "completed" and batch.request_counts.completed == 600
    out = _jsonl(client, batch.output_file_id)
    assert Counter(line["custom_id"] for line in out) == Counter(ids)  # every line exactly once
    assert batch.error_file_id is None
    log = (stack.state_dir / "logs" / "supervisor.log").read_text()
    assert "batches exited with code -9; starting it again" in log
    assert pid != killed


def _answers(stack: BatchStack) -> bool:
    try:
        stack.client.batches.list(limit=1)
    except openai.InternalServerError:  # 502 from the router while the service starts again
        return False
    return True


def _pid_or_none(stack: BatchStack) -> int | None:
    try:
        pid = stack.batches_pid()
    except StopIteration:
        return None
    return pid if state.pid_alive(pid) else None


def test_bad_input_gets_the_apis_own_error_shapes_and_nothing_is_lost(stack: BatchStack) -> None:
    client = stack.client
    # malformed lines: the batch fails validation, each line named; nothing runs
    bad = [
        _line("fine"),
        "{oops",
        json.dumps({"custom_id": "no-body", "method": "POST", "url": "/v1/chat/completions"}),
    ]
    failed = _wait(client, _submit(client, bad), {"failed", "completed"})
    assert failed.status == "failed"
    assert [(e.line, e.code) for e in failed.errors.data] == [(2, "invalid_json_line"), (3, "invalid_body")]
    # unknown endpoint, oversized file: 400s for the request
    file_id = client.files.create(file=("a.jsonl", io.BytesIO(_line("x").encode())), purpose="batch").id
    with pytest.raises(openai.BadRequestError) as unknown:
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/images/generations", completion_window="24h"
        )
    assert unknown.value.body["param"] == "endpoint"
    with pytest.raises(openai.BadRequestError) as oversized:
        client.files.create(file=("big.jsonl", io.BytesIO(b"x" * (1024 * 1024 + 1))), purpose="batch")
    assert oversized.value.body["code"] == "file_too_large"
    # a model the platform does not serve: refused at validation, each line named, nothing runs (#34: names
    # from input files must not grow the service's lanes and metric series)
    lines = [_line(f"ok-{i}") for i in range(3)] + [
        _line(f"nope-{i}", model="no-such-model") for i in range(2)
    ]
    mixed = _wait(client, _submit(client, lines), {"completed", "failed"})
    assert mixed.status == "failed"
    assert [(e.line, e.code) for e in mixed.errors.data] == [(4, "model_not_found"), (5, "model_not_found")]
