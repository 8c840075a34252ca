"""The model store for real: the weights CLI against the loopback S3 server (s3rver), every request counted.

Preparation is idempotent (a second run uploads nothing) and resumable (killed midway, nothing is served
until a re-run completes it); a node cache fills once (two fills at once on one node fetch the weights
once, a later one sends no request at all); a corrupted, truncated or replaced object is caught before
anything loads it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from components.local.s3_server import LoopbackS3
from runtime.weights.manifest import MANIFEST_NAME, FileEntry, Manifest, scan
from tests.conftest import REPO_ROOT
from tests.runtime.weights.helpers import client, make_model, new_bucket, since, weights, write_safetensors


def _puts(requests: list[dict[str, object]]) -> list[str]:
    return sorted(str(r["path"]).rsplit("/", 1)[-1] for r in requests if r["method"] == "PUT")


def test_prepare_is_idempotent_and_skips_pickles(loopback_s3: LoopbackS3, tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    uri = f"s3://{new_bucket(loopback_s3)}/models/m/rev1/"
    bucket = uri.split("/")[2]
    first = weights(loopback_s3, "prepare", "--from", str(model), "--to", uri)
    assert first.code == 0, first.stderr
    assert not first.report["already_there"]
    assert "pytorch_model.bin" not in first.report["uploaded"]
    assert first.report["content_id"] == scan(model).content_id
    mark = len(loopback_s3.logged())
    second = weights(loopback_s3, "prepare", "--from", str(model), "--to", uri)
    assert second.code == 0, second.stderr
    assert second.report["already_there"] and second.report["uploaded_bytes"] == 0
    assert _puts(since(loopback_s3, mark, bucket)) == []


def test_other_content_at_a_prepared_prefix_is_refused(loopback_s3: LoopbackS3, tmp_path: Path) -> None:
    uri = f"s3://{new_bucket(loopback_s3)}/models/m/rev1/"
    assert weights(loopback_s3, "prepare", "--from", str(make_model(tmp_path / "a")), "--to", uri).code == 0
    other = weights(loopback_s3, "prepare", "--from", str(make_model(tmp_path / "b", seed=9)), "--to", uri)
    assert other.code == 1
    assert "already holds other weights" in other.stderr and "Traceback" not in other.stderr


def test_a_killed_preparation_serves_nothing_and_resumes(loopback_s3: LoopbackS3, tmp_path: Path) -> None:
    model = make_model(tmp_path / "m", shards=3)
    bucket = new_bucket(loopback_s3)
    uri = f"s3://{bucket}/models/m/rev1/"
    killed = weights(
        loopback_s3,
        "prepare",
        "--from",
        str(model),
        "--to",
        uri,
        env={"INFERSTACK_WEIGHTS_STOP_AFTER_UPLOADS": "2"},
    )
    assert killed.code == 137
    done_before = _puts(loopback_s3.logged())
    # Nothing reads a prefix without its manifest: neither the streamer's check nor a node cache.
    unverified = weights(loopback_s3, "verify", "--store", uri)
    assert unverified.code == 1 and "is not prepared" in unverified.stderr
    cache = tmp_path / "cache"
    refused = weights(loopback_s3, "fetch", "--store", uri, "--cache-root", str(cache))
    assert refused.code == 1 and "is not prepared" in refused.stderr
    assert not (cache / bucket / "models/m/rev1").exists()
    mark = len(loopback_s3.logged())
    resumed = weights(loopback_s3, "prepare", "--from", str(model), "--to", uri)
    assert resumed.code == 0, resumed.stderr
    files = len(scan(model).files)
    assert len(resumed.report["uploaded"]) == files - 2  # only what the killed run had not uploaded
    assert MANIFEST_NAME in _puts(since(loopback_s3, mark, bucket))
    assert len(done_before) >= 2
    assert weights(loopback_s3, "verify", "--store", uri).code == 0


def test_node_cache_fills_once_per_node(loopback_s3: LoopbackS3, tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    bucket = new_bucket(loopback_s3)
    uri = f"s3://{bucket}/models/m/rev1/"
    assert weights(loopback_s3, "prepare", "--from", str(model), "--to", uri).code == 0
    total = scan(model).total_bytes
    cache = tmp_path / "node-nvme"
    mark = len(loopback_s3.logged())
    # Two replicas start on one node at once: the lock makes one fetch and the other wait, then hit.
    argv = [sys.executable, "-m", "runtime.weights", "fetch", "--store", uri, "--cache-root", str(cache)]
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO_ROOT), **loopback_s3.env()}
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    reports = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(r["fetched_bytes"] for r in reports) == [0, total]
    assert sorted(r["hit"] for r in reports) == [False, True]
    weight_gets = [
        r
        for r in since(loopback_s3, mark, bucket)
        if r["method"] == "GET" and r["path"].endswith(".safetensors")
    ]
    assert sum(int(r["bytes"]) for r in weight_gets) == sum(
        f.size for f in scan(model).files if f.path.endswith(".safetensors")
    )
    mark = len(loopback_s3.logged())
    third = weights(loopback_s3, "fetch", "--store", uri, "--cache-root", str(cache))
    assert third.code == 0 and third.report == {**third.report, "hit": True, "fetched_bytes": 0}
    assert since(loopback_s3, mark, bucket) == []  # a hit asks the store nothing
    copy = Path(third.report["path"])
    assert scan(copy).content_id == scan(model).content_id


def test_a_truncated_cache_copy_is_fetched_again_not_loaded(loopback_s3: LoopbackS3, tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    uri = f"s3://{new_bucket(loopback_s3)}/models/m/rev1/"
    assert weights(loopback_s3, "prepare", "--from", str(model), "--to", uri).code == 0
    cache = tmp_path / "cache"
    copy = Path(weights(loopback_s3, "fetch", "--store", uri, "--cache-root", str(cache)).report["path"])
    shard = next(copy.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-100])
    again = weights(loopback_s3, "fetch", "--store", uri, "--cache-root", str(cache))
    assert again.code == 0 and not again.report["hit"] and again.report["fetched_bytes"] > 0
    assert scan(copy).content_id == scan(model).content_id


def test_a_corrupted_or_truncated_store_object_is_caught(loopback_s3: LoopbackS3, tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    bucket = new_bucket(loopback_s3)
    uri = f"s3://{bucket}/models/m/rev1/"
    assert weights(loopback_s3, "prepare", "--from", str(model), "--to", uri).code == 0
    s3 = client(loopback_s3)
    shard = sorted(model.glob("*.safetensors"))[0]
    key = f"models/m/rev1/{shard.name}"
    head = s3.head_object(Bucket=bucket, Key=key)
    # Same size and the same hash label, other bytes: only a full hash (the cache) or the ETag (verify) tell.
    flipped = bytearray(shard.read_bytes())
    flipped[-1] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(flipped), Metadata=head["Metadata"])
    bad = weights(loopback_s3, "verify", "--store", uri)
    assert bad.code == 1 and "rewritten after it was prepared" in bad.stderr
    cache = tmp_path / "cache"
    fetched = weights(loopback_s3, "fetch", "--store", uri, "--cache-root", str(cache))
    assert fetched.code == 1 and "corrupt or was replaced" in fetched.stderr
    assert not (cache / bucket / "models/m/rev1").exists()
    # Truncated: the size already gives it away.
    s3.put_object(Bucket=bucket, Key=key, Body=shard.read_bytes()[:1000], Metadata=head["Metadata"])
    truncated = weights(loopback_s3, "verify", "--store", uri)
    assert truncated.code == 1 and "truncated or replaced" in truncated.stderr
    # Preparing again repairs it.
    shutil.rmtree(cache, ignore_errors=True)
    s3.delete_object(Bucket=bucket, Key=f"models/m/rev1/{MANIFEST_NAME}")
    assert weights(loopback_s3, "prepare", "--from", str(model), "--to", uri).code == 0
    assert weights(loopback_s3, "verify", "--store", uri).code == 0


def test_bad_command_lines_exit_2_with_one_line(loopback_s3: LoopbackS3, tmp_path: Path) -> None:
    not_s3 = weights(loopback_s3, "verify", "--store", "/data/models")
    assert not_s3.code == 2 and "is not a store location" in not_s3.stderr
    unpinned = weights(
        loopback_s3, "prepare", "--to", "s3://bucket1/m/", "--hub", "org/m", "--revision", "main"
    )
    assert unpinned.code == 2 and "not a commit hash" in unpinned.stderr
    assert len(unpinned.stderr.strip().splitlines()) == 1
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    empty = weights(
        loopback_s3, "prepare", "--from", str(not_a_model), "--to", f"s3://{new_bucket(loopback_s3)}/m/"
    )
    assert empty.code == 1 and "no .safetensors weights" in empty.stderr


def test_a_hub_source_is_prepared_at_its_pinned_commit(loopback_s3: LoopbackS3, tmp_path: Path) -> None:
    """The Job's path: huggingface_hub downloads the revision (from a loopback hub that answers as the hub
    does), then the store holds it; a second run neither downloads nor uploads."""
    from bench.coldstart.hub_server import Hub, serve
    from components.local.engine_process import free_port

    model = make_model(tmp_path / "m")
    revision = "a" * 40
    hub = Hub("org/model", revision, model)
    port = free_port()
    server = serve(port, hub)
    try:
        uri = f"s3://{new_bucket(loopback_s3)}/models/org/model/{revision}/"
        args = ["prepare", "--to", uri, "--hub", "org/model", "--revision", revision]
        env = {
            "HF_ENDPOINT": f"http://127.0.0.1:{port}",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HOME": str(tmp_path),
        }
        first = weights(loopback_s3, *args, "--staging", str(tmp_path / "staging"), env=env)
        assert first.code == 0, first.stderr
        assert first.report["content_id"] == scan(model).content_id
        sent = hub.sent
        assert sent == scan(model).total_bytes  # every model file came from the hub, and no pickle
        second = weights(loopback_s3, *args, env=env)
        assert second.code == 0 and second.report["already_there"] and hub.sent == sent
    finally:
        server.shutdown()


def test_a_lora_adapter_goes_through_the_store_to_where_the_router_names_it(
    loopback_s3: LoopbackS3, tmp_path: Path
) -> None:
    """An adapter directory (adapter_config.json, no config.json) is prepared and fetched like a model, into
    the path the router's load call names (components.render.weights.adapter_path: bucket, then prefix)."""
    adapter = tmp_path / "sql-lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    write_safetensors(adapter / "adapter_model.safetensors", {"lora_A.weight": 512, "lora_B.weight": 512})
    bucket = new_bucket(loopback_s3)
    uri = f"s3://{bucket}/models/acme/sql-lora/{'a' * 40}/"
    assert weights(loopback_s3, "prepare", "--from", str(adapter), "--to", uri).code == 0
    root = tmp_path / "adapters"
    fetched = weights(loopback_s3, "fetch", "--store", uri, "--cache-root", str(root))
    assert fetched.code == 0, fetched.stderr
    assert fetched.report["path"] == f"{root}/{uri.removeprefix('s3://').rstrip('/')}"
    assert scan(Path(fetched.report["path"])).content_id == scan(adapter).content_id
    (adapter / "adapter_config.json").unlink()  # neither a model nor an adapter: refused
    other = weights(loopback_s3, "prepare", "--from", str(adapter), "--to", f"s3://{bucket}/models/x/")
    assert other.code == 1 and "adapter_config.json" in other.stderr


