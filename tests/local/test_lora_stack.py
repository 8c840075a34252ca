"""`make local` with a LoRA adapter, for real: a local stack whose tiny Llama has one adapter under
.cache/adapters that does not exist yet. `up` makes it (peft, random weights, seconds), starts the engine with
LoRA on, and the `openai` SDK gets different answers from the adapter and the base at temperature 0."""

from __future__ import annotations

import os
import random
import shutil
import signal
from pathlib import Path

import openai
import pytest
import yaml

from tests.local.helpers import REPO, assert_nothing_left, free_port_block, port_args, run_local, stack_pids

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

STACK = Path(__file__).with_name("stacks") / "Pulumi.lora.yaml"


def test_local_stack_makes_its_adapter_at_start_and_serves_it(
    engine_python: Path, tiny_chat_model: Path, tmp_path: Path
) -> None:
    seed = random.Random().randrange(1000, 999_999)  # a new adapter, so `up` has to make it
    adapter = f"tiny-llama-lora-{seed}"
    raw = yaml.safe_load(STACK.read_text())
    model = raw["config"]["inferstack:platform"]["models"][0]
    model["adapters"] = [{"name": adapter, "source": f"./.cache/adapters/{adapter}", "rank": 8}]
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.lora.yaml").write_text(yaml.safe_dump(raw))
    made = REPO / ".cache" / "adapters" / adapter
    state_dir = tmp_path / "state"
    base = free_port_block(5)
    up = run_local(
        "up", "--detach", "-s", "lora", "--stacks-dir", str(stacks), "--state-dir", str(state_dir),
        *port_args(base, base + 4), timeout=420,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        said = (state_dir / "logs" / "supervisor.log").read_text()
        assert f"making the random LoRA adapter {made.resolve()}" in said, said
        assert (made / "adapter_config.json").is_file()
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{base}/v1", api_key="unused", max_retries=0, timeout=120
        )
        listed = {m.id: getattr(m, "parent", None) for m in client.models.list().data}
        assert listed == {"tiny-llama": None, adapter: "tiny-llama"}

        def answer(name: str) -> str:
            done = client.completions.create(
                model=name, prompt="Once upon a time", max_tokens=10, temperature=0
            )
            return done.choices[0].text

        assert answer(adapter) != answer("tiny-llama")
    finally:
        pids = stack_pids(state_dir)
        down = run_local("down", "--state-dir", str(state_dir), timeout=120)
        for pid in stack_pids(state_dir):  # never leave an engine behind
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(made, ignore_errors=True)
    assert down.returncode == 0, down.stdout + down.stderr
    assert_nothing_left(state_dir, pids)
