"""`make local` for real: vLLM on CPU behind the health monitor, batcher and router, talked to with the
``openai`` SDK. One stack serves every assertion (engines take a minute to start); it is brought up the
way the README says (`make local`, here with DETACH=1 and its own ports and state dir, so a stack the
developer runs on the default ports is left alone) and brought down with `make local-down`.

The stack runs with S3=1, as a cluster does: its models are prepared into the loopback S3 store (s3rver) and every
engine streams its weights from there with the Run:ai streamer at its defaults (8 streams, 1 s stall). Two chat
engines streaming SmolLM2 at once is the case that broke with a one-process store (components/local/store.py
says why). Reading the weights from disk, the default, is what the session engines of tests/conftest.py do; one
stack for both would cost a second start of three engines.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from components.local import state
from components.local.plan import LocalOptions, build_plan
from tests.conftest import STREAM_TOKENS, FreshLocalModels
from tests.local.helpers import (
    REPO,
    assert_nothing_left,
    detached_stack,
    free_port_block,
    make_target,
    port_args,
    run_local,
    stack_pids,
)
from tests.local.test_readme import fenced, readme_curls, readme_python_snippet
from tests.stacks import load

# Engines take a minute to start on a quiet machine, many on a busy one; the fixture's start counts
# against the first test's timeout.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

CHAT = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"
_CHAT_SPEC = next(m for m in load("local", REPO / "stacks").spec.models if m.name == CHAT)
DTYPE = _CHAT_SPEC.engine.dtype.value
(ADAPTER,) = (a.name for a in _CHAT_SPEC.adapters)  # the one LoRA adapter `make local` ships, made at start
START_TIMEOUT_S = 1200


@dataclass
class LocalStack:
    state_dir: Path
    router_url: str
    make_args: list[str]
    pids: set[int]
    started_s: float
    router_metrics_url: str

    def store_requests(self) -> list[dict[str, object]]:
        """What the model store served: one JSON line per request (method, path, status, bytes sent)."""
        lines = (self.state_dir / "logs" / "s3-requests.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    @property
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.router_url}/v1", api_key="unused", max_retries=0, timeout=60)


def _make(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return make_target(*args, timeout=timeout)


@pytest.fixture(scope="module")
def local_stack(
    fresh_local_models: FreshLocalModels, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    """`make local S3=1` on its default stack; its models are in the repository's cache already (fresh_local_models)."""
    state_dir = tmp_path_factory.mktemp("local") / "state"
    base = free_port_block(8)
    engines = base + 5
    ports = port_args(base, engines)
    metrics_url = f"http://127.0.0.1:{ports[ports.index('--router-metrics-port') + 1]}/metrics"
    args = " ".join([*ports, "--s3-port", str(base + 4), "--timeout", str(START_TIMEOUT_S - 20)])
    make_args = [f"LOCAL_STATE={state_dir}", "S3=1", f"LOCAL_ARGS={args}"]
    started = time.monotonic()
    with detached_stack(state_dir, "S3=1", f"LOCAL_ARGS={args}", timeout=START_TIMEOUT_S) as up:
        took = time.monotonic() - started
        assert up.returncode == 0, f"make local S3=1 failed:\n{up.stdout}\n{up.stderr}"
        assert "is ready in" in up.stdout, up.stdout
        yield LocalStack(
            state_dir, f"http://127.0.0.1:{base}", make_args, stack_pids(state_dir), took, metrics_url
        )


