#!/usr/bin/env bash
# Builds (through setup.sh) and runs the whole test suite with ctest; prints ctest's summary.
#   scripts/test.sh                 main build (build/), all tests
#   scripts/test.sh --sanitize      also ASan+UBSan and TSan builds of the analyzer + unit tests
#   scripts/test.sh --fuzz          also 60 s of the trace fuzzer (scripts/fuzz.sh, clang)
#   scripts/test.sh --lint          also clang-tidy (scripts/lint.sh)
# (options combine: .ci/run passes all three)
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=0 fuzz=0 lint=0
for a in "$@"; do
  case "$a" in
    --sanitize) sanitize=1 ;;
    --fuzz) fuzz=1 ;;
    --lint) lint=1 ;;
    *) echo "test.sh: unknown option $a" >&2; exit 2 ;;
  esac
done
scripts/setup.sh
status=0
(cd build && ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 600) || status=$?
if [ $sanitize = 1 ]; then
  for san in "address;undefined" "thread"; do
    dir="build-san-${san%%;*}"
    [ -f "$dir/CMakeCache.txt" ] || cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DGPUHEAP_SANITIZE=$san" >/dev/null
    cmake --build "$dir" -j "${JOBS:-$(nproc)}" >/dev/null
    (cd "$dir" && GPUHEAP_TEST_SCALE=small ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 900) || status=$?
  done
fi
if [ $fuzz = 1 ]; then
  scripts/fuzz.sh "${FUZZ_SECONDS:-60}" || status=$?
fi
if [ $lint = 1 ]; then
  scripts/lint.sh || status=$?
fi
exit $status
