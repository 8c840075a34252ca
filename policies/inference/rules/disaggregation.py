"""Prefill/decode disaggregation, read from the rendered engines: P/D only on engines and connectors the router
can pair; in prod, roles in two pools only with a fast path between them; each role checked by the other.

The rules share their logic with the spec and the plan, so a stack file and the resources it renders are judged
alike: ``components.spec.kv_transfer_refusal`` (which engines hand KV to another), the engine table's
``KvTransfer`` (the connector's config, its role, its lease), ``components.core.disaggregation.KvPath`` (what a
fast path between two pools is) and ``runtime.config.PrefillStage.lease_for`` (how long the KV must outlast the
router's waits). A role's engines are the workloads whose ``--kv-transfer-config`` gives them that role; the two
roles of one model serve one name (``--served-model-name``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from components.base.enums import Device
from components.core.disaggregation import FAST_PATH_ENVIRONMENTS, KvPath
from components.render.common import MODEL_LABEL
from components.spec import kv_transfer_refusal
from components.spec.model import Transport
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
    of_kind,
)
from policies.inference.rules.engines import Engine, NodePool, engines, gpu_pool_of, node_pools
from policies.inference.rules.fit import POOL_SETTING
from policies.inference.rules.groups import launch_template
from policies.inference.rules.k8s import environment_of, stack_environment
from policies.inference.rules.reliability import ENVIRONMENTS_SCHEMA
from runtime.config import KV_LEASE_MARGIN_S, PrefillStage, RouterSettings
from runtime.engines import VLLM_KV_TRANSFER, KvTransfer, facts

SGLANG_PD_FLAG = "--disaggregation-mode"
"""SGLang's own P/D switch (``--disaggregation-mode prefill|decode``, python/sglang/srt/server_args.py): its
prefill and decode servers pair through SGLang's own router, not inferstack's."""
UCX_TLS = "UCX_TLS"


def _argv(e: Engine) -> list[str]:
    return [
        str(a) for a in as_list(e.container.props.get("command")) + as_list(e.container.props.get("args"))
    ]


def _value(argv: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _env(e: Engine) -> dict[str, str]:
    return {
        str(as_map(v).get("name")): str(as_map(v).get("value"))
        for v in as_list(e.container.props.get("env"))
        if "value" in as_map(v)
    }


def _device(e: Engine) -> Device:
    return Device.GPU if e.uses_gpu else Device.CPU


@dataclass(frozen=True)
class Role:
    """An engine workload that takes part in P/D: its connector's config and the role it gives it."""

    engine: Engine
    kv: KvTransfer
    config: Mapping[str, Any]

    @property
    def role(self) -> str | None:
        return self.kv.role_of(self.config)

    @property
    def served(self) -> str:
        return self.engine.args.served_name or self.engine.args.model or self.engine.res.k8s_name

    @property
    def unit(self) -> str:
        return str(self.engine.labels.get(MODEL_LABEL) or self.engine.res.k8s_name)

    @property
    def transport(self) -> Transport:
        backends = [
            str(b).upper()
            for b in as_list(as_map(self.config.get("kv_connector_extra_config")).get("backends"))
        ]
        if "LIBFABRIC" in backends:
            return Transport.LIBFABRIC
        tls = _env(self.engine).get(UCX_TLS, "")
        return Transport.TCP if tls and set(tls.split(",")) <= {"tcp", "self", "sm", "shm"} else Transport.UCX


def _roles(resources: Sequence[Res]) -> tuple[list[Role], list[tuple[Engine, str]]]:
    """(P/D engines inferstack's router can pair, with their config; engines that ask for P/D it cannot, why)."""
    roles: list[Role] = []
    unable: list[tuple[Engine, str]] = []
    for e in engines(resources):
        argv = _argv(e)
        kv = facts(e.args.kind).kv_transfer
        flag = kv.flag if kv is not None else VLLM_KV_TRANSFER.flag
        raw = _value(argv, flag)
        sglang_mode = _value(argv, SGLANG_PD_FLAG)
        if raw is None and sglang_mode in (None, "null"):
            continue
        refusal = kv_transfer_refusal(e.args.kind, _device(e), e.args.kv_cache_dtype)
        if kv is None or refusal is not None or raw is None:
            why = refusal or f"{SGLANG_PD_FLAG} {sglang_mode}: its roles pair through the engine's own router"
            unable.append((e, why))
            continue
        try:
            config = json.loads(raw)
        except ValueError:
            unable.append((e, f"{flag} is not JSON: {raw[:80]}"))
            continue
        roles.append(Role(e, kv, as_map(config)))
    return roles, unable


