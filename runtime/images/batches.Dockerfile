# syntax=docker/dockerfile:1
# The inferstack batch service (OpenAI Files and Batches API): python -m runtime.batch_service --config /etc/inferstack/runtime.yaml
# Build from the repository root:  docker build -f runtime/images/batches.Dockerfile -t inferstack-batches .

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY runtime/images/requirements.txt runtime/images/batches.requirements.txt runtime/images/tracing.requirements.txt /tmp/
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-compile --only-binary=:all: -r /tmp/batches.requirements.txt

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="inferstack-batches" \
      org.opencontainers.image.description="OpenAI Files and Batches API: offline work fed to idle replicas through the router"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app
RUN groupadd --system --gid 10001 inferstack \
    && useradd --system --uid 10001 --gid inferstack --no-create-home --shell /usr/sbin/nologin inferstack \
    && mkdir -p /var/lib/inferstack/batches \
    && chown 10001:10001 /var/lib/inferstack/batches
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# The contract (with the scheduling registry it validates against), the config-file reader and service
# plumbing, the shared HTTP helpers, the lean HTTP server and the keep-alive client (to the router), the service.
COPY runtime/__init__.py runtime/config.py runtime/defaults.py runtime/config_file.py runtime/service.py runtime/engines.py runtime/http.py runtime/server.py runtime/upstream.py runtime/tracing.py runtime/py.typed /app/runtime/
COPY runtime/scheduling /app/runtime/scheduling
COPY runtime/batch_service /app/runtime/batch_service
USER 10001:10001
EXPOSE 8083
VOLUME ["/var/lib/inferstack/batches"]
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8083/healthz', timeout=2).status == 200 else 1)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "runtime.batch_service"]
CMD ["--config", "/etc/inferstack/runtime.yaml"]
