#!/usr/bin/env bash
# Trace size (issue #36): bytes per event, raw and after zstd (level 3, as `gpuheap run` and
# `gpuheap compress` write it), of each event encoding: plain (the fixed-layout records of
# format version 4 and before) and compact (version 5, what the preload writes).
#   - the demo workload on the simulated runtime, with stacks: examples/mini_train STEPS
#     (STEPS=530: ~40 k events), recorded by this build's libgpuheap.so;
#   - the stored PyTorch GPT training traces (examples/traces, recorded on an H100 and an H200
#     in plain records), rewritten compact.
# Events: alloc, free, free_completed and segment_* records; the bytes are the whole file's.
# Writes bench/results/trace-size-<date>-<commit>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
STEPS=${STEPS:-530}
gh="$BUILD_DIR/gpuheap"
recode="$BUILD_DIR/gpuheap_recode_trace"
if [ ! -x "$gh" ] || [ ! -x "$recode" ]; then echo "bench-trace-size: build first (scripts/setup.sh)" >&2; exit 2; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo true || echo false)

LD_LIBRARY_PATH="$BUILD_DIR/simcuda" LD_PRELOAD="$PWD/$BUILD_DIR/libgpuheap.so" GPUHEAP_QUIET=1 \
  GPUHEAP_OUTPUT="$tmp/mini_train.trace" "$BUILD_DIR/examples/mini_train" "$STEPS" >/dev/null
rows=()
measure() {  # name trace (any encoding): one row per encoding
  local name=$1 src=$2 enc events
  events=$("$gh" dump -q "$src" | grep -cE '^(alloc|free|free_completed|segment_alloc|segment_free) ')
  for enc in plain compact; do
    "$recode" "$src" "$tmp/$name.$enc" "--$enc"
    zstd -q -3 -c "$tmp/$name.$enc" > "$tmp/$name.$enc.zst3"
    rows+=("$name $enc $events $(stat -c %s "$tmp/$name.$enc") $(stat -c %s "$tmp/$name.$enc.zst3") $tmp/$name.$enc")
  done
  "$gh" compress --keep "$tmp/$name.compact" >/dev/null
  zstd -q -d -c "$tmp/$name.compact.zst" > "$tmp/$name.blocks"
  rows+=("$name blocks $events $(stat -c %s "$tmp/$name.blocks") $(stat -c %s "$tmp/$name.compact.zst") $tmp/$name.blocks")
}
measure "mini_train-$STEPS" "$tmp/mini_train.trace"
for t in examples/traces/*.trace.zst; do measure "$(basename "$t" .trace.zst)" "$t"; done
out="bench/results/trace-size-$(date +%Y-%m-%d)-$commit.json"
python3 - "$out" "$commit" "$dirty" "${rows[@]}" <<'PY'
import datetime, json, struct, subprocess, sys
out, commit, dirty, *rows = sys.argv[1:]
res = {"date": datetime.date.today().isoformat(), "commit": commit, "dirty": dirty == "true",
       "unit": "bytes per event (alloc, free, free_completed, segment_* records), whole file; "
               "events_zstd_per_event: the event frames (or blocks) alone, zstd -3",
       "zstd_level": 3, "results": {}}


def events_only(path):
    """The file's event frames (compact, fixed-layout alloc..segment_free, event_block) alone."""
    d = open(path, "rb").read()
    off, ev = 16, bytearray()
    while off < len(d) and d[off] != 0:
        t = d[off]
        n = 2 + d[off + 1] if t & 0x80 else 5 + struct.unpack_from("<I", d, off + 1)[0]
        if t & 0x80 or 6 <= t <= 10 or t == 22:
            ev += d[off:off + n]
        off += n
    return len(subprocess.run(["zstd", "-3", "-c"], input=bytes(ev), capture_output=True, check=True).stdout)


print(f"{'trace':<24} {'encoding':<8} {'events':>8} {'raw B/ev':>9} {'zstd B/ev':>9} {'events-only':>11}")
for r in rows:
    name, enc, events, raw, z, path = r.split()
    events, raw, z = int(events), int(raw), int(z)
    e = events_only(path)
    res["results"].setdefault(name, {"events": events})[enc] = {
        "bytes": raw, "zstd_bytes": z, "raw_per_event": round(raw / events, 2), "zstd_per_event": round(z / events, 2),
        "events_zstd_per_event": round(e / events, 2)}
    print(f"{name:<24} {enc:<8} {events:>8} {raw / events:>9.2f} {z / events:>9.2f} {e / events:>11.2f}")
json.dump(res, open(out, "w"), indent=2)
print("written", out)
PY
