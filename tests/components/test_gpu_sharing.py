"""Shared GPUs end to end: placement, plan errors for bad shares, cost, and the rendered device plugin config
and engine requests (kubernetes-validate, and the device plugin's own config rules)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import kubernetes_validate
import pytest
import yaml

from components.base import catalog
from components.base.problems import SpecError
from components.core import nodes, placement
from components.core.cost import model_cost
from components.core.decisions import decide
from components.render import addons, engine
from components.render.engine_args import vllm
from components.spec import PlatformSpec
from tests.components.helpers import LLAMA_8B_COMMIT, OWN_STORE, SOME_COMMIT
from tests.stacks import load as load_stack

BASE: dict[str, Any] = {
    "environment": "dev",
    "target": "kubernetes",
    "model_store": OWN_STORE,
    "gpu_pools": [{"name": "l40s", "instance_type": "g6e.xlarge", "sharing": "time-slicing"}],
    "models": [
        {
            "name": "embed",
            "source": "BAAI/bge-m3",
            "revision": SOME_COMMIT,
            "pool": "l40s",
            "gpu_share": {"fraction": 0.25},
            "engine": {"max_model_len": 8192, "max_num_seqs": 32},
        },
        {
            "name": "chat",
            "source": "meta-llama/Llama-3.1-8B-Instruct",
            "revision": LLAMA_8B_COMMIT,
            "pool": "l40s",
            "gpu_share": {"fraction": 0.5},
            "engine": {"max_model_len": 8192, "max_num_seqs": 32},
            "scaling": {"min_replicas": 1, "max_replicas": 3},
        },
    ],
}


def _spec(**changes: Any) -> PlatformSpec:
    raw = copy.deepcopy(BASE)
    for key, value in changes.items():
        raw[key] = value
    return PlatformSpec.model_validate(raw)


def _problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as caught:
        placement.place(PlatformSpec.model_validate(raw))
    return [(p.path, p.message) for p in caught.value.problems]


def test_time_sliced_models_pack_two_per_gpu_with_derived_memory() -> None:
    spec = _spec()
    layout = placement.place(spec)
    pool = layout.pools["l40s"]
    assert pool.packing is not None and pool.packing.slots_per_gpu == 2  # 1 / the largest fraction (0.5)
    # 1 embed + 3 chat replicas at max, two per GPU, one GPU per g6e.xlarge node
    assert len(pool.packing.gpus) == 2 and pool.max_nodes == 2
    args = vllm(spec.models[1]).args
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.45"  # 0.5 of the 0.9 safe total
    chat = model_cost(spec, layout, "chat", catalog.EC2_PRICES)
    assert chat.usd_per_replica_month == pytest.approx(chat.unshared_usd_per_replica_month / 2)
    assert chat.sharing_saves_usd_month == pytest.approx(chat.usd_per_replica_month * 3)


def test_a_share_that_does_not_fit_names_the_fraction_that_would() -> None:
    raw = copy.deepcopy(BASE)
    raw["models"][1]["gpu_share"]["fraction"] = 0.3
    [(path, message)] = _problems(raw)
    assert path == "models[1].gpu_share.fraction"
    assert "does not fit 0.3 of a L40S" in message and "at least 0.5 of a L40S" in message


def test_mig_on_a_gpu_without_it_is_one_error_naming_the_gpus_that_have_it() -> None:
    raw = copy.deepcopy(BASE)
    raw["gpu_pools"][0]["sharing"] = "mig"
    for m in raw["models"]:
        m["gpu_share"] = {"mig_profile": "1g.10gb"}
    problems = _problems(raw)
    assert problems[0][0] == "models[0].gpu_share.mig_profile"
    assert "L40S (g6e.xlarge) has no MIG" in problems[0][1] and "H100" in problems[0][1]


def test_a_mig_profile_too_small_names_the_smallest_that_holds_it() -> None:
    raw = copy.deepcopy(BASE)
    raw["gpu_pools"] = [{"name": "h100", "instance_type": "p5.48xlarge", "sharing": "mig"}]
    raw["models"] = [{**raw["models"][1], "pool": "h100", "gpu_share": {"mig_profile": "1g.10gb"}}]
    [(path, message)] = _problems(raw)
    assert path == "models[0].gpu_share.mig_profile"
    assert "the smallest that holds it is 3g.40gb" in message
    raw["models"][0]["gpu_share"]["mig_profile"] = "2g.99gb"
    [(path, message)] = _problems(raw)
    assert "H100 has no MIG profile '2g.99gb'; its profiles are 1g.10gb, 1g.20gb" in message


def test_fractions_summing_over_the_gpu_are_one_error_naming_what_fits() -> None:
    raw = copy.deepcopy(BASE)
    raw["gpu_pools"][0]["engines_per_gpu"] = 3
    [(path, message)] = _problems(raw)
    assert path == "gpu_pools[0].engines_per_gpu"
    assert "1.50 of its memory" in message and "at most 2" in message and "at most 0.333" in message


def test_sleep_on_an_engine_without_it_is_one_error_naming_what_has_it() -> None:
    raw = copy.deepcopy(BASE)
    raw["models"][1]["engine"]["kind"] = "sglang"
    raw["models"][1]["scaling"]["sleep_after_idle_s"] = 300
    with pytest.raises(
        ValueError, match=r"sleep_after_idle_s: SGLang on gpu has no sleep mode \(supported: vLLM on gpu\)"
    ):
        PlatformSpec.model_validate(raw)


def test_pools_and_shares_must_match() -> None:
    raw = copy.deepcopy(BASE)
    raw["models"].append(
        {
            "name": "whole",
            "source": "meta-llama/Llama-3.1-8B-Instruct",
            "revision": LLAMA_8B_COMMIT,
            "pool": "l40s",
        }
    )
    raw["models"][0]["gpu_share"] = {"mig_profile": "1g.10gb"}
    problems = dict(_problems(raw))
    assert (
        "a gpu_share.mig_profile needs a pool with sharing mig" in problems["models[0].gpu_share.mig_profile"]
    )
    assert "needs whole GPUs" in problems["models[2].pool"]


def test_shared_pools_need_the_device_plugin_this_stack_configures() -> None:
    raw = copy.deepcopy(BASE)
    raw["addons"] = {"gpu_plugin": "gpu-operator"}
    [(path, _)] = _problems(raw)
    assert path == "addons.gpu_plugin"


# -- rendering ---------------------------------------------------------------------------------------------
_MIG_STRATEGIES = {"none", "single", "mixed"}


def _check_device_plugin_config(cfg: dict[str, Any]) -> None:
    """The rules the device plugin applies when it reads a config (k8s-device-plugin api/config/v1: config.go,
    flags.go, replicas.go at v0.17.1): version v1, a known MIG strategy, time-slicing with at least one resource,
    each named and with replicas > 0, devices 'all' when absent, no strategy other than the default."""
    assert set(cfg) <= {"version", "flags", "sharing", "resources", "imex"}
    assert cfg["version"] == "v1"
    assert cfg["flags"]["migStrategy"] in _MIG_STRATEGIES
    sharing = cfg.get("sharing")
    if sharing is None:
        return
    assert set(sharing) <= {"timeSlicing", "mps"}
    ts = sharing["timeSlicing"]
    assert set(ts) <= {"strategy", "renameByDefault", "failRequestsGreaterThanOne", "resources"}
    assert ts.get("strategy", "") == ""
    assert ts["resources"]
    for res in ts["resources"]:
        assert set(res) <= {"name", "rename", "devices", "replicas"}
        assert res["name"] == nodes.GPU_RESOURCE and isinstance(res["replicas"], int) and res["replicas"] > 0


def test_device_plugin_gets_one_config_per_shared_pool_and_nodes_select_it() -> None:
    stack = load_stack("shared")
    spec, layout = stack.spec, stack.layout
    release = addons.device_plugin(spec)
    config = release.values["config"]
    assert config["default"] == "default"
    parsed = {name: yaml.safe_load(text) for name, text in config["map"].items()}
    for cfg in parsed.values():
        _check_device_plugin_config(cfg)
    ts = parsed["pool-l40s-shared"]["sharing"]["timeSlicing"]
    assert ts["resources"] == [{"name": "nvidia.com/gpu", "replicas": 2}] and ts["renameByDefault"] is True
    assert parsed["pool-h100-mig"]["flags"]["migStrategy"] == "mixed"
    for pool in layout.pools.values():
        assert nodes.gpu_node_labels(pool)[nodes.DEVICE_PLUGIN_CONFIG_LABEL] == f"pool-{pool.name}"
    assert release.version == spec.addons.versions.nvidia_device_plugin == "0.17.1"


def test_a_stack_without_sharing_keeps_the_chart_default_config() -> None:
    raw = copy.deepcopy(BASE)
    raw["gpu_pools"][0]["sharing"] = "none"
    for m in raw["models"]:
        m.pop("gpu_share")
    assert "config" not in addons.device_plugin(PlatformSpec.model_validate(raw)).values


def test_engines_request_one_slice_or_one_mig_instance_and_pass_strict_validation() -> None:
    stack = load_stack("shared")
    spec = stack.spec
    wanted = {
        "bge-m3": "nvidia.com/gpu.shared",
        "llama-3-8b": "nvidia.com/gpu.shared",
        "qwen-7b": "nvidia.com/mig-3g.40gb",
        "llama-3-1b": "nvidia.com/mig-1g.10gb",
    }
    for model in spec.models:
        deployment = engine.deployment(spec, stack.decisions.models[model.name])
        kubernetes_validate.validate(deployment, f"{spec.cluster.kubernetes_version}.0", strict=True)
        [container] = [
            c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "engine"
        ]
        limits = container["resources"]["limits"]
        assert {k: v for k, v in limits.items() if k.startswith("nvidia.com/")} == {wanted[model.name]: "1"}
    sleeper = next(m for m in spec.models if m.name == "qwen-7b")
    cmd = vllm(sleeper)
    assert "--enable-sleep-mode" in cmd.args and cmd.env["VLLM_SERVER_DEV_MODE"] == "1"


def test_inferstack_size_shows_the_shares_plan_would_suggest() -> None:
    """`inferstack size` and plan's errors name the same smallest share (one function, packing's)."""
    from typer.testing import CliRunner

    from components.cli.main import app, share_rows

    spec = _spec()
    chat = spec.models[1]
    arch = chat.arch()
    assert arch is not None
    # a MIG instance is a GPU of its own: the engine keeps its gpu_memory_utilization (0.9) there
    shape = dataclasses.replace(placement.engine_shape(chat), gpu_memory_utilization=0.9)
    rows = {gpu: (fraction, mig) for gpu, fraction, mig in share_rows(arch, shape)}
    assert rows["L40S"] == ("0.5", "no MIG")  # the fraction the 0.3 error above asks for
    assert rows["H100"][1] == "3g.40gb"  # the profile the 1g.10gb error above asks for
    result = CliRunner().invoke(app, ["size", "llama-3.1-8b", "--max-num-seqs", "32"])
    assert result.exit_code == 0 and "Or a share of one GPU" in result.output and "3g.40gb" in result.output


def test_a_cpu_engine_shares_memory_only_on_target_local() -> None:
    raw = copy.deepcopy(BASE)
    raw["models"].append(
        {
            "name": "cpu",
            "source": "BAAI/bge-m3",
            "revision": SOME_COMMIT,
            "engine": {"device": "cpu"},
            "gpu_share": {"fraction": 0.5},
        }
    )
    [(path, message)] = _problems(raw)
    assert path == "models[2].gpu_share" and "target local" in message


def test_a_sleeping_replica_must_find_room_for_its_weights_in_host_memory() -> None:
    """Sleep level 1 parks the weights in host memory: the engine asks for them, and a share of a small node that
    cannot hold them is one plan error."""
    raw = copy.deepcopy(BASE)
    raw["models"][1]["scaling"]["sleep_after_idle_s"] = 300
    [(path, message)] = _problems(raw)
    assert path == "models[1].scaling.sleep_after_idle_s"
    assert (
        "weights (15.0 GiB)" in message
        and "needs 31 GiB" in message
        and "gets 14 GiB of g6e.xlarge" in message
    )
    raw["gpu_pools"][0]["instance_type"] = "g6e.4xlarge"  # 128 GiB: half of it holds them
    spec = PlatformSpec.model_validate(raw)
    layout = placement.place(spec)
    chat = spec.models[1]
    deployment = engine.deployment(spec, decide(spec, layout).models[chat.name])
    [container] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "engine"]
    assert (
        container["resources"]["requests"]["memory"] == f"{57 * 1024}Mi"
    )  # its share, above the 31 it needs


def _user_data_scripts(stack: str) -> dict[str, list[str]]:
    """Each launch template's shell parts of its (MIME multipart) user data, by template name."""
    import base64

    from tests.stacks import synthesized

    out: dict[str, list[str]] = {}
    for r in synthesized(stack).resources:
        if r.type != "aws:ec2/launchTemplate:LaunchTemplate" or not r.inputs.get("userData"):
            continue
        text = base64.b64decode(r.inputs["userData"]).decode()
        parts = [p.split("\n\n", 1)[1] for p in text.split("--==INFERSTACK==")[1:-1]]
        out[r.name] = [p for p in parts if p.startswith("#!/bin/bash")]
    return out


