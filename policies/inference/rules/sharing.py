"""Shared GPUs and sleeping engines: who may share a GPU, that time-sliced engines fit its memory together, and
that sleep mode is only switched on where the engine has it.

Read from what is rendered: engines' resource requests (``nvidia.com/gpu.shared``, ``nvidia.com/mig-<profile>``)
and command lines, their team label, the node groups' device plugin config label, and the device plugin chart's
config map (the replicas per GPU of each time-slicing config).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import yaml

from components.base.packing import SHARED_GPU_SAFE_TOTAL
from components.core import nodes
from policies.inference.rules.base import (
    Category,
    Config,
    Finding,
    Res,
    Rule,
    Setting,
    Severity,
    as_list,
    as_map,
    dig,
)
from policies.inference.rules.engines import Engine, engines, gpu_pool_of, node_pools
from policies.inference.rules.k8s import environment_of, stack_environment
from policies.inference.rules.reliability import ENVIRONMENTS_SCHEMA
from runtime.engines import facts

CHART = "kubernetes:helm.sh/v4:Chart"
DEVICE_PLUGIN_CHART = "nvidia-device-plugin"


def _co_location(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    """Time-sliced GPUs share memory and faults: across teams only outside the listed environments."""
    pools = node_pools(resources, config)
    stack_env = stack_environment(resources)
    by_pool: dict[str, list[Engine]] = {}
    for e in engines(resources):
        if e.shared_gpu != nodes.SHARED_GPU_RESOURCE:
            continue
        env = environment_of(e.res) or stack_env
        pool = gpu_pool_of(e, pools)
        if pool is not None and env in set(config["environments"]):
            by_pool.setdefault(pool.name, []).append(e)
    for pool_name, members in by_pool.items():
        teams = {e.labels.get(nodes.TEAM_LABEL, "(no team)") for e in members}
        if len(teams) > 1:
            who = ", ".join(
                f"{e.res.k8s_name} ({e.labels.get(nodes.TEAM_LABEL, 'no team')})" for e in members
            )
            yield Finding(
                f"pool {pool_name}: engines of different teams time-slice the same GPUs ({who}); time-slicing has no "
                "memory or fault isolation: give each team its own pool, or share through MIG (sharing: mig, "
                "gpu_share.mig_profile)",
                members[0].res.urn,
            )


CO_LOCATION = Rule(
    name="shared-gpu-across-teams-only-with-mig",
    category=Category.SECURITY,
    severity=Severity.HIGH,
    description="In the listed environments (prod by default), engines of different teams (label "
    f"{nodes.TEAM_LABEL}) share a GPU only through MIG instances, never time-slicing.",
    remediation="Put each team's time-sliced models on its own pool, or move them to a pool with sharing: mig.",
    stack_check=_co_location,
    settings=(
        Setting("environments", ENVIRONMENTS_SCHEMA, ["prod"], "Environments where the rule applies."),
    ),
)


def _time_slicing_replicas(resources: Sequence[Res]) -> dict[str, int]:
    """Device plugin config name -> replicas per GPU, from the chart's integrated config map."""
    out: dict[str, int] = {}
    for r in resources:
        if r.type != CHART or str(r.props.get("chart", "")) != DEVICE_PLUGIN_CHART:
            continue
        for name, text in as_map(dig(r.props, "values", "config", "map")).items():
            try:
                cfg: Any = yaml.safe_load(str(text))
            except yaml.YAMLError:
                continue
            for res in as_list(dig(cfg, "sharing", "timeSlicing", "resources")):
                if as_map(res).get("name") == nodes.GPU_RESOURCE:
                    out[str(name)] = int(as_map(res).get("replicas") or 1)
    return out


