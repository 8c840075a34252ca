"""Problems with a stack file, for people: where, what is wrong, how to fix it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One mistake: ``path`` is the field path in the spec, e.g. ``models[1].engine.tensor_parallel_size``."""

    path: str
    message: str
    detail: tuple[str, ...] = ()  # extra lines, e.g. a memory breakdown

    def render(self, source: str) -> str:
        where = f"{source}: {self.path}" if self.path else source
        return "\n".join([f"{where}: {self.message}", *(f"    {line}" for line in self.detail)])


class SpecError(Exception):
    """A stack file that cannot be planned; carries every problem found, not just the first."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(self.render())

    def render(self) -> str:
        return "\n\n".join(p.render(self.source) for p in self.problems)
