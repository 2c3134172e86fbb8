#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan, tests/fuzz/) and runs each on the checked-in
# seed corpus: fuzz_model (reader + model replay, thousands of inputs/s), fuzz_model_zstd (the
# same with each input wrapped in a zstd stream, maybe cut) and fuzz_trace (the whole
# `gpuheap summary` path with check, diff and dump; slower). Exit 1 on a crash, hang,
# leak or sanitizer report (the reproducer is left in $FUZZ_DIR/<target>/artifacts).
#   scripts/fuzz.sh [SECONDS=60]    fuzz_trace runs SECONDS; fuzz_model and fuzz_model_zstd
#                                   share SECONDS (half each), so the total time is unchanged
#   FUZZ_TARGETS="fuzz_model fuzz_model_zstd fuzz_trace"   FUZZ_BUILD_DIR=build-fuzz   FUZZ_DIR=<build>/fuzz-run
#   FUZZ_BIN_DIR=dir   use prebuilt targets from dir (no build; e.g. carried to a bigger machine)
#   FUZZ_FORK=N        run N worker processes (libFuzzer -fork=N); FUZZ_ARGS: more flags
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
dir=${FUZZ_BUILD_DIR:-build-fuzz}
targets=${FUZZ_TARGETS:-fuzz_model fuzz_model_zstd fuzz_trace}
bin=${FUZZ_BIN_DIR:-}
if [ -z "$bin" ]; then
  if ! command -v clang++ >/dev/null 2>&1 || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
    if [ -z "${GPUHEAP_NO_APT:-}" ]; then
      SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-dev >/dev/null
    fi
  fi
  [ -f "$dir/CMakeCache.txt" ] || cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_C_COMPILER=clang "-DGPUHEAP_SANITIZE=address;undefined" -DGPUHEAP_FUZZ=ON >/dev/null
  # shellcheck disable=SC2086
  cmake --build "$dir" -j "${JOBS:-2}" --target $targets >/dev/null
  bin=$dir/tests/fuzz
fi
status=0
for t in $targets; do
  tsecs=$secs
  # The two reader/model targets split their time when both run.
  if [[ "$t" == fuzz_model* && " $targets " == *" fuzz_model "* && " $targets " == *" fuzz_model_zstd "* ]]; then
    tsecs=$(((secs + 1) / 2))
  fi
  run=${FUZZ_DIR:-$dir/fuzz-run}/$t
  mkdir -p "$run/corpus" "$run/artifacts"
  # A fresh working corpus each run: the checked-in seeds plus what earlier runs here found.
  # -rss_limit_mb: a trace of at most max_len bytes must not need more (the analyzer's memory
  # follows the file size); -timeout: one input must not take seconds.
  set +e
  # shellcheck disable=SC2086
  "$bin/$t" "$run/corpus" tests/fuzz/corpus -max_total_time="$tsecs" -max_len=65536 -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$run/artifacts/" \
    ${FUZZ_FORK:+-fork=$FUZZ_FORK} ${FUZZ_ARGS:-} >"$run/fuzz.log" 2>&1
  rc=$?
  set -e
  grep -E "^(#[0-9]+:? *(DONE|INITED|cov)|==[0-9]+==|SUMMARY|stat::|INFO: fuzzed for)" "$run/fuzz.log" | tail -8 || true
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $t FAILED (exit $rc); reproducers in $run/artifacts; log $run/fuzz.log" >&2
    status=1
    continue
  fi
  # -fork mode prints no final stats; its last status line carries the total count.
  n=$(grep -E '^stat::number_of_executed_units' "$run/fuzz.log" | awk '{print $2}' || true)
  [ -n "$n" ] || n=$(grep -oE '^#[0-9]+' "$run/fuzz.log" | tail -1 | tr -d '#' || true)
  echo "fuzz: $t ok: ${n:-?} executions in ${tsecs} s, $(find "$run/artifacts" -mindepth 1 -maxdepth 1 | wc -l) artifacts"
done
exit $status
