"""The import-linter contracts of pyproject.toml bite, and they name every module the rules are about.

`make lint` runs the contracts on the real tree. These tests run the same contracts on a skeleton tree
built from the modules they name: kept when nothing breaks a rule, broken by one forbidden import per
contract (direct and through a third module). The completeness tests fail when a new runtime service,
runtime module or Pulumi SDK arrives that no contract speaks about.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# What components may read of runtime: the contract, the engine facts, what pins a hub revision and the
# scorer/filter registry.
RUNTIME_CONTRACT_MODULES = {
    "runtime.config",
    "runtime.defaults",
    "runtime.engines",
    "runtime.revision",
    "runtime.scheduling",
}


@cache
def _pyproject() -> dict[str, Any]:
    with PYPROJECT.open("rb") as f:
        return tomllib.load(f)


def _config() -> dict[str, Any]:
    config: dict[str, Any] = _pyproject()["tool"]["importlinter"]
    return config


def _contracts() -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in _config()["contracts"]}


def _layers(contract: dict[str, Any]) -> list[list[str]]:
    """A layers contract's layers, top first, each as its modules (siblings split, the container prefixed)."""
    [container] = contract["containers"]
    return [[f"{container}.{m.strip()}" for m in re.split(r"[|:]", layer)] for layer in contract["layers"]]


def _contract_modules(contract: dict[str, Any]) -> list[str]:
    return [
        *contract.get("source_modules", []),
        *contract.get("forbidden_modules", []),
        *contract.get("modules", []),
        *(m for layer in (_layers(contract) if contract["type"] == "layers" else []) for m in layer),
    ]


def _is_internal(module: str) -> bool:
    return module.partition(".")[0] in _config()["root_packages"]


def _write_package(root: Path, module: str, body: str = "") -> None:
    """Make ``module`` a package under ``root`` (with its parents), ``body`` in its ``__init__``."""
    path = root
    for part in module.split("."):
        path = path / part
        path.mkdir(exist_ok=True)
        (path / "__init__.py").touch()
    if body:
        (path / "__init__.py").write_text(body)


def _skeleton(root: Path) -> None:
    """Every internal module a contract names, as an empty package: the contracts' world without imports."""
    for contract in _contracts().values():
        for module in _contract_modules(contract):
            if _is_internal(module):
                _write_package(root, module)
    (root / "pyproject.toml").write_text(PYPROJECT.read_text())


def _lint(root: Path, *contract_ids: str) -> subprocess.CompletedProcess[str]:
    limit = [arg for cid in contract_ids for arg in ("--contract", cid)]
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", *limit],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _violation(contract: dict[str, Any]) -> tuple[str, str]:
    """(importer, imported): one import the contract forbids."""
    if contract["type"] == "forbidden":
        return contract["source_modules"][0], contract["forbidden_modules"][0]
    if contract["type"] == "independence":
        first, second = contract["modules"][:2]
        return first, second
    if contract["type"] == "layers":  # the bottom layer reaching up to the top one
        layers = _layers(contract)
        return layers[-1][0], layers[0][0]
    raise AssertionError(f"no violation known for a {contract['type']} contract: teach _violation")


def test_the_skeleton_of_the_contracts_keeps_every_contract(tmp_path: Path) -> None:
    _skeleton(tmp_path)
    result = _lint(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in result.stdout


@pytest.mark.parametrize("contract_id", list(_contracts()))
def test_a_forbidden_import_breaks_the_contract(tmp_path: Path, contract_id: str) -> None:
    _skeleton(tmp_path)
    importer, imported = _violation(_contracts()[contract_id])
    _write_package(tmp_path, f"{importer}.probe", f"import {imported}\n")
    result = _lint(tmp_path, contract_id)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert f"{importer}.probe -> {imported}" in result.stdout


def test_an_indirect_import_through_a_third_module_breaks_a_contract(tmp_path: Path) -> None:
    # The first wave's arrow: cost -> aws.decisions -> render.common.
    _skeleton(tmp_path)
    _write_package(tmp_path, "components.core.cost", "import components.clouds.aws.decisions\n")
    _write_package(tmp_path, "components.clouds.aws.decisions", "import components.render.common\n")
    _write_package(tmp_path, "components.render.common")
    result = _lint(tmp_path, "pure-core")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "components.clouds.aws.decisions -> components.render.common" in result.stdout


def test_every_runtime_service_is_in_the_independence_contract() -> None:
    services = {f"runtime.{main.parent.name}" for main in (ROOT / "runtime").glob("*/__main__.py")}
    assert services, "no runtime service found: is the glob still right?"
    assert services == set(_contracts()["runtime-services-independent"]["modules"])


def test_components_are_forbidden_every_runtime_module_but_the_contract() -> None:
    runtime = {
        f"runtime.{p.stem if p.is_file() else p.name}"
        for p in (ROOT / "runtime").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    forbidden = set(_contracts()["control-plane-reads-the-runtime-contract-only"]["forbidden_modules"])
    assert runtime - RUNTIME_CONTRACT_MODULES == forbidden


def test_every_pulumi_sdk_the_project_depends_on_is_forbidden_where_pulumi_is() -> None:
    names = (re.match(r"[A-Za-z0-9_.-]+", dep) for dep in _pyproject()["project"]["dependencies"])
    sdks = {m[0].replace("-", "_") for m in names if m and m[0].startswith("pulumi")}
    assert "pulumi_aws" in sdks
    for contract_id in ("runtime-standalone", "pure-core"):
        assert sdks <= set(_contracts()[contract_id]["forbidden_modules"]), contract_id


#: components' layers outside the pure core and the renderers: the cloud code, the Pulumi shells of Kubernetes,
#: the Pulumi program, the command line and `make local`'s processes.
SHELLS = frozenset(f"components.{name}" for name in ("clouds", "kubernetes", "deploy", "cli", "local"))


def test_a_package_added_to_components_breaks_the_layers_until_it_joins_one(tmp_path: Path) -> None:
    _skeleton(tmp_path)
    _write_package(tmp_path, "components.newcomer")
    result = _lint(tmp_path, "layers")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "components.newcomer" in result.stdout + result.stderr


def test_components_is_packages_only_each_a_pure_layer_or_named_a_shell() -> None:
    """A module is added to a layer package, so a contract covers it without editing a list; a new package is
    classified when it is added (lifecycle.py, pure by its docstring, once went unguarded as a flat module)."""
    entries = [
        p for p in (ROOT / "components").iterdir() if p.name not in {"__init__.py", "__pycache__", "py.typed"}
    ]
    assert not [p.name for p in entries if p.is_file()], "components/ holds packages only: add it to a layer"
    packages = {f"components.{p.name}" for p in entries if (p / "__init__.py").is_file()}
    pure = set(_contracts()["pure-core"]["source_modules"])
    rendered = set(_contracts()["render-without-pulumi"]["source_modules"])
    assert not (pure | rendered) & SHELLS
    assert packages - SHELLS == pure | rendered, (packages - SHELLS) ^ (pure | rendered)
