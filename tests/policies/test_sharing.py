"""The shared-GPU and sleep rules on the committed shared stack, and on one mistake at a time."""

from __future__ import annotations

from typing import Any

from components.core import nodes
from tests.policies.helpers import container, crossguard, k8s, mutate, rendered

STACK = "shared"
PROD = {"environments": ["dev"]}  # the shared stack is dev: judge it as if dev were prod


def _set_arg(flag: str, value: str) -> Any:
    def change(props: dict[str, Any]) -> None:
        args = container(props, "engine")["args"]
        args[args.index(flag) + 1] = value

    return change


def test_the_shared_stack_passes_every_sharing_rule() -> None:
    resources = rendered(STACK)
    for rule in ("shared-gpu-memory-within-limits", "sleep-only-where-supported"):
        assert crossguard(rule, resources) == []
    # its time-sliced pool holds one team only, so even as prod it passes
    assert crossguard("shared-gpu-across-teams-only-with-mig", resources, PROD) == []


def test_two_teams_time_slicing_one_gpu_in_prod_is_refused_and_mig_is_not() -> None:
    resources = rendered(STACK)

    def other_team(props: dict[str, Any]) -> None:
        props["spec"]["template"]["metadata"]["labels"][nodes.TEAM_LABEL] = "ads"

    mixed = mutate(resources, k8s("Deployment", "bge-m3-engine"), other_team)
    [message] = crossguard("shared-gpu-across-teams-only-with-mig", mixed, PROD)
    assert "pool l40s-shared" in message and "bge-m3-engine (ads)" in message and "MIG" in message
    assert crossguard("shared-gpu-across-teams-only-with-mig", mixed) == []  # dev is not prod
    # the MIG pool already mixes teams (support, research): isolated, so allowed
    assert {"support", "research"} <= {
        r.props["spec"]["template"]["metadata"]["labels"].get(nodes.TEAM_LABEL)
        for r in resources
        if r.kind == "Deployment" and r.k8s_name in ("qwen-7b-engine", "llama-3-1b-engine")
    }


def test_time_sliced_memory_over_the_limit_is_refused() -> None:
    resources = rendered(STACK)
    greedy = mutate(
        resources, k8s("Deployment", "bge-m3-engine"), _set_arg("--gpu-memory-utilization", "0.6")
    )
    [message] = crossguard("shared-gpu-memory-within-limits", greedy)
    assert (
        "2 engines share each GPU" in message
        and "1.20 of its memory" in message
        and "at most 0.45" in message
    )


def test_sleep_on_cpu_on_an_old_image_or_without_its_endpoints_is_refused() -> None:
    resources = rendered(STACK)
    select = k8s("Deployment", "qwen-7b-engine")

    def old_and_silent(props: dict[str, Any]) -> None:
        engine = container(props, "engine")
        engine["image"] = "vllm/vllm-openai:v0.9.2"
        engine["env"] = [e for e in engine["env"] if e["name"] != "VLLM_SERVER_DEV_MODE"]

    messages = crossguard("sleep-only-where-supported", mutate(resources, select, old_and_silent))
    assert len(messages) == 2
    assert any("older than vLLM 0.10.1" in m for m in messages)
    assert any("without VLLM_SERVER_DEV_MODE=1" in m for m in messages)

    def on_cpu(props: dict[str, Any]) -> None:
        engine = container(props, "engine")
        for where in ("requests", "limits"):
            engine["resources"][where].pop("nvidia.com/mig-3g.40gb")

    [message] = crossguard("sleep-only-where-supported", mutate(resources, select, on_cpu))
    assert "has no GPU" in message and "gpu only" in message


def test_shared_engines_are_judged_by_the_gpu_rules_too() -> None:
    """A time slice or a MIG instance is a GPU to the fit and placement rules: its memory (the MIG instance's
    own) and its pool's taints."""
    resources = rendered(STACK)
    # 0.3 of a whole H100 (23.9 GiB) would hold the 7B's 14 GiB of weights; 0.3 of its 3g.40gb instance does not
    squeezed = mutate(
        resources, k8s("Deployment", "qwen-7b-engine"), _set_arg("--gpu-memory-utilization", "0.3")
    )
    [message] = crossguard("engine-model-fits-gpus", squeezed)
    assert (
        "qwen-7b-engine" in message and "does not fit its H100 MIG 3g.40gb instance of p5.48xlarge" in message
    )
    sliced = mutate(
        resources, k8s("Deployment", "bge-m3-engine"), _set_arg("--gpu-memory-utilization", "0.05")
    )
    [message] = crossguard("engine-model-fits-gpus", sliced)
    assert "bge-m3-engine" in message and "the L40S GPUs of g6e.xlarge" in message

    def no_toleration(props: dict[str, Any]) -> None:
        props["spec"]["template"]["spec"]["tolerations"] = []

    [message] = crossguard(
        "engine-tolerates-pool-taint",
        mutate(resources, k8s("Deployment", "llama-3-1b-engine"), no_toleration),
    )
    assert "llama-3-1b-engine" in message
