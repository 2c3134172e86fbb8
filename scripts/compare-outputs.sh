#!/usr/bin/env bash
# Byte-for-byte comparison of two gpuheap binaries' outputs (summary, summary --json, check,
# report, dump, and replay: policies, limits, sweep, minimal limit) over traces of the golden tests' and preload tests' programs (recorded here
# under the preload), the example traces, the fuzz corpus and generated traces of several
# seeds and sizes, and a few damaged files (cut, zeroed, empty, not a trace). Exit codes and
# stderr are compared too (refused inputs must be refused the same way).
#   scripts/compare-outputs.sh OLD_BINARY [NEW_BINARY (default build/gpuheap)]
#   GEN=build/gpuheap_gen_trace  EXTRA="more traces"  KEEP=dir (keep/reuse generated traces)
#   ONLY=replay (only the replay commands)  ONLY=analyzer (only the others)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
old=${1:?usage: compare-outputs.sh OLD_BINARY [NEW_BINARY]}
new=${2:-build/gpuheap}
gen=${GEN:-build/gpuheap_gen_trace}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
tdir=${KEEP:-$work/traces}; mkdir -p "$tdir"
if [ -x "$gen" ]; then
  for spec in "1 20000" "2 200000" "7 1000000" "3 50000 --no-end" "5 300000 --zstd"; do
    read -r seed n opt <<<"$spec"; f="$tdir/gen-s$seed-n$n$opt.trace"; [ "$opt" = --zstd ] && f="$f.zst"
    [ -s "$f" ] || "$gen" "$f" "$n" --seed "$seed" ${opt:+"$opt"} 2>/dev/null
  done
fi
# The simcuda programs the preload tests run, recorded under the preload (as the tests do).
if [ -f build/libgpuheap.so ] && [ -d build/tests/preload ]; then
  for p in prog_api prog_driver prog_limit prog_misuse prog_reuse prog_threads prog_phases prog_load prog_ctx; do
    [ -x "build/tests/preload/$p" ] || continue
    [ -n "$(ls "$tdir"/sim-"$p".*.trace 2>/dev/null)" ] && continue
    env LD_LIBRARY_PATH=build/simcuda LD_PRELOAD=build/libgpuheap.so GPUHEAP_OUTPUT="$tdir/sim-$p.%p.trace" \
      GPUHEAP_QUIET=1 timeout 60 "build/tests/preload/$p" > /dev/null 2>&1
  done
  for m in pooled kinds sites frag churn real; do  # the golden tests' patterns
    [ -x build/tests/golden/golden_prog ] || break
    [ -n "$(ls "$tdir"/golden-"$m".*.trace 2>/dev/null)" ] && continue
    env LD_LIBRARY_PATH=build/simcuda LD_PRELOAD=build/libgpuheap.so GPUHEAP_OUTPUT="$tdir/golden-$m.%p.trace" \
      GPUHEAP_QUIET=1 GPUHEAP_SEAL_US=0 timeout 60 build/tests/golden/golden_prog "$m" > /dev/null 2>&1
  done
fi
# Damaged inputs: cut mid-record, a zeroed stretch, empty, not a trace at all.
src=$(find "$tdir" -maxdepth 1 -name 'gen-s1-*.trace' | sort | head -1)
if [ -n "$src" ] && [ ! -f "$tdir/bad-cut.trace" ]; then
  head -c 100003 "$src" > "$tdir/bad-cut.trace"
  cp "$src" "$tdir/bad-zeroed.trace"; dd if=/dev/zero of="$tdir/bad-zeroed.trace" bs=1 seek=50000 count=300 conv=notrunc 2>/dev/null
  : > "$tdir/bad-empty.trace"; head -c 5000 /dev/urandom > "$tdir/bad-random.trace"
fi
traces=()
for f in examples/traces/*.trace* tests/gpu/traces/*.trace* tests/fuzz/corpus/* "$tdir"/*.trace*; do
  [ -f "$f" ] && traces+=("$f")
done
# Traces the tests wrote (simcuda programs, golden runs), when a build tree has them.
while IFS= read -r f; do traces+=("$f"); done < <(find build -path build/_deps -prune -o -type f \
  \( -name '*.trace' -o -name '*.trace.zst' \) -size -64M -print 2>/dev/null | sort | head -200)
for x in ${EXTRA:-}; do traces+=("$x"); done
cmds=()
[ "${ONLY:-}" = replay ] || cmds+=("summary" "summary --json" "check --max-leaked 0 --max-reserved 1GiB"
      "check --allow-truncated" "report -o -" "dump" "summary --json --after 0.5s")
# Replay: each policy family, non-default pool settings (a rounding that is not a power of
# two too), limits that run out, a sweep and the limit bisection. -q: the throughput line
# on stderr has a time in it.
[ "${ONLY:-}" = analyzer ] || cmds+=("replay -q" "replay -q --json" "replay -q --policy torch --json" "replay -q --policy none"
      "replay -q --json --policy gpuheap:max_split=32MiB,round=1KiB,large_segment=8MiB"
      "replay -q --policy gpuheap:round=1000B,small_max=64KiB --limit 300MiB"
      "replay -q --limit 64MiB --json" "replay -q --sweep all --limits 32MiB,256MiB,2GiB"
      "replay -q --find-min-limit --json" "replay -q --find-min-limit --policy torch")
# Traces recorded by this build's preload have compact event records (format version 5), which
# an older binary refuses: it reads their plain rewrite (gpuheap_recode_trace --plain), put in
# the trace's place while it runs, so paths in the outputs stay the same. The outputs must
# then be the same too: the two encodings hold the same events.
recode=${RECODE:-build/gpuheap_recode_trace}
version_of() {  # the header's version, of a zstd trace too
  if [[ "$1" == *.zst ]]; then zstd -dcq "$1" 2>/dev/null | head -c 16; else head -c 16 "$1"; fi |
    od -An -tu2 -j8 -N2 2>/dev/null | tr -d ' '
}
run_old() {  # command trace: the old binary's run, on the plain rewrite where the trace is compact
  local v; v=$(version_of "$2")
  rm -f "$work/plain.trace"
  if [ -x "$recode" ] && [ "${v:-0}" -ge 5 ] 2>/dev/null &&
     "$recode" "$2" "$work/plain.trace" --plain 2>/dev/null; then
    cp -p "$2" "$work/compact.trace" && cp "$work/plain.trace" "$2"
    # shellcheck disable=SC2086
    "$old" $1 "$2" > "$work/o.out" 2> "$work/o.err"; orc=$?
    cp -p "$work/compact.trace" "$2"; rm -f "$work/plain.trace"
  else
    # shellcheck disable=SC2086
    "$old" $1 "$2" > "$work/o.out" 2> "$work/o.err"; orc=$?
  fi
}
fail=0 n=0
for t in "${traces[@]}"; do
  for c in "${cmds[@]}"; do
    run_old "$c" "$t"
    # shellcheck disable=SC2086
    "$new" $c "$t" > "$work/n.out" 2> "$work/n.err"; nrc=$?
    n=$((n + 1))
    if [ $orc != $nrc ] || ! cmp -s "$work/o.out" "$work/n.out" || ! cmp -s "$work/o.err" "$work/n.err"; then
      echo "DIFF: $c $t (exit $orc vs $nrc)"; diff "$work/o.out" "$work/n.out" | head -5
      diff "$work/o.err" "$work/n.err" | head -5; fail=$((fail + 1))
    fi
  done
done
echo "compare-outputs: ${#traces[@]} traces x ${#cmds[@]} commands = $n runs, $fail differ"
[ $fail = 0 ]
