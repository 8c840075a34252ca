"""One line at the end of a run that says where its time went, beside pytest's slowest-tests table.

CI has a budget (25 min on a 2-core machine), and a run's wall time hides which part grew: the session engines'
group (one worker, in turn), the own-engines group (the other worker, beside the rest), or everything else. The
line adds each test's setup, call and teardown seconds into those parts, and names the files that cost most.
Registered by ``tests/conftest.py`` in the process that reports (the controller under xdist). Every test's seconds
also go to a file (``.cache/logs/test-durations.json``, slowest first), for the tests the table leaves out.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

#: xdist's loadgroup appends "@<group>" to a test's id (tests/conftest.py names the two engine groups).
UNGROUPED = "the rest"
TOP_FILES = 10


def part_of(nodeid: str) -> str:
    """The xdist group a test ran in, from its id."""
    _, at, group = nodeid.rpartition("@")
    return group if at and "/" not in group and "::" not in group else UNGROUPED


class WhereTimeWent:
    def __init__(self, durations_file: Path) -> None:
        self.started = time.monotonic()
        self.durations_file = durations_file
        self.parts: Counter[str] = Counter()
        self.setup: Counter[str] = Counter()
        self.files: Counter[str] = Counter()
        self.tests: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        part = part_of(report.nodeid)
        self.parts[part] += report.duration
        if report.when == "setup":
            self.setup[part] += report.duration
        self.files[report.nodeid.split("::", 1)[0]] += report.duration
        self.tests[report.nodeid] += report.duration

    def line(self) -> str:
        wall = time.monotonic() - self.started
        parts = ", ".join(
            f"{name} {seconds:,.0f} s (fixture setup {self.setup[name]:,.0f} s)"
            for name, seconds in self.parts.most_common()
        )
        files = ", ".join(f"{name} {seconds:,.0f} s" for name, seconds in self.files.most_common(TOP_FILES))
        return f"where the time went: wall {wall:,.0f} s; tests {parts}; costliest files {files}"

    @pytest.hookimpl(trylast=True)  # after the slowest-tests table, before the closing counts
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.parts:
            terminalreporter.write_line(self.line())
            self.durations_file.parent.mkdir(parents=True, exist_ok=True)
            slowest = {nodeid: round(seconds, 2) for nodeid, seconds in self.tests.most_common()}
            self.durations_file.write_text(json.dumps(slowest, indent=1) + "\n")
