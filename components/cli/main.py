"""The `inferstack` command: size a model, write the JSON Schema, plan a stack offline."""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from components.base import catalog, packing, sizing
from components.base.enums import KvCacheDType, Quantization
from components.base.problems import SpecError
from components.cli.cost import cost_command
from components.cli.output import OutputFormat, StdoutConsole, json_text, markdown_table, records
from components.core import cost, multinode
from components.core.paths import STACKS_DIR
from components.local.cli import local_app
from runtime.defaults import DEFAULT_MAX_NUM_SEQS

if TYPE_CHECKING:
    from components.cli.plan_diff import Gate
    from components.cli.plan_record import PlanRecord
    from components.cli.report import PlanReport
    from components.core.stackfile import Stack
    from components.deploy.synthesis import Synthesis
    from policies.inference.offline import PolicyResult

# Only what every command's options need is imported here: `--help` and `size` answer without pydantic's
# models or a Pulumi SDK. `plan` and `schema` import the spec, the program and the policy pack when they run.

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Typed model specs in, a production LLM inference platform out.",
)
out = StdoutConsole()
err = StdoutConsole(stderr=True)

SCHEMA_PATH = STACKS_DIR / "platform.schema.json"
EXIT_INVALID = 2


def _fail(message: str) -> typer.Exit:
    err.print(message, markup=False, highlight=False)
    return typer.Exit(EXIT_INVALID)


def schema_text() -> str:
    from components.spec import spec_json_schema  # noqa: PLC0415 - see the imports

    return json.dumps(spec_json_schema(), indent=2, sort_keys=True) + "\n"


@app.command()
def schema(
    path: Annotated[Path, typer.Option("--out", help="Where to write the schema.")] = SCHEMA_PATH,
    check: Annotated[
        bool, typer.Option(help="Exit 1 when the file on disk is stale instead of writing it.")
    ] = False,
) -> None:
    """Write the stack files' JSON Schema (editor completion and validation)."""
    text = schema_text()
    if check:
        current = path.read_text() if path.is_file() else ""
        if current != text:
            err.print(f"{path} is stale; run `inferstack schema` and commit it")
            raise typer.Exit(1)
        return
    path.write_text(text)
    out.print(f"wrote {path}")


