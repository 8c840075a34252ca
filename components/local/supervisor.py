"""The thin process shell behind `inferstack local up`: carries out a ``LocalPlan``, then waits.

Order: make missing models, start every engine (their minute of warm-up overlaps), wait for all of
them, start the health monitor, the batcher and the router (each waits for the one before to listen),
wait until the router reports ready and serves every model, print the banner. Then watch: an engine
that dies is reported and the router routes around it (this is not an orchestrator: engines are not
restarted); the batch service is started again when it dies, as its StatefulSet would start it (its
state on disk resumes every batch); any other runtime service that dies stops the stack.

SIGINT, SIGTERM and SIGHUP only set a flag; every wait polls it, so a signal at any moment (also
while models are made or engines warm up) leads to the same ordered stop: router (drains), batcher,
health monitor, then the engines' process groups, then anything else that carries the stack's tag.
A second signal shortens the grace periods.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import yaml

from components.local import monitor, s3_server, state, traces
from components.local import store as local_store
from components.local.autoscaler import Autoscaler
from components.local.defaults import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from components.local.engine_process import REPO_ROOT, EngineError, EngineProcess, engine_python
from components.local.plan import (
    ENVOY_CONFIG,
    HOST,
    TAG_ENV,
    EngineLaunch,
    LocalPlan,
    banner,
    describe,
)
from components.local.tiny_adapter import is_complete as is_adapter_complete
from components.local.tiny_model import MAKE_TIME, is_complete, needs_source_check

ENGINE_STOP_GRACE_S = 20.0
SERVICE_STOP_GRACE_S = 10.0
#: A runtime service listens within a second or two; generous for a machine under heavy load.
SERVICE_START_TIMEOUT_S = 180.0
POLL_S = 0.25


class StartError(Exception):
    """Starting failed; ``exit_code`` 2 for a user mistake (port in use, missing model), 1 otherwise."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class StoppedError(Exception):
    """A stop signal arrived while starting."""


def port_in_use(port: int, host: str = HOST) -> bool:
    """True when binding ``host:port`` fails the way our servers' bind would (they set SO_REUSEADDR)."""
    import socket  # noqa: PLC0415 - only here

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def check_ports_free(plan: LocalPlan, in_use: Callable[[int], bool] = port_in_use) -> None:
    for port, what, option in plan.ports():
        if in_use(port):
            make_hint = " (or `make local PORT=...`)" if option == "--port" else ""
            raise StartError(
                f"port {port} on {HOST} is already in use, and the local stack needs it for {what}; "
                f"stop whatever listens there, or choose another port with `inferstack local up {option} N`"
                f"{make_hint}",
                EXIT_USAGE,
            )


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as err:
        return int(err.code), b""
    except (urllib.error.URLError, OSError, ValueError):
        return 0, b""


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the service gets SIGTERM if the supervisor dies without stopping it (kill -9)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def engine_process(
    launch: EngineLaunch,
    logs_dir: Path,
    tag: str,
    python: Path | None = None,
    store_env: dict[str, str] | None = None,
) -> EngineProcess:
    """The ``EngineProcess`` (not started) for one planned replica; ``store_env`` reaches the model store."""
    return EngineProcess(
        launch.spec,
        launch.store or launch.path,
        host=HOST,
        port=launch.port,
        cpu_cores=launch.cpu_cores,
        kv_cache_space_gib=launch.kv_cache_space_gib,
        served_model_name=launch.spec.served_name,  # a prefill role serves its model's name
        env={TAG_ENV: tag, **(store_env or {}), **launch.env},
        log_path=logs_dir / f"engine-{launch.name}.log",
        python=python,
        kv_events=launch.kv_events,
    )


@dataclass
class Service:
    name: str
    port: int
    url: str
    log: Path
    proc: subprocess.Popen[bytes]
    argv: list[str] = field(default_factory=list)
    restart: bool = False
    restarts: int = 0


