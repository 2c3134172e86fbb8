#!/usr/bin/env bash
# test_wheel.sh BUILD_DIR MINI_TRAIN SOURCE_DIR PYTHON VERSION: see CMakeLists.txt.
set -euo pipefail
build=$1 prog=$2 src=$3 py=$4 version=$5
tmp=$(mktemp -d /tmp/gpuheap-wheel-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# ---- the wheel: built from this tree, its contents, tag and glibc floor ----
whl=$(BUILD_DIR=$build PYTHON=$py "$src/scripts/wheel.sh" "$tmp/dist") || fail "scripts/wheel.sh"
name=$(basename "$whl")
[[ $name =~ ^gpuheap-${version}-py3-none-manylinux_2_([0-9]+)_x86_64\.whl$ ]] || fail "wheel name $name"
floor=${BASH_REMATCH[1]}
mkdir "$tmp/unz" && (cd "$tmp/unz" && "$py" -m zipfile -e "$whl" .)
for f in gpuheap/__init__.py gpuheap/__main__.py gpuheap/_build.py gpuheap/bin/gpuheap pytest_gpuheap.py \
         gpuheap/lib/gpuheap/libgpuheap.so gpuheap/lib/gpuheap/simcuda/libcudart.so.13 gpuheap/lib/gpuheap/simcuda/libcuda.so.1; do
  [ -f "$tmp/unz/$f" ] || fail "$f not in the wheel"
done
grep -q "^gpuheap = pytest_gpuheap" "$tmp"/unz/gpuheap-*.dist-info/entry_points.txt || fail "no pytest11 entry point"
grep -q "^Tag: py3-none-manylinux_2_${floor}_x86_64" "$tmp"/unz/gpuheap-*.dist-info/WHEEL || fail "WHEEL tag"
# Every ELF file: no debug info, no GLIBC version above the tag's, nothing needed from outside
# the wheel but the manylinux system libraries (the CUDA libraries come from the job).
elfs=$(find "$tmp/unz" -type f \( -name '*.so*' -o -path '*/bin/gpuheap' \))
glibc=0 glibcxx=0
for f in $elfs; do
  ! readelf -S -W "$f" | grep -q '\.debug_info' || fail "$f has debug info"
  for v in $(readelf -V -W "$f" | grep -o 'Name: GLIBC_2\.[0-9]*' | sed 's/.*GLIBC_2\.//'); do
    [ "$v" -le "$glibc" ] || glibc=$v
  done
  for v in $(readelf -V -W "$f" | grep -o 'Name: GLIBCXX_3\.4\.[0-9]*' | sed 's/.*GLIBCXX_3\.4\.//'); do
    [ "$v" -le "$glibcxx" ] || glibcxx=$v
  done
  for n in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    case "$n" in
      libc.so.6 | libm.so.6 | libdl.so.2 | librt.so.1 | libpthread.so.0 | libgcc_s.so.1 | libstdc++.so.6 | ld-linux-x86-64.so.2) ;;
      *) [ -f "$(dirname "$f")/$n" ] || [ -f "$tmp/unz/gpuheap/lib/$n" ] || fail "$f needs $n, not in the wheel" ;;
    esac
  done
done
# The tag is the lowest manylinux policy that has both: the glibc, and the libstdc++ of that
# policy's reference distribution (auditwheel: 2_34 has GCC 11's GLIBCXX_3.4.29, 2_35 GCC 12's
# 3.4.30, 2_39 GCC 14's 3.4.33).
want=$glibc
[ "$glibcxx" -le 29 ] || [ "$want" -ge 35 ] || want=35
[ "$glibcxx" -le 30 ] || [ "$want" -ge 39 ] || want=39
[ "$want" = "$floor" ] || fail "tagged manylinux_2_$floor, the files need GLIBC_2.$glibc and GLIBCXX_3.4.$glibcxx (2_$want)"
# The preload's own libraries carry names of their own (a job's libunwind/liblzma stay its own).
if readelf -d "$tmp/unz/gpuheap/lib/gpuheap/libgpuheap.so" | grep NEEDED | grep -E '\[(libunwind|liblzma)\.so'; then
  fail "libgpuheap.so needs an unrenamed libunwind/liblzma"
fi
size=$(stat -c %s "$whl")
[ "$size" -lt $((64 << 20)) ] || fail "wheel is $size bytes (the GPU machine's carry budget is 64 MiB)"
echo "wheel: $name, $size bytes, needs GLIBC_2.$glibc GLIBCXX_3.4.$glibcxx"

# ---- installed offline into a fresh venv; everything below runs from there ----
"$py" -m venv --system-site-packages "$tmp/venv" >/dev/null 2>&1 ||
  "$py" -m venv --system-site-packages --without-pip "$tmp/venv" || fail "venv"
"$tmp/venv/bin/python" -m pip install -q --no-index --no-deps "$whl" >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; fail "pip install"; }
export PATH=$tmp/venv/bin:$PATH
# As installed, every library the loader resolves is the wheel's own or a manylinux system one.
while IFS= read -r f; do
  outside=$(ldd "$f" | awk '$2 == "=>" {print $1, $3}' | grep -v " $tmp/venv/" |
    grep -Ev '^(libc|libm|libdl|librt|libpthread)\.so\.[0-9]+ |^(libgcc_s\.so\.1|libstdc\+\+\.so\.6) ' || true)
  [ -z "$outside" ] || fail "installed $f loads from outside the wheel: $outside"
