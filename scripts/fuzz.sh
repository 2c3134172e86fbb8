#!/usr/bin/env bash
# Builds the libFuzzer target (clang, ASan+UBSan, tests/fuzz/) and runs it on the checked-in
# seed corpus. Exit 1 on a crash, hang, leak or sanitizer report (the reproducer is left in
# $FUZZ_DIR/artifacts).
#   scripts/fuzz.sh [SECONDS=60]     FUZZ_BUILD_DIR=build-fuzz   FUZZ_DIR=<dir>/fuzz-run
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
dir=${FUZZ_BUILD_DIR:-build-fuzz}
if ! command -v clang++ >/dev/null 2>&1 || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  if [ -z "${GPUHEAP_NO_APT:-}" ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-dev >/dev/null
  fi
fi
[ -f "$dir/CMakeCache.txt" ] || cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang "-DGPUHEAP_SANITIZE=address;undefined" -DGPUHEAP_FUZZ=ON >/dev/null
cmake --build "$dir" -j "${JOBS:-2}" --target fuzz_trace >/dev/null
run=${FUZZ_DIR:-$dir/fuzz-run}
mkdir -p "$run/corpus" "$run/artifacts"
# A fresh working corpus each run: the checked-in seeds plus what earlier runs here found.
# -rss_limit_mb: a trace of at most max_len bytes must not need more (the analyzer's memory
# follows the file size); -timeout: one input must not take seconds.
set +e
"$dir/tests/fuzz/fuzz_trace" "$run/corpus" tests/fuzz/corpus -max_total_time="$secs" -max_len=65536 \
  -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$run/artifacts/" \
  ${FUZZ_ARGS:-} >"$run/fuzz.log" 2>&1
status=$?
set -e
grep -E "^(#[0-9]+ *(DONE|INITED)|==[0-9]+==|SUMMARY|stat::)" "$run/fuzz.log" || true
if [ "$status" -ne 0 ]; then
  echo "fuzz: FAILED (exit $status); reproducers in $run/artifacts; log $run/fuzz.log" >&2
  exit 1
fi
echo "fuzz: ok: $(grep -E '^stat::number_of_executed_units' "$run/fuzz.log" | awk '{print $2}') executions in ${secs} s"
