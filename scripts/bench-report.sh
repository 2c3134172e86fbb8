#!/usr/bin/env bash
# `gpuheap report` on a generated trace (default 10 M events): wall/CPU seconds and events/s
# of producing the page (RUNS runs, pinned to one core when taskset exists), `gpuheap summary`
# on the same trace for comparison (the replay both share), the page's size, timeline points
# and flame nodes, and headless Chromium's load: wall seconds of --dump-dom and the page's
# own time from script start to every chart drawn (body[data-render-ms]).
# Writes bench/results/report-<date>-<shortcommit>.json.
#   EVENTS=10000000  RUNS=3  CPU=1  BUILD_DIR=build  KEEP_TRACES=dir (reuse/keep the trace)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
EVENTS=${EVENTS:-10000000}
RUNS=${RUNS:-3}
CPU=${CPU:-1}
gh="$BUILD_DIR/gpuheap"
gen="$BUILD_DIR/gpuheap_gen_trace"
if [ ! -x "$gh" ] || [ ! -x "$gen" ]; then echo "bench-report: build first (scripts/setup.sh): $gh, $gen" >&2; exit 2; fi
browser=$(command -v chromium || command -v chromium-browser || true)
[ -n "$browser" ] || { echo "bench-report: no chromium (scripts/setup.sh installs it)" >&2; exit 2; }
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo true || echo false)
out="bench/results/report-$(date +%Y-%m-%d)-$commit.json"
tdir=$(mktemp -d); trap 'rm -rf "$tdir"' EXIT
if [ -n "${KEEP_TRACES:-}" ]; then mkdir -p "$KEEP_TRACES"; trace="$KEEP_TRACES/report-$EVENTS.trace"
else trace="$tdir/report-$EVENTS.trace"; fi
[ -s "$trace" ] || "$gen" "$trace" "$EVENTS" 2>/dev/null
pin=(); command -v taskset >/dev/null && pin=(taskset -c "$CPU")
runs="$tdir/runs.tsv"; : > "$runs"
timed() {  # label command...
  local label=$1; shift
  python3 - "$label" "$runs" "$@" <<'PY'
import resource, subprocess, sys, time
label, runs, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
t = time.monotonic(); r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
w = time.monotonic() - t; u = resource.getrusage(resource.RUSAGE_CHILDREN)
if r.returncode: sys.exit(f"bench-report: {' '.join(cmd)} failed ({r.returncode})")
open(runs, "a").write(f"{label}\t{w:.3f}\t{u.ru_utime + u.ru_stime:.3f}\t{u.ru_maxrss}\n")
PY
}
for ((i = 0; i < RUNS; i++)); do
  timed report "${pin[@]}" "$gh" report --quiet --force -o "$tdir/report.html" "$trace"
  timed summary "${pin[@]}" "$gh" summary --quiet "$trace"
done
for ((i = 0; i < RUNS; i++)); do
  prof=$(mktemp -d)
  start=$(date +%s%N)
  timeout 300 "$browser" --headless --no-sandbox --disable-gpu --disable-background-networking \
    --disable-component-update --disable-sync --disable-dev-shm-usage --no-first-run --window-size=1400,2200 \
    --user-data-dir="$prof" --dump-dom "file://$tdir/report.html" 2>/dev/null > "$tdir/dom.html"
  end=$(date +%s%N)
  rm -rf "$prof"
  grep -q 'data-status="ok"' "$tdir/dom.html" || { echo "bench-report: the page did not render ok" >&2; exit 1; }
  ms=$(grep -o 'data-render-ms="[0-9]*"' "$tdir/dom.html" | grep -o '[0-9]*')
  printf 'browser\t%s.%03d\t%s\t0\n' $(( (end - start) / 1000000000 )) $(( (end - start) / 1000000 % 1000 )) "$ms" >> "$runs"
done
records=$("$gh" summary --json --quiet "$trace" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["trace"]["records"])')
python3 - "$runs" "$out" "$commit" "$dirty" "$EVENTS" "$records" "$trace" "$tdir/report.html" "${pin[*]:-none}" <<'PY'
import datetime, json, os, platform, re, statistics, sys
runs, out, commit, dirty, events, records, trace, page, pin = sys.argv[1:10]
records = int(records)
rows = {}
for line in open(runs):
    label, a, b, c = line.rstrip("\n").split("\t")
    rows.setdefault(label, []).append((float(a), float(b), int(c)))
html = open(page, encoding="utf-8").read()
m = re.search(r'id="gpuheap-data">(.*?)</script>', html, re.S)
data = json.loads(m.group(1))
def med(label, i): return statistics.median(r[i] for r in rows[label])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
doc = {"date": datetime.date.today().isoformat(), "commit": commit, "dirty_tree": dirty == "true", "pinned": pin,
       "machine": {"host": platform.node(), "cpu": cpu, "cpus": os.cpu_count(), "kernel": platform.release(),
                   "loadavg_at_end": open("/proc/loadavg").read().split()[:3]},
       "trace": {"generator": "gpuheap_gen_trace OUT EVENTS", "events_requested": int(events), "records": records,
                 "plain_bytes": os.path.getsize(trace)},
       "report": {"command": "gpuheap report --quiet -o report.html TRACE (defaults: --points 4096 --max-nodes 4000)",
                  "median_wall_s": med("report", 0), "median_cpu_s": med("report", 1),
                  "median_events_per_s": round(records / med("report", 0)),
                  "max_rss_kib": max(r[2] for r in rows["report"]), "runs_wall_s": [r[0] for r in rows["report"]]},
       "summary_same_trace": {"median_wall_s": med("summary", 0), "median_events_per_s": round(records / med("summary", 0))},
       "page": {"bytes": len(html.encode()), "timeline_points": [len(t["t"]) for t in data["timelines"]],
                "flame_nodes": [len(f["nodes"]) for f in data["flames"]]},
       "browser": {"command": "chromium --headless --dump-dom (fresh profile; start-up included)",
                   "median_wall_s": med("browser", 0), "median_render_ms": med("browser", 1),
                   "render_ms_runs": [r[1] for r in rows["browser"]],
                   "note": "render_ms: the page's own time from script start to every chart drawn (body[data-render-ms])"},
       "target": "issue 13: >= 10 M events/s for the report"}
os.makedirs(os.path.dirname(out), exist_ok=True)
json.dump(doc, open(out, "w"), indent=1); open(out, "a").write("\n")
print(json.dumps({k: doc[k] for k in ("report", "summary_same_trace", "page", "browser")}, indent=1))
print("written", out)
PY
