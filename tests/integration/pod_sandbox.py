"""Runs a command the way the kubelet runs a rendered container, as far as this machine allows.

    unshare --mount --propagation private -- python3 pod_sandbox.py SANDBOX.json -- COMMAND [ARG...]

Run as root (the test machines are). In a private mount namespace it builds a root from the host's
directories, each bind-mounted read-only (the image, and ``readOnlyRootFilesystem: true``); mounts the
rendered volumes at their rendered paths, writable (``emptyDir``: a host directory, group-owned by
``fsGroup`` with the setgid bit as the kubelet makes it; ``medium: Memory``: a tmpfs of the rendered
size) or read-only (``readOnly: true`` mounts: a ``hostPath`` subPath, a Secret's files); makes the root
itself read-only; ``chroot``s into it and execs COMMAND with ``setpriv`` as the
rendered UID and GID, which have no passwd entry, with no capabilities, ``no_new_privs`` and exactly the
given environment (``env -i``).

What it cannot do here: seccomp ``RuntimeDefault`` (the container runtime's profile), cgroup limits,
and a real image: the engine's interpreter is the host's. The host keeps that interpreter under root's
home (mode 0700), where no image would put it, and its venv in the checkout; ``expose`` lists such trees,
bind-mounted read-only on their own (after the volumes, so one under /tmp stays visible) so nothing else of
that home or checkout is visible.

SANDBOX.json::

    {"uid": 10001, "gid": 10001, "fs_group": 10001,
     "writable": {"/tmp": "/host/dir", "/models": "/host/dir"},   # emptyDir: mount path -> host dir
     "memory": {"/dev/shm": "2g"},                                # emptyDir medium Memory: path -> size
     "read_only": {"/models/m": "/host/dir"},                     # readOnly mounts: path -> host dir
     "expose": ["/root/.pyenv"],                                  # host trees the command needs
     "env": {"HOME": "/tmp"}}
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SPECIAL = {"proc", "sys", "dev"}


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _bind_read_only(source: str, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    _mount("--rbind", source, str(target))
    _mount("-o", "remount,bind,ro", str(target))


def _top(path: str) -> str:
    return path.strip("/").split("/", 1)[0]


def build_root(root: Path, spec: dict[str, Any]) -> None:
    """Fills ``root`` (an empty directory) with the read-only host tree and the writable volumes."""
    writable: dict[str, str] = spec.get("writable", {})
    memory: dict[str, str] = spec.get("memory", {})
    read_only: dict[str, str] = spec.get("read_only", {})
    expose: list[str] = spec.get("expose", [])
    fs_group = int(spec.get("fs_group", spec["gid"]))
    _mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(root))
    # Directories that rendered volumes or exposed trees live in come from the new root, not the host.
    own = {_top(p) for p in [*writable, *read_only, *expose]} | {"tmp"}
    for entry in sorted(os.listdir("/")):
        host, inside = f"/{entry}", root / entry
        if os.path.islink(host):
            inside.symlink_to(os.readlink(host))
        elif entry in SPECIAL or entry in own or not os.path.isdir(host):
            continue
        else:
            _bind_read_only(host, inside)
    for entry in SPECIAL:
        (root / entry).mkdir()
        _mount("--rbind", f"/{entry}", str(root / entry))
    _mount("-o", "remount,bind,ro", str(root / "sys"))
    for path, host_dir in writable.items():
        os.chown(host_dir, 0, fs_group)
        os.chmod(host_dir, 0o2777)  # what the kubelet makes of an emptyDir with fsGroup
        target = root / path.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        _mount("--bind", host_dir, str(target))
    for path, size in memory.items():
        target = root / path.lstrip("/")
        _mount("-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", str(target))
    # After the volumes: an exposed tree may sit under a volume's path (a checkout under /tmp, the pod's /tmp).
    for tree in expose:
        _bind_read_only(tree, root / tree.lstrip("/"))
    for path, host_dir in read_only.items():
        _bind_read_only(host_dir, root / path.lstrip("/"))
    _mount("-o", "remount,ro", str(root))


def command_as_user(spec: dict[str, Any], command: list[str]) -> list[str]:
    """``setpriv`` as the rendered user with nothing else: no capabilities, no privilege gain, given env."""
    uid, gid = int(spec["uid"]), int(spec["gid"])
    fs_group = int(spec.get("fs_group", gid))
    groups = ["--clear-groups"] if fs_group == gid else ["--groups", str(fs_group)]
    env = [f"{k}={v}" for k, v in spec["env"].items()]
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={gid}",
        *groups,
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
        "env",
        "-i",
        *env,
        *command,
    ]


def main(argv: list[str]) -> None:
    if os.geteuid() != 0 or "--" not in argv:
        sys.exit("usage (as root, in a private mount namespace): pod_sandbox.py SANDBOX.json -- COMMAND...")
    split = argv.index("--")
    spec_path, command = Path(argv[split - 1]), argv[split + 1 :]
    spec = json.loads(spec_path.read_text())
    root = spec_path.parent / "root"
    root.mkdir(exist_ok=True)
    _mount("--make-rprivate", "/")
    build_root(root, spec)
    os.chroot(root)
    os.chdir("/")
    final = command_as_user(spec, command)
    os.execvp(final[0], final)


if __name__ == "__main__":
    main(sys.argv[1:])
