"""A stack file as it was at a git revision (`inferstack plan --against REV`): read with `git show`, no checkout.

Only the stack file comes from the revision: the plan of it runs this working tree's code, so the diff shows what the
stack file's change does, not what a change of inferstack does. Every failure (no git, not a repository, no such
revision, no such file at it) is a ``RevisionError`` whose message says which.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

GIT_TIMEOUT_S = 30


class RevisionError(Exception):
    pass


@dataclass(frozen=True)
class StackFileAt:
    path: str
    """The stack file's path in the repository."""
    commit: str
    text: str


def _git(cwd: Path, *args: str) -> str:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise RevisionError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise RevisionError(f"git {' '.join(args)} took over {GIT_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise RevisionError(
            done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"git {args[0]} failed"
        )
    return done.stdout


def stack_file_at(path: Path, revision: str) -> StackFileAt:
    """``path`` (a stack file in a git work tree) as it was at ``revision`` (a commit, branch, tag, ``HEAD~1``...)."""
    if revision.startswith("-"):
        raise RevisionError(f"{revision!r} is not a revision")
    where = path.resolve().parent
    if not where.is_dir():
        raise RevisionError(f"{path.parent} does not exist")
    top = Path(_git(where, "rev-parse", "--show-toplevel").strip())
    try:
        commit = _git(
            top, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}"
        ).strip()
    except RevisionError:
        commit = ""
    if not commit:
        raise RevisionError(f"no commit {revision!r} in the repository at {top}")
    relative = path.resolve().relative_to(top.resolve()).as_posix()
    try:
        text = _git(top, "show", f"{commit}:{relative}")
    except RevisionError:
        raise RevisionError(f"{relative} does not exist at {revision} ({commit[:12]})") from None
    return StackFileAt(relative, commit, text)
