#!/usr/bin/env bash
# gpuheap on a real GPU: builds gpuheap if needed (scripts/setup.sh), runs every case of tests/gpu
# (PyTorch, CuPy, JAX, plain CUDA C++, stream safety, OOM, identical losses, GPUHEAP_LIMIT, gpuheap top), prints PASS/FAIL per
# case and writes the measured values to bench/results/gpu-test-<date>.json.
#   scripts/gpu-test.sh [--bench] [--only case1,case2]
#   GPUHEAP_BIN_DIR=dir   use gpuheap binaries from dir instead of build/ (no build then)
#                         (a COMMIT file there names the commit recorded in the results)
#   PYTHON=python3        the Python that has torch, cupy, jax, torchvision
#   --bench               also run bench/gpu_bench.py --latency afterwards (step time beside torch's memory
#                         history, in rounds; allocation latency)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
bench=0; only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) bench=1 ;;
    --only) only="$2"; shift ;;
    *) echo "usage: scripts/gpu-test.sh [--bench] [--only CASES]" >&2; exit 2 ;;
  esac
  shift
done
if ! nvidia-smi -L >/dev/null 2>&1; then echo "gpu-test: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2; exit 2; fi
command -v nvcc >/dev/null || { echo "gpu-test: nvcc is needed (CUDA C++ cases)" >&2; exit 2; }
bin=${GPUHEAP_BIN_DIR:-build}
if [ ! -x "$bin/gpuheap" ] || [ ! -f "$bin/libgpuheap.so" ]; then
  [ -n "${GPUHEAP_BIN_DIR:-}" ] && { echo "gpu-test: no gpuheap binaries in $bin" >&2; exit 2; }
  scripts/setup.sh || exit 2
fi
GPUHEAP_BIN_DIR=$(cd "$bin" && pwd) || exit 2
export GPUHEAP_BIN_DIR
PY=${PYTHON:-python3}
day=$(date +%F)
mkdir -p bench/results
out=${GPU_TEST_OUT:-bench/results/gpu-test-$day.json}
"$PY" tests/gpu/run_all.py --out "$out" ${only:+--only "$only"} ${GPU_TEST_WORK:+--work "$GPU_TEST_WORK"}
rc=$?
if [ "$bench" = 1 ]; then
  "$PY" bench/gpu_bench.py --latency --out "${GPU_BENCH_OUT:-bench/results/}" || rc=1
fi
exit $rc