def test_a_prepared_checkpoint_is_stored_once_per_source_label(
    loopback_s3: LoopbackS3, tmp_path: Path
) -> None:
    """A preparation Job's upload: a re-run whose tool made other bytes from the same inputs keeps what the store
    holds (the label names the inputs); another label at that prefix is other content, refused."""
    uri = f"s3://{new_bucket(loopback_s3)}/models/prepared/m/v2/abc/"
    label = "prepared:prepare-m-v2-abc@" + "a" * 64
    first = weights(
        loopback_s3, "prepare", "--from", str(make_model(tmp_path / "a")), "--to", uri, "--source", label
    )
    assert first.code == 0 and not first.report["already_there"], first.stderr
    rerun = make_model(tmp_path / "b", seed=5)  # not byte-identical: a non-deterministic tool
    again = weights(loopback_s3, "prepare", "--from", str(rerun), "--to", uri, "--source", label)
    assert again.code == 0 and again.report["already_there"], again.stderr
    assert again.report["content_id"] == first.report["content_id"]
    other = weights(loopback_s3, "prepare", "--from", str(rerun), "--to", uri, "--source", "prepared:other@b")
    assert other.code == 1 and "already holds other weights" in other.stderr


def test_a_tensorrt_llm_engine_goes_through_the_store(loopback_s3: LoopbackS3, tmp_path: Path) -> None:
    """trtllm-build leaves rank<N>.engine files and a config, no safetensors: a complete model for the store."""
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "config.json").write_text(json.dumps({"build_config": {"max_seq_len": 2048}}))
    (engine / "rank0.engine").write_bytes(b"\x00serialized engine" * 64)
    uri = f"s3://{new_bucket(loopback_s3)}/models/prepared/m/trt/abc/"
    stored = weights(loopback_s3, "prepare", "--from", str(engine), "--to", uri)
    assert stored.code == 0, stored.stderr
    assert weights(loopback_s3, "verify", "--store", uri).code == 0
    filled = weights(loopback_s3, "fetch", "--store", uri, "--cache-root", str(tmp_path / "cache"))
    assert filled.code == 0 and (Path(filled.report["path"]) / "rank0.engine").is_file()
    (engine / "rank0.engine").unlink()
    empty = weights(loopback_s3, "prepare", "--from", str(engine), "--to", uri + "x/")
    assert empty.code == 1 and "no .safetensors weights" in empty.stderr


