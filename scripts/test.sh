#!/usr/bin/env bash
# Builds (through setup.sh) and runs the whole test suite with ctest; prints ctest's summary.
#   scripts/test.sh                 main build (build/), all tests
#   scripts/test.sh --sanitize      also ASan+UBSan and TSan builds of the analyzer + unit tests
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
status=0
(cd build && ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 600) || status=$?
if [ "${1:-}" = "--sanitize" ]; then
  for san in "address;undefined" "thread"; do
    dir="build-san-${san%%;*}"
    [ -f "$dir/CMakeCache.txt" ] || cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DGPUHEAP_SANITIZE=$san" >/dev/null
    cmake --build "$dir" -j "${JOBS:-$(nproc)}" >/dev/null
    (cd "$dir" && GPUHEAP_TEST_SCALE=small ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 900) || status=$?
  done
fi
exit $status
