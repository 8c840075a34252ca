"""``gateway.shared_limits`` and ``precise_prefix`` as rendered: ElastiCache on eks (prod), a hardened Redis
StatefulSet on a cluster you bring (kind), the router's Secret and mounts, its tokenizer init container,
and the spec's rules. Manifests also pass kubernetes-validate and checkov (test_checkov.py, every stack)."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from components.core.redaction import REDACTED
from components.render import common, limit_store, runtime_config
from components.spec import PlatformSpec
from tests.components.helpers import minimal
from tests.components.test_aws import _of, _synth
from tests.stacks import load, synthesized


def _manifests(name: str) -> dict[tuple[str, str], dict]:
    return {(m["kind"], m["metadata"]["name"]): m for m in synthesized(name).kubernetes_manifests()}


def test_prod_keeps_its_limits_in_elasticache_encrypted_in_transit_and_at_rest() -> None:
    spec = load("prod").spec
    synthesis = _synth("prod")
    [group] = _of(synthesis, "aws:elasticache/replicationGroup:ReplicationGroup")
    g = group.inputs
    assert g["transitEncryptionEnabled"] is True and g["atRestEncryptionEnabled"] is True
    assert g["authToken"] == REDACTED, "the AUTH token only travels as a Pulumi secret"
    assert (
        g["numCacheClusters"] == 2 and g["automaticFailoverEnabled"] is True and g["multiAzEnabled"] is True
    )
    assert g["nodeType"] == spec.gateway.limit_store_node_type and g["port"] == 6379
    keys = {r.name: r for r in _of(synthesis, "aws:kms/key:Key")}
    assert keys[f"{spec.cluster_name}-limits"].inputs["enableKeyRotation"] is True
    assert g["kmsKeyId"].startswith("arn:aws:kms:")
    [sg] = _of(synthesis, "aws:ec2/securityGroup:SecurityGroup")
    [rule] = sg.inputs["ingress"]
    assert (rule["fromPort"], rule["toPort"], rule["cidrBlocks"]) == (6379, 6379, [spec.cluster.vpc_cidr])
    [subnets] = _of(synthesis, "aws:elasticache/subnetGroup:SubnetGroup")
    assert subnets.inputs["subnetIds"]
    # the router reads the address and the token from its Secret, never from the ConfigMap
    m = _manifests("prod")
    secret = m[("Secret", limit_store.secret_name(spec))]
    assert secret["stringData"] == {"url": REDACTED, "token": REDACTED}
    store = runtime_config.runtime_config(spec).router.limit_store
    assert store is not None and store.url is None and str(store.url_file).startswith(common.LIMIT_STORE_DIR)
    assert store.replicas == spec.gateway.replicas
    assert ("StatefulSet", limit_store.name(spec)) not in m  # managed: nothing runs in the cluster


def test_a_cluster_you_bring_runs_a_hardened_redis_only_the_router_reaches() -> None:
    spec = load("kind").spec
    m = _manifests("kind")
    sts = m[("StatefulSet", limit_store.name(spec))]["spec"]["template"]["spec"]
    [redis] = sts["containers"]
    assert redis["image"] == limit_store.REDIS_IMAGE
    assert redis["securityContext"]["readOnlyRootFilesystem"] and redis["securityContext"]["runAsNonRoot"]
    assert "env" not in redis, "AUTH comes from a mounted file, never an environment variable"
    assert redis["args"][redis["args"].index("--save") + 1] == ""
    assert m[("Secret", limit_store.auth_secret_name(spec))]["stringData"] == {"auth.conf": REDACTED}
    policy = m[("NetworkPolicy", limit_store.name(spec))]["spec"]
    [rule] = policy["ingress"]
    assert rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "router"
    assert "egress" not in policy and "Egress" in policy["policyTypes"]
    router = m[("NetworkPolicy", "inferstack-router")]["spec"]
    assert any(
        r["ports"] == [{"protocol": "TCP", "port": 6379}]
        and r["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "limits"
        for r in router["egress"]
    )
    mounts = m[("Deployment", "inferstack-router")]["spec"]["template"]["spec"]["containers"][0][
        "volumeMounts"
    ]
    assert {"name": "limit-store", "mountPath": common.LIMIT_STORE_DIR, "readOnly": True} in mounts
    assert limit_store.in_cluster_url(spec) == "redis://inferstack-limits.inference.svc:6379"


def test_precise_prefix_fetches_the_tokenizer_before_the_router_starts_and_opens_the_event_ports() -> None:
    m = _manifests("kind")
    pod = m[("Deployment", "inferstack-router")]["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    assert init["command"][:3] == ["python", "-m", "runtime.kvcache.fetch"]
    assert init["args"] == ["qwen-0-5b=Qwen/Qwen2.5-0.5B-Instruct"]
    assert init["image"] == pod["containers"][0]["image"]
    router_mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "tokenizers", "mountPath": common.TOKENIZERS_DIR, "readOnly": True} in router_mounts
    config = yaml.safe_load(m[("ConfigMap", "inferstack-runtime-config")]["data"]["runtime.yaml"])
    assert config["models"][0]["kv_events"]["tokenizer_dir"] == common.router_tokenizer_dir("qwen-0-5b")
    engine = m[("Deployment", "qwen-0-5b-engine")]["spec"]["template"]["spec"]["containers"][0]
    args = engine["args"]
    assert yaml.safe_load(args[args.index("--kv-events-config") + 1])["endpoint"] == "tcp://*:5557"
    assert args[args.index("--prefix-caching-hash-algo") + 1] == "sha256_cbor"


def test_prod_hands_the_hub_token_to_the_tokenizer_fetch_only() -> None:
    m = _manifests("prod")
    pod = m[("Deployment", "inferstack-router")]["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    assert any(mount["name"] == "hf-token" for mount in init["volumeMounts"])
    assert all(mount["name"] != "hf-token" for mount in pod["containers"][0]["volumeMounts"])


def _spec(**gateway: object) -> PlatformSpec:
    doc = minimal()
    doc["gateway"] = gateway
    return PlatformSpec.model_validate(doc)


def test_shared_limits_in_a_cluster_need_an_auth_token() -> None:
    with pytest.raises(ValidationError, match="limit_store_auth_config_key"):
        _spec(shared_limits=True)
    assert _spec(shared_limits=True, limit_store_auth_config_key="t").gateway.shared_limits


def test_precise_prefix_is_refused_where_it_cannot_work() -> None:
    doc = minimal()
    doc["models"][0]["routing"] = {"strategy": "precise_prefix"}
    doc["models"][0]["engine"]["enable_prefix_caching"] = False
    with pytest.raises(ValidationError, match="enable_prefix_caching is false"):
        PlatformSpec.model_validate(doc)
    doc["models"][0]["engine"] = {"kind": "sglang", "max_model_len": 8192}
    with pytest.raises(ValidationError, match="only vllm publishes"):
        PlatformSpec.model_validate(doc)
    doc = minimal()
    doc["models"][0]["routing"] = {"strategy": "precise_prefix"}
    doc["models"][0]["source"] = "s3://models/llama/"
    doc["models"][0].pop("revision", None)  # a revision pins hub sources only
    with pytest.raises(ValidationError, match="not a hub repo id"):
        PlatformSpec.model_validate(doc)
