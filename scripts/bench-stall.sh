#!/usr/bin/env bash
# Does writeback stall a traced program? (docs/reliability.md, "Known limits".) Runs
# build/bench/bench_stall (THREADS threads timing every cudaMalloc+cudaFree pair) under
# libgpuheap.so on the simulated runtime, stacks on, in three configurations, ROUNDS times
# interleaved:
#   quiet         trace in DIR, nothing else writing
#   writer        trace in DIR while `dd` writes BALLAST_MB files into DIR in a loop (page
#                 cache fills past vm.dirty_ratio; dirtiers of that disk get throttled)
#   writer_tmpfs  trace in /dev/shm (no writeback) while the same dd runs: the CPU and
#                 memory pressure of the writer without writeback on the trace's pages
# and writes bench/results/stall-<host>-<date>.json (p50/p99/p99.9/p99.99/max per pair,
# pairs over 1 ms and 10 ms, median over rounds; every round's numbers are kept).
#   scripts/bench-stall.sh [SECONDS=10]   THREADS=4 ROUNDS=3 DIR=build/stall-run BALLAST_MB=8192
#   RATE=N   each thread issues N pairs/s (0: flat out). A PyTorch step of ~200 allocations
#            every 5 ms is ~40 000 allocations/s: THREADS=4 RATE=10000.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
threads=${THREADS:-4}
rounds=${ROUNDS:-3}
dir=${DIR:-build/stall-run}
ballast=${BALLAST_MB:-8192}
rate=${RATE:-0}
[ -x build/bench/bench_stall ] || cmake --build build -j "${JOBS:-2}" --target bench_stall gpuheap simcuda_runtime >/dev/null
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
shm=$(mktemp -d /dev/shm/gpuheap-stall.XXXXXX)
tmp=$(mktemp -d)
writer_pid=""
cleanup() {
  [ -n "$writer_pid" ] && kill "$writer_pid" 2>/dev/null && wait "$writer_pid" 2>/dev/null
  rm -rf "$shm" "$tmp" "$dir"/ballast.* "$dir"/*.trace
}
trap cleanup EXIT

start_writer() {
  ( while :; do dd if=/dev/zero of="$dir/ballast.$BASHPID" bs=1M count="$ballast" status=none || true
               rm -f "$dir/ballast.$BASHPID"; done ) &
  writer_pid=$!
  sleep 3  # let the page cache fill past the dirty thresholds before measuring
}
stop_writer() {
  kill "$writer_pid" 2>/dev/null || true
  wait "$writer_pid" 2>/dev/null || true
  writer_pid=""
  pkill -f "of=$dir/ballast" 2>/dev/null || true
  rm -f "$dir"/ballast.*
  sync
}
measure() {  # name trace_dir round
  local out="$tmp/$1.$3.json" dirty
  dirty=$(awk '/^Dirty:/ {print $2}' /proc/meminfo)
  env LD_LIBRARY_PATH="$PWD/build/simcuda" LD_PRELOAD="$PWD/build/libgpuheap.so" GPUHEAP_QUIET=1 \
      GPUHEAP_OUTPUT="$2/stall.%p.trace" GPUHEAP_STACKS=1 build/bench/bench_stall "$threads" "$secs" 4096 "$rate" > "$out"
  local trace
  trace=$(find "$2" -maxdepth 1 -name 'stall.*.trace' -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
  python3 - "$out" "$dirty" "$(stat -c %s "$trace")" <<'PY'
import json, sys
p, dirty, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
d = json.load(open(p)); d["dirty_kb_at_start"] = dirty; d["trace_bytes"] = size
json.dump(d, open(p, "w"))
PY
  rm -f "$trace"
  echo "$1 round $3: $(cat "$out")"
}

sync
for r in $(seq 1 "$rounds"); do
  measure quiet "$dir" "$r"
  start_writer; measure writer "$dir" "$r"; stop_writer
  start_writer; measure writer_tmpfs "$shm" "$r"; stop_writer
done

suffix=""; [ "$rate" = 0 ] || suffix="-rate$rate"
out="bench/results/stall-$(hostname -s)-$(date +%Y%m%d)$suffix.json"
python3 - "$tmp" "$out" "$rounds" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "$ballast" <<'PY'
import datetime, glob, json, os, platform, statistics, sys
tmp, out, rounds, commit, ballast = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
res = {"date": datetime.date.today().isoformat(), "commit": commit, "host": platform.node(), "cpus": os.cpu_count(),
       "cuda": "simcuda", "stacks": True, "ballast_mb": ballast,
       "dirty_ratio": open("/proc/sys/vm/dirty_ratio").read().strip(),
       "mem_total_kb": int(open("/proc/meminfo").readline().split()[1]),
       "unit": "ns per cudaMalloc+cudaFree pair; medians over rounds", "configs": {}}
for name in ["quiet", "writer", "writer_tmpfs"]:
    runs = [json.load(open(f"{tmp}/{name}.{r}.json")) for r in range(1, rounds + 1)]
    keys = ["pairs", "p50_ns", "p99_ns", "p999_ns", "p9999_ns", "max_ns", "over_1ms", "over_10ms"]
    res["configs"][name] = {"median": {k: statistics.median(r[k] for r in runs) for k in keys}, "runs": runs}
os.makedirs(os.path.dirname(out), exist_ok=True)
json.dump(res, open(out, "w"), indent=1)
print(f"{'config':14} {'pairs':>10} {'p50':>8} {'p99':>8} {'p99.9':>9} {'p99.99':>10} {'max':>12} {'>1ms':>6} {'>10ms':>6}")
for name, c in res["configs"].items():
    m = c["median"]
    print(f"{name:14} {m['pairs']:>10.0f} {m['p50_ns']:>8.0f} {m['p99_ns']:>8.0f} {m['p999_ns']:>9.0f} "
          f"{m['p9999_ns']:>10.0f} {m['max_ns']:>12.0f} {m['over_1ms']:>6.0f} {m['over_10ms']:>6.0f}")
print("written", out)
PY
