"""Engine command lines from the spec: where each engine runs (a cluster pod, ``make local``, a member of a
multi-node group); what its command line is comes from its profile (``components.engines``), every flag from
``runtime.engines``.

A cluster pod and ``make local`` get their vLLM command line from the same profile: only ``Where`` differs
(what to load, host, port, and where downloads go), so a knob added there reaches both. The policy pack reads
command lines back through the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike

from components.engines import profile
from components.engines.common import (
    ENGINE_CONFIG_DIR,
    POD_ENV,
    EngineCommand,
    Where,
    kv_transfer_args,
    lora_args,
    side_channel_env,
    sleep_args,
)
from components.render.common import ENGINE_PORT
from components.spec import ModelSpec
from runtime.config import EngineKind, KvEventsSource
from runtime.engines import facts

__all__ = [
    "ENGINE_CONFIG_DIR",
    "MODEL_DIR",
    "POD_ENV",
    "EngineCommand",
    "GroupMember",
    "Where",
    "engine_command",
    "group_command",
    "in_cluster",
    "in_group",
    "model_dir",
    "model_env",
    "on_this_machine",
    "side_channel_env",
    "vllm",
]

MODEL_DIR = "/models"  # where an engine pod sees its node-level cache copy (components.render.weights)

_KV = KvEventsSource.model_fields


def kv_events_in_pod() -> tuple[str, str]:
    """An engine pod publishes on every interface (the NetworkPolicy admits only the router's pods)."""
    return f"tcp://*:{_KV['port'].default}", f"tcp://*:{_KV['replay_port'].default}"


def model_env(model: ModelSpec) -> dict[str, str]:
    """The environment the spec itself asks of an engine, wherever it runs (a pod adds ``POD_ENV``): what allows
    loading adapters at run time for a model with adapters, serving sleep mode's endpoints for one that sleeps,
    and the KV transport of a disaggregated model's engines."""
    return {**lora_args(model)[1], **sleep_args(model)[1], **kv_transfer_args(model)[1]}


def model_dir(model: ModelSpec) -> str:
    """Where an engine pod sees the node cache's copy of its model: a directory named after the model, because
    trtllm-serve (which has no served-name flag before 2026, NVIDIA/TensorRT-LLM#11711) serves a local
    directory under its base name (``openai_server.py``: ``self.model = model_dir.name``)."""
    return f"{MODEL_DIR}/{model.name}"


def in_cluster(model: ModelSpec, location: str | None = None) -> Where:
    """An engine pod: every interface, the Service's port; it loads ``location`` (the model store, or the node
    cache's copy at ``model_dir``: ``components.render.weights.engine_location``), or the spec's source where
    none is given (command-line checks), and downloads nothing. A model whose routing reads KV events publishes
    them on every interface."""
    events = kv_events_in_pod() if model.publishes_kv_events else None
    return Where(location or model.source, "0.0.0.0", ENGINE_PORT, download_dir=None, kv_events=events)


def on_this_machine(
    model_dir: str | PathLike[str],
    host: str,
    port: int,
    served_name: str | None = None,
    kv_events: tuple[str, str] | None = None,
) -> Where:
    """An engine of ``make local`` (or a test): a model directory on disk, a loopback port, no downloads
    (the engines run with HF_HUB_OFFLINE=1, and there is no model cache volume), KV events (if its routing
    reads them) on ``ipc://`` socket files: a tcp bind would take every interface."""
    return Where(str(model_dir), host, port, download_dir=None, served_name=served_name, kv_events=kv_events)


def vllm(model: ModelSpec, where: Where | None = None) -> EngineCommand:
    """The vLLM command line of ``model``, in a pod unless ``where`` says otherwise (``make local``, tests)."""
    return profile(EngineKind.VLLM).command(model, where or in_cluster(model))


def engine_command(model: ModelSpec, location: str | None = None) -> EngineCommand:
    """The cluster command line of ``model``'s engine, loading ``location`` (see ``in_cluster``)."""
    return profile(model.engine.kind).command(model, in_cluster(model, location))


# A replica that spans nodes runs as one LeaderWorkerSet group. The LeaderWorkerSet controller (v0.6.0 on) puts these
# variables in every container of a group (its pod webhook): the leader's stable DNS name, and the pod's index in the
# group, 0 on the leader. The kubelet expands $(NAME) in args from the container's environment.
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
LEADER_RANK = "0"


@dataclass(frozen=True)
class GroupMember:
    """One process of a multi-node group, as its command line names it."""

    nodes: int
    rank: str
    """Its node rank: "0" on the leader; on workers "$(LWS_WORKER_INDEX)", or a number on this machine."""
    leader: str
    """Where the leader is: "$(LWS_LEADER_ADDRESS)" in a pod, a host name on this machine."""

    @property
    def is_leader(self) -> bool:
        return self.rank == LEADER_RANK


def in_group(nodes: int, leader: bool) -> GroupMember:
    """A pod of a LeaderWorkerSet group: rank and leader address from the variables LeaderWorkerSet sets."""
    rank = LEADER_RANK if leader else f"$({WORKER_INDEX_ENV})"
    return GroupMember(nodes, rank, f"$({LEADER_ADDRESS_ENV})")


def group_args(kind: EngineKind, member: GroupMember) -> list[str]:
    """The arguments that make one engine process a member of a multi-node group (``runtime.engines``)."""
    cli = facts(kind).cli
    if cli.nnodes is None or cli.node_rank is None or cli.master_addr is None:
        raise ValueError(f"{facts(kind).display_name} cannot span nodes: {cli.multi_node_note}")
    if cli.master_port is None:
        rendezvous = [cli.master_addr.name, f"{member.leader}:{cli.rendezvous_port}"]
    else:
        rendezvous = [cli.master_addr.name, member.leader, cli.master_port.name, str(cli.rendezvous_port)]
    args = [cli.nnodes.name, str(member.nodes), cli.node_rank.name, member.rank, *rendezvous]
    return args if member.is_leader else [*args, *cli.worker_args]


def group_command(model: ModelSpec, member: GroupMember, where: Where | None = None) -> EngineCommand:
    """The command line of one member of ``model``'s group: the engine's own, plus its place in the group."""
    base = profile(model.engine.kind).command(model, where or in_cluster(model))
    return EngineCommand(
        command=base.command,
        args=[*base.args, *group_args(model.engine.kind, member)],
        env=base.env,
        files=base.files,
    )
