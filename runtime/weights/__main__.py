"""``python -m runtime.weights prepare|fetch|verify``: what the preparation Job and the engines' init
containers run. One JSON line on stdout when done; one line on stderr and exit 1 when the weights are
wrong (missing, corrupt, other content), exit 2 when the command line is.

    prepare --to s3://B/models/M/REV/ --hub ORG/NAME --revision <40 hex> [--token-file F] [--staging DIR]
    prepare --to s3://B/models/M/REV/ --from DIR [--source LABEL]
    fetch   --store s3://B/models/M/REV/ --cache-root /models/cache
    verify  --store s3://B/models/M/REV/
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from runtime.revision import is_pinned_revision
from runtime.weights import node_cache
from runtime.weights.manifest import WeightsError
from runtime.weights.prepare import prepare, prepare_from_hub, prepare_labelled
from runtime.weights.store import Location, Store, client

EXIT_BAD_WEIGHTS = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runtime.weights", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    owner = "AWS account that owns the store bucket (S3 refuses a bucket of another account)"
    prep = sub.add_parser("prepare", help="copy a model into the store (idempotent, resumable)")
    prep.add_argument("--to", required=True, help="s3://bucket/prefix/ of this model and revision")
    origin = prep.add_mutually_exclusive_group(required=True)
    origin.add_argument("--from", dest="from_dir", type=Path, help="a model directory on disk")
    origin.add_argument("--hub", help="a Hugging Face repository id (with --revision)")
    prep.add_argument("--revision", help="the hub commit (40 hex digits)")
    prep.add_argument(
        "--source",
        dest="label",
        help="with --from: where the directory came from, for the manifest (default dir:<name>); a store that "
        "already holds weights from this source is left as it is",
    )
    prep.add_argument("--token-file", help="a file holding the hub token (gated models)")
    prep.add_argument("--staging", type=Path, help="where hub downloads go (resumed from there)")
    prep.add_argument("--expected-owner", help=owner)
    fetch = sub.add_parser("fetch", help="fill this node's cache from the store (once per node and revision)")
    fetch.add_argument("--store", required=True)
    fetch.add_argument("--cache-root", required=True, type=Path)
    fetch.add_argument("--expected-owner", help=owner)
    verify = sub.add_parser(
        "verify", help="check the store's objects against the manifest (before streaming)"
    )
    verify.add_argument("--store", required=True)
    verify.add_argument("--expected-owner", help=owner)
    return parser


def _usage(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    uri = args.to if args.command == "prepare" else args.store
    try:
        where = Location.parse(uri)
    except WeightsError as exc:
        return _usage(str(exc))
    if args.command == "prepare" and args.hub and not is_pinned_revision(args.revision):
        return _usage(
            f"--revision {args.revision!r} is not a commit hash (40 hex digits): pin the exact commit"
        )
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415 - after argument checks

    store = Store(client(), where, args.expected_owner)
    try:
        if args.command == "prepare":
            if args.hub:
                done = prepare_from_hub(args.hub, args.revision, store, args.staging, args.token_file)
            elif args.label:
                done = prepare_labelled(args.from_dir, store, args.label)
            else:
                done = prepare(args.from_dir, store, f"dir:{args.from_dir.name}")
            report = {
                "store": where.uri(),
                "content_id": done.manifest.content_id,
                "already_there": done.already_there,
                "uploaded": list(done.uploaded),
                "uploaded_bytes": done.uploaded_bytes,
                "total_bytes": done.manifest.total_bytes,
            }
        elif args.command == "fetch":
            filled = node_cache.fill(args.cache_root, store)
            report = {
                "store": where.uri(),
                "path": str(filled.path),
                "hit": filled.hit,
                "fetched_bytes": filled.fetched_bytes,
            }
        else:
            manifest = store.verify()
            report = {"store": where.uri(), "content_id": manifest.content_id, "files": len(manifest.files)}
    except WeightsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_WEIGHTS
    except (BotoCoreError, ClientError) as exc:
        print(f"error: {where.uri()}: the store refused or could not be reached: {exc}", file=sys.stderr)
        return EXIT_BAD_WEIGHTS
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run())
