# syntax=docker/dockerfile:1
# The inferstack health monitor: python -m runtime.health --config /etc/inferstack/runtime.yaml
# Build from the repository root:  docker build -f runtime/images/health.Dockerfile -t inferstack-health .

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY runtime/images/requirements.txt runtime/images/health.requirements.txt /tmp/
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-compile --only-binary=:all: -r /tmp/health.requirements.txt

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="inferstack-health" \
      org.opencontainers.image.description="Probes vLLM/SGLang/TRT-LLM replicas, ejects and readmits them, serves /v1/backends"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app
RUN groupadd --system --gid 10001 inferstack \
    && useradd --system --uid 10001 --gid inferstack --no-create-home --shell /usr/sbin/nologin inferstack
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# Only what the monitor imports: the contract (with the scheduling registry it validates strategies
# against), the config-file reader and service plumbing, engine facts, discovery, the metrics reader, the canary
# verdict (runtime.versions), the monitor.
COPY runtime/__init__.py runtime/config.py runtime/defaults.py runtime/config_file.py runtime/service.py runtime/engines.py runtime/discovery.py runtime/metrics_text.py runtime/versions.py runtime/model_view.py runtime/breaker.py runtime/replica.py runtime/openai_request.py runtime/py.typed /app/runtime/
COPY runtime/scheduling /app/runtime/scheduling
COPY runtime/health /app/runtime/health
USER 10001:10001
EXPOSE 8081
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8081/healthz', timeout=2).status == 200 else 1)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "runtime.health"]
CMD ["--config", "/etc/inferstack/runtime.yaml"]
