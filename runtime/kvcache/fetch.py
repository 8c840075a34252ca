"""``python -m runtime.kvcache.fetch --out DIR NAME=REPO ...``: put models' tokenizers where the router reads
them (its pod's init container runs this, with the router image, before the router starts).

Only the files a tokenizer and its chat template need (``tokenizer.json`` must exist; the others are taken
when the repository has them), from the Hugging Face hub, with the token at ``HF_TOKEN_PATH`` for gated models. A missing
repository or tokenizer is one line on stderr and exit 2: the pod does not start, and its events say why.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REQUIRED = "tokenizer.json"
OPTIONAL = ("tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def fetch(repo: str, out: Path) -> None:
    from huggingface_hub import hf_hub_download  # noqa: PLC0415 - only the init container needs it
    from huggingface_hub.errors import EntryNotFoundError  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    hf_hub_download(repo, REQUIRED, local_dir=out)  # the token, if any: HF_TOKEN or the file at HF_TOKEN_PATH
    for name in OPTIONAL:
        try:
            hf_hub_download(repo, name, local_dir=out)
        except EntryNotFoundError:
            continue


def _pair(text: str) -> tuple[str, str]:
    name, sep, repo = text.partition("=")
    if not sep or not name or "/" not in repo:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write MODEL=ORG/REPO, e.g. llama-8b=meta-llama/Llama-3.1-8B"
        )
    return name, repo


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.kvcache.fetch", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory; each model's files go to OUT/MODEL")
    ap.add_argument("models", type=_pair, nargs="+", help="MODEL=ORG/REPO")
    args = ap.parse_args(argv)
    for name, repo in args.models:
        try:
            fetch(repo, args.out / name)
        except Exception as err:  # the hub's errors are many; each is one line for a person
            print(f"tokenizer of {name} ({repo}): {type(err).__name__}: {str(err)[:300]}", file=sys.stderr)
            return 2
        print(f"tokenizer of {name}: {args.out / name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
