"""How the commands print: rich tables on a terminal, full-width tables in pipes and CI logs, or markdown and JSON.

A console that is not a terminal has no width of its own: rich then assumes 80 columns and cuts every table to fit
(``llam…``, ``$80,…``), which is what a CI log or a redirected file showed. ``StdoutConsole`` gives such a console
all the width a row needs, so nothing is cut; ``COLUMNS`` still wins where it is set. ``--format markdown|json``
prints the same figures as a markdown table (a pull-request comment, a file) or JSON (a script).

Light on purpose: `inferstack --help` and `size` import it (tests/components/test_cli_imports.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from rich.console import Console, ConsoleDimensions

UNBOUNDED_WIDTH = 100_000
"""Columns given to a console that is not a terminal: wider than any row we print, so rich never cuts one."""


class OutputFormat(StrEnum):
    TABLE = "table"
    MARKDOWN = "markdown"
    JSON = "json"


class StdoutConsole(Console):
    """A console whose width, when it is not a terminal and ``COLUMNS`` is not set, is unbounded."""

    @property
    def size(self) -> ConsoleDimensions:
        found = super().size
        if self._width is None and not self.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
            return ConsoleDimensions(UNBOUNDED_WIDTH, found.height)
        return found

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        width, height = new_size
        self._width = width
        self._height = height


def markdown_table(
    columns: Sequence[str], rows: Sequence[Sequence[str]], right_aligned_from: int | None = None
) -> list[str]:
    """A markdown table; columns from ``right_aligned_from`` on are aligned right (numbers). A ``|`` inside a cell
    is escaped."""
    align = ["---|"] * len(columns)
    if right_aligned_from is not None:
        align[right_aligned_from:] = ["---:|"] * (len(columns) - right_aligned_from)

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [line(columns), "|" + "".join(align), *(line(row) for row in rows)]


def records(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[dict[str, str]]:
    """Table rows as JSON objects keyed by column, in column order."""
    return [dict(zip(columns, row, strict=True)) for row in rows]


def json_text(value: Any) -> str:
    """JSON for people and diffs alike: indented, in the order the value was built, one newline at the end."""
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"
