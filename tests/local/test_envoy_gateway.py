"""`make local GATEWAY=envoy` (`inferstack local up --gateway envoy`) with stand-in engines: a real Envoy on
the OpenAI port asks the endpoint picker for every request; the openai SDK gets chat and embeddings, a
replica killed is routed around, and `down` leaves no process (Envoy included)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import openai

from components.local import state
from tests.local.helpers import assert_nothing_left, free_port_block, run_local, stack_pids
from tests.local.test_lifecycle import fake  # the stand-in stack (a fixture, used by name)

__all__ = ["fake"]


def test_envoy_gateway_serves_routes_around_a_dead_replica_and_stops_clean(fake, tmp_path: Path) -> None:
    args, env, state_dir = fake
    picker = free_port_block(2)
    up = run_local(
        "up", "--detach", "--gateway", "envoy", "--picker-port", str(picker), *args, env=env, timeout=240
    )
    assert up.returncode == 0, up.stdout + up.stderr
    current = state.read_state(state_dir)
    assert current is not None and current["phase"] == "ready"
    assert "behind Envoy and the endpoint picker" in up.stdout and f"127.0.0.1:{picker}/metrics" in up.stdout
    names = [p["name"] for p in current["processes"]]
    assert "envoy" in names and "picker" in names and "router" not in names and "batcher" not in names
    rendered = json.loads((state_dir / "envoy.yaml").read_text())
    assert rendered["static_resources"]["listeners"][0]["address"]["socket_address"]["address"] == "127.0.0.1"
    pids = stack_pids(state_dir)
    port = args[args.index("--port") + 1]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    try:
        assert {m.id for m in client.models.list()} == {"smollm2-135m-instruct", "all-minilm-l6-v2"}
        chat = [{"role": "user", "content": "hi"}]
        engines = sorted(p["port"] for p in current["processes"] if p["name"].startswith("smollm2"))
        replies: set[str | None] = set()
        for _ in range(64):  # short prompts share no prefix: load decides, ties at random, so both serve
            reply = client.chat.completions.create(model="smollm2-135m-instruct", messages=chat)
            replies.add(reply.choices[0].message.content)
            if len(replies) == 2:
                break
        assert replies == {f"port {p}" for p in engines}  # both replicas, by the picker's choice
        assert client.embeddings.create(model="all-minilm-l6-v2", input=["x"]).data[0].embedding == [0.6, 0.8]
        dead = next(p for p in current["processes"] if p["name"] == "smollm2-135m-instruct-0")
        os.killpg(dead["pid"], signal.SIGKILL)
        for _ in range(6):  # at once: the picker's fallback endpoint takes what the dead one cannot
            reply = client.chat.completions.create(model="smollm2-135m-instruct", messages=chat)
            assert reply.choices[0].message.content == f"port {engines[1]}"
    finally:
        down = run_local("down", "--state-dir", str(state_dir), env=env)
    assert down.returncode == 0 and "no process left" in down.stdout
    assert_nothing_left(state_dir, pids)
