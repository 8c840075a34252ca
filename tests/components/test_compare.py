"""`inferstack cost --compare`: the arithmetic of self-hosting against pay-per-token APIs, the dated and sourced
API prices it reads, and the command (fast: no Pulumi)."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import date

import pytest
from typer.testing import CliRunner

from components.base import catalog
from components.cli.main import app
from components.core import compare
from tests.conftest import REPO_ROOT

runner = CliRunner()
A = compare.Assumptions(utilisation=0.5, input_share=0.75)


def _hosted(usd: float = 1000.0, tps: float | None = 100.0, lo: int = 1, hi: int = 4) -> compare.SelfHosted:
    return compare.SelfHosted("m", "g6e.xlarge", usd, tps, lo, hi)


def test_a_replica_serves_its_generated_tokens_at_the_utilisation_with_prompts_alongside():
    capacity = _hosted().capacity_tokens_month(A)
    assert capacity == pytest.approx(100 * 0.5 * compare.SECONDS_PER_MONTH / 0.25)
    assert _hosted(tps=None).capacity_tokens_month(A) is None


def test_replicas_follow_the_volume_between_min_and_max():
    h = _hosted()
    cap = h.capacity_tokens_month(A)
    assert cap is not None
    assert compare.replicas_for(1.0, h, A) == 1  # the floor
    assert compare.replicas_for(cap * 2.5, h, A) == 3
    assert compare.replicas_for(cap * 4, h, A) == 4
    assert compare.replicas_for(cap * 4.01, h, A) is None  # beyond the max: cannot serve it


def test_break_even_is_the_floor_of_replicas_against_the_api_price_or_never():
    h = _hosted(usd=1000.0, lo=2)
    cap = h.capacity_tokens_month(A)
    assert cap is not None
    cheap_per_token = 1000.0 / cap  # what a full replica costs per token at this utilisation
    assert compare.break_even_tokens(h, cheap_per_token * 2, A) == pytest.approx(
        2 * 1000.0 / (cheap_per_token * 2)
    )
    assert compare.break_even_tokens(h, cheap_per_token / 2, A) is None  # the API is cheaper at any volume
    scale_to_zero = _hosted(usd=1000.0, lo=0)
    assert compare.break_even_tokens(scale_to_zero, cheap_per_token * 2, A) == pytest.approx(
        1000.0 / (cheap_per_token * 2)
    )  # one replica still runs once there is any traffic


def test_api_prices_blend_input_and_output_by_the_token_mix():
    price = catalog.ApiPrice("P", "m", 1.0, 5.0, (0, 10), False, False, "https://example.com")
    assert compare.blended_usd_per_m(price, 0.75) == pytest.approx(2.0)


def test_a_comparison_at_the_stack_capacity_and_at_a_given_volume():
    arch = catalog.MODELS["meta-llama/Llama-3.1-70B-Instruct"]
    h = _hosted(usd=10_000.0, tps=1000.0, lo=1, hi=2)
    full = compare.compare(h, arch, A)
    cap = h.capacity_tokens_month(A)
    assert cap is not None and full.volume_tokens_month == pytest.approx(2 * cap) and full.replicas == 2
    assert full.platform_usd_month == 20_000.0
    assert [s.price.model for s in full.apis] == ["Llama 3.3 70B Instruct Turbo", "GPT-5.4 mini"]
    small = compare.compare(h, arch, A, volume=1e6)
    assert small.replicas == 1 and small.platform_usd_per_m == pytest.approx(10_000.0)
    assert small.apis[0].usd_month == pytest.approx(1e6 * small.apis[0].usd_per_m / 1e6)


def test_every_api_price_is_dated_and_sourced_and_classes_do_not_overlap():
    date.fromisoformat(catalog.API_PRICES_READ_ON)
    for price in catalog.API_PRICES:
        assert re.search(r"https://\S+", price.source), price
        assert price.usd_per_m_input > 0 and price.usd_per_m_output >= 0
    for model in catalog.MODELS.values():
        found = catalog.comparable_api_prices(model)
        assert found, f"no comparable API for {model}"
        providers = [p.provider for p in found]
        assert len(providers) == len(set(providers)), "one comparable model per provider and class"


def test_cost_compare_for_a_stack_prints_the_table_sources_and_assumptions():
    result = runner.invoke(app, ["cost", "--compare", "-s", "prod"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "inferstack cost --compare: prod (eks), utilisation 50%" in out
    assert "llama-3-70b" in out and "Llama 3.3 70B Instruct Turbo" in out and "GPT-5.4 mini" in out
    assert "break-even" in out and "Assumptions:" in out and "token mix: 75% prompt tokens" in out
    assert f"API prices read {catalog.API_PRICES_READ_ON}" in out
    assert (
        "https://www.together.ai/pricing" in out and "https://developers.openai.com/api/docs/pricing" in out
    )
    assert re.search(r"Stack: GPU replicas \$[\d,]+ \+ fixed infrastructure \$[\d,]+", out)
    other = runner.invoke(
        app, ["cost", "--compare", "-s", "prod", "--utilisation", "0.9"], env={"COLUMNS": "250"}
    )
    assert "utilisation 90%" in other.output


def test_cost_compare_for_a_model_and_a_volume():
    result = runner.invoke(
        app,
        ["cost", "--compare", "--model", "llama-3.1-8b", "--tokens-per-month", "5e9"],
        env={"COLUMNS": "250"},
    )
    assert result.exit_code == 0, result.output
    assert "5.00B" in result.output and "Llama 3.1 8B Instruct Turbo" in result.output
    assert "lowest on-demand cost per generated token" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["cost", "--compare"],
        ["cost", "--compare", "-s", "prod", "--model", "llama-3.1-8b"],
        ["cost", "--compare", "--model", "llama-3.1-8b"],
        ["cost", "--compare", "--model", "no-such-model", "--tokens-per-month", "1e9"],
        ["cost", "--compare", "-s", "no-such-stack"],
    ],
)
def test_cost_mistakes_are_one_message_and_exit_2(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_the_cost_command_never_imports_pulumi():
    probe = (
        "import sys; from typer.testing import CliRunner; from components.cli.main import app;"
        "r = CliRunner().invoke(app, ['cost', '--compare', '-s', 'prod']); assert r.exit_code == 0, r.output;"
        "print(sorted({m.split('.')[0] for m in sys.modules if m.startswith(('pulumi', 'policies'))}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