def _pairs(roles: Sequence[Role]) -> dict[str, tuple[list[Role], list[Role]]]:
    """Served name -> (its prefill engines, its decode engines)."""
    out: dict[str, tuple[list[Role], list[Role]]] = {}
    for r in roles:
        prefill, decode = out.setdefault(r.served, ([], []))
        if r.role == "prefill":
            prefill.append(r)
        elif r.role == "decode":
            decode.append(r)
    return out


# P/D on engines and connectors that can do it -------------------------------------------------------------


def _capable(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    roles, unable = _roles(resources)
    for e, why in unable:
        yield Finding(f"{e.res.display}: asks for prefill/decode disaggregation, but {why}", e.res.urn)
    for r in roles:
        for problem in r.kv.config_problems(r.config, _device(r.engine).value):
            yield Finding(f"{r.engine.res.display}: {r.kv.flag}: {problem}", r.engine.res.urn)
        version, since = _version(r.engine.container.image), _version(f":{r.kv.since_version}")
        if version is not None and since is not None and version < since:
            yield Finding(
                f"{r.engine.res.display}: {r.engine.container.image} is older than "
                f"{facts(r.engine.args.kind).display_name} {r.kv.since_version}, the first release whose "
                f"{r.kv.connector} inferstack's two-phase request and recovery are built on; use a newer image",
                r.engine.res.urn,
            )
    for served, (prefill, decode) in _pairs(roles).items():
        if not prefill or not decode:
            have, lack = ("prefill", "decode") if prefill else ("decode", "prefill")
            first = (prefill or decode)[0].engine
            yield Finding(
                f"{first.res.display}: a {have} engine of {served!r} with no {lack} engine serving that name: "
                f"nothing to hand the KV to; render both roles (models[].disaggregation)",
                first.res.urn,
            )


def _version(image: str | None) -> tuple[int, ...] | None:
    tag = (image or "").rsplit(":", 1)[-1].split("@", 1)[0].lstrip("v")
    parts = tag.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:3]):
        return None
    return tuple(int(p) for p in parts[:3])


PD_CAPABLE = Rule(
    name="pd-engines-can-transfer-kv",
    category=Category.RELIABILITY,
    severity=Severity.HIGH,
    description="Prefill/decode disaggregation only on engines, devices, images and connectors inferstack's router "
    "pairs (vLLM's NixlConnector, a producer and a consumer role, no fp8 KV cache on CPU), and each served name "
    "has both roles.",
    remediation="Set models[].disaggregation only on vLLM models (inferstack renders the connector, both roles and "
    "their pairing); serve other engines aggregated.",
    stack_check=_capable,
)


# Roles in two pools: a fast path between them (prod) -------------------------------------------------------


def _pool_facts(resources: Sequence[Res], pool: NodePool | None) -> tuple[bool, bool]:
    """(EFA interfaces on its nodes, its nodes in one cluster placement group) from its launch template."""
    template = launch_template(resources, pool) if pool is not None else None
    if template is None:
        return False, False
    interfaces = [as_map(i) for i in as_list(template.props.get("networkInterfaces"))]
    efa = any(str(i.get("interfaceType")).startswith("efa") for i in interfaces)
    return efa, bool(dig(template.props, "placement", "groupName"))