def test_the_mig_pool_is_cut_at_boot_into_the_instances_its_engines_request() -> None:
    """The device plugin's mixed strategy advertises only instances that exist, and nothing cut the shared stack's
    H100s: its MIG models stayed Pending for their whole budget, and a node repair brought back uncut nodes. The
    pool's user data now installs a unit that cuts each GPU as the placement laid it out, before kubelet."""
    import re
    import subprocess

    from components.render import mig

    stack = load_stack("shared")
    pool = stack.layout.pools["h100-mig"]
    assert pool.packing is not None and pool.packing.node_layout is not None
    scripts = _user_data_scripts("shared")
    [boot] = [s for s in scripts["inferstack-dev-h100-mig"] if mig.MARKER in s]
    assert not any(mig.MARKER in s for s in scripts.get("inferstack-dev-l40s-shared", []))  # time-sliced
    subprocess.run(["bash", "-n"], input=boot, text=True, check=True)
    applied = boot.split("<<'INFERSTACK_MIG_SCRIPT'\n", 1)[1].split("INFERSTACK_MIG_SCRIPT\n", 1)[0]
    subprocess.run(["bash", "-n"], input=applied, text=True, check=True)
    created = {
        int(gpu): sorted(profiles.split(","))
        for gpu, profiles in re.findall(r"nvidia-smi mig -i (\d+) -cgi (\S+) -C", applied)
    }
    wanted = {
        i: sorted(seat.profile for seat in load.seats if seat.profile is not None)
        for i, load in enumerate(pool.packing.node_layout)
    }
    assert created == wanted
    for gpu in wanted:
        assert f"nvidia-smi -i {gpu} -mig 1" in applied
    for gpu in range(len(wanted), pool.instance.gpus):
        assert f"nvidia-smi -i {gpu} -mig 0" in applied  # the rest stay whole
    unit = boot.split("<<'INFERSTACK_MIG_UNIT'\n", 1)[1]
    assert "Before=nodeadm-run.service" in unit and "After=nvidia-kmod-load.service" in unit
    assert f"systemctl enable --now {mig.UNIT}" in boot  # first boot; enabled for every boot after


def test_time_sliced_engines_on_one_pool_start_one_after_another() -> None:
    """Two time-sliced vLLM engines profiling one GPU's memory at the same moment each count the other's load
    against their KV cache: the shared stack's engines on l40s-shared now start in turn, and the plan says what
    that does not cover."""
    from components.cli import report
    from tests.stacks import synthesized

    synthesis = synthesized("shared")
    engines = {
        r.inputs["metadata"]["name"]: r
        for r in synthesis.resources
        if r.type == "kubernetes:apps/v1:Deployment" and r.inputs["metadata"]["name"].endswith("-engine")
    }
    assert engines["bge-m3-engine"].urn in synthesis.waits_for(engines["llama-3-8b-engine"])
    assert engines["llama-3-8b-engine"].urn not in synthesis.waits_for(engines["bge-m3-engine"])
    # MIG instances are isolated: those engines start side by side.
    assert engines["qwen-7b-engine"].urn not in synthesis.waits_for(engines["llama-3-1b-engine"])
    stack = load_stack("shared")
    text = "\n".join(report.plan_report(stack).sharing)
    assert "bge-m3 -> llama-3-8b" in text and "can still start side by side" in text
