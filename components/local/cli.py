"""`inferstack local up|down|status|logs`: the data plane of ``stacks/Pulumi.local.yaml`` on this machine.

``up`` runs in the foreground (Ctrl-C stops everything) or, with ``--detach``, in the background; the
other commands find it through its state directory (``.local/``). Mistakes exit 2 with one message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from components.base.problems import SpecError
from components.core.paths import STACKS_DIR
from components.local.defaults import (
    DEFAULT_BATCHER_PORT,
    DEFAULT_BATCHES_PORT,
    DEFAULT_ENGINE_MEMORY_GIB,
    DEFAULT_ENGINE_PORT,
    DEFAULT_HEALTH_PORT,
    DEFAULT_MONITOR_PORT,
    DEFAULT_PICKER_PORT,
    DEFAULT_REDIS_PORT,
    DEFAULT_ROUTER_METRICS_PORT,
    DEFAULT_ROUTER_PORT,
    DEFAULT_ROUTERS,
    DEFAULT_S3_PORT,
    DEFAULT_STATE_DIR,
    DEFAULT_TRACES_GRPC_PORT,
    DEFAULT_TRACES_PORT,
    EXIT_FAILED,
    EXIT_USAGE,
)

if TYPE_CHECKING:
    from components.local.plan import LocalOptions, LocalPlan

# The planner, the supervisor and the spec load inside the commands: `inferstack --help` builds every
# command's options, and should not pay for what only `local up` runs.

local_app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    help="Run the local stack (real vLLM on CPU, health monitor, batcher, router) on this machine.",
)

SUPERVISOR_LOG = "supervisor.log"
DOWN_TIMEOUT_S = 90.0

StateDirOpt = Annotated[
    Path, typer.Option("--state-dir", help="Lock, state file, rendered config and logs/ of the stack.")
]


def _fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return typer.Exit(code)


def _plan(stack: str, stacks_dir: Path, options: LocalOptions) -> LocalPlan:
    from components.clouds.targets import PROFILES  # noqa: PLC0415
    from components.core.stackfile import CONFIG_KEY, load, validate  # noqa: PLC0415
    from components.local.plan import PlanError, build_plan, disaggregated  # noqa: PLC0415 - see the imports
    from components.local.traces import traced  # noqa: PLC0415

    try:
        loaded = load(stack, stacks_dir, profiles=PROFILES)
        if options.pd:  # the stack as written, each generation model served as a prefill and a decode engine
            raw = disaggregated(loaded.config[CONFIG_KEY])
            decided = validate(raw, f"{loaded.source} (--pd)", profiles=PROFILES)
            loaded = dataclasses.replace(loaded, decisions=decided, config={**loaded.config, CONFIG_KEY: raw})
        if options.traces is not None:  # the engines export their spans to the local store too
            raw = traced(loaded.config[CONFIG_KEY], options.traces)
            decided = validate(raw, f"{loaded.source} (--traces)", profiles=PROFILES)
            loaded = dataclasses.replace(loaded, decisions=decided, config={**loaded.config, CONFIG_KEY: raw})
        return build_plan(loaded, options, Path.cwd())
    except SpecError as err:
        raise _fail(err.render()) from None
    except PlanError as err:
        raise _fail(str(err)) from None


@local_app.command()
def up(
    stack: Annotated[
        str, typer.Option("-s", "--stack", help="stacks/Pulumi.<stack>.yaml (target: local).")
    ] = "local",
    stacks_dir: Annotated[Path, typer.Option(help="Where the stack files are.")] = STACKS_DIR,
    port: Annotated[
        int, typer.Option("--port", help="The router's port: the OpenAI API.")
    ] = DEFAULT_ROUTER_PORT,
    router_metrics_port: Annotated[
        int, typer.Option(help="The router's /metrics port (several routers: it, + 1, + 2, ...).")
    ] = DEFAULT_ROUTER_METRICS_PORT,
    health_port: Annotated[int, typer.Option(help="The health monitor's port.")] = DEFAULT_HEALTH_PORT,
    batcher_port: Annotated[int, typer.Option(help="The batcher's port.")] = DEFAULT_BATCHER_PORT,
    batches_port: Annotated[
        int, typer.Option(help="The batch service's port (/v1/files, /v1/batches).")
    ] = DEFAULT_BATCHES_PORT,
    gateway: Annotated[
        str,
        typer.Option(
            help="What serves the OpenAI API: the router, or envoy (Envoy asking inferstack's endpoint picker,"
            " the Gateway API Inference Extension's data path)."
        ),
    ] = "router",
    picker_port: Annotated[
        int, typer.Option(help="--gateway envoy: the picker's HTTP port (its gRPC port is the next one).")
    ] = DEFAULT_PICKER_PORT,
    engine_port: Annotated[
        int, typer.Option(help="The first engine's port; the others take the next ones.")
    ] = DEFAULT_ENGINE_PORT,
    engine_memory_gib: Annotated[
        float,
        typer.Option(
            min=1,
            help="Memory of this machine that the engines of models with gpu_share.fraction share; each one's KV "
            "cache (VLLM_CPU_KVCACHE_SPACE) is sized from its fraction of it.",
        ),
    ] = DEFAULT_ENGINE_MEMORY_GIB,
    routers: Annotated[
        int,
        typer.Option(
            help="Router replicas: above 1, behind a round-robin balancer on --port, sharing rate limits"
            " through redis-server (make local ROUTERS=N)."
        ),
    ] = DEFAULT_ROUTERS,
    redis_port: Annotated[
        int, typer.Option(help="The shared rate-limit store's port (several routers).")
    ] = DEFAULT_REDIS_PORT,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Run in the background; stop with `inferstack local down`.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds the engines may take to become ready.")] = 900.0,
    s3: Annotated[
        bool,
        typer.Option(
            "--s3",
            help="Serve from the model store: a loopback S3 server (s3rver), the models prepared into it, engines "
            "streaming from it (runai_streamer), as a cluster does.",
        ),
    ] = False,
    s3_port: Annotated[
        int, typer.Option(help="The loopback model store's port (with --s3).")
    ] = DEFAULT_S3_PORT,
    monitor: Annotated[
        bool,
        typer.Option(
            "--monitor",
            help="Also run Prometheus (127.0.0.1, --monitor-port) scraping everything, with the stack's alert rules.",
        ),
    ] = False,
    monitor_port: Annotated[
        int, typer.Option(help="Prometheus' port (with --monitor).")
    ] = DEFAULT_MONITOR_PORT,
    monitor_interval: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=300,
            help="Seconds between scrapes and rule evaluations (with --monitor); default: the platform's scrape interval.",
        ),
    ] = None,
    monitor_alert_for: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Shorten every alert's `for:` to at most this many seconds, to watch alerts fire (with --monitor).",
        ),
    ] = None,
    pd: Annotated[
        bool,
        typer.Option(
            "--pd",
            help="Serve each generation model disaggregated: one prefill and one decode engine, vLLM's NixlConnector"
            " moving the KV cache between them (make local PD=1).",
        ),
    ] = False,
    traces: Annotated[
        bool,
        typer.Option(
            "--traces",
            help="Also run a trace store (Arize Phoenix, `make traces-venv`) on 127.0.0.1 that the router, the batcher,"
            " the batch service and the engines export every request's spans to (make local TRACES=1).",
        ),
    ] = False,
    traces_port: Annotated[
        int, typer.Option(help="The trace store's web UI and REST API port (with --traces).")
    ] = DEFAULT_TRACES_PORT,
    traces_grpc_port: Annotated[
        int, typer.Option(help="The trace store's OTLP/gRPC port (with --traces).")
    ] = DEFAULT_TRACES_GRPC_PORT,
    detached_child: Annotated[bool, typer.Option("--detached-child", hidden=True)] = False,
) -> None:
    """Start the local stack and wait until the router is ready; foreground unless --detach."""
    from components.local import state  # noqa: PLC0415 - see the imports
    from components.local.cpu_kernels import read_cpu_flags  # noqa: PLC0415
    from components.local.monitor import Monitor  # noqa: PLC0415
    from components.local.plan import LocalOptions, pick_cpus  # noqa: PLC0415
    from components.local.supervisor import StartError, Supervisor, check_ports_free  # noqa: PLC0415
    from components.local.traces import TraceStore  # noqa: PLC0415

    interval_s = Monitor.interval_s if monitor_interval is None else monitor_interval
    options = LocalOptions(
        router_port=port,
        router_metrics_port=router_metrics_port,
        health_port=health_port,
        batcher_port=batcher_port,
        batches_port=batches_port,
        engine_port=engine_port,
        state_dir=state_dir,
        cpus=pick_cpus(lambda: os.sched_getaffinity(0)),
        cpu_flags=read_cpu_flags(),
        routers=routers,
        redis_port=redis_port,
        s3_port=s3_port if s3 else None,
        gateway=gateway,
        picker_port=picker_port,
        engine_memory_gib=engine_memory_gib,
        monitor=Monitor(monitor_port, interval_s, monitor_alert_for) if monitor else None,
        pd=pd,
        traces=TraceStore(traces_port, traces_grpc_port) if traces else None,
    )
    plan = _plan(stack, stacks_dir, options)
    if detach:
        raise typer.Exit(_up_detached(plan, stack, stacks_dir, timeout))
    try:
        lock = state.acquire(state_dir)
    except state.AlreadyRunningError as err:
        raise _fail(str(err)) from None
    except OSError as err:
        raise _fail(
            f"cannot use {state_dir}/ for the lock, state and logs: {err}; choose another --state-dir"
        ) from None
    try:
        check_ports_free(plan)
    except StartError as err:
        lock.release()
        raise _fail(str(err), err.exit_code) from None
    code = Supervisor(plan, detached=detached_child, timeout_s=timeout).run(lock)
    raise typer.Exit(code)


def _up_detached(plan: LocalPlan, stack: str, stacks_dir: Path, timeout: float) -> int:
    """Checks what fails fast here, starts the supervisor in its own session, waits for it to be ready."""
    from components.local import state  # noqa: PLC0415 - see the imports
    from components.local.supervisor import StartError, check_ports_free, tail  # noqa: PLC0415

    state_dir = plan.state_dir
    pid = state.running_pid(state_dir)
    if pid is not None:
        print(
            f"error: {state.AlreadyRunningError(state_dir, pid, state.read_state(state_dir))}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        check_ports_free(plan)
    except StartError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    try:
        plan.logs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        print(f"error: cannot use {state_dir}/ for the lock, state and logs: {err}", file=sys.stderr)
        return EXIT_USAGE
    log = plan.logs_dir / SUPERVISOR_LOG
    argv = [sys.executable, "-m", "components.local", "up", "--detached-child", "--stack", stack]
    argv += ["--stacks-dir", str(stacks_dir), "--state-dir", str(state_dir), "--timeout", str(timeout)]
    argv += ["--port", str(plan.router.port), "--engine-port", str(plan.engines[0].port)]
    argv += ["--engine-memory-gib", str(plan.engine_memory_gib)]
    if plan.routers > 1:  # none behind Envoy
        argv += ["--routers", str(plan.routers)]
    metrics = [s.metrics_port for s in plan.services if s.metrics_port is not None]
    if metrics:  # the first router's; the others take the next ports
        argv += ["--router-metrics-port", str(min(metrics))]
    for service in plan.services[:-1]:
        if service.option != "--port":  # router replicas take the ports after --port
            argv += [service.option, str(service.port)]
    if plan.s3_port is not None:
        argv += ["--s3", "--s3-port", str(plan.s3_port)]
    argv += ["--gateway", "envoy" if plan.envoy is not None else "router"]
    if plan.pd:
        argv += ["--pd"]
    if plan.monitor is not None:
        m = plan.monitor
        argv += ["--monitor", "--monitor-port", str(m.port), "--monitor-interval", str(m.interval_s)]
        argv += [] if m.alert_for_cap_s is None else ["--monitor-alert-for", str(m.alert_for_cap_s)]
    with log.open("wb") as sink:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    print(f"starting in the background (pid {child.pid}); progress in {log}", flush=True)
    try:
        while True:
            code = child.poll()
            if code is not None:
                print(tail(log, 40), file=sys.stderr)
                print(f"error: the local stack did not start (exit {code}); full log {log}", file=sys.stderr)
                return code or EXIT_FAILED
            current = state.read_state(state_dir) or {}
            if current.get("pid") == child.pid and current.get("phase") == "ready":
                print(current.get("banner") or f"ready: {current.get('base_url')}", flush=True)
                return 0
            time.sleep(0.25)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the background stack...", file=sys.stderr, flush=True)
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGTERM)
        child.wait()
        return 130


@local_app.command()
def down(state_dir: StateDirOpt = DEFAULT_STATE_DIR) -> None:
    """Stop a running local stack (detached or not) and everything it started."""
    from components.local import state  # noqa: PLC0415 - see the imports

    pid = state.running_pid(state_dir)
    if pid is None:
        left = state.tagged_pids(state_dir)
        if left:
            state.kill_pids(left)
            state.wait_gone(left, 10.0)
            state.remove_engine_scratch(state.read_state(state_dir) or {})
            print(f"inferstack local was not running; killed {len(left)} leftover processes")
        else:
            print(f"inferstack local is not running (state dir {state_dir}/)")
        return
    if pid > 0:
        print(f"stopping inferstack local (pid {pid})...", flush=True)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    while state.running_pid(state_dir) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    if state.running_pid(state_dir) is not None and pid > 0:
        print(f"pid {pid} did not stop within {DOWN_TIMEOUT_S:.0f}s: killing it", file=sys.stderr)
        state.kill_pids([pid])
    if pid > 0:  # its lock goes before the process does: wait for the exit itself
        state.wait_gone([pid], 10.0)
    left = state.tagged_pids(state_dir)
    if left:
        state.kill_pids(left)
        state.wait_gone(left, 10.0)
    state.remove_engine_scratch(state.read_state(state_dir) or {})  # what a killed supervisor's engines left
    state.clear_state(state_dir)
    print("stopped; no process left")


@local_app.command()
def status(state_dir: StateDirOpt = DEFAULT_STATE_DIR) -> None:
    """Is the local stack running, and what are its processes? Exit 0 when running, 1 when not."""
    from components.local import state  # noqa: PLC0415 - see the imports
    from components.local.supervisor import http_get  # noqa: PLC0415

    pid = state.running_pid(state_dir)
    current = state.read_state(state_dir)
    if pid is None:
        print(f"inferstack local is not running (state dir {state_dir}/)")
        raise typer.Exit(1)
    if current is None:
        print(f"inferstack local is starting (pid {pid}); progress in {state_dir}/logs/")
        return
    up_s = time.time() - float(current.get("started_at") or time.time())
    url = current.get("router_url", "")
    ready = http_get(f"{url}/readyz", timeout=10.0)[0] == 200 if url else False
    print(
        f"inferstack local: {current.get('phase')} (pid {pid}, up {up_s:.0f}s, stack {current.get('stack')}); "
        f"router {url}/v1 {'ready' if ready else 'NOT ready'}"
    )
    for proc in current.get("processes", []):
        alive = state.pid_alive(int(proc["pid"])) if proc.get("pid") else False
        print(
            f"  {proc['name']:<26} pid {proc.get('pid')!s:<8} {'running' if alive else 'EXITED '}  "
            f"{proc['url']:<24} {proc['log']}"
        )


@local_app.command()
def logs(
    name: Annotated[
        str | None, typer.Argument(help="One log: router, health, batcher, engine-<model>-<n>, supervisor.")
    ] = None,
    lines: Annotated[int, typer.Option("-n", "--lines", min=1, help="Lines per log.")] = 20,
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep printing new lines (Ctrl-C ends).")
    ] = False,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
) -> None:
    """Print the tail of each process's log (or of one), from <state dir>/logs/."""
    from components.local.supervisor import tail  # noqa: PLC0415 - see the imports

    logs_dir = state_dir / "logs"
    files = sorted(logs_dir.glob("*.log"))
    if not files:
        raise _fail(f"no logs in {logs_dir}/: start the stack with `inferstack local up`", 1)
    if name is not None:
        files = [f for f in files if f.stem == name]
        if not files:
            known = ", ".join(f.stem for f in sorted(logs_dir.glob("*.log")))
            raise _fail(f"no log named {name!r} in {logs_dir}/; there are: {known}")
    for path in files:
        if len(files) > 1:
            print(f"==> {path} <==")
        print(tail(path, lines))
    if follow:
        _follow(files)


def _follow(files: list[Path]) -> None:
    offsets = {f: f.stat().st_size for f in files}
    try:
        while True:
            for path, seen in offsets.items():
                with contextlib.suppress(OSError), path.open("rb") as handle:
                    start = 0 if path.stat().st_size < seen else seen  # 0: rewritten by a new start
                    handle.seek(start)
                    chunk = handle.read()
                    offsets[path] = start + len(chunk)
                    for line in chunk.decode(errors="replace").splitlines():
                        print(f"{path.stem}: {line}" if len(files) > 1 else line, flush=True)
            time.sleep(0.5)
    except KeyboardInterrupt:
        return
