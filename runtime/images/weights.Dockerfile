# syntax=docker/dockerfile:1
# The inferstack weights image: python -m runtime.weights prepare|fetch|verify (the model store's preparation
# Jobs and the engines' init containers). Build from the repository root:
#   docker build -f runtime/images/weights.Dockerfile -t inferstack-weights .

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY runtime/images/weights.requirements.txt /tmp/
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-compile --only-binary=:all: -r /tmp/weights.requirements.txt

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="inferstack-weights" \
      org.opencontainers.image.description="Prepares model weights into the platform's S3 store, fills node caches, checks the store"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    HF_HUB_DISABLE_TELEMETRY=1
RUN groupadd --system --gid 10001 inferstack \
    && useradd --system --uid 10001 --gid inferstack --no-create-home --shell /usr/sbin/nologin inferstack
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# Only the weights package and the one rule of what pins a hub revision (runtime/revision.py, plain re): it imports
# nothing else of runtime.
COPY runtime/__init__.py runtime/py.typed runtime/revision.py /app/runtime/
COPY runtime/weights /app/runtime/weights
USER 10001:10001
ENTRYPOINT ["python", "-m", "runtime.weights"]
CMD ["--help"]