@dataclass
class Supervisor:
    plan: LocalPlan
    detached: bool = False
    timeout_s: float = 900.0
    python: str = sys.executable
    out: TextIO = field(default_factory=lambda: sys.stdout)
    engines: list[EngineProcess] = field(default_factory=list)
    services: list[Service] = field(default_factory=list)
    store: local_store.LocalStore | None = None
    stop_requested: bool = False
    hurry: bool = False
    phase: str = "starting"
    started: float = field(default_factory=time.monotonic)
    autoscaler: Autoscaler | None = None
    _reported_dead: set[str] = field(default_factory=set)

    # -- output ----------------------------------------------------------------------------------
    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {message}", file=self.out, flush=True)

    # -- signals ---------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.stop_requested:
            self.hurry = True
            return
        self.stop_requested = True
        name = signal.Signals(signum).name
        with contextlib.suppress(Exception):
            print(
                f"\n{name}: stopping everything (again to hurry)...",
                file=self.out,
                flush=True,
            )

    def _check_stop(self) -> None:
        if self.stop_requested:
            raise StoppedError

    # -- the run ---------------------------------------------------------------------------------
    def run(self, lock: state.Lock) -> int:
        """Start, serve until told to stop, stop. Returns the exit code."""
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        code = EXIT_OK
        try:
            self._write_state()
            self.start()
            self.phase = "ready"
            self._write_state()
            code = self.watch()
        except StoppedError:
            code = EXIT_OK
        except StartError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            code = err.exit_code
        except (
            EngineError,
            OSError,
        ) as err:  # a process that cannot be launched, a directory we cannot write
            print(f"error: {err}", file=sys.stderr, flush=True)
            code = EXIT_FAILED
        finally:
            self.phase = "stopping"
            with contextlib.suppress(OSError):
                self._write_state()
            self.stop()
            state.clear_state(self.plan.state_dir)
            lock.release()
        return code

    def start(self) -> None:
        plan = self.plan
        for line in describe(plan):
            self.say(line)
        plan.logs_dir.mkdir(parents=True, exist_ok=True)
        plan.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            python = engine_python()
        except EngineError as err:
            raise StartError(str(err), EXIT_USAGE) from None
        self.make_models(python)
        self.make_adapters(python)
        self.start_store()
        plan.config_path.write_text(
            "# Rendered by `inferstack local up` from "
            f"{plan.source} (components/render/runtime_config.py); rewritten at every start.\n"
            + plan.config.to_yaml()
        )
        if plan.envoy is not None:
            plan.config_path.with_name(ENVOY_CONFIG).write_text(json.dumps(plan.envoy, indent=1))
        if plan.traces is not None:  # before the engines: their first spans find it listening
            self.start_traces(plan.traces)
        self.start_engines(python)
        self.autoscaler = self._autoscaler(python)
        for spec in plan.services:
            self._check_stop()
            argv = spec.argv(self.python, plan.config_path.resolve())
            self.start_service(spec.name, argv, spec.port, spec.restart, tcp=spec.probe == "tcp")
        if plan.monitor is not None:
            self.start_monitor(plan.monitor)
        self.wait_router()
        ready_s = time.monotonic() - self.started
        print(banner(plan, ready_s, self.detached), file=self.out, flush=True)

    # -- models ----------------------------------------------------------------------------------
    def make_models(self, python: Path) -> None:
        done: set[Path] = set()
        for prep in self.plan.models:
            if prep.path in done:
                continue
            done.add(prep.path)
            if prep.recipe is None:
                if not (prep.path / "config.json").is_file():
                    raise StartError(
                        f"{self.plan.source}: model {prep.model}: {prep.path} is not a model directory "
                        "(no config.json there); point `source` at a directory with the model's "
                        "config.json, tokenizer and weights",
                        EXIT_USAGE,
                    )
                continue
            made = is_complete(prep.path, prep.recipe)
            if made and not needs_source_check(prep.recipe):
                continue
            if not made:
                self.say(
                    f"making the {prep.recipe} model {prep.path} (no download; {MAKE_TIME[prep.recipe]})"
                )
            log = self.plan.logs_dir / f"make-model-{prep.model}.log"
            with log.open("wb") as sink:
                proc = subprocess.Popen(
                    [
                        str(python),
                        "-m",
                        "components.local.tiny_model",
                        "--out",
                        str(prep.path),
                        "--kind",
                        prep.recipe,
                    ],
                    cwd=REPO_ROOT,
                    env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)},
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                )
                while proc.poll() is None:
                    if self.stop_requested:
                        proc.terminate()
                        proc.wait()
                        raise StoppedError
                    time.sleep(POLL_S)
            if proc.returncode != 0:
                raise StartError(f"making {prep.path} failed; log {log}:\n{tail(log)}")

    def make_adapters(self, python: Path) -> None:
        """Random LoRA adapters the stack names under .cache/adapters, made with peft when missing (seconds)."""
        for prep in self.plan.adapters:
            self._check_stop()
            if prep.seed is None or is_adapter_complete(prep.path, prep.base, prep.rank, prep.seed):
                continue
            self.say(f"making the random LoRA adapter {prep.path} for {prep.model} (no download; seconds)")
            log = self.plan.logs_dir / f"make-adapter-{prep.name}.log"
            argv = [str(python), "-m", "components.local.tiny_adapter", "--base", str(prep.base), "--out",
                    str(prep.path), "--rank", str(prep.rank), "--seed", str(prep.seed)]  # fmt: skip
            with log.open("wb") as sink:
                result = subprocess.run(
                    argv,
                    cwd=REPO_ROOT,
                    env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)},
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
            if result.returncode != 0:
                raise StartError(f"making {prep.path} failed; log {log}:\n{tail(log)}")

    # -- the model store (`make local S3=1`) ---------------------------------------------------
    def start_store(self) -> None:
        """The loopback S3 server, and every model prepared into it as the cluster's Job would."""
        plan = self.plan
        if plan.s3_port is None:
            return
        tag = {TAG_ENV: state.tag_value(plan.state_dir)}
        try:
            self.store = local_store.start(plan.s3_port, plan.logs_dir, tag, self.python)
            self.say(f"model store (S3) listening on {self.store.endpoint}")
            buckets = {b.removeprefix("s3://").split("/", 1)[0] for _, b in plan.store_preps}
            files = plan.config.batches.s3 if plan.config.batches is not None else None
            if files is not None and files.bucket is not None:  # the batch service's own bucket
                buckets.add(files.bucket)
            for bucket in sorted(buckets):
                local_store.create_bucket(self.store, bucket)
            for path, location in plan.store_preps:
                self._check_stop()
                log = plan.logs_dir / f"prepare-{path.name}.log"
                took = local_store.prepare(self.store, path, location, log, self.python)
                self.say(f"prepared {path} into {location} in {took:.1f}s")
        except local_store.StoreError as err:
            raise StartError(str(err)) from None

    # -- engines ---------------------------------------------------------------------------------
    def start_engines(self, python: Path) -> None:
        tag = state.tag_value(self.plan.state_dir)
        store_env = self.store.engine_env() if self.store is not None else None
        for launch in self.plan.always_on:
            self._check_stop()
            engine = engine_process(launch, self.plan.logs_dir, tag, python, store_env)
            engine.start()
            self.engines.append(engine)
            self._write_state()
        self.say(f"{len(self.engines)} engines starting (about a minute; logs in {self.plan.logs_dir}/)")
        waiting = dict(zip((e.name for e in self.plan.always_on), self.engines, strict=True))
        deadline = time.monotonic() + self.timeout_s
        while waiting:
            self._check_stop()
            for name, engine in list(waiting.items()):
                if not engine.running():
                    raise StartError(
                        f"engine {name} exited before it was ready; log {engine.log_file}:\n"
                        f"{engine.log_tail(30)}"
                    )
                if http_get(f"{engine.base_url}/health")[0] == 200:
                    self.say(f"engine {name} ready at {engine.base_url}")
                    del waiting[name]
            if waiting and time.monotonic() > deadline:
                raise StartError(
                    f"engines {', '.join(waiting)} not ready after {self.timeout_s:.0f}s; "
                    f"see {self.plan.logs_dir}/ (raise the limit with --timeout)"
                )
            time.sleep(POLL_S)

    def _autoscaler(self, python: Path) -> Autoscaler:
        """Takes over the started engines and starts the others on demand; publishes who is ready."""
        plan = self.plan
        assert plan.spec is not None
        tag = state.tag_value(plan.state_dir)
        store_env = self.store.engine_env() if self.store is not None else None
        scaler = Autoscaler(
            plan,
            plan.spec,
            make_engine=lambda launch: engine_process(launch, plan.logs_dir, tag, python, store_env),
            healthy=lambda url: http_get(f"{url}/health")[0] == 200,
            say=self.say,
        )
        for launch, engine in zip(plan.always_on, self.engines, strict=True):
            scaler.adopt(launch, engine)
        scaler.publish()
        return scaler

    # -- runtime services ------------------------------------------------------------------------
    def start_monitor(self, settings: monitor.Monitor) -> None:
        """Prometheus with the stack's rendered rules, scraping the services and the engines."""
        plan = self.plan
        assert plan.spec is not None
        binary = shutil.which(monitor.PROMETHEUS)
        if binary is None:
            raise StartError(
                "--monitor needs Prometheus, which is not installed: run `make prometheus` "
                "(Debian's package `prometheus`: apt-get install -y prometheus)",
                EXIT_USAGE,
            )
        directory = (plan.state_dir / monitor.MONITOR_DIR).absolute()
        data = directory / "data"
        shutil.rmtree(data, ignore_errors=True)
        rules, config = directory / "rules.yml", directory / "prometheus.yml"
        rules.write_text(
            yaml.safe_dump(
                monitor.rule_file(plan.spec, plan.units, settings.alert_for_cap_s), sort_keys=False
            )
        )
        runtime = monitor.runtime_targets(plan.spec, plan.scraped_services())
        doc = monitor.prometheus_config(settings, runtime, plan.engine_targets_path.absolute(), rules)
        config.write_text(yaml.safe_dump(doc, sort_keys=False))
        argv = monitor.argv(binary, config, data, settings.port)
        self.start_service("prometheus", argv, settings.port, ready_path="/-/ready")

    def start_traces(self, store: traces.TraceStore) -> None:
        """The trace store (Phoenix, in its own virtualenv), answering on its port before anything exports."""
        repo_root = Path.cwd()
        if not (repo_root / traces.TRACES_VENV / "bin" / "python").exists():
            raise StartError(
                f"--traces needs the trace store's virtualenv {traces.TRACES_VENV}/: run `make traces-venv`",
                EXIT_USAGE,
            )
        argv = store.argv(repo_root, self.plan.state_dir)
        self.start_service("traces", argv, store.port)

    def start_service(
        self,
        name: str,
        argv: list[str],
        port: int,
        restart: bool = False,
        again: bool = False,
        ready_path: str = "/healthz",
        tcp: bool = False,
    ) -> None:
        """Start one runtime service and wait until it answers ``ready_path`` (or, ``tcp``, accepts
        connections); ``again`` keeps its log (a restart)."""
        log = self.plan.logs_dir / f"{name}.log"
        env = {
            **os.environ,
            TAG_ENV: state.tag_value(self.plan.state_dir),
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "INFO",
            # the loopback server's credentials, for the batch service's files (`make local S3=1`)
            **(s3_server.client_env(self.store.endpoint) if self.store is not None else {}),
        }
        with log.open("ab" if again else "wb") as sink:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # Ctrl-C reaches the supervisor only; it stops us in order
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only, no locks taken
            )
        url = f"http://{HOST}:{port}"
        service = Service(name, port, url, log, proc, argv, restart)
        self.services.append(service)
        self._write_state()
        deadline = time.monotonic() + SERVICE_START_TIMEOUT_S
        while not (port_in_use(port) if tcp else http_get(f"{url}{ready_path}")[0] == 200):
            self._check_stop()
            if proc.poll() is not None:
                raise StartError(
                    f"{name} exited with code {proc.returncode} at start; log {log}:\n{tail(log)}"
                )
            if time.monotonic() > deadline:
                raise StartError(
                    f"{name} does not answer on {url} after {SERVICE_START_TIMEOUT_S:.0f}s; log {log}:\n{tail(log)}"
                )
            time.sleep(0.1)
        self.say(f"{name} listening on {url}")

    def wait_router(self) -> None:
        router = next(s for s in self.services if s.name == self.plan.router.name)
        want = self.plan.ready_models
        if not want:  # every model at zero and refused until it wakes (activator off): listening is all
            self.say(
                "router listening: every model is at zero; a request wakes it (and is refused meanwhile)"
            )
            return
        deadline = time.monotonic() + SERVICE_START_TIMEOUT_S
        while True:
            self._check_stop()
            self._check_services()
            status, _ = http_get(f"{router.url}/readyz")
            if status == 200:
                code, body = http_get(f"{router.url}/v1/models")
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    served = {m["id"] for m in json.loads(body)["data"]} if code == 200 else set()
                    if want <= served:
                        self.say(f"router ready: serving {', '.join(sorted(want))}")
                        return
            if time.monotonic() > deadline:
                raise StartError(
                    f"the router at {router.url} did not become ready within {SERVICE_START_TIMEOUT_S:.0f}s; "
                    f"logs {router.log} and {self.plan.logs_dir}/health.log:\n{tail(router.log)}"
                )
            time.sleep(POLL_S)

    def _check_services(self) -> None:
        for service in self.services:
            if service.proc.poll() is not None:
                raise StartError(
                    f"{service.name} exited with code {service.proc.returncode}; log {service.log}:\n"
                    f"{tail(service.log)}"
                )

    # -- serving ---------------------------------------------------------------------------------
    def watch(self) -> int:
        """Until a stop signal: report dead engines once; a dead runtime service stops the stack."""
        while not self.stop_requested:
            if self.autoscaler is not None and self.autoscaler.tick(self._router_metrics):
                self._write_state()
            for launch, engine in zip(self.plan.always_on, self.engines, strict=True):
                if launch.name not in self._reported_dead and not engine.running():
                    self._reported_dead.add(launch.name)
                    self.say(
                        f"warning: engine {launch.name} exited; the router serves {launch.model} "
                        f"through its other replicas, if any (log {engine.log_file})"
                    )
                    self._write_state()
            self._restart_dead()
            try:
                self._check_services()
            except StartError as err:
                print(f"error: {err}", file=sys.stderr, flush=True)
                return EXIT_FAILED
            time.sleep(POLL_S)
        return EXIT_OK

    def _restart_dead(self) -> None:
        """Start services that may restart (the batch service) again when they died."""
        for service in list(self.services):
            if not service.restart or service.proc.poll() is None:
                continue
            self.say(
                f"warning: {service.name} exited with code {service.proc.returncode}; starting it again"
                f" (log {service.log})"
            )
            at = self.services.index(service)
            self.services.remove(service)
            self.start_service(service.name, service.argv, service.port, restart=True, again=True)
            fresh = self.services.pop()
            fresh.restarts = service.restarts + 1
            self.services.insert(at, fresh)  # the start and stop order stays the plan's
            self._write_state()

    def _router_metrics(self) -> str | None:
        """Every router replica's /metrics (each on its own metrics port), or None when one does not answer:
        the autoscaler then waits for the next tick rather than act on a part of the picture."""
        texts = []
        for url in self.plan.router_metrics_urls():
            status, body = http_get(url)
            if status != 200:
                return None
            texts.append(body.decode())
        return "".join(texts) if texts else None

    # -- stopping --------------------------------------------------------------------------------
    def stop(self) -> None:
        """Router first (it drains), then batcher and health monitor, then all engines, then stragglers."""
        if not self.services and not self.engines and self.store is None:
            return
        self.say("stopping")
        for service in reversed(self.services):
            self._stop_service(service)
        grace = 5.0 if self.hurry else ENGINE_STOP_GRACE_S
        threads = [threading.Thread(target=engine.stop, args=(grace,)) for engine in self.engines]
        if self.autoscaler is not None:
            threads.append(threading.Thread(target=self.autoscaler.stop_all, args=(grace,)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.engines:
            self.say(f"{len(self.engines)} engines stopped")
        if self.store is not None:
            self.store.stop()
            self.say("model store stopped")
        left = state.tagged_pids(self.plan.state_dir)
        if left:
            self.say(f"killing {len(left)} leftover processes: {left}")
            state.kill_pids(left)
            state.wait_gone(left, 10.0)
        self.say("stopped; no process left")

    def _stop_service(self, service: Service) -> None:
        proc = service.proc
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            grace = 2.0 if self.hurry else SERVICE_STOP_GRACE_S
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            self.say(f"{service.name} stopped")
        else:
            proc.wait()

    # -- state file ------------------------------------------------------------------------------
    def _write_state(self) -> None:
        procs: list[dict[str, Any]] = []
        started = list(zip(self.plan.always_on, self.engines, strict=False))
        if self.autoscaler is not None:
            started += self.autoscaler.started()
        for launch, engine in started:
            procs.append(
                {
                    "name": launch.name,
                    "kind": "engine",
                    "pid": engine.pid,
                    "port": launch.port,
                    "url": launch.url,
                    "log": str(engine.log_file),
                    "scratch": str(engine.scratch_dir) if engine.scratch_dir is not None else None,
                }
            )
        for service in self.services:
            procs.append(
                {
                    "name": service.name,
                    "kind": "service",
                    "pid": service.proc.pid,
                    "port": service.port,
                    "url": service.url,
                    "log": str(service.log),
                }
            )
        state.write_state(
            self.plan.state_dir,
            {
                "pid": os.getpid(),
                "phase": self.phase,
                "stack": self.plan.stack,
                "source": self.plan.source,
                "router_url": self.plan.router.url,
                "base_url": self.plan.base_url,
                "logs": str(self.plan.logs_dir),
                "detached": self.detached,
                "started_at": time.time() - (time.monotonic() - self.started),
                "ready_s": round(time.monotonic() - self.started, 1) if self.phase == "ready" else None,
                "banner": banner(self.plan, time.monotonic() - self.started, self.detached)
                if self.phase == "ready"
                else None,
                "processes": procs,
            },
        )
