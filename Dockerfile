# clipserve container image. One Dockerfile, four variants, picked with a build argument:
#
#   docker build -t clipserve:cpu-torch .                                  # default: PyTorch, CPU only
#   docker build -t clipserve:cpu-onnx --build-arg VARIANT=cpu-onnx .      # ONNX Runtime only, no torch: the smallest
#   docker build -t clipserve:cpu-openvino --build-arg VARIANT=cpu-openvino .   # OpenVINO only, no torch (CPUs)
#   docker build -t clipserve:cuda     --build-arg VARIANT=cuda .          # PyTorch + onnxruntime-gpu (CUDA 13 wheels)
#
# The image serves a Flow: `python -m clipserve flows/torch.yml` (flows/onnx.yml for cpu-onnx,
# flows/openvino.yml for cpu-openvino),
# gRPC on 51000. The model comes from the environment variables the flows read: CLIPSERVE_MODEL,
# CLIPSERVE_MODEL_PATH, CLIPSERVE_DEVICE, CLIPSERVE_DTYPE. Weights are cached in the /cache volume.
# Its working directory also holds config.yml (the CLIPEncoder hub config by default, or
# --build-arg EXECUTOR=CLIPRanker), which is what `jina export kubernetes/docker-compose` containers
# run as `jina executor --uses config.yml`.
#
# No registry needed: PYTHON_IMAGE may be any local image with Python 3.11+ and its venv module, e.g.
# one made with deploy/make-base-image.sh (debootstrap; docs/containers.md). There is no `# syntax=`
# line on purpose: BuildKit would pull that frontend image from Docker Hub before building.
# CI builds cpu-onnx and cpu-openvino (Python 3.11, Debian bookworm) and cpu-onnx on Python 3.13
# (Debian trixie) and serves them (tests/containers/). The install is from the locks CI checks
# (locks/*.txt, made by deploy/lock.py: every distribution pinned with its hashes, so an image built twice
# holds the same versions), split into layers: the base lock (shared by every variant), the variant's lock,
# then the code. cpu-torch, and builds with MORE_EXTRAS or WITH_TENSORRT, have no lock: they install with
# constraints.txt (`pip install -c constraints.txt .[EXTRAS]`), as CI did before the locks.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG VARIANT=cpu-torch

# ---- base: the Python both stages share ---------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
# JINA_OPTOUT_TELEMETRY: unless this variable exists, Jina posts an event to Jina AI's telemetry
# server whenever a Flow, Executor or Client starts. The image opts out.
# JINA_RANDOM_PORT_MIN: Jina's ports for the Flow's executors above Linux's ephemeral range (README, Flows).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    JINA_OPTOUT_TELEMETRY=1 \
    JINA_RANDOM_PORT_MIN=61000

# ---- builder: a virtual environment with clipserve and one backend -----------------------------
# Dependencies before code: the layers up to the COPY of executors/clipserve depend only on
# pyproject.toml, constraints.txt and locks/ (and the build arguments), so editing the code rebuilds only
# the last layer, and every variant built on one PYTHON_IMAGE shares the first install layer.
FROM base AS builder
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml constraints.txt ./
COPY locks ./locks
COPY deploy/requirements.py ./deploy/
# 1. The base dependencies (jina, docarray, grpc, numpy, ...), from their lock: the same for every variant.
RUN /opt/venv/bin/pip install --no-deps --require-hashes -r locks/base.txt
ARG VARIANT
# The tensorrt extra (NVIDIA's TensorRT wheels, several GB) goes into the cuda image only when asked
# for with --build-arg WITH_TENSORRT=true.
ARG WITH_TENSORRT=false
# PyPI's torch wheels for Linux are CUDA builds (several GB of CUDA libraries). The cpu-torch variant
# takes the same pinned version from PyTorch's CPU-only index instead ("2.14.1+cpu" satisfies the
# constraint "torch==2.14.1"); set this to "" to use PyPI's build.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# More extras for the torch variants, comma separated: hf-text, multilingual (M-CLIP), cn-clip (CN-CLIP).
ARG MORE_EXTRAS=""
# 2. The variant's dependencies: its lock (resolved within the base lock, so the first layer's versions
#    stay), or, without one (cpu-torch: PyTorch's CPU index is not where the locks are resolved; MORE_EXTRAS,
#    WITH_TENSORRT), its extras with constraints.txt. This script is the whole install recipe: where the
#    code is already present (tests/integration/test_deploy.py runs it outside Docker) it installs
#    clipserve too. Here the code is not copied yet, so it installs the dependencies only, and step 3 adds
#    the package.
# $index is deliberately unquoted: it is either empty or two words ("--extra-index-url URL").
# hadolint ignore=SC2086
RUN set -eu; \
    index=""; lock="locks/$VARIANT.txt"; \
    case "$VARIANT" in \
      cpu-torch) extras="torch"; lock=""; if [ -n "$TORCH_CPU_INDEX" ]; then index="--extra-index-url $TORCH_CPU_INDEX"; fi ;; \
      cpu-onnx)  extras="onnx" ;; \
      cpu-openvino) extras="openvino" ;; \
      cuda)      extras="torch,onnx-gpu"; if [ "$WITH_TENSORRT" = "true" ]; then extras="$extras,tensorrt"; lock=""; fi ;; \
      *) echo "unknown VARIANT=$VARIANT (use cpu-torch, cpu-onnx, cpu-openvino or cuda)" >&2; exit 1 ;; \
    esac; \
    if [ -n "${MORE_EXTRAS:-}" ]; then extras="$extras,$MORE_EXTRAS"; lock=""; fi; \
    if [ -n "$lock" ]; then \
      /opt/venv/bin/pip install --no-deps --require-hashes -r "$lock"; \
      if [ -d executors/clipserve ]; then /opt/venv/bin/pip install --no-deps --no-build-isolation .; fi; \
    elif [ -d executors/clipserve ]; then \
      /opt/venv/bin/pip install $index -c constraints.txt ".[$extras]"; \
    else \
      /opt/venv/bin/python deploy/requirements.py "$extras" > /tmp/variant.txt; \
      /opt/venv/bin/pip install $index -c constraints.txt -r /tmp/variant.txt; \
      rm /tmp/variant.txt; \
    fi; \
    if [ "$VARIANT" != "cpu-torch" ] && [ "$VARIANT" != "cuda" ] && /opt/venv/bin/python -c "import torch" 2>/dev/null; then \
      echo "$VARIANT must not contain torch" >&2; exit 1; \
    fi
