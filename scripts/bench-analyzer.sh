#!/usr/bin/env bash
# Analyzer throughput: `gpuheap summary` over a generated 10 M-event trace, plain and zstd,
# N runs each pinned to one core (taskset, when present). Records wall and CPU seconds,
# events/s (records in the trace / wall seconds) and peak RSS (/usr/bin/time, else
# getrusage through python) per run, and the medians.
# Writes bench/results/analyzer-<date>-<shortcommit>.json.
#   EVENTS=10000000  RUNS=3  CPU=1 (core to pin to)  BUILD_DIR=build
#   BASELINE=path/to/older/gpuheap: also measures that binary, same traces, runs interleaved
#   KEEP_TRACES=dir: generate the traces there and keep them (reused when present)
#   CALLGRIND=500000: also count instructions per record under valgrind's callgrind (collected
#     inside gpuheap::analyze only) on a generated trace of that many events, for the current
#     binary and BASELINE: the noise-free figure where the machine is shared
#   NOTE="...": free text stored in the result (e.g. that other jobs shared the machine)
EVENTS=${EVENTS:-10000000}
# shellcheck source=scripts/bench-common.sh
. "$(dirname "$0")/bench-common.sh"
out="bench/results/analyzer-$(date +%Y-%m-%d)-$commit.json"
plain="$tdir/analyzer-$EVENTS.trace"
zst="$tdir/analyzer-$EVENTS.trace.zst"
[ -s "$plain" ] || "$gen" "$plain" "$EVENTS" 2>/dev/null
[ -s "$zst" ] || "$gen" "$zst" "$EVENTS" --zstd 2>/dev/null
results="$tdir/runs.tsv"; : > "$results"
one() {  # label binary trace
  local q=(); "$2" summary --help 2>/dev/null | grep -q -- --quiet && q=(--quiet)  # older binaries: no --quiet
  local t
  t=$(timed_run "$2" summary "${q[@]}" "$3") || { echo "bench-analyzer: $2 summary $3 failed" >&2; exit 1; }
  read -r wall user sys rss <<< "$t"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$(basename "$3")" "$wall" "$user" "$sys" "$rss" >> "$results"
  echo "bench-analyzer: $1 $(basename "$3"): ${wall}s wall, ${user}s user, ${rss} KiB peak RSS" >&2
}
for ((i = 0; i < RUNS; i++)); do
  for t in "$plain" "$zst"; do
    one current "$gh" "$t"
    [ -n "${BASELINE:-}" ] && one baseline "$BASELINE" "$t"
  done
done
cg="$tdir/callgrind.tsv"; : > "$cg"
if [ -n "${CALLGRIND:-}" ] && command -v valgrind >/dev/null; then
  small="$tdir/analyzer-$CALLGRIND.trace"
  [ -s "$small" ] || "$gen" "$small" "$CALLGRIND" 2>/dev/null
  for b in current:"$gh" ${BASELINE:+baseline:"$BASELINE"}; do
    valgrind --tool=callgrind --callgrind-out-file="$tdir/cg.out" "--toggle-collect=gpuheap::analyze(*" \
      "${b#*:}" summary --quiet "$small" > /dev/null 2> "$tdir/cg.err" || true
    ir=$(grep -o 'refs: *[0-9,]*' "$tdir/cg.err" | tr -dc 0-9)
    printf '%s\t%s\n' "${b%%:*}" "$ir" >> "$cg"
  done
  cg_records=$("$gh" summary --json --quiet "$small" 2>/dev/null |
               python3 -c 'import json,sys; print(json.load(sys.stdin)["trace"]["records"])')
fi
records=$("$gh" summary --json --quiet "$plain" 2>/dev/null |
          python3 -c 'import json,sys; d=json.load(sys.stdin); t=d.get("trace") or d["traces"][0]["trace"]; print(t["records"])')
python3 - "$results" "$out" "$commit" "$dirty" "$EVENTS" "$records" "$plain" "$zst" "${pin[*]:-none}" \
    "${BASELINE:-}" "$cg" "${cg_records:-0}" "${NOTE:-}" <<'PY'
import json, os, platform, statistics, subprocess, sys, datetime
results, out, commit, dirty, events, records, plain, zst, pin, baseline, cg, cg_records, note = sys.argv[1:14]
records = int(records)
def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"): return line.split(":", 1)[1].strip()
    except OSError: pass
    return platform.processor()
runs = {}
for line in open(results):
    label, trace, wall, user, sys_, rss = line.rstrip("\n").split("\t")
    kind = "zstd" if trace.endswith(".zst") else "plain"
    runs.setdefault(label, {}).setdefault(kind, []).append(
        {"wall_s": float(wall), "user_s": float(user), "sys_s": float(sys_), "max_rss_kib": int(rss),
         "events_per_s": round(records / float(wall)) if float(wall) > 0 else None,
         "events_per_cpu_s": round(records / (float(user) + float(sys_))) if float(user) + float(sys_) > 0 else None})
summary = {}
for label, kinds in runs.items():
    for kind, rs in kinds.items():
        summary.setdefault(label, {})[kind] = {
            "median_wall_s": statistics.median(r["wall_s"] for r in rs),
            "median_events_per_s": round(statistics.median(r["events_per_s"] for r in rs)),
            "best_events_per_s": max(r["events_per_s"] for r in rs),
            "median_events_per_cpu_s": round(statistics.median(r["events_per_cpu_s"] for r in rs)),
            "max_rss_kib": max(r["max_rss_kib"] for r in rs)}
try: load = open("/proc/loadavg").read().split()[:3]
except OSError: load = []
doc = {"date": datetime.date.today().isoformat(), "commit": commit, "dirty_tree": dirty == "true",
       "command": "gpuheap summary --quiet TRACE (--quiet left out for binaries without it; stderr is not a terminal anyway)", "pinned": pin,
       "machine": {"host": platform.node(), "cpu": cpu_model(), "cpus": os.cpu_count(), "kernel": platform.release(),
                   "loadavg_at_end": load},
       "trace": {"generator": "gpuheap_gen_trace OUT EVENTS [--zstd]", "events_requested": int(events),
                 "records": records, "plain_bytes": os.path.getsize(plain), "zstd_bytes": os.path.getsize(zst)},
       "unit": "events/s = records in the trace / wall seconds of the whole command (read, replay, report)",
       "summary": summary, "runs": runs}
if baseline: doc["baseline_binary"] = baseline
if note: doc["note"] = note
cg_rows = [l.rstrip("\n").split("\t") for l in open(cg) if l.strip()]
if cg_rows:
    doc["callgrind"] = {"command": "valgrind --tool=callgrind --toggle-collect='gpuheap::analyze(*' gpuheap summary --quiet TRACE",
                        "records": int(cg_records),
                        "instructions": {k: int(v) for k, v in cg_rows if v},
                        "instructions_per_record": {k: round(int(v) / int(cg_records), 1) for k, v in cg_rows if v}}
    print(json.dumps(doc["callgrind"], indent=1))
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "w") as f: json.dump(doc, f, indent=1); f.write("\n")
print(json.dumps(summary, indent=1))
print("written", out)
PY
