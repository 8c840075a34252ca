"""MIG partitions cut at node boot, before kubelet starts. Pure.

The NVIDIA device plugin's ``mixed`` strategy advertises the MIG instances a node's GPUs are already cut into; it
cuts nothing (``components.render.addons``). A pool with ``sharing: mig`` therefore gets its partition in its
nodes' user data, so every node of the group (a new one, one node repair put in place of a failed one, one that
rebooted: GPU instances do not survive a reboot) has its instances before kubelet registers it.

How: the EKS AL2023 NVIDIA AMIs ship the driver with ``nvidia-smi``, nvidia-persistenced and the fabric manager,
but not ``nvidia-mig-parted`` (awslabs/amazon-eks-ami templates/al2023/provisioners/install-nvidia-driver.sh
installs none), and fetching a binary at boot would put an unpinned download on every node's start. So the
partition is the pool's nvidia-mig-parted config (``packing.mig_parted_config``, which the plan shows and the
GPU operator's MIG manager would also read), applied by a systemd unit through ``nvidia-smi``: MIG mode per GPU
(NVML's set-MIG-mode, which resets the GPU itself when it must), then its GPU instances, each with its compute
instance. The unit runs after the AMI's ``nvidia-kmod-load.service`` and before ``nodeadm-run.service``, which
starts kubelet after cloud-init (templates/al2023/runtime/rootfs/etc/systemd/system/nodeadm-run.service:
``After=nodeadm-config.service cloud-final.service``); the user data installs and starts it on first boot.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import yaml

from components.base import packing
from components.base.packing import Mechanism
from components.core.placement import PoolPlan

UNIT = "inferstack-mig-partition.service"
SCRIPT = "/usr/local/sbin/inferstack-mig-partition"
CONFIG = "/etc/inferstack/mig-parted.yaml"
"""The pool's nvidia-mig-parted config on the node: what the unit applied (``nvidia-mig-parted assert -f`` checks
it where the tool is installed)."""
MARKER = "# inferstack: MIG partition"
"""The first line after the shebang of the boot script: how a plan reader finds it in a node group's user data."""
_PROFILE_SLICES = re.compile(r"^(\d+)g\.")


def config_name(pool: PoolPlan) -> str:
    return f"inferstack-{pool.name}"


def parted_config(pool: PoolPlan) -> dict[str, Any] | None:
    """The pool's partition as an nvidia-mig-parted config (every node of the pool alike), or None when the
    pool is not cut into MIG instances."""
    pack = pool.packing
    if pool.sharing is not Mechanism.MIG or pack is None or pack.node_layout is None:
        return None
    return packing.mig_parted_config(config_name(pool), pack.node_layout, pool.instance.gpus)


def _largest_first(devices: dict[str, int]) -> list[str]:
    """Instances in creation order, largest first (small ones first can leave no aligned room for a big one)."""

    def slices(profile: str) -> int:
        found = _PROFILE_SLICES.match(profile)
        return int(found.group(1)) if found else 0

    return [p for p in sorted(devices, key=slices, reverse=True) for _ in range(devices[p])]


def commands(config: dict[str, Any]) -> list[str]:
    """The ``nvidia-smi`` calls that apply an nvidia-mig-parted config's one entry list: MIG mode per GPU, the old
    instances gone (a restart of the unit), then each GPU's instances with their compute instances (``-C``)."""
    [entries] = config["mig-configs"].values()
    out: list[str] = []
    for entry in entries:
        for gpu in entry["devices"]:
            if not entry["mig-enabled"]:
                out.append(f"nvidia-smi -i {gpu} -mig 0")
                continue
            profiles = ",".join(_largest_first(entry["mig-devices"]))
            out += [
                f"nvidia-smi -i {gpu} -mig 1",
                f"mig_enabled {gpu}",
                f"nvidia-smi mig -i {gpu} -dci >/dev/null 2>&1 || true",
                f"nvidia-smi mig -i {gpu} -dgi >/dev/null 2>&1 || true",
                f"nvidia-smi mig -i {gpu} -cgi {profiles} -C",
            ]
    return out


def boot_script(pool: PoolPlan) -> str | None:
    """The shell part of a pool's user data that installs the partition unit and runs it before kubelet; None
    when the pool is not cut into MIG instances."""
    config = parted_config(pool)
    if config is None:
        return None
    text = yaml.safe_dump(config, sort_keys=False)
    body = "\n".join(commands(config))
    script = (
        "#!/bin/bash\nset -euo pipefail\n"
        "mig_enabled() {\n"
        '  mode=$(nvidia-smi -i "$1" --query-gpu=mig.mode.current --format=csv,noheader)\n'
        '  [ "$mode" = "Enabled" ] || { echo "GPU $1: MIG mode is $mode, not Enabled" >&2; exit 1; }\n'
        "}\n"
        f"{body}\n"
    )
    unit = (
        "[Unit]\n"
        f"Description=inferstack: cut the GPUs of pool {pool.name} into MIG instances before kubelet\n"
        "After=nvidia-kmod-load.service nvidia-persistenced.service nvidia-fabricmanager.service\n"
        "Before=nodeadm-run.service kubelet.service\n"
        "[Service]\nType=oneshot\nRemainAfterExit=true\n"
        f"ExecStart={SCRIPT}\n"
        "[Install]\nWantedBy=multi-user.target\nRequiredBy=nodeadm-run.service\n"
    )
    return (
        f"#!/bin/bash\n{MARKER} ({config_name(pool)})\nset -euo pipefail\n"
        f"install -d -m 0755 {shlex.quote(CONFIG.rsplit('/', 1)[0])}\n"
        f"cat > {CONFIG} <<'INFERSTACK_MIG_CONFIG'\n{text}INFERSTACK_MIG_CONFIG\n"
        f"cat > {SCRIPT} <<'INFERSTACK_MIG_SCRIPT'\n{script}INFERSTACK_MIG_SCRIPT\n"
        f"chmod 0755 {SCRIPT}\n"
        f"cat > /etc/systemd/system/{UNIT} <<'INFERSTACK_MIG_UNIT'\n{unit}INFERSTACK_MIG_UNIT\n"
        "systemctl daemon-reload\n"
        f"systemctl enable --now {UNIT}\n"
    )
