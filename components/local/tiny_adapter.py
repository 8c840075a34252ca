"""Random LoRA adapters for a local base model, made with ``peft`` in seconds (no download, no training).

Run under the ENGINE venv's python (it has torch, transformers and peft), repo root as cwd:

    .venv-engine/bin/python -m components.local.tiny_adapter --base DIR --out DIR [--rank 8] [--seed 1]

``peft`` initialises LoRA's B matrices to zero (an adapter that changes nothing); this one asks for
random A and B (``init_lora_weights=False``) so each adapter really shifts the base model's logits and
a test can tell its answers from the base model's. Scaled down (``lora_alpha`` = rank / 2, scale 0.5: on
SmolLM2-135M-Instruct each projection moves by about 3.5% of its norm, median) so a real chat model still
writes sentences, only different ones (at scale 2, 14%, it repeats itself and garbles words; the tiny
Llama's random weights change at any scale). The seed fixes the weights: the same arguments give the
same files, and different seeds give different adapters. The output is the layout vLLM's
``/v1/load_lora_adapter`` and ``--lora-modules`` read: ``adapter_config.json`` +
``adapter_model.safetensors``. Idempotent: a complete adapter of the same recipe is left alone.
"""

# Heavy imports (torch, transformers, peft) stay inside functions: only the engine venv has them.
# ruff: noqa: PLC0415
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

MARKER = "inferstack-adapter.json"
RECIPE_VERSION = 2
#: Attention and MLP projections of a Llama: the modules vLLM's LoRA layers wrap.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FILES = ("adapter_config.json", "adapter_model.safetensors")


def lora_alpha(rank: int) -> int:
    """Half the rank: a LoRA scale of 0.5 (alpha / rank), whatever the rank, since random A and B give the
    same update size at every rank; at least 1 (rank 1: scale 1)."""
    return max(1, rank // 2)


def _stamp(base: Path, rank: int, seed: int) -> dict[str, object]:
    return {"recipe": RECIPE_VERSION, "base": base.name, "rank": rank, "seed": seed, "files": list(FILES)}


def is_complete(out: Path, base: Path, rank: int, seed: int) -> bool:
    """True when ``out`` already holds this exact adapter (same recipe, base, rank and seed)."""
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker == _stamp(base, rank, seed) and all((out / name).is_file() for name in FILES)


def _write(base: Path, out: Path, rank: int, seed: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=lora_alpha(rank),
        target_modules=list(TARGET_MODULES),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        init_lora_weights=False,
    )
    peft_model = get_peft_model(model, config)
    # Point at the base by its directory name, not this machine's path: the engine gets the base itself.
    peft_model.peft_config["default"].base_model_name_or_path = base.name
    peft_model.save_pretrained(str(out), safe_serialization=True)


def make_adapter(base: Path, out: Path, *, rank: int = 8, seed: int = 1, force: bool = False) -> Path:
    """Builds a random rank-``rank`` LoRA adapter for the model in ``base`` into ``out``; returns ``out``."""
    base, out = base.resolve(), out.resolve()
    if not force and is_complete(out, base, rank, seed):
        return out
    if not (base / "config.json").is_file():
        raise SystemExit(f"{base}: no config.json; make the base model first (components.local.tiny_model)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write(base, tmp, rank, seed)
        (tmp / MARKER).write_text(json.dumps(_stamp(base, rank, seed), indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the base model directory")
    parser.add_argument("--out", type=Path, required=True, help="where the adapter goes")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    parser.add_argument(
        "--seed", type=int, default=1, help="weights seed: different seeds, different adapters"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if complete")
    args = parser.parse_args(argv)
    if args.rank < 1:
        parser.error(f"--rank must be at least 1, got {args.rank}")
    out = make_adapter(args.base, args.out, rank=args.rank, seed=args.seed, force=args.force)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
