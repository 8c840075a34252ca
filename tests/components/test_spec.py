"""The spec: every committed stack validates; every kind of mistake gets one clear, located message."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from components.base.problems import SpecError
from components.cli.main import SCHEMA_PATH
from components.core.stackfile import STACKS_DIR, available_stacks
from tests.components.helpers import LLAMA_8B_COMMIT, minimal, write_stack
from tests.stacks import load

COMMITTED = available_stacks(STACKS_DIR)


def test_every_expected_environment_has_a_stack_file() -> None:
    assert {"local", "kind", "dev", "staging", "prod"} <= set(COMMITTED)


@pytest.mark.parametrize("stack", COMMITTED)
def test_committed_stack_validates(stack: str) -> None:
    loaded = load(stack)
    assert loaded.spec.models
    assert set(loaded.layout.placements) == {m.name for m in loaded.spec.models}


def test_prod_serves_a_70b_awq_model_with_tensor_parallelism_on_h100_an_8b_and_an_embedding_model() -> None:
    prod = load("prod")
    by_name = {m.name: m for m in prod.spec.models}
    big = next(m for m in prod.spec.models if (m.arch() or None) and m.arch().params_b > 60)  # type: ignore[union-attr]
    assert big.engine.quantization.value == "awq"
    assert big.engine.tensor_parallel_size > 1
    assert prod.layout.placements[big.name].instance.gpu == "H100"  # type: ignore[union-attr]
    gpus = {prod.layout.placements[n].instance.gpu for n in by_name}  # type: ignore[union-attr]
    assert gpus & {"L4", "L40S"}
    assert any(m.resolved_task().value == "embed" for m in prod.spec.models)


def test_dev_uses_spot_g6() -> None:
    dev = load("dev")
    assert all(
        p.capacity_type.value == "spot" and p.instance.family == "g6" for p in dev.layout.pools.values()
    )


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation of the minimal spec at a dotted path (list indices as numbers)."""

    def mutate(spec: dict[str, Any]) -> None:
        parts = path.split(".")
        node: Any = spec
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        last = parts[-1]
        if last.isdigit() and int(last) == len(node):
            node.append(value)
        elif last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _add_model(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(spec: dict[str, Any]) -> None:
        spec["models"].append(
            {
                "name": "second",
                "source": "meta-llama/Llama-3.1-8B-Instruct",
                "revision": LLAMA_8B_COMMIT,
                "pool": "l40s",
                **fields,
            }
        )

    return mutate


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(spec: dict[str, Any]) -> None:
        parts = path.split(".")
        node: Any = spec
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[parts[-1]]

    return mutate


def _tp_not_dividing(spec: dict[str, Any]) -> None:
    spec["gpu_pools"][0]["instance_type"] = "g6e.12xlarge"
    spec["models"][0]["engine"]["tensor_parallel_size"] = 3


def _tp_not_filling_nodes(spec: dict[str, Any]) -> None:
    spec["gpu_pools"][0]["instance_type"] = "g6e.12xlarge"
    spec["models"][0]["engine"]["tensor_parallel_size"] = 6


def _fp8_on_ampere(spec: dict[str, Any]) -> None:
    spec["gpu_pools"][0]["instance_type"] = "g5.2xlarge"
    spec["models"][0]["engine"]["quantization"] = "fp8"


def _pool_too_small(spec: dict[str, Any]) -> None:
    spec["gpu_pools"][0]["max_nodes"] = 1
    spec["models"][0]["scaling"]["max_replicas"] = 3


def _on_local(spec: dict[str, Any]) -> None:
    """The minimal stack on this machine: target local, without the eks cluster section."""
    spec["target"] = "local"
    del spec["cluster"]


def _unpinned_source(source: str) -> Callable[[dict[str, Any]], None]:
    """Another kind of source (a revision pins hub sources only)."""

    def mutate(spec: dict[str, Any]) -> None:
        del spec["models"][0]["revision"]
        spec["models"][0]["source"] = source

    return mutate


_s3_elsewhere = _unpinned_source("s3://someone-elses-bucket/llama-3.1-8b/")


def _cache_too_big(spec: dict[str, Any]) -> None:
    spec["models"][0]["engine"]["kind"] = "sglang"  # reads a node cache
    spec["gpu_pools"][0]["model_cache_gib"] = 5000  # g6e.xlarge has 250 GB of NVMe


def _other_account(spec: dict[str, Any]) -> None:
    spec["cluster"] = {"account_id": "123456789012"}
    spec["model_store"] = {"account_id": "210987654321"}


def _sglang_streamer(spec: dict[str, Any]) -> None:
    spec["models"][0]["engine"]["kind"] = "sglang"
    spec["models"][0]["weights"] = {"fetch": "streamer"}


# (id, mutation, field path expected in the message, words the message must contain)
BAD_INPUTS: list[tuple[str, Callable[[dict[str, Any]], None], str, list[str]]] = [
    ("unknown top-level key", _set("modles", []), "modles", ["unknown key 'modles'", "models"]),
    (
        "moving karpenter ami",
        _set("cluster.karpenter_ami_version", "latest"),
        "cluster.karpenter_ami_version",
        ["'latest' is not an AMI release", "v20250620"],
    ),
    (
        "unknown engine key",
        _set("models.0.engine.tensor_paralel_size", 2),
        "models[0].engine.tensor_paralel_size",
        ["unknown key", "tensor_parallel_size"],
    ),
    (
        "wrong type",
        _set("models.0.engine.max_num_seqs", "many"),
        "models[0].engine.max_num_seqs",
        ["integer", "many"],
    ),
    (
        "negative replicas",
        _set("models.0.scaling.min_replicas", -1),
        "models[0].scaling.min_replicas",
        ["greater than or equal to 0"],
    ),
    (
        "min above max",
        _set("models.0.scaling", {"min_replicas": 3, "max_replicas": 2}),
        "models[0].scaling",
        ["min_replicas (3) is above max_replicas (2)", "raise max_replicas"],
    ),
    (
        "unknown engine kind",
        _set("models.0.engine.kind", "ollama"),
        "models[0].engine.kind",
        ["vllm", "sglang"],
    ),
    (
        "unknown quantization",
        _set("models.0.engine.quantization", "int3"),
        "models[0].engine.quantization",
        ["awq"],
    ),
    (
        "gpu memory utilization too high",
        _set("models.0.engine.gpu_memory_utilization", 1.5),
        "models[0].engine.gpu_memory_utilization",
        ["0.98"],
    ),
    ("model name not DNS-safe", _set("models.0.name", "Llama_8B"), "models[0].name", ["not a DNS label"]),
    ("model name too long", _set("models.0.name", "a" * 50), "models[0].name", ["at most 40"]),
    ("duplicate model names", _add_model(name="llama-8b"), "models[1].name", ["used twice"]),
    (
        "duplicate pool names",
        _set("gpu_pools.1", {"name": "l40s", "instance_type": "g6.xlarge"}),
        "gpu_pools[1].name",
        ["used twice"],
    ),
    ("unknown pool", _set("models.0.pool", "h100"), "models[0].pool", ["unknown pool 'h100'", "l40s"]),
    (
        "bad model source",
        _set("models.0.source", "not a model"),
        "models[0].source",
        ["Hugging Face repo id", "s3://"],
    ),
    ("bad s3 uri", _set("models.0.source", "s3://UPPER/x"), "models[0].source", ["S3 URI"]),
    (
        "local path outside target local",
        _unpinned_source("./weights"),
        "models[0].source",
        ["target: local"],
    ),
    (
        "unknown model without architecture",
        _set("models.0.source", "acme/secret-model-13b"),
        "models[0].architecture",
        ["catalog does not know", "params_b"],
    ),
    (
        "unknown instance type",
        _set("gpu_pools.0.instance_type", "g7.huge"),
        "gpu_pools[0].instance_type",
        ["unknown GPU instance type", "g6"],
    ),
    (
        "tensor x pipeline parallel filling no whole number of nodes",
        _tp_not_filling_nodes,
        "models[0].engine.tensor_parallel_size",
        ["fills no whole number of g6e.12xlarge nodes", "whole nodes (8, 12, 16, 20, ...)"],
    ),
    (
        "tensor parallel not dividing GPUs",
        _tp_not_dividing,
        "models[0].engine.tensor_parallel_size",
        ["does not divide the 4 GPUs of g6e.12xlarge", "1, 2 or 4"],
    ),
    (
        "model does not fit",
        _set("models.0.source", "meta-llama/Llama-3.1-70B-Instruct"),
        "models[0]",
        ["does not fit g6e.xlarge", "weights", "KV budget"],
    ),
    ("fp8 on a GPU without fp8", _fp8_on_ampere, "models[0].engine", ["fp8 weights need an Ada", "A10G"]),
    (
        "chunked prefill off with too few batched tokens",
        _set(
            "models.0.engine",
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048, "max_model_len": 8192},
        ),
        "models[0].engine",
        ["max_num_batched_tokens (2048) is below max_model_len (8192)"],
    ),
    (
        "unpinned image",
        _set("models.0.engine.image", "vllm/vllm-openai:latest"),
        "models[0].engine.image",
        ["not pinned", "digest"],
    ),
    (
        "untagged image",
        _set("models.0.engine.image", "vllm/vllm-openai"),
        "models[0].engine.image",
        ["not pinned"],
    ),
    (
        "extra args overriding the port",
        _set("models.0.engine.extra_args", ["--port", "9000"]),
        "models[0].engine.extra_args",
        ["--port"],
    ),
    (
        "pool max nodes too small",
        _pool_too_small,
        "gpu_pools[0].max_nodes",
        ["cannot hold", "raise max_nodes to 3"],
    ),
    (
        "auto pool with no model",
        _set("gpu_pools.1", {"name": "spare", "instance_type": "auto"}),
        "gpu_pools[1].instance_type",
        ["no model names it"],
    ),
    ("no models", _set("models", []), "models", ["at least 1"]),
    ("missing environment", _delete("environment"), "environment", ["required"]),
    (
        "bad kubernetes version",
        _set("cluster.kubernetes_version", "1.12"),
        "cluster.kubernetes_version",
        ["pattern"],
    ),
    (
        "gpu model on target local",
        _on_local,
        "models[0].engine.device",
        ["set engine.device: cpu"],
    ),
    (
        "an eks field on a cluster you bring",
        lambda spec: spec.update(target="kubernetes"),
        "cluster.api_endpoint",
        ["api_endpoint is a field of target eks", "target kubernetes has no such field"],
    ),
    (
        "an unknown key in the cluster section",
        lambda spec: spec.update(target="kubernetes", cluster={"namespce": "ml"}),
        "cluster.namespce",
        ["unknown key 'namespce'", "known keys here: account_id, kubernetes_version, name, namespace"],
    ),
    (
        "cpu engine with tensor parallelism",
        _set("models.0.engine", {"device": "cpu", "tensor_parallel_size": 2}),
        "models[0].engine",
        ["device: cpu"],
    ),
    (
        "awq on trtllm",
        _set("models.0.engine", {"kind": "trtllm", "quantization": "awq"}),
        "models[0].engine",
        ["not served by TensorRT-LLM", "fp8", "kind: vllm or sglang"],
    ),
    (
        "hub source without a pinned revision",
        _delete("models.0.revision"),
        "models[0].revision",
        ["without a pinned revision", "40 hex digits", "s3://"],
    ),
    (
        "revision that is not a commit hash",
        _set("models.0.revision", "main"),
        "models[0].revision",
        ["not a commit hash", "40 hex digits"],
    ),
    (
        "revision on an s3 source",
        _set("models.0.source", "s3://inferstack-test-us-east-1-models/models/llama/"),
        "models[0]",
        ["revision pins a Hugging Face source", "remove revision"],
    ),
    (
        "s3 source outside the model store",
        _s3_elsewhere,
        "models[0].source",
        ["not the platform's model store"],
    ),
    (
        "node cache larger than the instance's NVMe",
        _cache_too_big,
        "gpu_pools[0].model_cache_gib",
        ["local NVMe"],
    ),
    (
        "model store bucket from another account",
        _other_account,
        "model_store.account_id",
        ["belongs to account 210987654321", "use a store bucket of 123456789012"],
    ),
    (
        "streamer for an engine that cannot stream",
        _sglang_streamer,
        "models[0]",
        ["streamer is for engines that stream weights from the store (vllm)", "node-cache"],
    ),
    (
        "hpa for an engine without a load metric",
        lambda spec: spec.update(
            addons={"autoscaler": "hpa"}, models=[{**spec["models"][0], "engine": {"kind": "trtllm"}}]
        ),
        "models[0].engine.kind",
        ["exports no queue or KV-cache metric", "use autoscaler: keda"],
    ),
]