def test_models_chat_completion_and_streaming(local_stack: LocalStack) -> None:
    client = local_stack.client
    assert {m.id for m in client.models.list().data} == {CHAT, EMBED, ADAPTER}
    chat = client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8
    )
    assert chat.model == CHAT and chat.usage is not None and chat.usage.completion_tokens > 0
    assert isinstance(chat.choices[0].message.content, str)
    completion = client.completions.create(model=CHAT, prompt="The quick brown fox", max_tokens=8)
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    chunks = list(
        client.chat.completions.create(
            model=CHAT,
            messages=[{"role": "user", "content": "Tell me a story"}],
            max_tokens=STREAM_TOKENS,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 2 and text
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_every_engine_streamed_its_weights_from_the_store(local_stack: LocalStack) -> None:
    """Each engine read the whole of its weights from the store (retried ranges may add to it)."""
    plan = build_plan(load("local", REPO / "stacks"), LocalOptions(s3_port=9000), REPO)
    weights: dict[str, int] = {}
    for request in local_stack.store_requests():
        path = str(request["path"])
        if request["method"] == "GET" and path.endswith(".safetensors") and int(str(request["status"])) < 300:
            model = path.split("/models/", 1)[1].split("/", 1)[0]
            weights[model] = weights.get(model, 0) + int(str(request["bytes"]))
    shard = {p.model: sum(f.stat().st_size for f in p.path.glob("*.safetensors")) for p in plan.models}
    engines = {model: sum(1 for e in plan.engines if e.model == model) for model in (CHAT, EMBED)}
    assert engines == {CHAT: 2, EMBED: 1}
    for model, count in engines.items():
        assert weights[model] >= count * shard[model] > 0, (model, weights)


REFERENCE = Path(__file__).with_name("reference_chat.py")
REFERENCE_PROMPTS = ("What is the capital of France?", "Explain Kubernetes in one sentence.")
REFERENCE_TOKENS = 24
#: Two greedy decoders may choose differently where the top two tokens are this close (float32 rounding of two
#: implementations is about 1e-5 nats); anywhere else they must agree.
NEAR_TIE_NATS = 0.01


def test_chat_answers_as_the_reference_implementation_does(
    local_stack: LocalStack, engine_python: Path
) -> None:
    """The served chat model is SmolLM2 converted right: at temperature 0, through the router, vLLM picks the
    tokens ``transformers`` picks from the same weights, prompt and chat template. Two implementations may part
    ways only where the reference itself saw a near tie (two tokens within NEAR_TIE_NATS): from there on their
    texts may differ, as the kernels' rounding decides the tie."""
    model_dir = REPO / ".cache" / "models" / CHAT
    reference = subprocess.run(
        [
            str(engine_python),
            str(REFERENCE),
            str(model_dir),
            DTYPE,
            str(REFERENCE_TOKENS),
            *REFERENCE_PROMPTS,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    expected = json.loads(reference.stdout)
    for prompt, ref in zip(REFERENCE_PROMPTS, expected, strict=True):
        reply = local_stack.client.chat.completions.create(
            model=CHAT,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=REFERENCE_TOKENS,
            temperature=0,
            logprobs=True,
            extra_body={"return_tokens_as_token_ids": True},
        )
        choice = reply.choices[0]
        assert choice.logprobs is not None and choice.logprobs.content is not None
        ids = [int(t.token.removeprefix("token_id:")) for t in choice.logprobs.content]
        served = [t for t in ids if t not in ref["ends"]]
        if served == ref["tokens"]:  # the same tokens, ended at the same place: the same answer
            assert choice.message.content == ref["text"]
        else:  # parted at the first difference, or where one ended and the other went on
            parted = next(
                (i for i, (a, b) in enumerate(zip(served, ref["tokens"], strict=False)) if a != b),
                min(len(served), len(ref["tokens"])),
            )
            assert ref["margins"][parted] <= NEAR_TIE_NATS, (
                f"{prompt!r}: vLLM parted from transformers at token {parted}, where the reference's choice led "
                f"by {ref['margins'][parted]:.4f} nats: {choice.message.content!r} against {ref['text']!r}"
            )
        if prompt == REFERENCE_PROMPTS[0]:
            assert "Paris" in (choice.message.content or "")  # and it makes sense


def test_the_shipped_adapter_answers_unlike_the_base_model_but_in_words(local_stack: LocalStack) -> None:
    """The stack's LoRA adapter, made at start, is a model of its own: listed with its parent, loaded on the first
    request for it, and at temperature 0 it answers otherwise than the base model, the same way each time,
    and still in words (a random adapter at half the usual scale perturbs SmolLM2 without wrecking it)."""
    client = local_stack.client
    assert {m.id: getattr(m, "parent", None) for m in client.models.list().data}[ADAPTER] == CHAT

    def answers(model: str) -> list[str]:
        return [
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=REFERENCE_TOKENS,
                temperature=0,
            )
            .choices[0]
            .message.content
            or ""
            for prompt in REFERENCE_PROMPTS
        ]

    tuned, base = answers(ADAPTER), answers(CHAT)
    assert tuned != base, tuned
    assert answers(ADAPTER) == tuned
    assert all(len(re.findall(r"[A-Za-z]{2,}", answer)) >= 4 for answer in tuned), tuned


def test_chat_template_stop_and_streaming_behave_through_the_router(local_stack: LocalStack) -> None:
    client = local_stack.client
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(model=CHAT, messages=messages, max_tokens=64, temperature=0)
    answer = whole.choices[0].message.content or ""
    assert whole.choices[0].finish_reason == "stop"  # the model ended its turn (<|im_end|>) on its own
    assert answer and "<|im_" not in answer  # the end-of-turn token is not part of the text
    chunks = client.chat.completions.create(
        model=CHAT, messages=messages, max_tokens=64, temperature=0, stream=True
    )
    streamed = list(chunks)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == answer
    assert [c.choices[0].finish_reason for c in streamed if c.choices and c.choices[0].finish_reason] == [
        "stop"
    ]
    stopped = client.chat.completions.create(
        model=CHAT, messages=messages, max_tokens=64, temperature=0, stop=["Paris"]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert answer.startswith(stopped.choices[0].message.content or "") and "Paris" not in (
        stopped.choices[0].message.content or ""
    )


def test_embeddings_are_real_sentence_embeddings(local_stack: LocalStack) -> None:
    sentences = ["A cat sits on the mat.", "A kitten is sitting on a rug.", "Interest rates rose again."]
    result = local_stack.client.embeddings.create(model=EMBED, input=sentences)
    vectors = [d.embedding for d in sorted(result.data, key=lambda d: d.index)]
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert all(abs(math.hypot(*v) - 1) < 1e-2 for v in vectors)
    cos = [sum(a * b for a, b in zip(vectors[0], v, strict=True)) for v in vectors[1:]]
    assert cos[0] > cos[1] + 0.2, cos  # all-MiniLM-L6-v2 knows a cat from a central bank


def test_router_metrics_and_status(local_stack: LocalStack) -> None:
    with urllib.request.urlopen(local_stack.router_metrics_url, timeout=10) as response:
        metrics = response.read().decode()
    with pytest.raises(urllib.error.HTTPError) as public:  # the API port (what an ingress routes) has none
        urllib.request.urlopen(f"{local_stack.router_url}/metrics", timeout=10)
    assert public.value.code == 404
    assert "inferstack_router_requests_total{" in metrics and f'model="{CHAT}"' in metrics
    healthy = [line for line in metrics.splitlines() if line.startswith("inferstack_router_backend_healthy")]
    assert len(healthy) == 3 and all(line.endswith(" 1.0") for line in healthy), healthy
    status = run_local("status", "--state-dir", str(local_stack.state_dir))
    assert status.returncode == 0 and "ready (pid" in status.stdout and "NOT ready" not in status.stdout


def test_the_readmes_curl_lines_and_openai_snippet_work(local_stack: LocalStack) -> None:
    """As written in README.md, with the test stack's ports in place of the defaults."""
    base = int(local_stack.router_url.rsplit(":", 1)[1])
    ports = {"8080": str(base), "8081": str(base + 1), "8082": str(base + 2)}
    ports["9091"] = local_stack.router_metrics_url.rsplit(":", 1)[1].removesuffix("/metrics")

    def here(text: str) -> str:
        return re.sub(r"127\.0\.0\.1:(808[012]|9091)", lambda m: f"127.0.0.1:{ports[m.group(1)]}", text)

    curls = readme_curls()
    assert len(curls) >= 3
    for command in curls:
        result = subprocess.run(
            here(command), shell=True, capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0 and result.stdout, command
        if "/v1/chat/completions" in command:
            assert (
                "Paris" in json.loads(result.stdout)["choices"][0]["message"]["content"]
            )  # a sensible answer
        if "/v1/backends" in command:
            assert len(json.loads(result.stdout)["backends"]) == 3
    snippet = subprocess.run(
        [sys.executable, "-c", here(readme_python_snippet())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert snippet.returncode == 0, snippet.stderr
    assert snippet.stdout.splitlines()[-1] == "384"


def test_the_readmes_batch_api_snippet_runs_to_completion(local_stack: LocalStack) -> None:
    """The Batch API example in README.md, after the client snippet it builds on, on the test stack's port."""
    base = int(local_stack.router_url.rsplit(":", 1)[1])
    code = readme_python_snippet().replace("127.0.0.1:8080", f"127.0.0.1:{base}") + "\n" + fenced("python")[1]
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "20"


def test_a_second_make_local_fails_fast(local_stack: LocalStack) -> None:
    # The venvs are make prerequisites: bring them up to date first (untimed), so the clock below
    # measures the refusal, not a reinstall after someone touched pyproject.toml.
    assert _make("venv", "engine-venv", timeout=900).returncode == 0
    started = time.monotonic()
    second = _make("local", *local_stack.make_args, timeout=120)
    assert second.returncode != 0
    assert "inferstack local is already running (pid" in second.stderr
    assert "Traceback" not in second.stderr
    assert time.monotonic() - started < 60  # refused, not started: a start takes minutes


def test_serving_goes_on_when_one_chat_replica_dies(local_stack: LocalStack) -> None:
    current = state.read_state(local_stack.state_dir)
    assert current is not None
    victim = next(p for p in current["processes"] if p["name"] == f"{CHAT}-0")
    os.killpg(victim["pid"], signal.SIGKILL)  # the engine and its EngineCore
    client = local_stack.client
    for i in range(8):
        reply = client.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": f"still there? {i}"}], max_tokens=4
        )
        assert reply.usage is not None and reply.usage.completion_tokens > 0
    status = run_local("status", "--state-dir", str(local_stack.state_dir))
    assert "EXITED" in status.stdout


def test_down_leaves_no_process(local_stack: LocalStack) -> None:
    """Last: `make local-down` stops everything; no pid of the stack survives."""
    pids = stack_pids(local_stack.state_dir) | local_stack.pids
    assert len(pids) >= 7
    down = _make("local-down", f"LOCAL_STATE={local_stack.state_dir}", timeout=120)
    assert down.returncode == 0 and "no process left" in down.stdout, down.stdout + down.stderr
    assert "model store stopped" in (local_stack.state_dir / "logs" / "supervisor.log").read_text()
    assert_nothing_left(local_stack.state_dir, pids)


def test_missing_models_under_the_cache_are_made_without_download(
    fresh_local_models: FreshLocalModels,
) -> None:
    """`make local` on a fresh clone: the stack's models do not exist yet and are made on the spot (the fixture
    checks the cache was empty, then runs the supervisor's own steps)."""
    from components.local.tiny_adapter import is_complete as is_adapter_complete
    from components.local.tiny_model import is_complete

    plan, root = fresh_local_models.plan, fresh_local_models.root
    assert all(p.recipe is not None and is_complete(p.path, p.recipe) for p in plan.models)
    assert {p.path.parent for p in plan.models} == {root / ".cache" / "models"}
    (adapter,) = plan.adapters  # and the stack's LoRA adapter, for the chat model just made
    assert adapter.seed is not None
    assert is_adapter_complete(adapter.path, adapter.base, adapter.rank, adapter.seed)
    assert adapter.base == root / ".cache" / "models" / CHAT


def test_engine_command_lines_pass_vllms_own_parser(check_vllm_args, tmp_path: Path) -> None:
    """Every `vllm serve` command line the local plan makes, parsed by vLLM itself (no engine started)."""
    from components.local.supervisor import engine_process

    plan = build_plan(load("local", REPO / "stacks"), LocalOptions(cpus=(0, 1)), REPO)
    argvs = [engine_process(e, tmp_path, "tag").argv for e in plan.engines]
    at = argvs[0].index("--max-num-seqs")
    assert argvs[0][at : at + 2] == ["--max-num-seqs", "32"]
    assert "--runner" in argvs[2] and "--enable-prefix-caching" not in argvs[2]  # vLLM decides for MiniLM
    assert "--enable-lora" in argvs[0] and "--enable-lora" not in argvs[2]  # the chat model has an adapter
    assert check_vllm_args(argvs, parse_only=True) == [None] * len(argvs)
