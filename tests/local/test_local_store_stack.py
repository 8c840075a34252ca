"""`make local S3=1` end to end: the stack's models prepared into the loopback S3 store (moto), every engine
streaming its weights from there with the Run:ai streamer, and the router answering from them.

Two chat engines streaming SmolLM2 at once is the case that broke: with the streamer's defaults (8 streams,
a request retried after 1 s without a byte) the one-process store fell behind and the load failed, always
idle at 8 streams, and under the test suite's load at 2 (components/local/store.py says why).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from components.local.plan import LocalOptions, build_plan
from components.stackfile import load
from tests.conftest import OWN_ENGINES_GROUP, FreshLocalModels
from tests.local.helpers import (
    REPO,
    assert_nothing_left,
    detached_stack,
    free_port_block,
    make_target,
    port_args,
    stack_pids,
)

# Its own engines, beside the session engines' group: a stack start takes ~75 s on an idle machine.
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group(OWN_ENGINES_GROUP), pytest.mark.timeout(1500)]

START_TIMEOUT_S = 1200
PLAN = build_plan(load("local", REPO / "stacks"), LocalOptions(s3_port=9000), REPO)
CHAT = next(e.model for e in PLAN.engines if e.model.startswith("smollm2"))
EMBED = next(e.model for e in PLAN.engines if e.model.startswith("all-minilm"))


@dataclass
class StoreStack:
    state_dir: Path
    router_url: str
    pids: set[int]

    def requests(self) -> list[dict[str, object]]:
        """What the store served: one JSON line per request (method, path, status, bytes sent)."""
        lines = (self.state_dir / "logs" / "s3-requests.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def store_stack(
    fresh_local_models: FreshLocalModels, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StoreStack]:
    state_dir = tmp_path_factory.mktemp("local-s3") / "state"
    base = free_port_block(8)
    args = [*port_args(base, base + 5), "--s3-port", str(base + 4), "--timeout", str(START_TIMEOUT_S - 20)]
    with detached_stack(state_dir, "S3=1", f"LOCAL_ARGS={' '.join(args)}", timeout=START_TIMEOUT_S) as up:
        assert up.returncode == 0, f"make local S3=1 failed:\n{up.stdout}\n{up.stderr}"
        yield StoreStack(state_dir, f"http://127.0.0.1:{base}", stack_pids(state_dir))


def test_every_engine_streams_its_weights_from_the_store_and_the_router_answers(
    store_stack: StoreStack,
) -> None:
    client = openai.OpenAI(
        base_url=f"{store_stack.router_url}/v1", api_key="unused", max_retries=0, timeout=60
    )
    reply = client.chat.completions.create(
        model=CHAT, max_tokens=8, temperature=0, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert reply.choices[0].message.content
    assert len(client.embeddings.create(model=EMBED, input=["a sentence"]).data[0].embedding) == 384

    weights: dict[str, int] = {}
    for request in store_stack.requests():
        path = str(request["path"])
        if request["method"] == "GET" and path.endswith(".safetensors") and int(str(request["status"])) < 300:
            model = path.split("/models/", 1)[1].split("/", 1)[0]
            weights[model] = weights.get(model, 0) + int(str(request["bytes"]))
    shard = {p.model: sum(f.stat().st_size for f in p.path.glob("*.safetensors")) for p in PLAN.models}
    chat_engines = sum(1 for e in PLAN.engines if e.model == CHAT)
    assert chat_engines == 2
    # Each engine read the whole of its weights from the store (retried ranges may add to it).
    assert weights[CHAT] >= chat_engines * shard[CHAT] > 0
    assert weights[EMBED] >= shard[EMBED] > 0


def test_down_stops_the_store_with_the_rest(store_stack: StoreStack) -> None:
    pids = stack_pids(store_stack.state_dir) | store_stack.pids
    down = make_target("local-down", f"LOCAL_STATE={store_stack.state_dir}", timeout=120)
    assert down.returncode == 0 and "no process left" in down.stdout, down.stdout + down.stderr
    assert "model store stopped" in (store_stack.state_dir / "logs" / "supervisor.log").read_text()
    assert_nothing_left(store_stack.state_dir, pids)