done < <(find "$tmp/venv" -path '*/site-packages/gpuheap/*' -type f \( -name '*.so*' -o -path '*/bin/gpuheap' \))
unset LD_LIBRARY_PATH LD_PRELOAD GPUHEAP_BIN PYTHONPATH PYTEST_ADDOPTS
vpy=$tmp/venv/bin/python
[ "$(command -v gpuheap)" = "$tmp/venv/bin/gpuheap" ] || fail "gpuheap is not the venv's console script"
[ "$(gpuheap --version)" = "$version" ] || fail "gpuheap --version: $(gpuheap --version)"
[ "$("$vpy" -m gpuheap --version)" = "$version" ] || fail "python -m gpuheap --version"
cd "$tmp"

# gpuheap run --simulate (the wheel's simulated runtime and preload) and gpuheap summary.
gpuheap run --simulate -o "$tmp/mini.trace" -- "$prog" 3 2 64 >"$tmp/run.out" 2>&1 || { cat "$tmp/run.out"; fail "gpuheap run --simulate"; }
[ -f "$tmp/mini.trace.zst" ] || fail "no trace from gpuheap run"
gpuheap summary "$tmp/mini.trace.zst" >"$tmp/summary.txt" || { cat "$tmp/summary.txt"; fail "gpuheap summary"; }
if ! grep -q "Peak memory consumers" "$tmp/summary.txt" || ! grep -q mini_train "$tmp/summary.txt"; then
  cat "$tmp/summary.txt"; fail "summary"
fi
# shellcheck disable=SC2016  # the traced shell expands them: what the program sees
env_seen=$(gpuheap run -q --simulate -- sh -c 'echo "$LD_PRELOAD|$LD_LIBRARY_PATH"')
preload=$("$vpy" -c 'import gpuheap; print(gpuheap.preload_path())')
case "$preload" in "$tmp"/venv/lib/*/site-packages/gpuheap/lib/gpuheap/libgpuheap.so) ;; *) fail "preload_path() $preload" ;; esac
seen_preload=$(realpath "${env_seen%%|*}") seen_sim=${env_seen#*|}
seen_sim=$(realpath "${seen_sim%%:*}")
if [ "$seen_preload" != "$preload" ] || [ "$seen_sim" != "$(dirname "$preload")/simcuda" ]; then
  fail "run did not use the venv's preload and simulated runtime: $env_seen"
fi

# import gpuheap: a no-op without the preload; under it, markers and ranges are phases.
cat >"$tmp/markers.py" <<'PY'
import ctypes, sys
import gpuheap
if sys.argv[1] == "off":
    gpuheap.mark("x"); gpuheap.push("y"); gpuheap.pop()
    with gpuheap.phase("z"):
        pass
    assert not gpuheap.active() and gpuheap.stats() is None and gpuheap.trace_path() is None
    sys.exit(0)
assert gpuheap.active(), "gpuheap.active() is False under gpuheap run"
rt = ctypes.CDLL("libcudart.so.13")
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
rt.cudaFree.argtypes = [ctypes.c_void_p]
p = ctypes.c_void_p()
gpuheap.mark("warmup")
with gpuheap.phase("step 1"):
    assert rt.cudaMalloc(ctypes.byref(p), 3 << 20) == 0
    assert gpuheap.stats(0)["requested_bytes"] == 3 << 20
    rt.cudaFree(p)
PY
"$vpy" "$tmp/markers.py" off || fail "gpuheap markers without the preload"
gpuheap run -q --simulate -o "$tmp/markers.trace" -- "$vpy" "$tmp/markers.py" on || fail "markers under gpuheap run"
gpuheap summary --json "$tmp/markers.trace.zst" >"$tmp/markers.json" || fail "summary --json of the markers"
"$vpy" - "$tmp/markers.json" <<'PY' || fail "markers are not phases"
import json, sys
ph = json.load(open(sys.argv[1]))["phases"]
got = {(p["name"], p["kind"]) for p in ph}
assert ("warmup", "mark") in got and ("step 1", "range") in got, got
step = next(p for p in ph if p["name"] == "step 1")
assert step["devices"] and step["devices"][0]["peak_requested"] == 3 << 20, step
PY

# The pytest plugin from the wheel's pytest11 entry point (no -p, no PYTHONPATH): --gpuheap
# re-executes pytest under the venv's gpuheap; the over-limit test fails, the other passes.
"$vpy" -c "import pytest_gpuheap, sys; sys.exit(0 if pytest_gpuheap.__file__.startswith('$tmp/venv/') else 1)" ||
  fail "pytest_gpuheap is not the venv's"
cat >"$tmp/test_limits.py" <<'PY'
import ctypes
import pytest
rt = ctypes.CDLL("libcudart.so.13")
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
rt.cudaFree.argtypes = [ctypes.c_void_p]
def alloc_and_free(n):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), n) == 0
    rt.cudaFree(p)
@pytest.mark.limit_gpu_memory("8 MiB")
def test_under_limit():
    alloc_and_free(4 << 20)
@pytest.mark.limit_gpu_memory("8 MiB")
def test_over_limit():
    alloc_and_free(12 << 20)
PY
rc=0
"$vpy" -m pytest -p no:cacheprovider -q -rf --gpuheap --gpuheap-simulate test_limits.py >"$tmp/pytest.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || { cat "$tmp/pytest.out"; fail "pytest --gpuheap exited $rc, not 1"; }
if ! grep -q "1 failed, 1 passed" "$tmp/pytest.out" || ! grep -q "^FAILED test_limits.py::test_over_limit" "$tmp/pytest.out" ||
  ! grep -q "^GPU memory peak 12.00 MiB > limit 8.00 MiB on device 0" "$tmp/pytest.out"; then
  cat "$tmp/pytest.out"; fail "pytest --gpuheap results"
fi
echo "wheel test: ok ($name, $size bytes)"
