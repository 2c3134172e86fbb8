#!/usr/bin/env bash
# gpuheap on a real GPU: installs the gpuheap wheel into a fresh venv and runs every case of
# tests/gpu from there (PyTorch, CuPy, JAX, plain CUDA C++, stream safety, OOM, identical losses,
# GPUHEAP_LIMIT, gpuheap top, the wheel itself), prints PASS/FAIL per case and writes the measured values to
# bench/results/gpu-test-<date>.json.
#   scripts/gpu-test.sh [--bench] [--only case1,case2] [--wheel FILE]
#   --only compat         the compatibility matrix alone (tests/gpu/compat: torch.compile, CUDA graphs,
#                         allocator settings, statistics, batch-size finder, DataLoader, spawn, transformers,
#                         Lightning, JAX, numba, CuPy; native vs `gpuheap run`); --only compat.NAME one case
#   GPU_COMPAT_STEPS=N    steps per compat job (default 10)
#   --wheel FILE          the wheel (default: .whl/gpuheap-*.whl of this checkout, made by
#                         scripts/wheel.sh and carried here): `python3 -m venv --system-site-packages`
#                         (torch, cupy, jax stay visible), `pip install --no-index`, and the cases
#                         run with the venv's python
#   GPUHEAP_BIN_DIR=dir   a build tree's binaries instead of a wheel (no venv)
#                         (a COMMIT file there names the commit recorded in the results)
#   neither               builds build/ (scripts/setup.sh) and uses it
#   PYTHON=python3        the Python that has torch, cupy, jax, torchvision (the venv's base)
#   --bench               also run bench/gpu_bench.py --latency afterwards (step time beside torch's memory
#                         history, in rounds; allocation latency)
#   --bench-only          bench/gpu_bench.py alone, from the same wheel/venv (no test cases);
#                         GPU_BENCH_ARGS="--rounds 5 --configs ..." are passed to it
#   --alloc-cost          bench/alloc_cost.py alone (ns per allocation from Python under each stack
#                         mode, by Python depth); GPU_ALLOC_COST_ARGS are passed to it
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
bench=0; bench_only=0; alloc_cost=0; only=""; wheel=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) bench=1 ;;
    --bench-only) bench=1; bench_only=1 ;;
    --alloc-cost) alloc_cost=1; bench_only=1 ;;
    --only) only="$2"; shift ;;
    --wheel) wheel="$2"; shift ;;
    *) echo "usage: scripts/gpu-test.sh [--bench|--bench-only|--alloc-cost] [--only CASES] [--wheel FILE]" >&2; exit 2 ;;
  esac
  shift
done
if ! nvidia-smi -L >/dev/null 2>&1; then echo "gpu-test: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2; exit 2; fi
command -v nvcc >/dev/null || { echo "gpu-test: nvcc is needed (CUDA C++ cases)" >&2; exit 2; }
PY=${PYTHON:-python3}
if [ -z "$wheel" ] && [ -z "${GPUHEAP_BIN_DIR:-}" ]; then
  for w in .whl/gpuheap-*.whl; do [ -f "$w" ] && wheel=$w; done  # scripts/wheel.sh leaves one
fi
if [ -n "$wheel" ]; then
  [ -f "$wheel" ] || { echo "gpu-test: no wheel $wheel" >&2; exit 2; }
  venv=$(mktemp -d /tmp/gpuheap-gpu-venv-XXXXXX)
  trap 'rm -rf "$venv"' EXIT
  # Without ensurepip (Ubuntu's python3-venv missing) the venv still sees the system's pip.
  "$PY" -m venv --system-site-packages "$venv" >/dev/null 2>&1 ||
    "$PY" -m venv --system-site-packages --without-pip "$venv" || exit 2
  # --system-site-packages sees the base interpreter's packages only: when $PY is itself a
  # venv's (or has a user site), its site directories go in a .pth, after the venv's own.
  "$PY" -c 'import site, sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
    >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/gpuheap-test-parent.pth" || exit 2
  "$venv/bin/python" -m pip install -q --no-index --no-deps "$wheel" || { echo "gpu-test: pip install $wheel failed" >&2; exit 2; }
  "$venv/bin/python" -c 'import gpuheap, os, sys; sys.exit(0 if os.path.isfile(gpuheap.cli_path()) else 1)' ||
    { echo "gpu-test: the venv's gpuheap is not the wheel's" >&2; exit 2; }
  PY=$venv/bin/python
  export PATH=$venv/bin:$PATH GPUHEAP_EXPECT_WHEEL=1
  unset GPUHEAP_BIN_DIR
  echo "gpu-test: $(basename "$wheel") in $venv ($("$PY" -m gpuheap --version))"
else
  bin=${GPUHEAP_BIN_DIR:-build}
  if [ ! -x "$bin/gpuheap" ] || [ ! -f "$bin/libgpuheap.so" ]; then
    [ -n "${GPUHEAP_BIN_DIR:-}" ] && { echo "gpu-test: no gpuheap binaries in $bin" >&2; exit 2; }
    scripts/setup.sh || exit 2
  fi
  GPUHEAP_BIN_DIR=$(cd "$bin" && pwd) || exit 2
  export GPUHEAP_BIN_DIR
fi
day=$(date +%F)
mkdir -p bench/results
out=${GPU_TEST_OUT:-bench/results/gpu-test-$day.json}
rc=0
if [ "$bench_only" = 0 ]; then
  "$PY" tests/gpu/run_all.py --out "$out" ${only:+--only "$only"} ${GPU_TEST_WORK:+--work "$GPU_TEST_WORK"}
  rc=$?
fi
if [ "$bench" = 1 ]; then
  # shellcheck disable=SC2086  # GPU_BENCH_ARGS is a list of words
  "$PY" bench/gpu_bench.py ${GPU_BENCH_ARGS:---latency} --out "${GPU_BENCH_OUT:-bench/results/}" || rc=1
fi
if [ "$alloc_cost" = 1 ]; then
  # shellcheck disable=SC2086  # GPU_ALLOC_COST_ARGS is a list of words
  "$PY" bench/alloc_cost.py ${GPU_ALLOC_COST_ARGS:-} --out "${GPU_BENCH_OUT:-bench/results/}" || rc=1
fi
exit $rc