def test_there_are_at_least_25_distinct_bad_inputs() -> None:
    assert len({case[0] for case in BAD_INPUTS}) >= 25


@pytest.mark.parametrize(
    ("mutate", "path", "words"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_gets_a_located_message_that_says_how_to_fix(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], None], path: str, words: list[str]
) -> None:
    spec = minimal()
    mutate(spec)
    write_stack(tmp_path, "bad", spec)
    with pytest.raises(SpecError) as caught:
        load("bad", tmp_path)
    rendered = caught.value.render()
    assert rendered.startswith(str(tmp_path / "Pulumi.bad.yaml"))
    assert f": {path}: " in rendered
    for word in words:
        assert word in rendered, rendered


def test_missing_stack_file_lists_the_stacks_that_exist(tmp_path: Path) -> None:
    write_stack(tmp_path, "dev", minimal())
    with pytest.raises(SpecError, match=r"no such stack file; stacks in .*: dev"):
        load("prod", tmp_path)


def test_malformed_yaml_names_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.broken.yaml").write_text("config:\n  inferstack:platform:\n    name: [unclosed\n")
    with pytest.raises(SpecError, match=r"not valid YAML at line \d+, column \d+"):
        load("broken", tmp_path)


def test_stack_file_without_the_platform_key_says_which_key(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.empty.yaml").write_text("config:\n  aws:region: us-east-1\n")
    with pytest.raises(SpecError, match="missing the 'inferstack:platform' key"):
        load("empty", tmp_path)


def test_every_problem_is_reported_not_just_the_first(tmp_path: Path) -> None:
    spec = minimal()
    spec["models"][0]["engine"]["max_num_seqs"] = "many"
    spec["models"][0]["name"] = "Bad_Name"
    write_stack(tmp_path, "two", spec)
    with pytest.raises(SpecError) as caught:
        load("two", tmp_path)
    assert {p.path for p in caught.value.problems} == {"models[0].engine.max_num_seqs", "models[0].name"}


def test_auto_pool_picks_the_cheapest_instance_that_fits_and_says_why(tmp_path: Path) -> None:
    spec = minimal()
    spec["gpu_pools"][0]["instance_type"] = "auto"
    write_stack(tmp_path, "auto", spec)
    loaded = load("auto", tmp_path)
    pool = loaded.layout.pools["l40s"]
    assert pool.reason.startswith("auto: ")
    assert loaded.layout.placements["llama-8b"].fit.fits  # type: ignore[union-attr]


def test_auto_model_placement_takes_the_cheapest_declared_pool_that_fits(tmp_path: Path) -> None:
    spec = minimal()
    spec["gpu_pools"] = [
        {"name": "big", "instance_type": "p5.48xlarge"},
        {"name": "small", "instance_type": "g6e.xlarge"},
        {"name": "tiny", "instance_type": "g4dn.xlarge"},
    ]
    spec["models"][0]["pool"] = "auto"
    write_stack(tmp_path, "auto", spec)
    placement = load("auto", tmp_path).layout.placements["llama-8b"]
    assert placement.pool == "small"
    assert "cheapest pool that fits" in placement.reason


def test_mistakes_across_three_sections_are_all_reported_in_one_run(tmp_path: Path) -> None:
    """Cross-section rules (components/spec/rules.py) all run: the autoscaler against a model's scale, shared
    rate limits against the target, the cluster's name against the target; one run names all three."""
    raw = minimal()
    raw["addons"] = {"autoscaler": "hpa"}
    raw["models"][0]["scaling"]["min_replicas"] = 0
    raw["gateway"] = {**raw.get("gateway", {}), "shared_limits": True}
    raw["cluster"] = {**raw.get("cluster", {}), "name": "a-cluster-name-that-is-far-too-long-for-aws-iam"}
    write_stack(tmp_path, "bad", raw)
    with pytest.raises(SpecError) as caught:
        load("bad", tmp_path)
    paths = [p.path for p in caught.value.problems]
    assert {"addons.autoscaler", "gateway.shared_limits", "cluster.name"} <= set(paths), caught.value.render()
    assert "Traceback" not in caught.value.render()


ROOT = Path(__file__).resolve().parents[2]
STACK_FILES = sorted(p for d in ("stacks", "examples", "tests") for p in (ROOT / d).rglob("Pulumi.*.yaml"))


@pytest.mark.parametrize("path", STACK_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_stack_file_matches_the_committed_json_schema(path: Path) -> None:
    """The schema editors read (`inferstack schema`): its cluster section is a union chosen by the target."""
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


def test_the_json_schema_gives_each_target_its_own_cluster_section() -> None:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    eks_field = {"vpc_cidr": "10.0.0.0/16"}

    def errors(**platform: Any) -> list[str]:
        document = {"config": {"inferstack:platform": {**minimal(), **platform}}}
        return [e.message for e in validator.iter_errors(document)]

    assert errors(cluster=eks_field) == []  # eks, the default target
    assert errors(target="kubernetes", cluster={"namespace": "ml"}) == []
    assert any("vpc_cidr" in e for e in errors(target="kubernetes", cluster=eks_field))
    assert any("vpc_cidr" in e for e in errors(target="local", cluster=eks_field))


def _paths(raw: dict[str, Any], tmp_path: Path) -> list[str]:
    """The field paths of every problem one run of the stack file reports (the target's cloud rules included)."""
    write_stack(tmp_path, "bad", raw)
    with pytest.raises(SpecError) as caught:
        load("bad", tmp_path)
    assert "Traceback" not in caught.value.render()
    return [p.path for p in caught.value.problems]


def test_a_mistake_in_each_of_three_sections_own_rules_is_reported_in_one_run(tmp_path: Path) -> None:
    """Each section's own rules run whether or not another section's fail: the gateway's replicas, a model's
    scale against its SLO and the cluster's zones are named together."""
    raw = minimal()
    raw["gateway"] = {"replicas": 5, "max_replicas": 2}
    raw["models"][0]["scaling"]["min_replicas"] = 0
    raw["models"][0]["slo"] = {"allow_cold_starts": False}
    raw["cluster"]["availability_zones"] = ["us-east-1a"]
    assert set(_paths(raw, tmp_path)) == {"gateway", "models[0]", "cluster"}


def test_a_section_with_mistakes_in_several_of_its_parts_hears_of_each(tmp_path: Path) -> None:
    """A section's rules all run (pydantic stops at a model's first failing validator): a model's weights and its
    scale, the gateway's ingress and its replicas."""
    raw = minimal()
    model = raw["models"][0]
    model["engine"]["kind"] = "sglang"
    model["weights"] = {"fetch": "streamer"}
    model["scaling"]["min_replicas"] = 0
    model["slo"] = {"allow_cold_starts": False}
    raw["gateway"] = {"ingress": "alb", "replicas": 5, "max_replicas": 2}
    write_stack(tmp_path, "bad", raw)
    with pytest.raises(SpecError) as caught:
        load("bad", tmp_path)
    rendered = caught.value.render()
    for located in (
        ": models[0]: weights.fetch: streamer is for engines that stream weights",
        ": models[0]: scaling.min_replicas: 0 lets llama-8b scale to zero",
        ": gateway: ingress alb needs a hostname",
        ": gateway: replicas (5) is above max_replicas (2)",
    ):
        assert located in rendered, rendered


def test_cross_section_and_plan_time_mistakes_are_reported_in_one_run(tmp_path: Path) -> None:
    """The spec's cross-section rules and the plan-time rules run together on a spec whose sections are valid: the
    autoscaler against a model's scale (spec), the EKS API's way in (the spec and the target), the model store's
    fields (the target's cloud) and a startup budget below a cold start (the layout), all in one run."""
    raw = minimal()
    raw["addons"] = {"autoscaler": "hpa"}
    raw["models"][0]["scaling"]["min_replicas"] = 0
    raw["models"][0]["rollout"] = {"startup_budget_s": 60}
    del raw["cluster"]["api_endpoint"]
    raw["model_store"] = {"endpoint_url": "http://minio.minio.svc:9000"}
    assert _paths(raw, tmp_path) == [
        "addons.autoscaler",
        "model_store.endpoint_url",
        "cluster.api_endpoint",
        "models[0].rollout.startup_budget_s",
    ]


def test_a_pool_too_small_for_its_models_does_not_hide_the_rules_that_read_the_layout(tmp_path: Path) -> None:
    """Placement reports a pool's size and still hands over the layout, so a startup budget is checked with it."""
    raw = minimal()
    raw["gpu_pools"][0]["max_nodes"] = 1
    raw["models"][0]["scaling"] = {"min_replicas": 1, "max_replicas": 3}
    raw["models"][0]["rollout"] = {"startup_budget_s": 60}
    assert _paths(raw, tmp_path) == ["gpu_pools[0].max_nodes", "models[0].rollout.startup_budget_s"]


def test_a_model_placement_cannot_place_still_hears_of_the_rules_that_need_no_layout(tmp_path: Path) -> None:
    """An unknown pool leaves nothing to place: the rules that read the layout find nothing, the others still
    report (the API's way in, a hub source's revision)."""
    raw = minimal()
    raw["models"][0]["pool"] = "missing"
    raw["models"][0]["rollout"] = {"startup_budget_s": 60}
    del raw["models"][0]["revision"]
    del raw["cluster"]["api_endpoint"]
    assert _paths(raw, tmp_path) == ["models[0].pool", "models[0].revision", "cluster.api_endpoint"]