@app.command()
def size(
    model: Annotated[
        str, typer.Argument(help="A catalog model: alias (llama-3.1-70b) or Hugging Face id.")
    ] = "",
    quant: Annotated[Quantization, typer.Option("--quant", help="Weight quantization.")] = Quantization.NONE,
    max_model_len: Annotated[int, typer.Option(min=16, help="Context length in tokens.")] = 8192,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Concurrent sequences.")] = DEFAULT_MAX_NUM_SEQS,
    kv_cache_dtype: Annotated[KvCacheDType, typer.Option(help="KV cache precision.")] = KvCacheDType.AUTO,
    gpu_memory_utilization: Annotated[float, typer.Option(min=0.1, max=0.98)] = 0.90,
    top: Annotated[int, typer.Option(min=1, help="How many instance types to list.")] = 10,
    list_models: Annotated[bool, typer.Option("--list", help="List the models the catalog knows.")] = False,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="table (rich; full width in pipes), markdown or json.")
    ] = OutputFormat.TABLE,
) -> None:
    """Memory breakdown of a model and the instance types that fit it, cheapest first."""
    if list_models or not model:
        rows = [
            (alias, repo, f"{a.params_b:g}", str(a.layers), str(a.kv_heads), f"{a.max_context_tokens:,}")
            for alias, repo in sorted(catalog.ALIASES.items())
            for a in [catalog.MODELS[repo]]
        ]
        print_table(LIST_COLUMNS, rows, "models the catalog knows", output_format)
        return
    found = catalog.lookup_model(model)
    if found is None:
        raise _fail(
            f"unknown model {model!r}; known: {', '.join(sorted(catalog.ALIASES))} "
            "(or a Hugging Face id of one of them). For other models, put an architecture block in the stack file."
        )
    repo, arch = found
    shape = sizing.EngineShape(
        quantization=quant.value,
        kv_cache_dtype=kv_cache_dtype.value,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    weights = sizing.weight_bytes(arch, sizing.weight_precision(quant.value, "auto")) / sizing.GIB
    kv_token = sizing.kv_bytes_per_token(arch, sizing.kv_precision(kv_cache_dtype.value, "auto")) / sizing.KIB
    ranked = multinode.candidates(arch, shape)
    if not ranked:
        raise _fail(
            f"{repo} does not fit any instance type, nor a group of up to {multinode.MAX_GROUP_NODES} nodes, with "
            "these settings; quantize (--quant awq|fp8) or lower --max-model-len"
        )
    if output_format is not OutputFormat.TABLE:
        _size_document(repo, arch, shape, ranked[:top], weights, kv_token, output_format)
        return
    licence = f", licence {arch.licence}" if arch.licence else ""
    out.print(f"[bold]{repo}[/bold] ({arch.params_b:g}B parameters, source {arch.source}{licence})")
    out.print(
        f"weights {weights:.1f} GiB ({quant.value}); KV cache {kv_token:.0f} KiB per token, "
        f"{kv_token * max_model_len / 1024 / 1024:.2f} GiB per {max_model_len:,}-token sequence, "
        f"{kv_token * max_model_len * max_num_seqs / 1024 / 1024:.1f} GiB for all {max_num_seqs} at full length"
    )
    best = ranked[0]
    out.print()
    where = best.instance.name if best.nodes == 1 else f"{best.nodes} x {best.instance.name} (one group)"
    stages = f" x PP {best.pipeline_parallel_size}" if best.pipeline_parallel_size > 1 else ""
    out.print(f"Cheapest fit: {where} with TP {best.tensor_parallel_size}{stages}:")
    for line in best.fit.lines():
        out.print(f"  {line}", markup=False, highlight=False)
    table = Table(
        *SIZE_COLUMNS,
        title=f"Where a replica fits, one node or a group of nodes, by on-demand cost per replica "
        f"({catalog.EC2_PRICES.region})",
    )
    for row in size_rows(ranked[:top]):
        table.add_row(*row)
    out.print(table)
    out.print(
        f"Prices read {catalog.EC2_PRICES.read_on}: {catalog.EC2_PRICES.source}. Spot is an average estimate."
    )
    if any(c.nodes > 1 for c in ranked[:top]):
        out.print(
            "A group spans nodes only where no single node of its type holds the model: tensor parallel inside a "
            "node, pipeline stages across nodes, EFA and a cluster placement group between them "
            f"(EFA counts read {catalog.EFA_READ_ON})."
        )
    shares = share_rows(arch, shape)
    if shares:
        share_table = Table(*SHARE_COLUMNS, title="Or a share of one GPU (pool sharing time-slicing or mig)")
        for share_row in shares:
            share_table.add_row(*share_row)
        out.print(share_table)


LIST_COLUMNS = ("alias", "model", "params (B)", "layers", "KV heads", "context")


def print_table(
    columns: Sequence[str], rows: Sequence[Sequence[str]], title: str, output_format: OutputFormat
) -> None:
    """One table in the chosen format: rich, a markdown table under its title, or JSON objects keyed by column."""
    if output_format is OutputFormat.JSON:
        out.print(json_text(records(columns, rows)), end="", markup=False, highlight=False)
    elif output_format is OutputFormat.MARKDOWN:
        text = "\n".join([f"**{title}**", "", *markdown_table(columns, rows)])
        out.print(text, markup=False, highlight=False)
    else:
        table = Table(*columns, title=title)
        for row in rows:
            table.add_row(*row)
        out.print(table)


def _size_document(
    repo: str,
    arch: catalog.ModelArch,
    shape: sizing.EngineShape,
    ranked: list[sizing.Candidate],
    weights_gib: float,
    kv_kib_per_token: float,
    output_format: OutputFormat,
) -> None:
    """`size --format markdown|json`: the same figures as the tables, for a file, a comment or a script."""
    fits, shares = size_rows(ranked), share_rows(arch, shape)
    prices = (
        f"Prices read {catalog.EC2_PRICES.read_on}: {catalog.EC2_PRICES.source}. Spot is an average estimate."
    )
    if output_format is OutputFormat.JSON:
        document = {
            "model": repo,
            "params_b": arch.params_b,
            "source": arch.source,
            "weights_gib": round(weights_gib, 2),
            "kv_cache_kib_per_token": round(kv_kib_per_token, 2),
            "fits": records(SIZE_COLUMNS, fits),
            "gpu_shares": records(SHARE_COLUMNS, shares),
            "prices": prices,
        }
        out.print(json_text(document), end="", markup=False, highlight=False)
        return
    lines = [
        f"## {repo}",
        "",
        f"{arch.params_b:g}B parameters (source {arch.source}); weights {weights_gib:.1f} GiB; KV cache "
        f"{kv_kib_per_token:.0f} KiB per token.",
        "",
        f"Where a replica fits, by on-demand cost per replica ({catalog.EC2_PRICES.region}):",
        "",
        *markdown_table(SIZE_COLUMNS, fits),
        "",
        *(["Or a share of one GPU:", "", *markdown_table(SHARE_COLUMNS, shares), ""] if shares else []),
        prices,
    ]
    out.print("\n".join(lines), markup=False, highlight=False)


SIZE_COLUMNS = (
    "instance",
    "GPUs",
    "TP x PP",
    "nodes/replica",
    "between nodes",
    "replicas/node",
    "KV headroom",
    "seqs at full length",
    "$/month/replica",
    "spot",
)


def size_rows(found: list[sizing.Candidate]) -> list[tuple[str, ...]]:
    """The rows of `size`'s table, one per placement that fits: one node, or a group of nodes."""
    rows: list[tuple[str, ...]] = []
    for c in found:
        spot = c.usd_per_replica_month * c.instance.family_facts.spot_fraction
        rows.append(
            (
                c.instance.name,
                f"{c.instance.gpus} x {c.instance.gpu}",
                f"{c.tensor_parallel_size} x {c.pipeline_parallel_size}",
                str(c.nodes),
                multinode.interconnect(c.instance).describe() if c.nodes > 1 else "-",
                str(c.replicas_per_node) if c.nodes == 1 else "-",
                f"{c.fit.headroom_gib:.1f} GiB",
                f"{c.fit.full_length_sequences} ({c.fit.kv_coverage:.0%})",
                cost.monthly(c.usd_per_replica_month),
                cost.monthly(spot),
            )
        )
    return rows


SHARE_COLUMNS = ("GPU", "time-sliced fraction (gpu_share.fraction)", "MIG profile (gpu_share.mig_profile)")


def share_rows(arch: catalog.ModelArch, shape: sizing.EngineShape) -> list[tuple[str, ...]]:
    """Per GPU model: the smallest time-sliced fraction and MIG profile that hold one replica (single-GPU shapes)."""
    if shape.gpus != 1:
        return []
    rows: list[tuple[str, ...]] = []
    for gpu in catalog.GPUS.values():
        if sizing.gpu_supports(gpu, shape) is not None:
            continue
        fraction = packing.smallest_fraction(arch, shape, gpu)
        profile = packing.smallest_mig_profile(arch, shape, gpu)
        if fraction is None and profile is None:
            continue
        mig = profile.name if profile else ("-" if gpu.mig_profiles else "no MIG")
        rows.append((gpu.name, f"{fraction:g}" if fraction is not None else "-", mig))
    return rows


@app.command()
def plan(
    stack: Annotated[str, typer.Option("-s", "--stack", help="Stack name: stacks/Pulumi.<stack>.yaml.")],
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write manifests/, resources.json, summary.md, plan.json, policy.json here."
        ),
    ] = None,
    stacks_dir: Annotated[Path, typer.Option(help="Where the stack files are.")] = STACKS_DIR,
    policy_config: Annotated[
        Path | None,
        typer.Option("--policy-config", help="Policy config (the pack's --policy-pack-config format)."),
    ] = None,
    against: Annotated[
        str | None,
        typer.Option(
            "--against",
            help="Compare with a base: a directory an earlier `plan --out` wrote, or a git revision of the stack "
            "file (planned offline with this code). Prints the diff and writes diff.md and diff.json (into --out, "
            "else the current directory).",
        ),
    ] = None,
    fail_on: Annotated[
        list[str] | None,
        typer.Option(
            "--fail-on",
            help="With --against, exit 3 when the change does this: `replacement` (a node group or cluster "
            "replaced or deleted) or `cost-increase-over=USD` (the monthly cost at min or max replicas rises by "
            "more). Repeatable.",
        ),
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="table (rich; full width in pipes), markdown or json.")
    ] = OutputFormat.TABLE,
) -> None:
    """Run the Pulumi program offline (mock runtime): resources, manifests, cost, policy. No credentials needed."""
    with _cyclic_gc_paused():
        _plan(stack, out_dir, stacks_dir, policy_config, against, fail_on or [], output_format)


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """A plan builds hundreds of thousands of objects (the SDKs' classes, then every resource's futures) and
    frees few before it ends: the cyclic collector's passes over them were a quarter of its CPU time, and
    pausing it left peak memory unchanged (222 MiB on 100 models either way)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


EXIT_GATE = 3
"""`plan --against --fail-on ...`: the change trips a gate (1 stays a mandatory policy verdict, 2 a mistake)."""


def _plan(
    stack: str,
    out_dir: Path | None,
    stacks_dir: Path,
    policy_config: Path | None,
    against: str | None,
    fail_on: list[str],
    output_format: OutputFormat,
) -> None:
    from components.cli import plan_diff  # noqa: PLC0415 - see the imports

    try:
        gates = [plan_diff.parse_gate(g) for g in fail_on]
    except plan_diff.GateError as error:
        raise _fail(str(error)) from None
    if gates and against is None:
        raise _fail("--fail-on needs --against BASE: it gates on what changes from the base")
    base = _base(stack, stacks_dir, policy_config, against) if against is not None else None
    planned = _planned(stack, stacks_dir, policy_config)
    if base is not None:
        _print_diff(planned, base, out_dir, output_format, gates)
        return
    loaded, rep, synthesis = planned.stack, planned.report, planned.synthesis
    if output_format is OutputFormat.JSON:
        out.print(json_text({"plan": planned.document, "policy": planned.verdicts.as_json()}), end="")
    elif output_format is OutputFormat.MARKDOWN:
        out.print(rep.markdown(loaded, synthesis), markup=False, highlight=False)
    else:
        _print_plan(planned)
    if out_dir is not None:
        planned.write(out_dir)
        if output_format is OutputFormat.TABLE:
            out.print(
                f"wrote {out_dir}/manifests/, {out_dir}/resources.json, {out_dir}/summary.md, "
                f"{out_dir}/plan.json, {out_dir}/policy.json",
                markup=False,
                highlight=False,
            )
    if output_format is not OutputFormat.JSON:
        for line in planned.verdicts.lines():
            out.print(line, markup=False, highlight=False)
    if planned.verdicts.failed:
        raise typer.Exit(1)


def _print_plan(planned: Planned) -> None:
    from components.cli import report  # noqa: PLC0415 - see the imports

    loaded, rep, synthesis = planned.stack, planned.report, planned.synthesis
    table = Table(*report.PLAN_COLUMNS, title=f"inferstack plan: {loaded.name} ({loaded.spec.target.value})")
    for row in rep.rows:
        table.add_row(*row)
    out.print(table)
    out.print(
        f"Monthly cost: {cost.monthly(rep.bill.min_usd_month)} at min replicas, "
        f"{cost.monthly(rep.bill.max_usd_month)} at max replicas"
    )
    for note in [*rep.notes, *rep.versions, *rep.deploy_notes]:
        out.print(f"  - {note}", markup=False, highlight=False)
    for warning in rep.warnings:
        out.print(f"warning: {warning}", markup=False, highlight=False)
    if loaded.spec.cluster.on_this_machine:
        out.print("target local has no cloud or cluster resources; `make local` runs it on this machine")
    else:
        out.print(
            f"{len(synthesis.resources)} resources, {len(synthesis.kubernetes_manifests())} Kubernetes objects"
        )


@dataclass(frozen=True)
class Planned:
    """One stack planned: what `plan` prints and writes, and the record a diff compares."""

    stack: Stack
    report: PlanReport
    synthesis: Synthesis
    verdicts: PolicyResult
    document: dict[str, Any]

    def record(self) -> PlanRecord:
        from components.cli.plan_record import PlanRecord  # noqa: PLC0415 - see the imports

        resources = [r.as_json() for r in sorted(self.synthesis.resources, key=lambda r: r.urn)]
        return PlanRecord.of(self.document, resources, self.verdicts.as_json())

    def write(self, out_dir: Path) -> None:
        from components.cli import plan_record  # noqa: PLC0415 - see the imports
        from components.deploy import synthesis as planner  # noqa: PLC0415 - see the imports

        planner.write(self.synthesis, out_dir, self.report.markdown(self.stack, self.synthesis))
        plan_record.write(out_dir, self.document)
        self.verdicts.write(out_dir)


def _planned(
    stack: str, stacks_dir: Path, policy_config: Path | None, shown_as: str | None = None
) -> Planned:
    """Plan ``stack`` (offline, under mocks) and judge it; a mistake in the stack file or the policy config exits 2
    (``shown_as``: the name the stack file goes by in that message, for a copy of it)."""
    from components.cli import plan_record, report  # noqa: PLC0415
    from components.clouds.targets import PROFILES  # noqa: PLC0415
    from components.core.stackfile import load  # noqa: PLC0415
    from components.deploy import synthesis as planner  # noqa: PLC0415 - see the imports
    from policies.inference import offline  # noqa: PLC0415

    try:
        loaded = load(stack, stacks_dir, profiles=PROFILES)
        policy = offline.prepare(loaded, policy_config)
    except (SpecError, offline.PolicyConfigError) as error:
        message = error.render() if isinstance(error, SpecError) else str(error)
        if shown_as is not None:
            message = message.replace(str(stacks_dir / f"Pulumi.{stack}.yaml"), shown_as)
        raise _fail(message) from None
    rep = report.plan_report(loaded)
    is_local = loaded.spec.cluster.on_this_machine  # no Pulumi program: nothing to synthesize
    synthesis = planner.Synthesis() if is_local else planner.synthesize(loaded)
    verdicts = policy.run(synthesis, has_resources=not is_local)
    return Planned(loaded, rep, synthesis, verdicts, plan_record.plan_document(loaded, synthesis))


@dataclass(frozen=True)
class Base:
    record: PlanRecord
    label: str


def _base(stack: str, stacks_dir: Path, policy_config: Path | None, against: str) -> Base:
    """The plan to compare with: read from a directory `plan --out` wrote, or the stack file at a git revision,
    planned here (this code, that stack file) in a temporary directory removed after."""
    import tempfile  # noqa: PLC0415

    from components.cli import gitrev, plan_record  # noqa: PLC0415 - see the imports
    from components.core.stackfile import stack_path  # noqa: PLC0415

    where = Path(against)
    if where.is_dir():
        try:
            return Base(plan_record.read(where), f"the plan in `{where}`")
        except plan_record.RecordError as error:
            raise _fail(str(error)) from None
    path = stack_path(stack, stacks_dir)
    try:
        found = gitrev.stack_file_at(path, against)
    except gitrev.RevisionError as error:
        raise _fail(
            f"--against {against}: not a directory written by `inferstack plan --out`, nor a git revision to read "
            f"{path} at: {error}"
        ) from None
    shown = f"{found.path} at {against}"
    with tempfile.TemporaryDirectory(prefix="inferstack-base-") as tmp:
        Path(tmp, path.name).write_text(found.text)
        planned = _planned(stack, Path(tmp), policy_config, shown_as=shown)
        label = f"`{found.path}` at `{against}` ({found.commit[:12]}), planned with this inferstack"
        return Base(planned.record(), label)


def _print_diff(
    planned: Planned, base: Base, out_dir: Path | None, output_format: OutputFormat, gates: list[Gate]
) -> None:
    from components.cli import diff_render, plan_diff  # noqa: PLC0415 - see the imports

    head_label = f"`{planned.stack.source}` as it is now"
    found = plan_diff.diff(base.record, planned.record(), base.label, head_label)
    md, js = diff_render.markdown(found), diff_render.as_json(found)
    where = out_dir if out_dir is not None else Path.cwd()
    if out_dir is not None:
        planned.write(out_dir)
    where.mkdir(parents=True, exist_ok=True)
    (where / "diff.md").write_text(md)
    (where / "diff.json").write_text(js)
    err.print(f"wrote {where / 'diff.md'}, {where / 'diff.json'}", markup=False, highlight=False)
    if output_format is OutputFormat.JSON:
        out.print(js, end="", markup=False, highlight=False)
    else:
        out.print(md, markup=False, highlight=False)
    lines = planned.verdicts.lines()
    tripped = [why for g in gates if (why := g.tripped(found))]
    for line in [*lines, *(f"fail: {why}" for why in tripped)]:
        err.print(line, markup=False, highlight=False)
    if planned.verdicts.failed:
        raise typer.Exit(1)
    if tripped:
        raise typer.Exit(EXIT_GATE)


app.command("cost")(cost_command)
app.add_typer(local_app, name="local")


def main() -> None:
    try:
        app()
    finally:
        # The process ends here. The collector's passes at interpreter exit over everything a plan loaded cost
        # about 0.5 s of CPU (a quarter of `plan -s prod`); frozen objects are skipped, and the memory goes
        # back to the system with the process either way.
        gc.freeze()


if __name__ == "__main__":
    main()
