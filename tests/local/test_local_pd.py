"""`make local PD=1` (`inferstack local up --pd`): the local stack's chat model as one prefill and one decode engine,
each on its own core and KV side channel, the router pairing them; the embedding model as it was. No engine
starts here: tests/integration/test_pd_nixl.py runs the two roles for real."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from components.clouds.targets import PROFILES
from components.core.stackfile import CONFIG_KEY, Stack, validate
from components.local.autoscaler import Autoscaler
from components.local.plan import SIDE_CHANNEL_OFFSET, LocalOptions, banner, build_plan, disaggregated
from components.local.supervisor import engine_process
from tests.stacks import load

REPO = Path(__file__).resolve().parents[2]


def _pd_local() -> Stack:
    stack = load("local", REPO / "stacks")
    raw = disaggregated(stack.config[CONFIG_KEY])
    return dataclasses.replace(stack, decisions=validate(raw, "local --pd", profiles=PROFILES))


def test_pd_serves_each_generation_model_as_one_prefill_and_one_decode_engine() -> None:
    raw = yaml.safe_load((REPO / "stacks" / "Pulumi.local.yaml").read_text())["config"][CONFIG_KEY]
    doc = disaggregated(raw)
    chat, embed = doc["models"]
    assert chat["disaggregation"] == {"prefill": {"scaling": {"min_replicas": 1, "max_replicas": 1}}}
    assert (chat["scaling"]["min_replicas"], chat["scaling"]["max_replicas"]) == (1, 1)
    assert "disaggregation" not in embed
    assert "disaggregation" not in raw["models"][0]  # the stack as written is left alone


def test_the_two_roles_run_on_their_own_cores_with_their_own_side_channels_and_the_router_pairs_them(
    tmp_path: Path,
) -> None:
    plan = build_plan(_pd_local(), LocalOptions(cpus=(0, 1), engine_port=9100, pd=True), REPO)
    decode, prefill, embed = plan.engines
    assert (decode.name, prefill.name) == ("smollm2-135m-instruct-0", "smollm2-135m-instruct-prefill-0")
    assert (decode.cpu_cores, prefill.cpu_cores) == ("0", "1")
    for launch, role in ((decode, "kv_consumer"), (prefill, "kv_producer")):
        engine = engine_process(launch, tmp_path, "tag")
        args = engine.argv
        assert args[args.index("--served-model-name") + 1] == "smollm2-135m-instruct"
        assert f'"kv_role":"{role}"' in args[args.index("--kv-transfer-config") + 1]
        env = engine.environment()
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1" and env["UCX_TLS"] == "tcp"
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(launch.port + SIDE_CHANNEL_OFFSET)
    assert (
        embed.side_channel_port is None
        and "--kv-transfer-config" not in engine_process(embed, tmp_path, "t").argv
    )
    targets = {t.name: t for t in plan.config.models}
    stage = targets["smollm2-135m-instruct"].prefill
    assert stage is not None and stage.target == "smollm2-135m-instruct-prefill"
    assert [str(b.url) for b in targets["smollm2-135m-instruct-prefill"].static_backends] == [
        f"{prefill.url}/"
    ]
    assert [a.name for a in targets["smollm2-135m-instruct"].adapters] == ["smollm2-135m-instruct-lora-1"]
    assert plan.pd
    assert plan.ready_models == {"smollm2-135m-instruct", "all-minilm-l6-v2"}  # what the router lists
    (line,) = [line for line in banner(plan, 1.0, False).splitlines() if "P/D" in line]
    assert "prefill smollm2-135m-instruct-prefill-0 (http://127.0.0.1:9101)" in line
    assert "decode smollm2-135m-instruct-0 (http://127.0.0.1:9100), NixlConnector over tcp" in line


def test_without_pd_the_local_stack_is_planned_as_before() -> None:
    plan = build_plan(load("local", REPO / "stacks"), LocalOptions(cpus=(0, 1)), REPO)
    assert [e.name for e in plan.engines] == [
        "smollm2-135m-instruct-0",
        "smollm2-135m-instruct-1",
        "all-minilm-l6-v2-0",
    ]
    assert all(e.side_channel_port is None for e in plan.engines) and not plan.pd
    assert all(t.prefill is None for t in plan.config.models)


def test_the_local_autoscaler_takes_both_roles_as_fixed_engines() -> None:
    plan = build_plan(_pd_local(), LocalOptions(cpus=(0, 1), pd=True), REPO)
    assert plan.spec is not None
    scaler = Autoscaler(plan, plan.spec, make_engine=lambda launch: None, healthy=lambda url: True, say=print)  # type: ignore[arg-type,return-value]
    assert scaler.models == {}  # one decode and one prefill engine: nothing to scale
