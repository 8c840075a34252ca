"""Model weights: engines load from the platform's model store, and what goes into the store is pinned.

Read back from resources: an engine's model argument (the command line it will run) must be an ``s3://``
store location or a directory on the node (the node cache's copy), never a hub repository id that it would
download at every start; a preparation Job that copies from the hub must name an exact commit. Prod config
makes the rule mandatory (a pin is required there), other environments see it as advice.
"""

from __future__ import annotations

from collections.abc import Iterator

from components.spec import is_pinned_revision
from policies.inference.rules.base import Category, Config, Res, Rule, Severity, as_list
from policies.inference.rules.engines import parse_engine
from policies.inference.rules.k8s import containers, pod_spec


def _argv(props: dict[str, object]) -> list[str]:
    return [str(a) for a in as_list(props.get("command")) + as_list(props.get("args"))]


def _pinned(res: Res, config: Config) -> Iterator[str]:
    pod = pod_spec(res)
    if pod is None:
        return
    for c in containers(pod):
        argv = _argv(dict(c.props))
        if "--hub" in argv:
            revision = argv[argv.index("--revision") + 1] if "--revision" in argv[:-1] else None
            if not is_pinned_revision(revision):
                yield (
                    f"{res.display}: container {c.name} copies {argv[argv.index('--hub') + 1]} from the hub at "
                    f"{revision or 'no revision'}, not a commit: set the model's revision to the exact hub commit"
                )
        engine = None if c.init else parse_engine(c)
        if engine is not None and engine.model and not engine.model.startswith(("s3://", "/")):
            yield (
                f"{res.display}: container {c.name} loads {engine.model!r}, which the engine would download from "
                "the hub at every start: give the model a pinned revision so it is prepared into the model store"
            )


WEIGHTS_PINNED = Rule(
    name="weights-from-pinned-store",
    category=Category.RELIABILITY,
    severity=Severity.HIGH,
    description="Engines load weights from the model store (streamed, or a node cache's copy), never from the "
    "hub at start; weights copied from the hub are pinned to a commit.",
    remediation="Give hub sources `revision: <40-hex commit>` (the preparation Job copies them into the store).",
    resource_check=_pinned,
)

RULES = (WEIGHTS_PINNED,)
