"""`make local TRACES=1` (``inferstack local up --traces``): a real trace store on this machine, the router, the
batcher, the batch service and the vLLM engines exporting every request's spans to it. Pure: what to run and how
the stack changes; the supervisor starts it.

The store is Arize Phoenix (PyPI ``arize-phoenix``, in its own virtualenv ``.venv-traces``: ``make traces-venv``):
an OTLP receiver (gRPC, what vLLM and ``runtime.tracing`` export with) that keeps spans in SQLite under the stack's
state directory and shows each trace as a tree in its web UI, with a REST API (``/v1/projects/default/traces``,
sortable by latency). Looked for first and not usable here: Jaeger's all-in-one and the OpenTelemetry Collector
(Go programs, on neither PyPI nor Debian for this machine), Grafana Tempo (AGPL). Two of Phoenix's defaults are
changed: its usage telemetry is off (``PHOENIX_TELEMETRY_ENABLED``: nothing may leave the machine), and its gRPC
receiver, which Phoenix 20.26 binds on every interface (``[::]``, phoenix/server/grpc_server.py), is bound to the
loopback address like everything else here (the launcher below rewrites that one bind).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.local.defaults import DEFAULT_TRACES_GRPC_PORT, DEFAULT_TRACES_PORT
from runtime.config import EngineKind
from runtime.engines import facts

TRACES_VENV = ".venv-traces"
"""Phoenix's virtualenv (``make traces-venv``; its pins clash with the project's)."""
TRACES_DIR = "traces"
"""Phoenix's working directory (its SQLite database) under the stack's state directory."""
HOST = "127.0.0.1"

# Run in Phoenix's python: its gRPC receiver's one bind moved from every interface to the loopback address, then
# Phoenix's own command line (``phoenix serve``).
LAUNCHER = """
import sys
import grpc.aio._server as server

bind = server.Server.add_insecure_port
server.Server.add_insecure_port = lambda self, address: bind(self, address.replace("[::]:", "127.0.0.1:", 1))
from phoenix.server.main import main

sys.argv = ["phoenix", "serve"]
sys.exit(main())
"""


@dataclass(frozen=True)
class TraceStore:
    """Phoenix for one local stack: its UI/REST port and its OTLP/gRPC port."""

    port: int = DEFAULT_TRACES_PORT
    grpc_port: int = DEFAULT_TRACES_GRPC_PORT

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def endpoint(self) -> str:
        """Where the services and the engines export (OTLP/gRPC)."""
        return f"http://{HOST}:{self.grpc_port}"

    def argv(self, repo_root: Path, state_dir: Path) -> list[str]:
        """The store's command line: Phoenix's python with its settings in the environment (``env``)."""
        python = (repo_root / TRACES_VENV / "bin" / "python").absolute()
        settings = {
            "PHOENIX_HOST": HOST,
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_WORKING_DIR": str((state_dir / TRACES_DIR).absolute()),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        return ["env", *(f"{k}={v}" for k, v in settings.items()), str(python), "-c", LAUNCHER]


def traced(raw: Mapping[str, Any], store: TraceStore) -> dict[str, Any]:
    """A stack's platform document with each engine that can trace exporting to ``store`` (its own option,
    ``runtime.engines``: vLLM's ``--otlp-traces-endpoint``), added to the model's ``engine.extra_args``."""
    doc: dict[str, Any] = copy.deepcopy(dict(raw))
    for model in doc.get("models", []):
        engine = model.setdefault("engine", {})
        flag = facts(EngineKind(engine.get("kind", EngineKind.VLLM.value))).cli.otlp_traces
        if flag is not None:
            engine["extra_args"] = [*engine.get("extra_args", []), flag.name, store.endpoint]
    return doc


def runtime_tracing(store: TraceStore) -> dict[str, Any]:
    """The runtime config's ``tracing`` here: every request kept (one machine, one person looking)."""
    return {"endpoint": store.endpoint, "sample_ratio": 1.0}
