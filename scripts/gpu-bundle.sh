#!/usr/bin/env bash
# Packs what scripts/gpu-test.sh needs onto a GPU machine that has no apt (the lent H100 and
# H200 hosts: Ubuntu 24.04 with the CUDA toolkit and PyTorch, but no libunwind and no zstd): the CLI with the libraries it needs beyond glibc and
# libstdc++ (spdlog, fmt, libdw, libelf, libzstd: `gpuheap run` compresses its traces at exit; ncurses: `gpuheap top`;
# RUNPATH $ORIGIN, for the CLI alone), libgpuheap.so
# with its bundled libunwind, and a COMMIT file naming the build's commit for bench/results.
#   scripts/gpu-bundle.sh [OUT_DIR]     (default .carry/bin; BUILD_DIR=build)
# Then, there:  GPUHEAP_BIN_DIR=.carry/bin scripts/gpu-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
out=${1:-.carry/bin}
command -v patchelf >/dev/null || { echo "gpu-bundle: patchelf is needed (apt-get install patchelf)" >&2; exit 2; }
if [ ! -x "$BUILD_DIR/gpuheap" ] || [ ! -f "$BUILD_DIR/libgpuheap.so" ]; then echo "gpu-bundle: build first (scripts/setup.sh)" >&2; exit 2; fi
rm -rf "$out"; mkdir -p "$out"
cp "$BUILD_DIR/gpuheap" "$BUILD_DIR/libgpuheap.so" "$out/"
cp -L "$BUILD_DIR"/libunwind*.so* "$out/"
# The CLI's own libraries: whatever ldd resolves for these sonames (and the libraries they
# pull in that a bare Ubuntu lacks).
for lib in $(ldd "$BUILD_DIR/gpuheap" | awk '/libspdlog|libfmt|libdw|libelf|libzstd|libncurses/ {print $3}'); do cp -L "$lib" "$out/"; done
# zstd (the GPU machine has none), to compress a trace made there for examples/traces.
if command -v zstd >/dev/null; then
  cp -L "$(command -v zstd)" "$out/"
  for lib in $(ldd "$(command -v zstd)" | awk '/libzstd|liblzma|liblz4/ {print $3}'); do cp -L "$lib" "$out/"; done
  patchelf --set-rpath "\$ORIGIN" "$out/zstd"
fi
patchelf --set-rpath "\$ORIGIN" "$out/gpuheap"
for f in "$out"/libspdlog* "$out"/libfmt* "$out"/libdw* "$out"/libelf*; do patchelf --set-rpath "\$ORIGIN" "$f"; done
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD || commit="$commit-dirty"
echo "$commit" > "$out/COMMIT"
# Every bundled library must resolve inside the bundle (or to the base system's glibc set).
if ldd "$out/gpuheap" | grep -q "not found"; then ldd "$out/gpuheap" >&2; exit 1; fi
echo "gpu-bundle: $out ($(du -sh "$out" | cut -f1), commit $commit)"
