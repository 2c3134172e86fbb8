#!/usr/bin/env bash
# Replay throughput (issue #15: >= 5 M events/s): `gpuheap replay -q --policy P` over a
# generated trace for P in gpuheap, torch, none, N runs each pinned to one core, the current
# and (BASELINE) an older binary interleaved. CPU (user) seconds are the figure: wall time
# on a shared machine measures the neighbours. Instructions per event come from callgrind
# (noise-free) on a smaller trace, when valgrind is installed.
# Writes bench/results/replay-<date>-<shortcommit>.json.
#   EVENTS=2000000  CG_EVENTS=500000 (0: no callgrind)  RUNS=3  CPU=1  BUILD_DIR=build
#   BASELINE=path/to/older/gpuheap   KEEP_TRACES=dir   POLICIES="gpuheap torch none"
EVENTS=${EVENTS:-2000000}
CG_EVENTS=${CG_EVENTS:-500000}
POLICIES=${POLICIES:-gpuheap torch none}
# shellcheck source=scripts/bench-common.sh
. "$(dirname "$0")/bench-common.sh"
out="bench/results/replay-$(date +%Y-%m-%d)-$commit.json"
trace="$tdir/replay-$EVENTS.trace"
[ -s "$trace" ] || "$gen" "$trace" "$EVENTS" 2>/dev/null
results="$tdir/replay-runs.tsv"; : > "$results"
one() {  # label binary policy
  local t
  t=$(timed_run "$2" replay -q --policy "$3" "$trace") || { echo "bench-replay: $2 replay --policy $3 failed" >&2; exit 1; }
  read -r wall user sys rss <<< "$t"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$3" "$wall" "$user" "$sys" "$rss" >> "$results"
  echo "bench-replay: $1 $3: ${wall}s wall, ${user}s user" >&2
}
for ((i = 0; i < RUNS; i++)); do
  for p in $POLICIES; do
    one current "$gh" "$p"
    [ -n "${BASELINE:-}" ] && one baseline "$BASELINE" "$p"
  done
done
cg="$tdir/callgrind.tsv"; : > "$cg"
if [ "$CG_EVENTS" != 0 ] && command -v valgrind >/dev/null; then
  cgtrace="$tdir/replay-cg-$CG_EVENTS.trace"
  [ -s "$cgtrace" ] || "$gen" "$cgtrace" "$CG_EVENTS" 2>/dev/null
  for p in $POLICIES; do
    for lb in current${BASELINE:+ baseline}; do
      bin=$gh; [ "$lb" = baseline ] && bin=$BASELINE
      ir=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" replay -q --policy "$p" "$cgtrace" 2>&1 >/dev/null |
           sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
      printf '%s\t%s\t%s\n' "$lb" "$p" "$ir" >> "$cg"
      echo "bench-replay: callgrind $lb $p: $ir instructions" >&2
    done
  done
fi
# Records in the trace: replay's event count is only alloc/free/free_completed.
records=$("$gh" summary --json --quiet "$trace" 2>/dev/null |
          python3 -c 'import json,sys; d=json.load(sys.stdin); t=d.get("trace") or d["traces"][0]["trace"]; print(t["records"])')
cgrecords=0
[ -s "$cg" ] && cgrecords=$("$gh" summary --json --quiet "$cgtrace" 2>/dev/null |
          python3 -c 'import json,sys; d=json.load(sys.stdin); t=d.get("trace") or d["traces"][0]["trace"]; print(t["records"])')
python3 - "$results" "$cg" "$out" "$commit" "$dirty" "$EVENTS" "$records" "$CG_EVENTS" "$cgrecords" \
    "$(machine_json)" "${BASELINE:-}" <<'PY'
import json, os, statistics, sys, datetime
results, cg, out, commit, dirty, events, records, cg_events, cg_records, machine, baseline = sys.argv[1:12]
records, cg_records = int(records), int(cg_records)
runs, summary = {}, {}
for line in open(results):
    label, policy, wall, user, sys_, rss = line.rstrip("\n").split("\t")
    runs.setdefault(label, {}).setdefault(policy, []).append(
        {"wall_s": float(wall), "user_s": float(user), "sys_s": float(sys_), "max_rss_kib": int(rss)})
for label, pols in runs.items():
    for policy, rs in pols.items():
        u = statistics.median(r["user_s"] for r in rs)
        summary.setdefault(label, {})[policy] = {
            "median_user_s": u, "best_user_s": min(r["user_s"] for r in rs),
            "median_events_per_cpu_s": round(records / u) if u > 0 else None,
            "best_events_per_cpu_s": round(records / min(r["user_s"] for r in rs)) if min(r["user_s"] for r in rs) > 0 else None,
            "median_wall_s": statistics.median(r["wall_s"] for r in rs), "max_rss_kib": max(r["max_rss_kib"] for r in rs)}
for line in open(cg):
    label, policy, ir = line.rstrip("\n").split("\t")
    if ir:
        summary.setdefault(label, {}).setdefault(policy, {})["instructions_per_event"] = round(int(ir) / cg_records, 1)
        summary[label][policy]["callgrind_instructions"] = int(ir)
doc = {"date": datetime.date.today().isoformat(), "commit": commit, "dirty_tree": dirty == "true",
       "command": "gpuheap replay -q --policy P TRACE", "machine": json.loads(machine),
       "machine_note": "shared VM (2 vCPUs, other engineers' builds running): user seconds, not wall, are the figure",
       "trace": {"generator": "gpuheap_gen_trace OUT EVENTS", "events_requested": int(events), "records": records},
       "callgrind_trace": {"events_requested": int(cg_events), "records": cg_records},
       "unit": "events/CPU-s = records in the trace / user seconds of the whole command (read, replay, report); "
               "instructions_per_event = callgrind instructions of the whole command / records of the callgrind trace",
       "target_events_per_s": 5000000, "summary": summary, "runs": runs}
if baseline: doc["baseline_binary"] = baseline
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "w") as f: json.dump(doc, f, indent=1); f.write("\n")
print(json.dumps(summary, indent=1))
print("written", out)
PY