# 3. The code: the package alone (its dependencies are in place; pip check proves they fit it). Built with the
#    venv's own setuptools (a base dependency, within pyproject.toml's build requirement): nothing to download.
COPY README.md ./
COPY executors/clipserve ./executors/clipserve
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation -c constraints.txt . \
    && /opt/venv/bin/pip check \
    && /opt/venv/bin/python -c "import clipserve; print('clipserve', clipserve.__version__)"

# ---- runtime: the venv, the Flow files, a non-root user, nothing else ---------------------------
FROM base AS runtime
ARG EXECUTOR=CLIPEncoder
RUN groupadd --system --gid 10001 clipserve \
    && useradd --system --no-log-init --uid 10001 --gid clipserve --create-home --home-dir /home/clipserve \
       --shell /usr/sbin/nologin clipserve \
    && mkdir -p /cache \
    && chown clipserve:clipserve /cache
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/home/clipserve \
    CLIPSERVE_CACHE=/cache
# Not /app: `jina export docker-compose` bind-mounts the host's jina cache over /app by default.
WORKDIR /srv/clipserve
COPY flows ./flows
COPY executors/hub ./hub
COPY executors/hub/${EXECUTOR}/config.yml ./config.yml
# Model weights, ONNX exports and fp16 conversions: mount a volume here to keep them across runs.
VOLUME ["/cache"]
# gRPC gateway (all flows), HTTP and WebSocket gateways (flows/multi-protocol.yml only).
EXPOSE 51000 51001 51002
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
# Healthy once every replica and shard of the Flow has loaded, warmed up and is not draining (the
# gateway's gRPC health service "readiness"; `jina ping` says yes when one copy answers). Big models
# can take minutes to download and load, hence the long start period. This probes the default gateway
# port: when the container runs something else (e.g. `jina executor`), override it with --health-cmd.
HEALTHCHECK --interval=30s --timeout=20s --start-period=600s --retries=3 \
    CMD ["python", "-m", "clipserve", "ready", "127.0.0.1:51000", "--timeout", "10"]
# A Jina Flow shuts its executors down cleanly on SIGINT (what the test suite stops Flows with).
STOPSIGNAL SIGINT
ENTRYPOINT ["python", "-m", "clipserve"]
CMD ["flows/torch.yml"]

# ---- the three variants: only defaults differ ---------------------------------------------------
FROM runtime AS variant-cpu-torch
# The runtime's defaults as they are: flows/torch.yml, device chosen at start (always cpu with CPU torch).

FROM runtime AS variant-cpu-onnx
# The hub config.yml reads CLIPSERVE_BACKEND, so `jina executor --uses config.yml` (Kubernetes and
# compose exports) runs on ONNX Runtime here too. Set CLIPSERVE_MODEL_PATH to a directory exported with
# `python -m clipserve export onnx` (needs torch, so do it elsewhere): this image cannot export.
ENV CLIPSERVE_BACKEND=onnx
CMD ["flows/onnx.yml"]

FROM runtime AS variant-cpu-openvino
# As cpu-onnx, on OpenVINO (CLIPSERVE_BACKEND for the hub config.yml): serves an export made elsewhere.
# Intel GPUs (device gpu) also need Intel's GPU driver in the image, which this variant does not install.
ENV CLIPSERVE_BACKEND=openvino
CMD ["flows/openvino.yml"]

FROM runtime AS variant-cuda
# torch 2.14.1 and onnxruntime-gpu bring CUDA 13 and cuDNN 9 as pip wheels; the host supplies only the
# driver (>= 580 for CUDA 13) through the NVIDIA container toolkit. onnxruntime loads these libraries
# without torch's help only if they are on the loader path. The path names the Python version of
# PYTHON_IMAGE: change both together.
ENV LD_LIBRARY_PATH=/opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# hadolint cannot see that variant-${VARIANT} names one of the stages above, not an untagged image.
# hadolint ignore=DL3006
FROM variant-${VARIANT} AS final
# OCI labels, last, so that a new commit changes the metadata only, no layer. VERSION is pyproject.toml's
# (tests/containers checks that they agree); CI passes SOURCE (the repository's URL) and REVISION (the
# commit) as build arguments.
ARG VERSION=0.1.0
ARG SOURCE=""
ARG REVISION=""
LABEL org.opencontainers.image.title="clipserve" \
      org.opencontainers.image.description="CLIP embeddings and ranking as Jina executors, a drop-in successor to clip-as-service" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}"
