#!/usr/bin/env bash
# GPU readiness check for a lent GPU machine: parity (GPU vs CPU) and throughput for torch, onnx and
# tensorrt. Installs and downloads nothing; pieces that cannot run print "SKIP: why" (exit 0), a parity
# or engine-cache failure exits 1. Details: the docstring of benchmarks/gpu_check.py.
#
#   benchmarks/gpu_check.sh                       # ViT-B-32::random, batches 1 32 256, ~7.5 min at most
#   CLIPSERVE_GPU_PEAK_FLOPS=312e12 benchmarks/gpu_check.sh --batches 1 32    # e.g. an A100 (dense bf16)
#
# Environment: CLIPSERVE_PYTHON (default: .venv/bin/python, else python3), CLIPSERVE_GPU_PEAK_FLOPS
# (default 989e12, H200 dense bf16), GPU_CHECK_TIMEOUT (hard limit, default 470 s), GPU_CHECK_BUDGET
# (soft budget the script plans its sections in, default 450 s), CLIPSERVE_CACHE (default: a
# directory under /tmp, so ONNX exports and engines are reused by a rerun).
set -u
cd "$(dirname "$0")/.."

PY=${CLIPSERVE_PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=$(command -v python3 || true); fi
fi
if [ -z "$PY" ]; then
  echo "gpu_check: SKIP everything: no Python (set CLIPSERVE_PYTHON)"
  exit 0
fi

echo "== nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || true
else
  echo "nvidia-smi not found"
fi

export PYTHONPATH="$PWD/executors:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
export NO_VERSION_CHECK=1 JINA_LOG_LEVEL=WARNING
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1     # nothing from the internet
export CLIPSERVE_CACHE=${CLIPSERVE_CACHE:-${TMPDIR:-/tmp}/clipserve-gpu-check}

echo "== python: $PY"
timeout --kill-after=10 "${GPU_CHECK_TIMEOUT:-470}" "$PY" -m benchmarks.gpu_check "$@"
rc=$?
if [ "$rc" -eq 124 ]; then echo "gpu_check: stopped at the ${GPU_CHECK_TIMEOUT:-470}s limit"; fi
exit "$rc"
