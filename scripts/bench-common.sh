# shellcheck shell=bash
# Shared preamble of the scripts/bench-*.sh throughput scripts: source it, don't run it.
# Reads BUILD_DIR=build RUNS=3 CPU=1 (core to pin to) KEEP_TRACES=dir (keep generated traces
# there, reused when present). Sets gh, gen (binaries), commit, dirty, tdir (scratch dir),
# pin (taskset prefix, when present) and defines timed_run.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RUNS:-3}
CPU=${CPU:-1}
gh="$BUILD_DIR/gpuheap"
gen="$BUILD_DIR/gpuheap_gen_trace"
if [ ! -x "$gh" ] || [ ! -x "$gen" ]; then
  echo "$(basename "$0"): build first (scripts/setup.sh): $gh, $gen" >&2; exit 2
fi
# shellcheck disable=SC2034  # commit and dirty are read by the scripts that source this file
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
# shellcheck disable=SC2034  # (as above)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo true || echo false)
if [ -n "${KEEP_TRACES:-}" ]; then tdir=$KEEP_TRACES; mkdir -p "$tdir"; else tdir=$(mktemp -d); trap 'rm -rf "$tdir"' EXIT; fi
pin=(); command -v taskset >/dev/null && pin=(taskset -c "$CPU")
timer=(); [ -x /usr/bin/time ] && timer=(/usr/bin/time -f "%e %U %S %M" -o "$tdir/time.txt")

# timed_run CMD...: runs CMD pinned, stdout/stderr dropped; prints "wall user sys max_rss_kib"
# (/usr/bin/time, else getrusage through python). Returns CMD's exit status.
timed_run() {
  if [ ${#timer[@]} -gt 0 ]; then
    local rc=0
    "${pin[@]}" "${timer[@]}" "$@" > /dev/null 2>&1 || rc=$?
    cat "$tdir/time.txt"
    return $rc
  fi
  python3 - "${pin[@]}" "$@" <<'PY'
import resource, subprocess, sys, time
t = time.monotonic(); p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
w = time.monotonic() - t; r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{w:.2f} {r.ru_utime:.2f} {r.ru_stime:.2f} {r.ru_maxrss}")
sys.exit(p.returncode)
PY
}

# The machine, for the results file (JSON on stdout).
machine_json() {
  python3 - "${pin[*]:-none}" <<'PY'
import json, os, platform, sys
cpu = platform.processor()
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"): cpu = line.split(":", 1)[1].strip(); break
except OSError: pass
try: load = open("/proc/loadavg").read().split()[:3]
except OSError: load = []
print(json.dumps({"host": platform.node(), "cpu": cpu, "cpus": os.cpu_count(), "kernel": platform.release(),
                  "loadavg_at_end": load, "pinned": sys.argv[1]}))
PY
}
