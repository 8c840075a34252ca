"""The README's Layout block names only what exists: a module or folder renamed or removed fails here, so the
map a newcomer reads first cannot drift from the tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOP = re.compile(r"^([a-z_]+)/\s")
NAMED = re.compile(r"(?<![\w./-])([a-z_][a-z0-9_]*(?:/[a-z0-9_]+)*(?:\.py|/))(?![\w])")


def _layout() -> list[tuple[str, str]]:
    """(top-level folder, text of its entry) for each entry of the Layout block."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    entries: list[tuple[str, str]] = []
    for line in block.splitlines():
        top = TOP.match(line)
        if top:
            entries.append((top.group(1), line[top.end() :]))
        elif entries and line.strip():
            folder, words = entries[-1]
            entries[-1] = (folder, f"{words} {line.strip()}")
    return entries


def _exists_under(folder: Path, name: str) -> bool:
    if (folder / name).exists() or ("/" in name.rstrip("/") and (REPO / name).exists()):
        return True
    return any(p.is_dir() if name.endswith("/") else p.is_file() for p in folder.rglob(name.rstrip("/")))


def test_every_module_and_folder_the_readme_layout_names_exists() -> None:
    entries = _layout()
    assert {"components", "runtime", "policies", "tests"} <= {folder for folder, _ in entries}
    missing = [
        f"{folder}/: {name}"
        for folder, words in entries
        for name in NAMED.findall(words)
        if not _exists_under(REPO / folder, name)
    ]
    assert not missing, f"README.md's Layout names what is not in the tree: {missing}"


@pytest.mark.parametrize("top", ["components", "runtime"])
def test_the_readme_layout_names_every_package_of_the_control_and_data_planes(top: str) -> None:
    """A layer added to components/ or a service or library added to runtime/ (a package, or the images'
    folder) gets its words in the map."""
    words = dict(_layout())[top]
    packages = sorted(
        p.name for p in (REPO / top).iterdir() if (p / "__init__.py").is_file() or p.name == "images"
    )
    unnamed = [name for name in packages if f"{name}/" not in words]
    assert not unnamed, f"README.md's Layout does not name {top}/{unnamed}: add words for each"
