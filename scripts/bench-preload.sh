#!/usr/bin/env bash
# Measures a cudaMalloc+cudaFree pair through libgpuheap.so in four configurations (pool
# on/off x stacks on/off), 1 and 16 threads, on the simulated CUDA runtime unless --gpu.
# Writes bench/results/preload-<host>-<date>.json and prints a table of medians.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
sim="build/simcuda"; [ "${1:-}" = "--gpu" ] && sim=""
out="bench/results/preload-$(hostname -s)-$(date +%Y%m%d).json"
tmp=$(mktemp -d)
run() {  # name env...
  local name=$1; shift
  env LD_LIBRARY_PATH="${sim}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" LD_PRELOAD="$PWD/build/libgpuheap.so" \
      GPUHEAP_OUTPUT="$tmp/$name.%p.trace" GPUHEAP_QUIET=1 "$@" \
      build/bench/bench_preload --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
      --benchmark_min_time=0.2 --benchmark_format=json > "$tmp/$name.json"
}
run pool_stacks GPUHEAP_POOL=1 GPUHEAP_STACKS=1
run pool_nostacks GPUHEAP_POOL=1 GPUHEAP_STACKS=0
run nopool_nostacks GPUHEAP_POOL=0 GPUHEAP_STACKS=0
run nopool_stacks GPUHEAP_POOL=0 GPUHEAP_STACKS=1
python3 - "$tmp" "$out" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "${sim:-gpu}" <<'PY'
import json, sys, os, datetime, platform
tmp, out, commit, target = sys.argv[1:5]
res = {"date": datetime.date.today().isoformat(), "commit": commit, "cuda": "simcuda" if target else "gpu",
       "host": platform.node(), "cpus": os.cpu_count(), "unit": "ns per cudaMalloc+cudaFree pair (median of 5)", "results": {}}
for name in ["pool_stacks", "pool_nostacks", "nopool_nostacks", "nopool_stacks"]:
    d = json.load(open(f"{tmp}/{name}.json"))
    for b in d["benchmarks"]:
        if b.get("aggregate_name") != "median": continue
        key = b["run_name"].replace("BM_alloc_free_pair/", "")
        # real time per iteration per thread
        res["results"].setdefault(name, {})[key] = round(b["real_time"], 1)
os.makedirs(os.path.dirname(out), exist_ok=True)
json.dump(res, open(out, "w"), indent=2)
print(json.dumps(res["results"], indent=2))
print("written", out)
PY
