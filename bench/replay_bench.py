#!/usr/bin/env python3
"""Throughput of `gpuheap replay` on a generated trace (issue #15 asks >= 5 M events/s).

  bench/replay_bench.py BUILD_DIR [EVENTS] [RUNS]   -> bench/results/replay-DATE-COMMIT.json

events/s = trace records / wall seconds of the whole command (read, replay, report), as in
the analyzer's summary benchmark; `summary` on the same trace is measured beside it.
"""
import json, os, re, subprocess, sys, time, datetime, statistics, resource

build = sys.argv[1]
events = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000_000
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
trace = f"/tmp/gpuheap-replay-bench-{events}.trace"
subprocess.run([f"{build}/gpuheap_gen_trace", trace, str(events)], check=True, stdout=subprocess.DEVNULL)
records = events + 1


def measure(args):
    walls, inner = [], []
    for _ in range(runs):
        t = time.monotonic()
        p = subprocess.run([f"{build}/gpuheap"] + args + [trace], capture_output=True, text=True)
        walls.append(time.monotonic() - t)
        if p.returncode not in (0, 1):
            sys.exit(f"{args}: exit {p.returncode}: {p.stderr}")
        m = re.search(r"replayed (\d+) events in ([0-9.]+) s", p.stderr)
        if m:
            inner.append(int(m.group(1)) / float(m.group(2)))
    w = statistics.median(walls)
    out = {"median_wall_s": round(w, 3), "median_events_per_s": int(records / w), "best_events_per_s": int(records / min(walls))}
    if inner:
        out["median_replay_loop_events_per_s"] = int(statistics.median(inner))
    return out


res = {
    "date": datetime.date.today().isoformat(),
    "commit": subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "dirty_tree": bool(subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()),
    "command": "gpuheap replay TRACE (default policy, no limit); gpuheap summary --quiet TRACE for comparison",
    "machine": {"cpus": os.cpu_count(), "loadavg_at_start": list(os.getloadavg())},
    "trace": {"generator": "gpuheap_gen_trace OUT EVENTS", "events_requested": events, "records": records,
              "plain_bytes": os.path.getsize(trace)},
    "runs": runs,
    "unit": "events/s = records in the trace / wall seconds of the whole command",
    "target_events_per_s": 5_000_000,
    "replay": measure(["replay"]),
    "summary": measure(["summary", "--quiet"]),
}
res["machine"]["loadavg_at_end"] = list(os.getloadavg())
res["meets_target"] = res["replay"]["median_events_per_s"] >= res["target_events_per_s"]
out = os.path.join(root, "bench", "results", f"replay-{res['date']}-{res['commit']}.json")
with open(out, "w") as f:
    json.dump(res, f, indent=1)
    f.write("\n")
os.remove(trace)
print(out)
print(json.dumps(res, indent=1))
