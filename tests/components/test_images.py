"""Runtime images on every target: built from runtime/images/ with the same docker-build resource, pushed, and run
by digest; a stack that runs a runtime image nothing builds is a policy verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from components.base.problems import SpecError
from components.cli.main import app
from components.deploy import synthesis as plan
from components.kubernetes import images
from components.render import limit_store
from policies.inference.offline import evaluate, resources_of
from tests.components.helpers import engine_deployments, minimal, on_own_cluster, write_stack
from tests.stacks import load, synthesized


def _builds(synthesis: plan.Synthesis) -> dict[str, dict[str, Any]]:
    """Pushed repository -> the docker-build Image's inputs and the digest the mocks give it."""
    out = {}
    for r in synthesis.resources:
        if r.type == "docker-build:index:Image":
            [tag] = r.inputs["tags"]
            out[tag.rsplit(":", 1)[0]] = {**r.inputs, "digest": plan.mock_image_digest(r.name, [tag])}
    return out


def _runtime_images(synthesis: plan.Synthesis) -> dict[str, str]:
    """Component -> image of the gateway's Deployments and the model store's preparation Jobs."""
    return {
        m["metadata"]["labels"]["app.kubernetes.io/component"]: m["spec"]["template"]["spec"]["containers"][
            0
        ]["image"]
        for m in synthesis.kubernetes_manifests()
        if m["kind"] in ("Deployment", "StatefulSet", "Job")
        and m["metadata"]["labels"]["app.kubernetes.io/component"] not in ("engine", limit_store.STORE)
    }


def test_kind_runs_only_runtime_images_the_program_builds_and_pushes_to_the_local_registry() -> None:
    stack = load("kind")
    synthesis = synthesized("kind")
    builds = _builds(synthesis)
    running = _runtime_images(synthesis)
    assert set(running) == {"router", "health", "batches", "weights"}  # no embedding model: no batcher
    # the in-cluster rate-limit store (shared_limits) runs the pinned upstream Redis image: nothing to build
    name = limit_store.name(stack.spec)
    [store] = [
        m
        for m in synthesis.kubernetes_manifests()
        if (m["kind"], m["metadata"]["name"]) == ("StatefulSet", name)
    ]
    assert store["spec"]["template"]["spec"]["containers"][0]["image"] == limit_store.REDIS_IMAGE
    registry = stack.spec.gateway.image_registry
    assert registry == "localhost:5001"
    for part, reference in running.items():
        repository, digest = reference.split("@")
        assert repository == f"{registry}/{part}"
        assert builds[repository]["digest"] == digest  # the digest of this very push
        build = builds[repository]
        assert build["push"] is True and build["platforms"] == [images.PLATFORM]
        assert build["dockerfile"]["location"] == str(images.dockerfile(Path(), part))
        assert build["tags"] == [f"{repository}:{images.context_tag(Path(), part)}"]
        assert "registries" not in build  # the deploying machine's Docker login, never a secret in the stack
    assert len(builds) == len(running)
    # The engines' init containers (store check, node-cache fill) run the same weights image.
    [init] = engine_deployments(synthesis)["qwen-0-5b"]["spec"]["template"]["spec"]["initContainers"]
    assert init["image"] == running["weights"]


def test_a_cluster_you_bring_without_a_registry_runs_the_spec_images_and_the_policy_says_nothing_builds_them(
    tmp_path: Path,
) -> None:
    raw = on_own_cluster(minimal())
    write_stack(tmp_path, "byo", raw)
    synthesis = plan.synthesize(load("byo", tmp_path))
    assert _builds(synthesis) == {}
    assert _runtime_images(synthesis)["router"] == "ghcr.io/inferstack/router:0.1.0"
    verdicts = [v for v in evaluate(resources_of(synthesis), {}) if v.rule == "runtime-images-built"]
    job = next(m for m in synthesis.kubernetes_manifests() if m["kind"] == "Job")["metadata"]["name"]
    assert {v.resource for v in verdicts} == {
        "Deployment inferstack/inferstack-router",
        "Deployment inferstack/inferstack-health",
        f"Job inferstack/{job}",
    }
    assert all("set gateway.image_registry" in v.message for v in verdicts)
    allowed = {"runtime-images-built": {"prebuilt_images": ["ghcr.io/inferstack/*:0.1.0"]}}
    assert [v for v in evaluate(resources_of(synthesis), allowed) if v.rule == "runtime-images-built"] == []