def _memory_sum(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    """Kubernetes may put any `replicas` engines of a time-sliced pool on one GPU: the largest must fit together."""
    replicas = _time_slicing_replicas(resources)
    pools = node_pools(resources, config)
    limit = float(config["max_total"])
    seen: dict[str, list[Engine]] = {}
    for e in engines(resources):
        if e.shared_gpu != nodes.SHARED_GPU_RESOURCE:
            continue
        pool = gpu_pool_of(e, pools)
        if pool is not None:
            seen.setdefault(pool.name, []).append(e)
    for pool in pools:
        members = seen.get(pool.name)
        if not members:
            continue
        name = pool.labels.get(nodes.DEVICE_PLUGIN_CONFIG_LABEL)
        slots = replicas.get(name or "")
        if slots is None:
            yield Finding(
                f"pool {pool.name}: engines request {nodes.SHARED_GPU_RESOURCE} but its nodes name no time-slicing "
                f"config of the device plugin (label {nodes.DEVICE_PLUGIN_CONFIG_LABEL}={name})",
                pool.res.urn if pool.res else None,
            )
            continue
        largest = max(members, key=lambda e: e.args.gpu_memory_utilization)
        worst = slots * largest.args.gpu_memory_utilization
        if worst > limit + 1e-6:
            yield Finding(
                f"pool {pool.name}: {slots} engines share each GPU and {largest.res.k8s_name} takes "
                f"--gpu-memory-utilization {largest.args.gpu_memory_utilization:g}, so one GPU may be asked for "
                f"{worst:.2f} of its memory (limit {limit:g}); lower the engines' fractions to at most "
                f"{limit / slots:.3g} or the replicas per GPU",
                largest.res.urn,
            )


MEMORY_SUM = Rule(
    name="shared-gpu-memory-within-limits",
    category=Category.RELIABILITY,
    severity=Severity.HIGH,
    description="On time-sliced GPUs, replicas per GPU x the largest engine's gpu_memory_utilization stays within "
    "the limit: Kubernetes does not know memory and may put any of them together.",
    remediation="Derive each engine's memory from gpu_share.fraction (inferstack does) and keep the fractions of "
    "one pool at most 1 / engines_per_gpu.",
    stack_check=_memory_sum,
    settings=(
        Setting(
            "max_total",
            {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            SHARED_GPU_SAFE_TOTAL,
            "The most of a GPU's memory its time-sliced engines together may take.",
        ),
    ),
)

_VERSION = re.compile(r":v?(\d+)\.(\d+)\.(\d+)")


def _version(image: str | None) -> tuple[int, ...] | None:
    found = _VERSION.search(image or "")
    return tuple(int(g) for g in found.groups()) if found else None


def _sleep(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    del config
    for e in engines(resources):
        engine = facts(e.args.kind)
        argv = [
            str(a) for a in as_list(e.container.props.get("args")) + as_list(e.container.props.get("command"))
        ]
        if "--enable-sleep-mode" not in argv:
            continue
        sleep = engine.sleep
        name = e.res.k8s_name
        if sleep is None:
            yield Finding(
                f"{name}: {engine.display_name} has no sleep mode; remove --enable-sleep-mode", e.res.urn
            )
            continue
        if e.gpus == 0 and e.shared_gpu is None:
            yield Finding(
                f"{name}: sleep mode frees GPU memory, and this engine has no GPU ({engine.display_name} supports it on "
                f"{', '.join(sorted(sleep.devices))} only; on CPU it refuses to start); remove --enable-sleep-mode",
                e.res.urn,
            )
        version, since = _version(e.container.image), _version(f":{sleep.since_version}")
        if version is not None and since is not None and version < since:
            yield Finding(
                f"{name}: {e.container.image} is older than {engine.display_name} {sleep.since_version}, the first "
                "release inferstack allows sleep mode on (its HTTP endpoints documented); use a newer image",
                e.res.urn,
            )
        env = {
            str(as_map(v).get("name")): str(as_map(v).get("value"))
            for v in as_list(e.container.props.get("env"))
        }
        missing = {k: v for k, v in sleep.env.items() if env.get(k) != v}
        if missing:
            yield Finding(
                f"{name}: --enable-sleep-mode without {', '.join(f'{k}={v}' for k, v in missing.items())}: the sleep "
                "and wake endpoints are not served, so nothing can wake it",
                e.res.urn,
            )


SLEEP = Rule(
    name="sleep-only-where-supported",
    category=Category.RELIABILITY,
    severity=Severity.HIGH,
    description="Sleep mode only on engines, devices and versions that support it, with its endpoints served.",
    remediation="Set scaling.sleep_after_idle_s only on vLLM GPU models (inferstack renders the flag and "
    "environment); pin a recent vLLM image.",
    stack_check=_sleep,
)

RULES = (CO_LOCATION, MEMORY_SUM, SLEEP)
