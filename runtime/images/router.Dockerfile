# syntax=docker/dockerfile:1
# The inferstack router: python -m runtime.router --config /etc/inferstack/runtime.yaml
# Build from the repository root:  docker build -f runtime/images/router.Dockerfile -t inferstack-router .

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY runtime/images/requirements.txt runtime/images/router.requirements.txt runtime/images/tracing.requirements.txt /tmp/
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-compile --only-binary=:all: -r /tmp/router.requirements.txt

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="inferstack-router" \
      org.opencontainers.image.description="OpenAI-compatible, cache- and load-aware gateway for vLLM/SGLang fleets"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app
RUN groupadd --system --gid 10001 inferstack \
    && useradd --system --uid 10001 --gid inferstack --no-create-home --shell /usr/sbin/nologin inferstack
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# Only what the router imports: the contract, the config-file reader and service plumbing, engine facts,
# discovery, shared HTTP helpers, the lean HTTP server and engine client (shared with the batcher), the
# circuit breaker, request reading and the signal loop (shared with the picker), the version split
# (runtime.versions), the scheduling library (routing decisions), the engines' KV-event view, the router.
COPY runtime/__init__.py runtime/config.py runtime/defaults.py runtime/api_keys.py runtime/config_file.py runtime/service.py runtime/engines.py runtime/discovery.py runtime/http.py runtime/server.py runtime/upstream.py runtime/breaker.py runtime/replica.py runtime/model_view.py runtime/metrics_text.py runtime/engine_probe.py runtime/fleet_feed.py runtime/signal_loop.py runtime/openai_request.py runtime/versions.py runtime/tracing.py runtime/py.typed /app/runtime/
COPY runtime/scheduling /app/runtime/scheduling
COPY runtime/kvcache /app/runtime/kvcache
COPY runtime/router /app/runtime/router
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "runtime.router"]
CMD ["--config", "/etc/inferstack/runtime.yaml"]
