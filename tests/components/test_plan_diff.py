"""`inferstack plan --against BASE`: pairs of real stack changes, planned by the real command, compared both ways.

Each variant of a small stack is planned once (`plan --out`) and read back as the diff reads a base directory; a
diff says exactly what changed, with its monthly cost delta, and the reverse change says the reverse.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from components.base import catalog
from components.base.enums import CapacityType
from components.cli import diff_render, plan_diff, plan_record
from components.cli.main import EXIT_GATE, app
from components.core.stackfile import STACKS_DIR
from tests.components.helpers import SOME_COMMIT, minimal, write_stack

runner = CliRunner()
STACK = "diff"
HOURS = catalog.HOURS_PER_MONTH


def _price(instance: str) -> float:
    return catalog.EC2_PRICES.hourly(catalog.INSTANCE_TYPES[instance], CapacityType.ON_DEMAND) * HOURS


def _raise_max_replicas(raw: dict[str, Any]) -> None:
    raw["models"][0]["scaling"]["max_replicas"] = 4


def _change_instance_type(raw: dict[str, Any]) -> None:
    raw["gpu_pools"][0]["instance_type"] = "g6e.2xlarge"


def _add_a_model(raw: dict[str, Any]) -> None:
    raw["gpu_pools"].append({"name": "l4", "instance_type": "g6.xlarge"})
    raw["models"].append(
        {
            "name": "bge-large",
            "source": "BAAI/bge-large-en-v1.5",
            "revision": "d4aa6901d3a41ba39fb536a557fa166f842b0e09",
            "pool": "l4",
            "engine": {"max_model_len": 512},
            "scaling": {"min_replicas": 1, "max_replicas": 1},
        }
    )


def _change_weights_revision(raw: dict[str, Any]) -> None:
    raw["models"][0]["revision"] = SOME_COMMIT


def _change_an_engine_flag(raw: dict[str, Any]) -> None:
    raw["models"][0]["engine"]["max_num_seqs"] = 128


def _add_a_policy_violation(raw: dict[str, Any]) -> None:
    raw["budget"] = {"monthly_usd_cap": 100}


VARIANTS: dict[str, Callable[[dict[str, Any]], None]] = {
    "base": lambda raw: None,
    "max-replicas": _raise_max_replicas,
    "instance-type": _change_instance_type,
    "model-added": _add_a_model,
    "weights-revision": _change_weights_revision,
    "engine-flag": _change_an_engine_flag,
    "policy-violation": _add_a_policy_violation,
}


def plan_out(stacks: Path, out: Path, raw: dict[str, Any]) -> Path:
    stacks.mkdir(parents=True, exist_ok=True)
    write_stack(stacks, STACK, raw)
    result = runner.invoke(app, ["plan", "-s", STACK, "--stacks-dir", str(stacks), "--out", str(out)])
    assert result.exit_code in (0, 1), result.output  # 1: a mandatory verdict, still a plan
    return out


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, plan_record.PlanRecord]:
    """Every variant, planned by `plan --out` and read back from its directory."""
    out: dict[str, plan_record.PlanRecord] = {}
    for name, change in VARIANTS.items():
        raw = minimal()
        change(raw)
        where = tmp_path_factory.mktemp(name)
        out[name] = plan_record.read(plan_out(where / "stacks", where / "plan", raw))
    return out


def both_ways(
    planned: dict[str, plan_record.PlanRecord], variant: str
) -> tuple[plan_diff.PlanDiff, plan_diff.PlanDiff]:
    base, head = planned["base"], planned[variant]
    return plan_diff.diff(base, head, "base", variant), plan_diff.diff(head, base, variant, "base")


def spec_paths(d: plan_diff.PlanDiff) -> dict[str, list[tuple[str, Any, Any]]]:
    return {
        m.name: [(c.path, c.before, c.after) for c in m.changes if not c.path.startswith("(")]
        for m in d.models
    }


def test_raising_max_replicas_adds_the_nodes_it_needs_at_max_and_nothing_at_min(
    planned: dict[str, plan_record.PlanRecord],
) -> None:
    up, down = both_ways(planned, "max-replicas")
    assert spec_paths(up) == {"llama-8b": [("scaling.max_replicas", 2, 4)]}
    node = _price("g6e.xlarge")  # one GPU a node: one node a replica
    pool, disks, total = up.costs  # what changed, then the total
    assert pool.name == "pool l40s" and pool.min.delta == 0
    assert pool.max.delta == pytest.approx(2 * node)
    assert disks.kind == "ebs" and disks.max.delta > 0  # two more nodes' root disks
    assert total.max.delta == pytest.approx(pool.max.delta + disks.max.delta)
    assert total.min.delta == 0
    assert (up.models[0].replicas, down.models[0].replicas) == (("1-2", "1-4"), ("1-4", "1-2"))
    assert not up.attention and not up.rollouts
    assert [(a.kind, a.subject) for a in down.attention] == [
        ("capacity-drop", "llama-8b"),
        ("capacity-drop", "pool l40s"),  # its max nodes follow the model's max replicas
    ]
    assert "max replicas 4 -> 2" in down.attention[0].message
    assert down.attention[1].message == "pool l40s: max nodes 4 -> 2"
    assert down.total.max.delta == pytest.approx(-total.max.delta)
    changed = {c.resource.name: [ch.path for ch in c.changes] for c in up.changed}
    assert "spec.maxReplicaCount" in changed["scaledobject:inferstack/llama-8b-engine"]
    md = diff_render.markdown(up)
    assert "scaling.max_replicas` `2` -> `4`" in md
    assert f"Monthly cost +${total.max.delta:,.0f} at max replicas" in md


def test_changing_the_instance_type_replaces_the_node_group_and_says_why(
    planned: dict[str, plan_record.PlanRecord],
) -> None:
    there, back = both_ways(planned, "instance-type")
    for d, before, after in ((there, "g6e.xlarge", "g6e.2xlarge"), (back, "g6e.2xlarge", "g6e.xlarge")):
        assert spec_paths(d) == {"llama-8b": []}  # the model's own spec did not change: where it runs did
        model = d.models[0]
        assert model.instance == (before, after)
        assert ("(instance)", before, after) in [(c.path, c.before, c.after) for c in model.changes]
        [group] = [c for c in d.changed if c.resource.type == "aws:eks/nodeGroup:NodeGroup" and c.replaced_by]
        assert group.resource.name.endswith("-l40s")
        assert group.replaced_by == ("instanceTypes",)
        assert [a.kind for a in d.replacements] == ["replacement"]
        assert f'`instanceTypes` ["{before}"] -> ["{after}"]' in d.replacements[0].message
        assert d.attention[0].kind == "replacement"  # first: it needs attention most
        delta = _price(after) - _price(before)
        assert d.total.min.delta == pytest.approx(delta)  # min_nodes 1 (the model's min replica)
        assert d.total.max.delta == pytest.approx(2 * delta)
        assert plan_diff.Gate("replacement").tripped(d)
    launch = [c for c in there.changed if c.resource.type == "aws:ec2/launchTemplate:LaunchTemplate"]
    assert all(not c.replaced_by for c in launch)  # a new launch template version updates the group in place


def test_adding_a_model_adds_its_resources_and_cost_and_removing_it_drops_capacity(
    planned: dict[str, plan_record.PlanRecord],
) -> None:
    added, removed = both_ways(planned, "model-added")
    assert [(m.name, m.status) for m in added.models] == [("bge-large", "added")]
    assert [(m.name, m.status) for m in removed.models] == [("bge-large", "removed")]
    node = _price("g6.xlarge")
    pool, disks, total = added.costs
    assert pool.name == "pool l4" and pool.min.before == pool.max.before == 0
    assert pool.min.after == pytest.approx(node) and pool.max.after == pytest.approx(node)
    assert total.min.delta == pytest.approx(node + disks.min.delta)
    assert total.max.delta == pytest.approx(node + disks.max.delta)
    assert [(c.name, c.max.delta) for c in removed.costs] == [(c.name, -c.max.delta) for c in added.costs]
    names = {r.name for r in added.added}
    assert "deployment:inferstack/bge-large-engine" in names
    assert {r.name for r in removed.removed} == names
    assert [a.kind for a in added.attention] == []
    # The new pool's node group goes with the model: deleting it is a replacement-class change.
    kinds = [(a.kind, a.subject) for a in removed.attention]
    assert ("capacity-drop", "bge-large") in kinds
    assert any(k == "replacement" and s.endswith("-l4") for k, s in kinds)
    assert removed.models[0].max_usd_month.after == 0


def test_a_weights_revision_change_runs_the_store_job_again_and_rolls_the_engines(
    planned: dict[str, plan_record.PlanRecord],
) -> None:
    new, old = both_ways(planned, "weights-revision")
    base_revision = minimal()["models"][0]["revision"]
    assert spec_paths(new) == {"llama-8b": [("revision", base_revision, SOME_COMMIT)]}
    for d, after in ((new, SOME_COMMIT), (old, base_revision)):
        [job] = [a for a in d.attention if a.kind == "store-job"]
        assert job.subject == "llama-8b"
        assert (
            f"-> {after}" in job.message and "store Job(s) `job:inferstack/llama-8b-weights-" in job.message
        )
        assert [r.type for r in d.added] == [
            "kubernetes:batch/v1:Job"
        ]  # a new Job: its name holds the revision
        assert [r.type for r in d.removed] == ["kubernetes:batch/v1:Job"]
        [roll] = d.rollouts
        assert roll.model == "llama-8b" and roll.replicas == 2
        assert d.total.min.delta == 0 and d.total.max.delta == 0
    assert new.attention[0].kind == "store-job"


def test_an_engine_flag_change_rolls_the_replicas_and_names_the_flag(
    planned: dict[str, plan_record.PlanRecord],
) -> None:
    more, fewer = both_ways(planned, "engine-flag")
    assert spec_paths(more) == {"llama-8b": [("engine.max_num_seqs", 64, 128)]}
    assert spec_paths(fewer) == {"llama-8b": [("engine.max_num_seqs", 128, 64)]}
    [engine] = [c for c in more.changed if c.resource.name == "deployment:inferstack/llama-8b-engine"]
    args = [c for c in engine.changes if c.path.startswith("spec.template.spec.containers[0]")]
    assert args, [c.path for c in engine.changes]
    md = diff_render.markdown(more)
    assert "`128`" in md and "`64`" in md
    for d in (more, fewer):
        [roll] = d.rollouts
        budget = planned["base"].models["llama-8b"]["startup"]
        assert roll.model == "llama-8b" and roll.replicas == 2
        assert roll.about_s == roll.rounds * budget["estimate_s"]
        assert roll.up_to_s == roll.rounds * budget["budget_s"]
        assert roll.describe().startswith("this update replaces 2 replica(s) of llama-8b, ")
        assert "### Rollouts" in diff_render.markdown(d)
        assert d.total.max.delta == 0
    assert not more.attention
    # Fewer sequences a replica: a smaller batch, fewer tokens/s by the cost estimate's roofline.
    [drop] = fewer.attention
    assert drop.kind == "capacity-drop" and "tokens/s at max replicas (est.)" in drop.message


def test_a_policy_violation_appears_and_goes(planned: dict[str, plan_record.PlanRecord]) -> None:
    broke, fixed = both_ways(planned, "policy-violation")
    assert spec_paths(broke) == {}  # the budget is the platform's, not a model's
    assert [v.rule for v in broke.verdicts_appeared] == ["monthly-cost-within-budget"]
    assert broke.verdicts_gone == () and fixed.verdicts_appeared == ()
    assert fixed.verdicts_gone == broke.verdicts_appeared
    assert "### Policy" in diff_render.markdown(broke)
    assert "- new: " in diff_render.markdown(broke) and "- gone: " in diff_render.markdown(fixed)


def test_the_same_plans_give_byte_identical_diffs_ordered_for_reading(
    planned: dict[str, plan_record.PlanRecord], tmp_path: Path
) -> None:
    base, head = planned["base"], planned["model-added"]
    first = plan_diff.diff(base, head, "b", "h")
    shuffled = plan_record.PlanRecord(
        {**head.document, "pools": list(reversed(head.document["pools"]))},
        list(reversed(head.resources)),
        list(reversed(head.verdicts)),
    )
    again = plan_diff.diff(copy.deepcopy(base), shuffled, "b", "h")
    assert diff_render.markdown(first) == diff_render.markdown(again)
    assert diff_render.as_json(first) == diff_render.as_json(again)
    urns = [r.urn for r in first.added]
    assert urns == sorted(urns)
    assert json.loads(diff_render.as_json(first))["models"][0]["name"] == "bge-large"


def test_no_change_says_so(planned: dict[str, plan_record.PlanRecord]) -> None:
    same = plan_diff.diff(planned["base"], planned["base"], "b", "h")
    assert same.empty
    assert "No changes" in diff_render.markdown(same)


# The command: --against a directory or a git revision, the gates, and the errors a user meets.


def _stack_dir(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    raw = minimal()
    change(raw)
    stacks = tmp_path / "stacks"
    stacks.mkdir(parents=True, exist_ok=True)
    write_stack(stacks, STACK, raw)
    return stacks


def test_plan_against_a_directory_prints_and_writes_the_diff_and_gates_on_cost(tmp_path: Path) -> None:
    base = plan_out(tmp_path / "base-stacks", tmp_path / "base", minimal())
    stacks = _stack_dir(tmp_path / "head", _raise_max_replicas)
    out = tmp_path / "out"
    args = ["plan", "-s", STACK, "--stacks-dir", str(stacks), "--against", str(base), "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    md = (out / "diff.md").read_text()
    assert md.startswith(diff_render.marker(STACK)) and md in result.stdout
    assert (
        json.loads((out / "diff.json").read_text())["models"][0]["changes"][0]["path"]
        == "scaling.max_replicas"
    )
    assert (out / "plan.json").is_file()  # the head's plan too: the next change's base
    gated = runner.invoke(app, [*args, "--fail-on", "cost-increase-over=100", "--fail-on", "replacement"])
    assert gated.exit_code == EXIT_GATE, gated.output
    assert "--fail-on cost-increase-over=100: the monthly cost rises by $" in gated.stderr
    big = runner.invoke(app, [*args, "--fail-on", "cost-increase-over=1e6", "--format", "json"])
    assert big.exit_code == 0, big.output
    assert json.loads(big.stdout)["cost_increase_usd_month"] > 100


@pytest.mark.parametrize(
    ("fail_on", "message"),
    [
        ("replace", "use `replacement` or `cost-increase-over=USD`"),
        ("cost-increase-over=lots", "give the USD a month as a number"),
    ],
)
def test_a_bad_fail_on_is_refused_before_planning(fail_on: str, message: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", "-s", "prod", "--against", str(tmp_path), "--fail-on", fail_on])
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.output


def test_a_base_without_a_plan_or_from_an_older_inferstack_says_how_to_fix(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["plan", "-s", "prod", "--against", str(empty)])
    assert result.exit_code == 2
    assert "holds no plan" in result.stderr and "inferstack plan -s <stack> --out" in result.stderr
    older = tmp_path / "older"
    older.mkdir()
    (older / "resources.json").write_text("[]\n")
    (older / "policy.json").write_text("{}\n")
    result = runner.invoke(app, ["plan", "-s", "prod", "--against", str(older)])
    assert result.exit_code == 2
    assert "written by an older inferstack (no plan.json" in result.stderr
    (older / "plan.json").write_text(json.dumps({"format": 0}))
    result = runner.invoke(app, ["plan", "-s", "prod", "--against", str(older)])
    assert result.exit_code == 2 and "format 0, this inferstack reads format 1" in result.stderr


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_plan_against_a_git_revision_plans_the_stack_file_as_it_was(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    stacks = _stack_dir(repo, lambda raw: None)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "base")
    _stack_dir(repo, _change_an_engine_flag)
    _git(repo, "commit", "-q", "-am", "more sequences")
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["plan", "-s", STACK, "--stacks-dir", str(stacks), "--against", "HEAD~1", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    found = json.loads((out / "diff.json").read_text())
    assert [
        (c["path"], c["before"], c["after"]) for c in found["models"][0]["changes"] if c["path"][0] != "("
    ] == [("engine.max_num_seqs", 64, 128)]
    assert found["base"].startswith(f"`stacks/Pulumi.{STACK}.yaml` at `HEAD~1` (")
    assert [r["model"] for r in found["rollouts"]] == ["llama-8b"]
    bad = runner.invoke(
        app, ["plan", "-s", STACK, "--stacks-dir", str(stacks), "--against", "no-such-branch"]
    )
    assert bad.exit_code == 2, bad.output
    assert "not a directory written by `inferstack plan --out`, nor a git revision" in bad.stderr
    assert "no commit 'no-such-branch'" in bad.stderr and "Traceback" not in bad.output


README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_shows_the_diff_the_command_prints(tmp_path: Path) -> None:
    """The README's example diff: `stacks/Pulumi.prod.yaml` with llama-3-70b's max_num_seqs halved, against the
    committed file, as `plan --against` prints it (less the Base/Head line, which names where each plan came from)."""
    text = README.read_text()
    block = text.split("```markdown\n", 1)[1].split("```", 1)[0]
    base = tmp_path / "base"
    assert runner.invoke(app, ["plan", "-s", "prod", "--out", str(base)]).exit_code == 0
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    committed = (STACKS_DIR / "Pulumi.prod.yaml").read_text()
    assert committed.count("max_num_seqs: 256") == 2  # llama-3-70b's is the first
    (stacks / "Pulumi.prod.yaml").write_text(committed.replace("max_num_seqs: 256", "max_num_seqs: 128", 1))
    out = tmp_path / "out"
    args = ["plan", "-s", "prod", "--stacks-dir", str(stacks), "--against", str(base), "--out", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    printed = "\n".join(
        line for line in (out / "diff.md").read_text().splitlines() if not line.startswith("Base: ")
    )
    assert re.sub(r"\n{3,}", "\n\n", printed).strip() == block.strip()
