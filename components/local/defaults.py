"""The local stack's default ports and state directory, and its exit codes, in a module that imports
nothing: `inferstack --help` shows them without loading the planner or the supervisor."""

from __future__ import annotations

from pathlib import Path

DEFAULT_ROUTER_PORT = 8080
DEFAULT_HEALTH_PORT = 8081
DEFAULT_BATCHER_PORT = 8082
#: The router's metrics listener (``router.metrics_port``); several routers take it, + 1, + 2, ...
DEFAULT_ROUTER_METRICS_PORT = 9091
#: The batch service (``/v1/files``, ``/v1/batches`` reach it through the router). The picker's default below
#: shares it: the batch service runs behind the router only, never with ``--gateway envoy``.
DEFAULT_BATCHES_PORT = 8083
DEFAULT_ENGINE_PORT = 8000
#: Memory the engines of models with gpu_share.fraction share, GiB, unless `--engine-memory-gib` says otherwise.
DEFAULT_ENGINE_MEMORY_GIB = 8.0
DEFAULT_MONITOR_PORT = 9090
#: Router replicas; above one they sit behind a round-robin balancer on the router's port.
DEFAULT_ROUTERS = 1
#: The shared rate-limit store (redis-server on 127.0.0.1), with several routers or gateway.shared_limits.
DEFAULT_REDIS_PORT = 6379
#: ``--gateway envoy``: the picker's HTTP port (/metrics, /healthz); its gRPC (ext_proc) port is the next one.
DEFAULT_PICKER_PORT = 8083
#: ``--s3``: the loopback S3 server that holds the model store.
DEFAULT_S3_PORT = 9000
#: What may sit on the OpenAI port: inferstack's router, or Envoy asking the endpoint picker (the Gateway
#: API Inference Extension's data path, components/render/envoy.py).
GATEWAYS = ("router", "envoy")
DEFAULT_STATE_DIR = Path(".local")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
#: The local trace store's web UI and OTLP/gRPC receiver (`--traces`: components/local/traces.py).
DEFAULT_TRACES_PORT = 6006
DEFAULT_TRACES_GRPC_PORT = 4317
