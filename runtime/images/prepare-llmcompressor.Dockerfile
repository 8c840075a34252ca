# syntax=docker/dockerfile:1
# The quantize preparation image: python -m runtime.prepare.quantize (a version's `preparation: {kind: quantize}`
# Job step; components/render/preparation.py), llm-compressor 0.14.0.1 on torch 2.13.0. Build from the
# repository root:
#   docker build -f runtime/images/prepare-llmcompressor.Dockerfile -t inferstack-prepare-llmcompressor .
# GPU: the torch 2.13.0 wheel from PyPI is the CUDA 13.0 build and brings the CUDA runtime libraries as
# nvidia-*-cu13 / cuda-toolkit wheels (pinned in the requirements), so no CUDA base image is needed: the node
# supplies only the driver (>= 580; the NVIDIA device plugin mounts it). Without a GPU it quantizes on CPU.

# One stage, unlike the other images: the venv is ~6 GB of torch and CUDA wheels, and copying it out of a build
# stage would hold it twice on the builder's disk (a GitHub runner has ~14 GB free).
FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="inferstack-prepare-llmcompressor" \
      org.opencontainers.image.description="Quantizes a model checkpoint once per distinct input with llm-compressor (a model version's preparation Job)"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    HF_HUB_DISABLE_TELEMETRY=1 \
    DO_NOT_TRACK=1
COPY runtime/images/prepare-llmcompressor.requirements.txt /tmp/
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-compile --only-binary=:all: -r /tmp/prepare-llmcompressor.requirements.txt \
    && rm /tmp/prepare-llmcompressor.requirements.txt \
    && groupadd --system --gid 10001 inferstack \
    && useradd --system --uid 10001 --gid inferstack --no-create-home --shell /usr/sbin/nologin inferstack
WORKDIR /app
# Only the prepare package: it imports nothing else of runtime (the Job's weights steps fetch and upload).
COPY runtime/__init__.py runtime/py.typed /app/runtime/
COPY runtime/prepare /app/runtime/prepare
USER 10001:10001
ENTRYPOINT ["python", "-m", "runtime.prepare.quantize"]
CMD ["--help"]
