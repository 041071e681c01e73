# syntax=docker/dockerfile:1
# The sidecarctl manager image: `docker build -t sidecarctl:0.1.0 .`
#
# Two stages. The builder turns the source into a wheel (setuptools, from pyproject.toml); the runtime
# stage installs that wheel with the pinned dependency versions of constraints.txt into a venv, then
# drops pip and setuptools from it. Every dependency ships manylinux wheels, so neither stage needs a
# compiler, and the wheel and constraints are bind-mounted, never copied into a layer.
# tests/e2e/test_image_e2e.py builds and runs exactly this install without a Docker engine.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# .dockerignore lets in only pyproject.toml, constraints.txt, README.md and the Python packages.
COPY . .
RUN python -m pip wheel --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="sidecarctl" \
      org.opencontainers.image.description="Kubernetes sidecar injector and SidecarSet manager: /inject webhook, SidecarSet controller with in-place upgrades, cert watcher" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/sidecarctl \
    PATH=/opt/sidecarctl/bin:$PATH
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    --mount=type=bind,source=constraints.txt,target=/tmp/constraints.txt \
    python -m venv /opt/sidecarctl \
 && /opt/sidecarctl/bin/pip install -c /tmp/constraints.txt /wheels/sidecarctl-*.whl \
 && /opt/sidecarctl/bin/pip uninstall -y setuptools pip \
 && sidecarctl --help >/dev/null
# Bytecode was compiled at install time; the root filesystem is read-only at run time.
USER 65532:65532
WORKDIR /tmp
EXPOSE 9443 8080
ENTRYPOINT ["sidecarctl", "run"]
