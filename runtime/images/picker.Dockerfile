# syntax=docker/dockerfile:1
# The inferstack endpoint picker: python -m runtime.picker --config /etc/inferstack/runtime.yaml
# Build from the repository root:  docker build -f runtime/images/picker.Dockerfile -t inferstack-picker .

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY runtime/images/requirements.txt runtime/images/picker.requirements.txt runtime/images/tracing.requirements.txt /tmp/
# xds-protos ships an old copy of opentelemetry/proto/* that overwrites opentelemetry-proto's (whichever unpacks
# last wins) and the OTLP exporter then fails to import: OpenTelemetry's own files go back in last.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-compile --only-binary=:all: -r /tmp/picker.requirements.txt \
    && /opt/venv/bin/pip install --no-compile --only-binary=:all: --force-reinstall --no-deps -r /tmp/tracing.requirements.txt

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="inferstack-picker" \
      org.opencontainers.image.description="The inferstack router's scheduler as a Gateway API Inference Extension endpoint picker (Envoy ext_proc)"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app
RUN groupadd --system --gid 10001 inferstack \
    && useradd --system --uid 10001 --gid inferstack --no-create-home --shell /usr/sbin/nologin inferstack
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# The contract, the config-file reader and service plumbing, engine facts and metrics reading, discovery,
# the feed reader and signal loop, shared HTTP helpers and the lean HTTP server (for /metrics), the breaker
# and request reading shared with the router, traces (runtime.tracing), the scheduling library, the picker.
COPY runtime/__init__.py runtime/config.py runtime/defaults.py runtime/api_keys.py runtime/config_file.py runtime/service.py runtime/engines.py runtime/metrics_text.py runtime/engine_probe.py runtime/discovery.py runtime/fleet_feed.py runtime/signal_loop.py runtime/http.py runtime/server.py runtime/breaker.py runtime/replica.py runtime/model_view.py runtime/openai_request.py runtime/tracing.py runtime/py.typed /app/runtime/
COPY runtime/scheduling /app/runtime/scheduling
COPY runtime/picker /app/runtime/picker
USER 10001:10001
# 9002: gRPC (ext_proc and grpc.health.v1); 9090: HTTP /metrics, /healthz, /readyz
EXPOSE 9002 9090
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9090/healthz', timeout=2).status == 200 else 1)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "runtime.picker"]
CMD ["--config", "/etc/inferstack/runtime.yaml"]
