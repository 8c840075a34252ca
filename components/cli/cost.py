"""`inferstack cost`: a stack's monthly bill and, with ``--compare``, the platform beside pay-per-token APIs.

For a stack (``-s prod``): each model at what its max replicas serve at the expected utilisation (the stack's
``budget.expected_utilisation``, or ``--utilisation``), or at ``--tokens-per-month``. For a model
(``--model llama-3.1-70b --tokens-per-month 2e9``): the instance type with the lowest cost per token, as
many replicas as the volume needs. Every answer prints its sources and assumptions. No Pulumi here: the
command answers in well under a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from components.base import catalog, sizing
from components.base.enums import Quantization
from components.base.problems import SpecError
from components.cli.output import OutputFormat, StdoutConsole, json_text, markdown_table, records
from components.core import cost
from components.core.paths import STACKS_DIR

if TYPE_CHECKING:
    from components.core import compare
    from components.core.stackfile import Stack

# The spec, the placement and the stack file load when the command runs: `inferstack --help` builds this
# command's options and should not pay for them (tests/components/test_cli_imports.py).

out = StdoutConsole()
err = StdoutConsole(stderr=True)
EXIT_INVALID = 2
UNLIMITED_REPLICAS = 10_000


def _fail(message: str) -> typer.Exit:
    err.print(message, markup=False, highlight=False)
    return typer.Exit(EXIT_INVALID)


def tokens(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:,.2f}{unit}"
    return f"{n:,.0f}"


def usd(n: float | None) -> str:
    return "-" if n is None else cost.monthly(n)


def per_m(n: float | None) -> str:
    return "-" if n is None else f"${n:,.3f}"


BILL_COLUMNS = ("item", "min $/month", "max $/month")
COLUMNS = (
    "model",
    "runs on",
    "replicas",
    "tokens/month",
    "platform $/month",
    "platform $/M",
    "API (comparable)",
    "API $/M",
    "API $/month",
    "break-even tokens/month",
)


def rows(result: compare.Comparison) -> list[tuple[str, ...]]:
    h = result.hosted
    first = (
        h.model,
        h.where,
        "-" if result.replicas is None else str(result.replicas),
        tokens(result.volume_tokens_month),
        usd(result.platform_usd_month),
        per_m(result.platform_usd_per_m),
    )
    if not result.apis:
        return [(*first, "none in the catalog", "-", "-", "-")]
    out_rows: list[tuple[str, ...]] = []
    for i, side in enumerate(result.apis):
        left = first if i == 0 else ("", "", "", "", "", "")
        even = tokens(side.break_even_tokens_month) if side.break_even_tokens_month else "never"
        if h.tokens_per_second_per_replica is None:
            even = "-"
        out_rows.append(
            (
                *left,
                f"{side.price.model} ({side.price.provider})",
                per_m(side.usd_per_m),
                usd(side.usd_month),
                even,
            )
        )
    return out_rows


def note_lines(
    results: list[compare.Comparison], a: compare.Assumptions, prices: cost.PriceList
) -> list[str]:
    """Assumptions and sources, as lines (indented items under their heading)."""
    lines = ["Assumptions:", *(f"  - {line}" for line in a.lines())]
    if any(r.hosted.tokens_per_second_per_replica is None for r in results):
        lines.append(
            "  - '-': no throughput estimate for this model (embedding models and CPU engines: the roofline "
            "covers GPU decoding), so no volume or break-even"
        )
    lines.append(
        f"Sources (API prices read {catalog.API_PRICES_READ_ON}; instance prices read {prices.read_on}:"
        f" {prices.source}):"
    )
    used = {s.price.source for r in results for s in r.apis}
    lines += [f"  - {source}" for source in sorted(used)]
    return lines


def emit(
    columns: Sequence[str], rows: Sequence[Sequence[str]], title: str, notes: list[str], fmt: OutputFormat
) -> None:
    """A table and the lines that go with it: rich (full width in pipes), markdown, or JSON."""
    if fmt is OutputFormat.JSON:
        document = {"title": title, "rows": records(columns, rows), "notes": notes}
        out.print(json_text(document), end="", markup=False, highlight=False)
        return
    if fmt is OutputFormat.MARKDOWN:
        text = "\n".join([f"**{title}**", "", *markdown_table(columns, rows), "", *notes])
        out.print(text, markup=False, highlight=False)
        return
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*row)
    out.print(table)
    for line in notes:
        out.print(line, markup=False, highlight=False)


def _stack(name: str, stacks_dir: Path) -> Stack:
    from components.clouds.targets import PROFILES  # noqa: PLC0415 - see the imports
    from components.core.stackfile import load  # noqa: PLC0415 - see the imports

    try:
        return load(name, stacks_dir, profiles=PROFILES)
    except SpecError as error:
        raise _fail(error.render()) from None


def compare_stack(
    loaded: Stack, a: compare.Assumptions, volume: float | None, fmt: OutputFormat = OutputFormat.TABLE
) -> None:
    from components.core import compare  # noqa: PLC0415 - see the imports

    spec, layout, bill = loaded.spec, loaded.layout, loaded.bill  # priced once, as the plan report reads it
    results = []
    for model in spec.models:
        hosted = compare.hosted_in_stack(spec, layout, model, bill.prices)
        arch = layout.placements[model.name].arch
        results.append(compare.compare(hosted, arch, a, volume))
    title = f"inferstack cost --compare: {loaded.name} ({spec.target.value}), utilisation {a.utilisation:.0%}"
    table_rows = [row for result in results for row in rows(result)]
    fixed_usd = sum(i.max_usd_month for i in bill.items if i.kind != cost.GPU_POOL)
    gpus = sum(r.platform_usd_month or 0.0 for r in results)
    served = [r for r in results if r.volume_tokens_month and r.apis]
    cheapest_api = sum(min(s.usd_month or 0.0 for s in r.apis) for r in served)
    stack_line = (
        f"Stack: GPU replicas {usd(gpus)} + fixed infrastructure {usd(fixed_usd)} (control plane, system nodes,"
        f" NAT, disks, keys) = {usd(gpus + fixed_usd)} a month; the same tokens from the cheapest comparable API"
        f" per model: {usd(cheapest_api)}."
    )
    emit(COLUMNS, table_rows, title, [stack_line, *note_lines(results, a, bill.prices)], fmt)


def compare_model(
    name: str,
    volume: float,
    a: compare.Assumptions,
    quant: Quantization,
    max_model_len: int,
    fmt: OutputFormat = OutputFormat.TABLE,
) -> None:
    from components.core import compare  # noqa: PLC0415 - see the imports

    found = catalog.lookup_model(name)
    if found is None:
        raise _fail(
            f"unknown model {name!r}; known: {', '.join(sorted(catalog.ALIASES))} (or a Hugging Face id of one)"
        )
    repo, arch = found
    shape = sizing.EngineShape(quantization=quant.value, max_model_len=max_model_len)
    hosted = compare.cheapest_host(repo, arch, shape, UNLIMITED_REPLICAS)
    if hosted is None:
        raise _fail(f"{repo} fits no single instance type with these settings; try --quant awq or fp8")
    result = compare.compare(hosted, arch, a, volume)
    where = (
        f"Runs on the instance type with the lowest on-demand cost per generated token ({hosted.where}); GPU"
        " instances only: a cluster's fixed infrastructure is not in the platform column."
    )
    title = f"inferstack cost --compare: {repo}, utilisation {a.utilisation:.0%}"
    # The catalog's instance types, at EC2's prices.
    emit(COLUMNS, rows(result), title, [where, *note_lines([result], a, catalog.EC2_PRICES)], fmt)


def cost_command(
    stack: Annotated[
        str | None, typer.Option("-s", "--stack", help="Stack name: stacks/Pulumi.<stack>.yaml.")
    ] = None,
    compare_apis: Annotated[
        bool,
        typer.Option(
            "--compare", help="Set the platform beside pay-per-token APIs, with break-even volumes."
        ),
    ] = False,
    model: Annotated[
        str | None, typer.Option(help="A catalog model (alias or Hugging Face id) instead of a stack.")
    ] = None,
    tokens_per_month: Annotated[
        float | None,
        typer.Option(min=1, help="Monthly tokens (prompt and generated); required with --model."),
    ] = None,
    utilisation: Annotated[
        float | None,
        typer.Option(
            min=0.01, max=1.0, help="Share of a replica's capacity used; default: the stack's (or 0.5)."
        ),
    ] = None,
    input_share: Annotated[
        float, typer.Option(min=0.0, max=0.99, help="Prompt tokens as a share of all tokens.")
    ] = cost.DEFAULT_INPUT_SHARE,
    quant: Annotated[
        Quantization, typer.Option("--quant", help="Weight quantization (--model).")
    ] = Quantization.NONE,
    max_model_len: Annotated[int, typer.Option(min=16, help="Context length (--model).")] = 8192,
    stacks_dir: Annotated[Path, typer.Option(help="Where the stack files are.")] = STACKS_DIR,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="table (rich; full width in pipes), markdown or json.")
    ] = OutputFormat.TABLE,
) -> None:
    """A stack's monthly bill; with --compare, the platform beside pay-per-token APIs and the break-even volume."""
    from components.core import compare  # noqa: PLC0415 - see the imports

    if (stack is None) == (model is None):
        raise _fail(
            "give a stack (-s prod) or a model (--model llama-3.1-70b --tokens-per-month 2e9), not both"
        )
    if model is not None:
        if tokens_per_month is None:
            raise _fail("--model needs --tokens-per-month (prompt and generated tokens a month, e.g. 2e9)")
        a = compare.Assumptions(utilisation or 0.5, input_share)
        compare_model(model, tokens_per_month, a, quant, max_model_len, output_format)
        return
    assert stack is not None
    loaded = _stack(stack, stacks_dir)
    if not compare_apis:
        bill = loaded.bill
        bill_rows = [(i.name, usd(i.min_usd_month), usd(i.max_usd_month)) for i in bill.items]
        bill_rows.append(("total", usd(bill.min_usd_month), usd(bill.max_usd_month)))
        note = f"Prices read {bill.prices.read_on}: {bill.prices.source}. `--compare` sets it beside APIs."
        emit(BILL_COLUMNS, bill_rows, f"inferstack cost: {stack}", [note], output_format)
        return
    a = compare.Assumptions(utilisation or loaded.spec.budget.expected_utilisation, input_share)
    compare_stack(loaded, a, tokens_per_month, output_format)
