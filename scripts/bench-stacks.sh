#!/usr/bin/env bash
# Instructions per traced allocation (issue #36), counted by callgrind on the simulated CUDA
# runtime: a Python script allocating through ctypes from a few call paths and depths
# (tests/preload/py/nested_alloc.py churn N; each allocation is freed), the same script's chains
# of 6 and 40 Python frames (nested_alloc.py chain N D: 16 stacks sharing their outer frames, as
# a model's forward and backward do) and a C++ program (tests/preload/prog_load 1 N: N/2
# allocations, each freed) and a training step's pattern in native code (tests/preload/prog_stackmix
# varied 4 40 80: 240 allocations a step on each of two threads from 120 call paths, 40 of them
# once per layer). Each count is the difference between two run lengths divided by the
# allocations added: start-up and exit cancel out.
#   scripts/bench-stacks.sh [BEFORE_LIB]   BEFORE_LIB: another libgpuheap.so measured beside
#   this build's (e.g. the one before a change); writes bench/results/stacks-<date>-<commit>.json
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
before=${1:-}
command -v valgrind >/dev/null || { echo "bench-stacks: valgrind is needed" >&2; exit 2; }
# the interpreter itself, not a shim script; PYTHON=/path/to/python3.X picks another
py=$(${PYTHON:-python3} -c 'import sys; print(sys.executable)')
lib="$PWD/$BUILD_DIR/libgpuheap.so"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo true || echo false)

# ir LIB ENV... -- CMD...: callgrind's instruction total (LIB "-": no preload)
ir() {
  local l=$1; shift
  local env=()
  while [ "$1" != "--" ]; do env+=("$1"); shift; done; shift
  [ "$l" != "-" ] && env+=("LD_PRELOAD=$l")
  # PYTHONHASHSEED: the interpreter's own count otherwise moves by a few hundred a run
  env PYTHONHASHSEED=0 LD_LIBRARY_PATH="$PWD/$BUILD_DIR/simcuda" GPUHEAP_QUIET=1 GPUHEAP_OUTPUT="$tmp/t.%p.trace" "${env[@]}" \
    valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.out" "$@" >/dev/null 2>&1
  rm -f "$tmp"/t.*.trace
  sed -n 's/^totals: //p' "$tmp/cg.out"
}
# per_alloc LIB ENV...: instructions per allocation of each workload, as "py py6 py40 native step"
per_alloc() {
  local a b c d e f g h i j
  a=$(ir "$@" -- "$py" tests/preload/py/nested_alloc.py churn 200)
  b=$(ir "$@" -- "$py" tests/preload/py/nested_alloc.py churn 1200)
  e=$(ir "$@" -- "$py" tests/preload/py/nested_alloc.py chain 200 6)
  f=$(ir "$@" -- "$py" tests/preload/py/nested_alloc.py chain 1200 6)
  g=$(ir "$@" -- "$py" tests/preload/py/nested_alloc.py chain 200 40)
  h=$(ir "$@" -- "$py" tests/preload/py/nested_alloc.py chain 1200 40)
  # prog_load: one thread, N/2 cudaMalloc and N/2 cudaFree; 10000 calls more are 5000 allocations
  c=$(ir "$@" -- "$BUILD_DIR/tests/preload/prog_load" 1 2000)
  d=$(ir "$@" -- "$BUILD_DIR/tests/preload/prog_load" 1 12000)
  # prog_stackmix: 480 allocations a step; 20 steps more are 9600
  i=$(ir "$@" -- "$BUILD_DIR/tests/preload/prog_stackmix" varied 4 40 80 5)
  j=$(ir "$@" -- "$BUILD_DIR/tests/preload/prog_stackmix" varied 4 40 80 25)
  echo "$(( (b - a) / 1000 )) $(( (f - e) / 1000 )) $(( (h - g) / 1000 )) $(( (d - c) / 5000 )) $(( (j - i) / 9600 ))"
}
rows=()
row() {  # name LIB ENV...
  local name=$1; shift
  read -r p p6 p40 n st < <(per_alloc "$@")
  printf '%-34s %10s %10s %10s %10s %10s\n' "$name" "$p" "$p6" "$p40" "$n" "$st" >&2
  rows+=("$name $p $p6 $p40 $n $st")
}
printf '%-34s %10s %10s %10s %10s %10s\n' "instructions per allocation" "python" "python_6" "python_40" "native" "step" >&2
row "no gpuheap" -
row "gpuheap, no stacks" "$lib" GPUHEAP_STACKS=0
row "gpuheap, stacks, cache off" "$lib" GPUHEAP_STACK_CACHE=0
row "gpuheap, stacks (default)" "$lib"
row "gpuheap, native stacks, cache off" "$lib" GPUHEAP_PYTHON_STACKS=0 GPUHEAP_STACK_CACHE=0
row "gpuheap, native stacks" "$lib" GPUHEAP_PYTHON_STACKS=0
if [ -n "$before" ]; then
  row "before: stacks (default)" "$before"
  row "before: native stacks" "$before" GPUHEAP_PYTHON_STACKS=0
fi
# With PYTHON= the interpreter's version is in the name (a second file beside the default's)
pytag=""; [ -n "${PYTHON:-}" ] && pytag="-py$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
out="bench/results/stacks-$(date +%Y-%m-%d)-$commit$pytag.json"
python3 - "$out" "$commit" "$dirty" "$before" "$($py --version 2>&1)" "${rows[@]}" <<'PY'
import datetime, json, os, platform, sys
out, commit, dirty, before, pyver, *rows = sys.argv[1:]
cpu = platform.processor()
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"): cpu = line.split(":", 1)[1].strip(); break
res = {"date": datetime.date.today().isoformat(), "commit": commit, "dirty": dirty == "true", "cpu": cpu,
       "host": platform.node(), "cuda": "simcuda", "python": pyver, "before_lib": before or None,
       "unit": "instructions per allocation (callgrind, difference of two run lengths)",
       "workloads": {"python": "nested_alloc.py churn: 1000 allocations (200 vs 1200), Python frames 4-8 deep",
                     "python_6": "nested_alloc.py chain N 6: 1000 allocations (200 vs 1200), 6 Python frames",
                     "python_40": "nested_alloc.py chain N 40: 1000 allocations (200 vs 1200), 40 Python frames",
                     "native": "tests/preload/prog_load 1 N: 5000 allocations (N 2000 vs 12000), stacks 4 frames deep",
                     "step": "tests/preload/prog_stackmix varied 4 40 80 N: 9600 allocations (N 5 vs 25 steps), 120 call paths a thread on two threads"},
       "results": {}}
for r in rows:
    name, p, p6, p40, n, st = r.rsplit(" ", 5)
    res["results"][name] = {"python": int(p), "python_6": int(p6), "python_40": int(p40), "native": int(n),
                            "step": int(st)}
json.dump(res, open(out, "w"), indent=2)
print("written", out)
PY