@pytest.mark.parametrize("name", ["prod", "kind"])
def test_committed_stacks_pass_the_runtime_images_rule(name: str) -> None:
    synthesis = synthesized(name)
    assert [v for v in evaluate(resources_of(synthesis), {}) if v.rule == "runtime-images-built"] == []


def test_eks_and_kubernetes_build_with_the_same_function() -> None:
    """One builder: ECR passes its login, a registry you name uses the machine's."""
    import inspect

    from components.clouds.aws import registry

    assert "builds.build(" in inspect.getsource(registry.Registry)
    assert "build(" in inspect.getsource(images.RegistryImages)


def test_a_malformed_registry_is_one_located_error(tmp_path: Path) -> None:
    raw = {**on_own_cluster(minimal()), "gateway": {"image_registry": "GHCR.io/Acme"}}
    write_stack(tmp_path, "bad", raw)
    with pytest.raises(SpecError, match=r"gateway.image_registry: 'GHCR.io/Acme' is not a registry and path"):
        load("bad", tmp_path)


def test_the_plan_says_where_the_runtime_images_come_from(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["plan", "-s", "kind", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (
        "runtime images: builds router, health, batches, weights from runtime/images/"
        in (tmp_path / "summary.md").read_text()
    )


def test_release_workflow_builds_every_runtime_image_and_publishes_its_digest() -> None:
    import yaml

    workflow = yaml.safe_load(Path(".github/workflows/release.yml").read_text())
    triggers = workflow.get(True) or workflow["on"]  # YAML 1.1 reads `on` as True
    assert "tags" in triggers["push"]
    build = workflow["jobs"]["build"]
    assert set(build["strategy"]["matrix"]["image"]) == set(images.RELEASED_IMAGES)
    assert build["permissions"]["packages"] == "write"
    steps = {s.get("id"): s for s in build["steps"]}
    push = steps["push"]
    assert push["with"]["file"] == "runtime/images/${{ matrix.image }}.Dockerfile"
    assert push["with"]["push"] is True and push["with"]["platforms"] == images.PLATFORM
    assert "steps.push.outputs.digest" in yaml.safe_dump(build["steps"])
    for step in [*build["steps"], *workflow["jobs"]["publish"]["steps"]]:
        if "uses" in step:
            assert "@v" in step["uses"], f"unpinned action {step['uses']}"
    assert all(Path(f"runtime/images/{image}.Dockerfile").is_file() for image in images.RELEASED_IMAGES)


def test_every_default_runtime_image_is_one_the_release_publishes() -> None:
    """A stack that builds nothing runs the defaults: each must be an image the release workflow pushes."""
    from components.spec import RUNTIME_IMAGES as DEFAULTS

    for part, reference in DEFAULTS.items():
        assert reference.rsplit(":", 1)[0] == f"ghcr.io/inferstack/{part}"
        assert part in images.RELEASED_IMAGES, f"the default {part} image is never released"


def test_the_quantize_default_is_the_released_image_of_the_llmcompressor_it_installs() -> None:
    """The default tool image names the released image and, as its tag, the llm-compressor its requirements pin
    (which .venv-prepare installs too), so the default cannot drift from what the image holds."""
    from components.spec import PREPARATION_IMAGES, QUANTIZE_IMAGE, PreparationKind

    requirements = Path(f"runtime/images/{QUANTIZE_IMAGE}.requirements.txt").read_text().splitlines()
    pins = [
        line.removeprefix("llmcompressor==") for line in requirements if line.startswith("llmcompressor==")
    ]
    assert pins, "the quantize image pins llmcompressor"
    assert QUANTIZE_IMAGE in images.RELEASED_IMAGES and QUANTIZE_IMAGE not in images.RUNTIME_IMAGES
    default = PREPARATION_IMAGES[PreparationKind.QUANTIZE]
    assert default.rsplit(":", 1) == [f"ghcr.io/inferstack/{QUANTIZE_IMAGE}", pins[0]]
    assert "prepare-llmcompressor.requirements.txt" in Path("scripts/prepare-venv.sh").read_text()
