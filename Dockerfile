# syntax=docker/dockerfile:1
#
# The kvpool image: the `kvpool` command (master, storage node and client subcommands), run as a
# non-root user. The Helm chart in helm/kvpool runs this image.
#
#   docker build -t kvpool:0.1.0 .
#   docker run --rm kvpool:0.1.0 master --help
#
# Two stages: the UCX binding is a cffi extension compiled at install time (against the headers
# of the libucx-cu12 wheel), so the build stage has a C compiler; the runtime stage only gets
# the finished virtual environment.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/kvpool
ENV PATH=/opt/kvpool/bin:$PATH
WORKDIR /src
COPY . .
RUN pip install . \
    && kvpool --help >/dev/null \
    && python -c "import kvpool.transport.ucp"

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/kvpool/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/kvpool /opt/kvpool
RUN groupadd --system --gid 10001 kvpool \
    && useradd --system --uid 10001 --gid kvpool --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin kvpool
# Numeric, so that Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
USER 10001:10001
WORKDIR /tmp
# 50051: master gRPC; 9090: master /healthz /readyz /metrics; 9091: storage node HTTP.
EXPOSE 50051 9090 9091
ENTRYPOINT ["kvpool"]
CMD ["--help"]
