# syntax=docker/dockerfile:1
# The inferstack embedding batcher: python -m runtime.batcher --config /etc/inferstack/runtime.yaml
# Build from the repository root:  docker build -f runtime/images/batcher.Dockerfile -t inferstack-batcher .

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY runtime/images/requirements.txt runtime/images/tracing.requirements.txt /tmp/
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-compile --only-binary=:all: -r /tmp/requirements.txt -r /tmp/tracing.requirements.txt

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="inferstack-batcher" \
      org.opencontainers.image.description="Coalesces concurrent embedding requests into batched engine calls"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app
RUN groupadd --system --gid 10001 inferstack \
    && useradd --system --uid 10001 --gid inferstack --no-create-home --shell /usr/sbin/nologin inferstack
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# The contract (with the scheduling registry it validates strategies against), the config-file reader and
# service plumbing, discovery (which needs aiohttp for the Kubernetes watch), the lean HTTP server and
# engine client shared with the router, the batcher.
COPY runtime/__init__.py runtime/config.py runtime/defaults.py runtime/config_file.py runtime/service.py runtime/engines.py runtime/discovery.py runtime/http.py runtime/server.py runtime/upstream.py runtime/tracing.py runtime/py.typed /app/runtime/
COPY runtime/scheduling /app/runtime/scheduling
COPY runtime/batcher /app/runtime/batcher
USER 10001:10001
EXPOSE 8082
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8082/healthz', timeout=2).status == 200 else 1)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "runtime.batcher"]
CMD ["--config", "/etc/inferstack/runtime.yaml"]
