"""Reading engines' Prometheus text exposition safely: only the names we want, within size limits.

Why a filter in front of ``prometheus_client.parser``: the parser is correct but pure Python, and its
cost grows with what it is fed (measured here: 4 MiB of histograms ~0.8 s, one line with 100k labels
~2.7 s). Engines expose hundreds of families we never read, and a broken or hostile engine may send
anything. So lines are first cut to the wanted metric names and a maximum line length (a cheap
``str`` scan), and only those reach the parser. One bad line costs only itself: when the filtered
block fails to parse, lines are parsed one by one and the bad ones counted.

The body itself is bounded by the caller while reading (``runtime.health.probe``); this module never
sees more than ``max_bytes``. What is kept is bounded too, since the health monitor keeps each histogram for
a window per replica: a page with more wanted samples, more series of one name or more buckets of one
histogram than a real engine has is refused whole (``ParsedMetrics.refused``, no samples), not half-read.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
DEFAULT_MAX_LINE_CHARS = 16 * 1024
DEFAULT_MAX_SAMPLES = 50_000
#: Series of one sample name (label sets: vLLM has one per engine, a histogram one per bucket and engine).
DEFAULT_MAX_SERIES = 2_048
#: Distinct bucket bounds of one histogram (vLLM's and SGLang's have 10 to 30).
DEFAULT_MAX_BUCKETS = 128


class MetricsTooLargeError(ValueError):
    """The body exceeded its byte limit; the scrape is discarded, not truncated and half-read."""


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


@dataclass
class ParsedMetrics:
    """Samples by sample name (``vllm:x_bucket`` etc.), plus what was dropped and why."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)
    bad_lines: int = 0
    skipped_long_lines: int = 0
    refused: str = ""  # why the page was refused whole (a bound exceeded); then there are no samples

    def total(self, name: str) -> float | None:
        """Sum of a gauge or counter across label sets (vLLM V1 has one series per ``engine``).

        ``None`` when the engine does not export the name: unknown is not zero.
        """
        values = [s.value for s in self.samples.get(name, ()) if math.isfinite(s.value)]
        return sum(values) if values else None

    def first_total(self, names: Iterable[str]) -> float | None:
        """The total of the first name present: current names come first, older ones after."""
        for name in names:
            value = self.total(name)
            if value is not None:
                return value
        return None

    def buckets(self, name: str) -> dict[float, float] | None:
        """Cumulative histogram buckets ``le -> count`` summed across label sets, or ``None``."""
        series = self.samples.get(name + "_bucket")
        if not series:
            return None
        out: dict[float, float] = {}
        for s in series:
            le_text = s.labels.get("le")
            if le_text is None or not math.isfinite(s.value):
                continue
            try:
                le = float(le_text)
            except ValueError:
                continue
            out[le] = out.get(le, 0.0) + s.value
        return out or None

    def first_buckets(self, names: Iterable[str]) -> dict[float, float] | None:
        for name in names:
            value = self.buckets(name)
            if value is not None:
                return value
        return None


def wanted_sample_names(family_names: Iterable[str]) -> frozenset[str]:
    """Family names plus their histogram sample names; counters are listed with ``_total`` already."""
    out: set[str] = set()
    for name in family_names:
        out.add(name)
        out.update(name + suffix for suffix in HISTOGRAM_SUFFIXES)
    return frozenset(out)


def _sample_name(line: str) -> str:
    end = len(line)
    for sep in ("{", " ", "\t"):
        pos = line.find(sep)
        if pos != -1 and pos < end:
            end = pos
    return line[:end]


def parse(
    text: str,
    wanted: frozenset[str],
    *,
    max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    max_series: int = DEFAULT_MAX_SERIES,
    max_buckets: int = DEFAULT_MAX_BUCKETS,
) -> ParsedMetrics:
    """Parse the wanted samples out of a text exposition; never raises on bad content. Past a bound (samples
    in all, series of one name, buckets of one histogram) the page is refused: ``refused`` says why."""
    result = ParsedMetrics()
    kept: list[str] = []
    series: Counter[str] = Counter()
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name = _sample_name(line)
        if name not in wanted:
            continue
        if len(line) > max_line_chars:
            result.skipped_long_lines += 1
            continue
        series[name] += 1
        if series[name] > max_series:
            return _refuse(result, f"more than {max_series} series of {name}")
        if len(kept) >= max_samples:
            return _refuse(result, f"more than {max_samples} wanted samples")
        kept.append(line)
    if not kept:
        return result
    try:
        _collect("\n".join(kept) + "\n", result)
    except Exception:  # the parser's errors are ValueError, but hostile text must never cost more than itself
        result.samples.clear()
        for line in kept:
            try:
                _collect(line + "\n", result)
            except Exception:
                result.bad_lines += 1
    for name, samples in result.samples.items():
        if name.endswith("_bucket") and len({s.labels.get("le") for s in samples}) > max_buckets:
            return _refuse(result, f"more than {max_buckets} buckets of {name.removesuffix('_bucket')}")
    return result


def _refuse(result: ParsedMetrics, why: str) -> ParsedMetrics:
    result.samples.clear()
    result.refused = why
    return result


def _collect(text: str, into: ParsedMetrics) -> None:
    # Materialise first: the parser is a generator, and a bad line late in the block must not leave
    # half of the block collected (the caller then retries line by line).
    families = list(text_string_to_metric_families(text))
    for family in families:
        for s in family.samples:
            into.samples.setdefault(s.name, []).append(Sample(labels=dict(s.labels), value=float(s.value)))


def decode(body: bytes) -> str:
    """Engines send UTF-8; anything else is replaced, not fatal (the parser then drops bad lines)."""
    return body.decode("utf-8", errors="replace")
