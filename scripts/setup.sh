#!/usr/bin/env bash
# Installs what gpuheap needs (Debian/Ubuntu packages, only when missing) and builds it into
# build/ (idempotent: a second run only rebuilds what changed).
#   BUILD_DIR=build   CMAKE_ARGS="..."   GPUHEAP_NO_APT=1 (never call apt-get)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
PKGS=(build-essential cmake pkg-config libunwind-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
      libcli11-dev libdw-dev libelf-dev libzstd-dev libgtest-dev libbenchmark-dev zstd python3 python3-pytest
      chromium python3-build python3-setuptools python3-wheel python3-venv python3-pip patchelf libncurses-dev tmux)
# python3: Python-stack tests; python3-pytest: the pytest plugin tests; chromium: tests/unit/test_report_html
# loads the HTML report headless; python3-build ... patchelf: the wheel (scripts/wheel.sh, ctest wheel_venv);
# libncurses-dev: `gpuheap top`'s view; tmux: its test drives the view (tests/preload/test_top.py)
missing=()
if command -v dpkg >/dev/null 2>&1; then
  for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
fi
if [ ${#missing[@]} -gt 0 ] && [ -z "${GPUHEAP_NO_APT:-}" ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
CUDA_ROOT=${CUDA_ROOT:-/usr/local/cuda}
if [ ! -f "$CUDA_ROOT/include/cuda.h" ]; then
  echo "setup: the CUDA toolkit headers are needed (cuda.h not under $CUDA_ROOT/include); set CUDA_ROOT" >&2
  exit 2
fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  read -r -a cmake_args <<<"${CMAKE_ARGS:-}"  # a list of options, split on blanks
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDA_ROOT="$CUDA_ROOT" "${cmake_args[@]}" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" 2>&1 | grep -E "error|warning: unused|FAILED|Error" || true
if [ ! -x "$BUILD_DIR/gpuheap" ] || [ ! -f "$BUILD_DIR/libgpuheap.so" ]; then
  echo "setup: build failed" >&2; cmake --build "$BUILD_DIR" -j1 2>&1 | tail -40; exit 1
fi