def test_a_hostile_manifest_writes_nothing_outside_the_cache(loopback_s3: LoopbackS3, tmp_path: Path) -> None:
    """Whoever can write the store's manifest must not steer a node's fill: '..', absolute paths and a symlink
    left in the cache are refused with one line, before a byte is written anywhere."""
    model = make_model(tmp_path / "m")
    bucket = new_bucket(loopback_s3)
    uri = f"s3://{bucket}/models/m/rev1/"
    assert weights(loopback_s3, "prepare", "--from", str(model), "--to", uri).code == 0
    s3 = client(loopback_s3)
    honest = Manifest.from_json(
        s3.get_object(Bucket=bucket, Key=f"models/m/rev1/{MANIFEST_NAME}")["Body"].read(), uri
    )
    config = honest.entry("config.json")
    cache = tmp_path / "cache"
    partial = cache / bucket / "models/m/rev1.partial"
    for hostile in ("../../../../../escaped.json", str(tmp_path / "escaped.json"), "a/./b.json", "a//b.json"):
        # The config's bytes again, listed under the hostile name (the store's objects are never reached).
        files = (*honest.files, FileEntry(hostile, config.size, config.sha256))
        s3.put_object(
            Bucket=bucket, Key=f"models/m/rev1/{MANIFEST_NAME}", Body=Manifest(files, honest.source).to_json()
        )
        refused = weights(loopback_s3, "fetch", "--store", uri, "--cache-root", str(cache))
        assert refused.code == 1, hostile
        assert f"file path {hostile!r} is not a plain relative path" in refused.stderr
        assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "escaped.json").exists() and not partial.exists()
    # A symlink in a resumed fill's directory (left by anyone who can write the node's cache) points out.
    s3.put_object(Bucket=bucket, Key=f"models/m/rev1/{MANIFEST_NAME}", Body=honest.to_json())
    victim = tmp_path / "victim.json"
    victim.write_text("not the model's")
    partial.mkdir(parents=True)
    (partial / "config.json").symlink_to(victim)
    followed = weights(loopback_s3, "fetch", "--store", uri, "--cache-root", str(cache))
    assert (
        followed.code == 1 and "'config.json' resolves to" in followed.stderr and "outside" in followed.stderr
    )
    assert victim.read_text() == "not the model's"
    assert [p.name for p in partial.iterdir()] == ["config.json"]  # nothing else written either
    (partial / "config.json").unlink()
    fetched = weights(loopback_s3, "fetch", "--store", uri, "--cache-root", str(cache))
    assert fetched.code == 0, fetched.stderr
    assert scan(Path(fetched.report["path"])).content_id == scan(model).content_id
