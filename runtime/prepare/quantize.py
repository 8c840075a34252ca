"""Quantize a model with llm-compressor once per distinct input, and record where the result came from.

Run as the Job of a version's ``preparation: {kind: quantize}``. Idempotent by input hash: the output
directory's ``provenance.json`` names the hash of everything that determines the result (source files,
tool version, scheme, calibration data and sizes); when it matches, the job exits without work, so
re-running ``pulumi up`` with the same inputs does nothing.

llm-compressor writes a compressed-tensors checkpoint, which vLLM loads without a --quantization flag.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

PROVENANCE = "provenance.json"
#: Spec format -> llm-compressor preset scheme and the modifier that applies it.
SCHEMES = {
    "awq": ("W4A16_ASYM", "awq"),
    "gptq": ("W4A16", "gptq"),
    "fp8": ("FP8_DYNAMIC", "rtn"),
    "int8": ("W8A8", "gptq"),
}
#: Used when no calibration dataset is reachable offline (tests, air-gapped clusters): short varied prose.
BUILTIN_CALIBRATION = [
    "The quick brown fox jumps over the lazy dog while the farmer watches from the barn.",
    "Explain how a transformer model attends to earlier tokens when it predicts the next one.",
    "Write a short poem about the sea, the wind and a lighthouse keeper who never sleeps.",
    "In 1969 the first humans walked on the Moon; the mission was called Apollo 11.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "A recipe: mix flour, water and salt, knead for ten minutes, let it rest, then bake.",
    "Summarize the main causes of inflation and how central banks respond to them.",
    "Customer: my order arrived damaged. Agent: I am sorry to hear that, let me help.",
]


def _files_digest(source: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in source.rglob("*") if p.is_file()):
        h.update(f.relative_to(source).as_posix().encode())
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def input_hash(inputs: dict[str, Any]) -> str:
    """The hash a finished output is recognised by: every input, canonically serialised."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _calibration(name: str, samples: int) -> tuple[list[str], str]:
    if name == "builtin":
        texts = (BUILTIN_CALIBRATION * (samples // len(BUILTIN_CALIBRATION) + 1))[:samples]
        return texts, "builtin:" + hashlib.sha256("\n".join(texts).encode()).hexdigest()
    from datasets import load_dataset  # noqa: PLC0415 - heavy, only for a named dataset

    ds = load_dataset(name, split=f"train_sft[:{samples}]" if "ultrachat" in name else f"train[:{samples}]")
    column = "messages" if "messages" in ds.column_names else ds.column_names[0]
    texts = [json.dumps(r[column]) if not isinstance(r[column], str) else r[column] for r in ds]
    return texts, f"{name}@{getattr(ds, '_fingerprint', 'unknown')}"


def quantize(source: Path, out: Path, fmt: str, dataset: str, samples: int, max_len: int) -> dict[str, Any]:
    import llmcompressor  # noqa: PLC0415 - only inside the job image
    import torch  # noqa: PLC0415
    from datasets import Dataset  # noqa: PLC0415
    from llmcompressor import oneshot  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    scheme, method = SCHEMES[fmt]
    texts, calibration_id = _calibration(dataset, samples)
    inputs = {
        "source_sha256": _files_digest(source),
        "tool": "llmcompressor",
        "tool_version": llmcompressor.__version__,
        "format": fmt,
        "scheme": scheme,
        "method": method,
        "calibration": calibration_id,
        "calibration_samples": samples,
        "max_sequence_length": max_len,
    }
    digest = input_hash(inputs)
    done = out / PROVENANCE
    if done.exists() and json.loads(done.read_text()).get("input_hash") == digest:
        return {"skipped": True, "input_hash": digest}
    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    ds = Dataset.from_dict({"text": texts}).map(
        lambda r: tokenizer(r["text"], truncation=True, max_length=max_len), remove_columns=["text"]
    )
    if method == "awq":
        from llmcompressor.modifiers.awq import AWQModifier  # noqa: PLC0415

        recipe: Any = AWQModifier(targets=["Linear"], ignore=["lm_head"], scheme=scheme)
    elif method == "gptq":
        from llmcompressor.modifiers.quantization import GPTQModifier  # noqa: PLC0415

        recipe = GPTQModifier(targets=["Linear"], ignore=["lm_head"], scheme=scheme)
    else:
        from llmcompressor.modifiers.quantization import QuantizationModifier  # noqa: PLC0415

        recipe = QuantizationModifier(targets=["Linear"], ignore=["lm_head"], scheme=scheme)
    oneshot(model=model, dataset=ds, recipe=recipe, max_seq_length=max_len, num_calibration_samples=samples)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, save_compressed=True)
    tokenizer.save_pretrained(out)
    for extra in ("chat_template.jinja", "generation_config.json"):
        if (source / extra).exists() and not (out / extra).exists():
            (out / extra).write_bytes((source / extra).read_bytes())
    record = {
        "input_hash": digest,
        "inputs": inputs,
        "source": str(source),
        "output_sha256": _files_digest_excluding(out, PROVENANCE),
        "seconds": round(time.monotonic() - started, 1),
    }
    done.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return {"skipped": False, **record}


def _files_digest_excluding(root: Path, name: str) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and p.name != name):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, required=True, help="directory of the source checkpoint")
    p.add_argument("--out", type=Path, required=True, help="directory the quantized checkpoint is written to")
    p.add_argument("--format", choices=sorted(SCHEMES), required=True)
    p.add_argument("--calibration-dataset", default="builtin")
    p.add_argument("--calibration-samples", type=int, default=256)
    p.add_argument("--max-sequence-length", type=int, default=2048)
    a = p.parse_args(argv)
    if not (a.source / "config.json").exists():
        print(
            f"--source {a.source}: no config.json there; give a Hugging Face checkpoint directory",
            file=sys.stderr,
        )
        return 2
    result = quantize(
        a.source, a.out, a.format, a.calibration_dataset, a.calibration_samples, a.max_sequence_length
    )
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
