#!/usr/bin/env bash
# Builds the gpuheap wheel offline (README "Install"): the PEP 517 build of python/ (setuptools,
# no isolation, no network), whose setup.py builds the CLI, the preload and the simulated
# runtime in BUILD_DIR (default build/) and bundles them. Then checks the platform tag against
# what the wheel's binaries need (objdump -T) and prints the wheel's path.
#   scripts/wheel.sh [OUT_DIR]      (default .whl; BUILD_DIR=build, JOBS=N)
# Debian/Ubuntu packages: python3-build python3-wheel python3-setuptools patchelf (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.whl}
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
"$PY" -m build --version >/dev/null 2>&1 || { echo "wheel: python3-build is needed (apt-get install python3-build)" >&2; exit 2; }
command -v patchelf >/dev/null || { echo "wheel: patchelf is needed (apt-get install patchelf)" >&2; exit 2; }
mkdir -p "$out"
rm -f "$out"/gpuheap-*.whl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$PY" -m build --no-isolation --wheel --outdir "$out" python >"$tmp/log" 2>&1; then
  cat "$tmp/log" >&2; echo "wheel: build failed" >&2; exit 1
fi
grep "^wheel: platform" "$tmp/log" >&2 || true
whl=$(ls "$out"/gpuheap-*.whl)

# The tag's promise, checked on the files themselves: no ELF file in the wheel needs a glibc
# newer than manylinux_2_N says, nor a libstdc++ newer than that policy's (2_34: GCC 11's
# GLIBCXX_3.4.29, 2_35: GCC 12's 3.4.30, as auditwheel's policy has them).
n=$(basename "$whl" | sed -n 's/.*-manylinux_2_\([0-9]*\)_x86_64\.whl$/\1/p')
[ -n "$n" ] || { echo "wheel: $whl has no manylinux_2_N_x86_64 tag" >&2; exit 1; }
case "$n" in 17) cxx=19 ;; 24) cxx=22 ;; 28) cxx=24 ;; 31) cxx=28 ;; 34) cxx=29 ;; 35) cxx=30 ;; 39) cxx=33 ;;
  *) echo "wheel: manylinux_2_$n is not a policy this check knows" >&2; exit 1 ;; esac
"$PY" -m zipfile -e "$whl" "$tmp/unz"
find "$tmp/unz" -type f \( -name '*.so*' -o -path '*/bin/gpuheap' \) -exec objdump -T {} + >"$tmp/syms"
glibc=$(grep -o 'GLIBC_2\.[0-9]*' "$tmp/syms" | cut -d. -f2 | sort -n | tail -1)
glibcxx=$(grep -o 'GLIBCXX_3\.4\.[0-9]*' "$tmp/syms" | cut -d. -f3 | sort -n | tail -1)
if [ "$glibc" -gt "$n" ] || [ "$glibcxx" -gt "$cxx" ]; then
  echo "wheel: tagged manylinux_2_$n, but needs GLIBC_2.$glibc and GLIBCXX_3.4.$glibcxx" >&2; exit 1
fi
echo "wheel: $whl ($(du -h "$whl" | cut -f1); needs GLIBC_2.$glibc, GLIBCXX_3.4.$glibcxx: manylinux_2_$n)" >&2
echo "$whl"
