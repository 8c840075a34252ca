"""LoRA adapters, read from the engine pod's adapter annotation and the engine's own command line: sources
pinned (prod enforces it), ranks within the limit the engine was started with, and only on engines that
serve adapters loaded at run time."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from components.render.common import ADAPTERS_ANNOTATION
from components.spec import is_pinned_source
from policies.inference.rules.base import Category, Config, Finding, Res, Rule, Severity, as_map
from policies.inference.rules.engines import Engine, engine_flags, engines
from policies.inference.rules.k8s import pod_annotations
from runtime.engines import ENGINES


def _adapters(engine: Engine) -> list[dict[str, Any]] | None:
    """The adapters an engine's pod declares; None when it declares none."""
    raw = pod_annotations(engine.res).get(ADAPTERS_ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        listed = json.loads(raw)
    except ValueError:
        return [{"name": "?", "source": "?", "rank": None, "unreadable": raw[:80]}]
    return [dict(as_map(a)) for a in listed] if isinstance(listed, list) else []


def _with_adapters(resources: Sequence[Res]) -> Iterator[tuple[Engine, list[dict[str, Any]]]]:
    for engine in engines(resources):
        adapters = _adapters(engine)
        if adapters:
            yield engine, adapters


def _pinned(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    for engine, adapters in _with_adapters(resources):
        for a in adapters:
            source, revision = str(a.get("source")), a.get("revision")
            if not is_pinned_source(source, revision):
                shown = f"revision {revision!r}" if revision else "no revision"
                yield Finding(
                    f"{engine.res.display}: adapter {a.get('name')} ({source}) has {shown}, so each replica may "
                    "fetch different weights; pin it to a commit (revision: <40 hex digits>)",
                    engine.res.urn,
                )


def _ranks(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    for engine, adapters in _with_adapters(resources):
        lora = ENGINES[engine.args.kind].lora
        if lora is None:
            continue  # adapters-on-lora-engines reports it
        flags = engine_flags(engine.container)
        where = engine.res.display
        if not all(arg in flags for arg in lora.enable):
            yield Finding(
                f"{where}: declares adapters but its engine runs without {' '.join(lora.enable)}",
                engine.res.urn,
            )
            continue
        max_rank = int(flags.get(lora.max_rank.name, "16") or 16)
        if max_rank not in lora.ranks:
            yield Finding(
                f"{where}: {lora.max_rank.name} {max_rank} is not one of {lora.ranks}", engine.res.urn
            )
        for a in adapters:
            rank = a.get("rank")
            if not isinstance(rank, int) or rank > max_rank:
                yield Finding(
                    f"{where}: adapter {a.get('name')} has rank {rank}, above the engine's {lora.max_rank.name} "
                    f"{max_rank}; the engine refuses to load it: raise engine.lora.max_rank",
                    engine.res.urn,
                )


def _engines(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    for engine, adapters in _with_adapters(resources):
        facts = ENGINES[engine.args.kind]
        if facts.lora is None:
            names = ", ".join(str(a.get("name")) for a in adapters)
            yield Finding(
                f"{engine.res.display}: declares adapters ({names}) but runs {facts.display_name} {facts.version}, "
                "whose adapters inferstack cannot load and route at run time; serve the model with vLLM",
                engine.res.urn,
            )


ADAPTER_SOURCES_PINNED = Rule(
    name="adapter-sources-pinned",
    category=Category.SECURITY,
    severity=Severity.HIGH,
    description="Every LoRA adapter from a model hub is pinned to a commit (S3 prefixes and local directories "
    "are pinned by their path).",
    remediation="Set models[].adapters[].revision to the adapter repository's commit (40 hex digits).",
    stack_check=_pinned,
)

ADAPTER_RANKS = Rule(
    name="adapter-ranks-within-limits",
    category=Category.RELIABILITY,
    severity=Severity.HIGH,
    description="Engines that declare adapters run with LoRA on, a rank limit the engine accepts, and no "
    "adapter above it (the engine would refuse to load it at the first request).",
    remediation="Raise engine.lora.max_rank to at least the largest adapter rank (a value the engine accepts).",
    stack_check=_ranks,
)

ADAPTER_ENGINES = Rule(
    name="adapters-on-lora-engines",
    category=Category.RELIABILITY,
    severity=Severity.HIGH,
    description="Adapters are declared only on engines whose adapters inferstack loads and routes (vLLM).",
    remediation="Serve models with adapters with engine.kind vllm, or remove the adapters.",
    stack_check=_engines,
)

RULES = (ADAPTER_SOURCES_PINNED, ADAPTER_RANKS, ADAPTER_ENGINES)
