"""A multi-node replica, for real: the tiny Llama split into two pipeline stages, each in its own vLLM-CPU process
(a leader and a headless worker, as two pods of a LeaderWorkerSet group would run), talking over gloo on loopback,
with the command lines the cluster renders (``engine_args.group_command``) and a router in front of the leader.

Each member gets what LWS gives a pod: its rank, and the leader's address as a host name ("localhost" here, the
leader's DNS name in a pod); ``VLLM_HOST_IP`` is the member's own address, as the rendered pod's status.podIP.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from components.local.engine_process import EngineProcess
from components.render.engine_args import LEADER_RANK, GroupMember
from components.spec import ModelSpec
from runtime.engines import VLLM_CLI
from tests.conftest import LOGS_DIR, OWN_ENGINES_GROUP
from tests.runtime.router.harness import LoopThread, RouterUnderTest

# engines of its own, none shared: beside the session engines' group (tests/conftest.py)
# A compiled two-process start counts against the test's timeout: room for it on a crowded machine.
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group(OWN_ENGINES_GROUP), pytest.mark.timeout(1200)]

NODES = 2
SERVED = "tiny-group"


def group_spec(model_dir: Path) -> ModelSpec:
    """What a stack says for a two-node group of one-GPU nodes: pipeline parallel 2, one stage a node. Not
    eager: in vLLM-CPU 0.32 an eager pipeline's later stage never allocates its intermediate tensors (an
    assertion at the first request); the compiled warm-up does."""
    return ModelSpec.model_validate(
        {
            "name": SERVED,
            "source": str(model_dir),
            "engine": {
                "tensor_parallel_size": 1,
                "pipeline_parallel_size": NODES,
                "nodes": NODES,
                "dtype": "bfloat16",
                "max_model_len": 512,
                "max_num_seqs": 16,
            },
        }
    )


@pytest.fixture(scope="module")
def group(tiny_chat_model: Path) -> Iterator[tuple[EngineProcess, EngineProcess]]:
    spec = group_spec(tiny_chat_model)
    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    leader = EngineProcess(
        spec,
        tiny_chat_model,
        served_model_name=SERVED,
        cpu_cores="0",
        group=GroupMember(NODES, LEADER_RANK, "localhost"),
        log_path=LOGS_DIR / "group-leader.log",
    )
    worker = EngineProcess(
        spec,
        tiny_chat_model,
        served_model_name=SERVED,
        cpu_cores="1",
        group=GroupMember(NODES, "1", "localhost"),
        log_path=LOGS_DIR / "group-worker.log",
    )
    try:
        leader.start()
        worker.start()
        leader.wait_ready(900)
        yield leader, worker
    finally:
        worker.stop()
        leader.stop()


def test_the_members_run_the_rendered_group_command_lines(group: tuple[EngineProcess, EngineProcess]) -> None:
    leader, worker = group
    rendezvous = ["--master-addr", "localhost", "--master-port", str(VLLM_CLI.rendezvous_port)]
    assert leader.argv[-8:] == ["--nnodes", "2", "--node-rank", "0", *rendezvous]
    assert worker.argv[-9:] == ["--nnodes", "2", "--node-rank", "1", *rendezvous, "--headless"]
    assert "--pipeline-parallel-size" in leader.argv and worker.running()


def test_the_group_serves_a_completion_through_the_router(group: tuple[EngineProcess, EngineProcess]) -> None:
    leader, worker = group
    lt = LoopThread()
    config = {
        "models": [
            {"name": SERVED, "static_backends": [{"url": leader.base_url}], "max_model_len_tokens": 512}
        ],
        "router": {"host": "127.0.0.1", "port": 8080, "probe_interval_ms": 500},
    }
    router = RouterUnderTest(lt, config).start()
    try:
        client = openai.OpenAI(base_url=f"{router.base}/v1", api_key="unused", max_retries=0, timeout=120)
        done = client.completions.create(
            model=SERVED,
            prompt="once upon a time",
            max_tokens=8,
            temperature=0,
            extra_body={"ignore_eos": True},  # greedy random weights may pick an end token first on some CPUs
        )
        assert done.usage is not None and done.usage.completion_tokens == 8
        assert done.choices[0].text
        # Both stages did the work: the leader runs pipeline stage 0 and the worker stage 1 of a 2-stage engine.
        # A two-stage engine ("-pp2-" in vLLM's fingerprint) whose stage 1 is the worker process: it joined the
        # leader's group as the headless executor of node rank 1, and stays up while the group serves.
        assert f"-pp{NODES}-" in (done.system_fingerprint or ""), done.system_fingerprint
        assert "headless multiproc executor" in worker.log_tail(400)
        assert worker.running()
    finally:
        router.stop()
        lt.stop()