def _fast_path(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    stack_env = stack_environment(resources)
    pools = node_pools(resources, config)
    roles, _ = _roles(resources)
    for served, (prefills, decodes) in _pairs(roles).items():
        for p in prefills:
            env = environment_of(p.engine.res) or stack_env
            if env not in set(config["environments"]):
                continue
            prefill_pool = gpu_pool_of(p.engine, pools)
            for d in decodes:
                decode_pool = gpu_pool_of(d.engine, pools)
                p_efa, p_zoned = _pool_facts(resources, prefill_pool)
                d_efa, d_zoned = _pool_facts(resources, decode_pool)
                path = KvPath(
                    prefill_pool=prefill_pool.name if prefill_pool is not None else None,
                    decode_pool=decode_pool.name if decode_pool is not None else None,
                    rdma_transport=p.transport is not Transport.TCP and d.transport is not Transport.TCP,
                    prefill_efa=p_efa,
                    decode_efa=d_efa,
                    prefill_zoned=p_zoned,
                    decode_zoned=d_zoned,
                )
                problem = path.problem()
                if problem is not None:
                    yield Finding(
                        f"{p.engine.res.display} and {d.engine.res.display} ({served}) in {env}: {problem}"
                    )


PD_FAST_PATH = Rule(
    name="pd-cross-pool-fast-path",
    category=Category.PLACEMENT,
    severity=Severity.HIGH,
    description="In the listed environments (prod by default), the prefill and decode engines of one model run in "
    "one pool, or in pools with a fast path between them: EFA on both, both in one zone (a cluster placement group "
    "each), and a transport that may use RDMA (not UCX over TCP only).",
    remediation="Remove models[].disaggregation.prefill.pool (both roles in the model's pool), or give both pools "
    "an EFA instance type with efa and placement_group on and transport ucx, libfabric or auto.",
    stack_check=_fast_path,
    settings=(
        POOL_SETTING,
        Setting(
            "environments",
            ENVIRONMENTS_SCHEMA,
            list(FAST_PATH_ENVIRONMENTS),
            "Environments where the two roles need a fast path between their pools.",
        ),
    ),
)


# Each role checked by the other -----------------------------------------------------------------------------


def _stages(resources: Sequence[Res]) -> dict[str, tuple[PrefillStage, int]]:
    """Decode unit -> (its prefill stage, the router's first-byte timeout) in every runtime config of the stack."""
    out: dict[str, tuple[PrefillStage, int]] = {}
    for cm in of_kind(resources, "ConfigMap"):
        for text in as_map(cm.props.get("data")).values():
            try:
                doc = yaml.safe_load(text) if isinstance(text, str) else None
            except yaml.YAMLError:
                continue
            router = as_map(as_map(doc).get("router"))
            if not router or "models" not in as_map(doc):
                continue
            first_byte = int(router.get("first_byte_timeout_ms") or RouterSettings().first_byte_timeout_ms)
            for model in as_list(as_map(doc).get("models")):
                stage = as_map(as_map(model).get("prefill"))
                if stage:
                    try:
                        out[str(as_map(model).get("name"))] = (PrefillStage.model_validate(stage), first_byte)
                    except ValueError:
                        continue
    return out


def _probed(e: Engine) -> bool:
    return bool(as_map(e.container.props.get("readinessProbe")))


def _watched(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    roles, _ = _roles(resources)
    stages = _stages(resources)
    for served, (prefills, decodes) in _pairs(roles).items():
        if not prefills or not decodes:
            continue  # pd-engines-can-transfer-kv says so
        units = {r.unit for r in prefills}
        for d in decodes:
            res = d.engine.res
            found = stages.get(d.unit)
            if found is None or found[0].target not in units:
                yield Finding(
                    f"{res.display}: no router pairs it with {served!r}'s prefill engines ({', '.join(sorted(units))}): "
                    "nothing health-checks the prefill role for it or stops pairing with a prefill whose transfers "
                    "fail; serve the model through inferstack's router (gateway.mode router)",
                    res.urn,
                )
                continue
            stage, first_byte = found
            wait = (
                stage.lease_for(first_byte) - KV_LEASE_MARGIN_S
            )  # from the prefill's sending, whole seconds
            for r in (d, *prefills):
                lease = r.kv.lease_of(r.config)
                if lease < wait:
                    yield Finding(
                        f"{r.engine.res.display}: kv_lease_duration {lease} s is shorter than the router's longest "
                        f"wait for a decode carrying its KV ({wait} s: prefill {stage.timeout_ms} ms, then the "
                        f"decode's first byte): its prefills' blocks may be freed and reused while a decode still "
                        f"reads them; render it with inferstack (kv_lease_duration {stage.lease_for(first_byte)})",
                        r.engine.res.urn,
                    )
            policy = d.config.get("kv_load_failure_policy")
            if policy != d.kv.failure_policy:
                yield Finding(
                    f"{res.display}: kv_load_failure_policy {policy!r}: a decode engine that fails to load a prefill's "
                    f"KV must say so ({d.kv.failure_policy!r}), or the router never learns that a prefill replica's "
                    "transfers fail and keeps pairing with it",
                    res.urn,
                )
        for r in (*prefills, *decodes):
            if not _probed(r.engine):
                yield Finding(
                    f"{r.engine.res.display}: a {r.role} engine without a readiness probe: the router pairs only "
                    "ready replicas, and would pair with this one before it serves",
                    r.engine.res.urn,
                )


PD_WATCHED = Rule(
    name="pd-roles-check-each-other",
    category=Category.RELIABILITY,
    severity=Severity.HIGH,
    description="Each decode engine is paired with its model's prefill engines by a router that health-checks both "
    "roles, tells a failed KV load (kv_load_failure_policy fail) and is outlasted by the prefill's KV lease; every "
    "engine of either role has a readiness probe.",
    remediation="Render disaggregated models with inferstack (models[].disaggregation, gateway.mode router): it "
    "renders the router's pairing, the failure policy, the lease and the probes.",
    stack_check=_watched,
)

RULES = (PD_CAPABLE, PD_FAST_PATH, PD_WATCHED)
