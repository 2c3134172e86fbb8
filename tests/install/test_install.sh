#!/usr/bin/env bash
# test_install.sh CMAKE BUILD_DIR MINI_TRAIN SOURCE_DIR [PYTHON]: see CMakeLists.txt.
set -euo pipefail
cmake=$1 build=$2 prog=$3 src=$4 py=${5:-}
tmp=$(mktemp -d /tmp/gpuheap-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "FAIL: $*" >&2; exit 1; }

"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
for f in bin/gpuheap lib/gpuheap/libgpuheap.so share/doc/gpuheap/README.md share/doc/gpuheap/cli.md \
         share/gpuheap/python/pytest_gpuheap.py share/gpuheap/python/pyproject.toml; do
  [ -e "$prefix/$f" ] || fail "$f not installed"
done
if [ -f "$src/preload/gpuheap.h" ]; then [ -f "$prefix/include/gpuheap.h" ] || fail "include/gpuheap.h not installed"; fi
if [ -e "$prefix/bin/simcuda" ] || [ -n "$(find "$prefix" -name 'libcudart*' -o -name 'libcuda.so*')" ]; then
  fail "simcuda was installed"
fi
# Bundled runtime libraries travel with the preload and are found through RUNPATH $ORIGIN.
for f in "$build"/libunwind*.so*; do
  [ -e "$f" ] || continue
  [ -e "$prefix/lib/gpuheap/$(basename "$f")" ] || fail "bundled $(basename "$f") not installed"
done
readelf -d "$prefix/lib/gpuheap/libgpuheap.so" | grep -E 'R(UN)?PATH' | grep -qF "\$ORIGIN" \
  || fail "libgpuheap.so has no RUNPATH \$ORIGIN"
if readelf -d "$prefix/bin/gpuheap" | grep -E 'R(UN)?PATH' | grep -q "$build"; then
  fail "installed gpuheap still has the build tree in its RUNPATH"
fi
! ldd "$prefix/lib/gpuheap/libgpuheap.so" | grep -q "not found" || fail "libgpuheap.so has unresolved libraries"

# DESTDIR staging (packaging) puts the same files under DESTDIR/PREFIX.
DESTDIR=$tmp/stage "$cmake" --install "$build" --prefix /opt/gpuheap >/dev/null || fail "DESTDIR install"
if [ ! -x "$tmp/stage/opt/gpuheap/bin/gpuheap" ] || [ ! -f "$tmp/stage/opt/gpuheap/lib/gpuheap/libgpuheap.so" ]; then
  fail "DESTDIR install misses bin/gpuheap or lib/gpuheap/libgpuheap.so"
fi

# The installed CLI finds its preload (no build tree on any path) and traces a simcuda program.
trace=$tmp/mini.trace
LD_LIBRARY_PATH=$build/simcuda "$prefix/bin/gpuheap" run -o "$trace" -- "$prog" 3 2 64 \
  >"$tmp/run.out" 2>"$tmp/run.err" || { cat "$tmp/run.err"; fail "installed gpuheap run"; }
t=$(find "$tmp" -maxdepth 1 -name 'mini.trace*' | sort | head -1)
[ -n "$t" ] || fail "no trace written"
"$prefix/bin/gpuheap" summary "$t" >"$tmp/summary.txt" || { cat "$tmp/summary.txt"; fail "installed gpuheap summary"; }
grep -q "Peak memory consumers" "$tmp/summary.txt" || { cat "$tmp/summary.txt"; fail "summary has no peak consumers"; }
grep -q "mini_train" "$tmp/summary.txt" || fail "summary does not name mini_train"
# --simulate without the simulated runtime (not installed) is a usage error, not a run on
# whatever libcudart the system has.
rc=0; "$prefix/bin/gpuheap" run --simulate -o "$tmp/sim.trace" -- "$prog" 1 1 8 >"$tmp/sim.out" 2>&1 || rc=$?
if [ "$rc" != 2 ] || ! grep -q "no simulated CUDA runtime" "$tmp/sim.out"; then
  cat "$tmp/sim.out"; fail "installed run --simulate exited $rc, not a usage error"
fi
# LD_PRELOAD of the installed library (no gpuheap run) traces as well.
LD_PRELOAD=$prefix/lib/gpuheap/libgpuheap.so LD_LIBRARY_PATH=$build/simcuda GPUHEAP_OUTPUT=$tmp/direct.trace \
  "$prog" 2 1 32 >/dev/null 2>"$tmp/direct.err" || { cat "$tmp/direct.err"; fail "LD_PRELOAD of the installed .so"; }
ls "$tmp"/direct.trace* >/dev/null 2>&1 || fail "LD_PRELOAD of the installed .so wrote no trace"

# The installed pytest plugin, found by the installed CLI's layout (no --gpuheap-bin).
if [ -n "$py" ] && "$py" -c "import pytest" 2>/dev/null && [ -f "$src/preload/gpuheap.h" ]; then
  cat >"$tmp/test_inst.py" <<'PY'
import ctypes
def test_loaded():
    assert hasattr(ctypes.CDLL(None), "gpuheap_stats")
PY
  (cd "$tmp" && PATH=$prefix/bin:$PATH PYTHONPATH=$prefix/share/gpuheap/python LD_LIBRARY_PATH=$build/simcuda \
     GPUHEAP_OUTPUT=$tmp/py.trace "$py" -m pytest -p pytest_gpuheap -p no:cacheprovider -q --gpuheap test_inst.py) \
     >"$tmp/py.out" 2>&1 || { cat "$tmp/py.out"; fail "installed pytest plugin"; }
fi
echo "install test: ok ($prefix)"
