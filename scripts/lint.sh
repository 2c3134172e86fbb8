#!/usr/bin/env bash
# The rooms' includes against their READMEs (scripts/check-rooms.sh), then clang-tidy
# (.clang-tidy at the root) over analyzer/, pool/, common/, preload/ and format/ (the header
# is checked through the sources that include it). Exit 1 on any finding.
#   LINT_BUILD_DIR=build-lint (configured only, for compile_commands.json)   JOBS=2
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/check-rooms.sh
if ! command -v clang-tidy >/dev/null 2>&1 && [ -z "${GPUHEAP_NO_APT:-}" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang-tidy clang >/dev/null
fi
dir=${LINT_BUILD_DIR:-build-lint}
if [ ! -f "$dir/compile_commands.json" ]; then
  cc=(); command -v clang++ >/dev/null 2>&1 && cc=(-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang)
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "${cc[@]}" >/dev/null
fi
files=$(ls analyzer/*/*.cpp pool/*.cpp common/*.cpp preload/*/*.cpp)
start=$(date +%s)
# One process per file, two at a time; findings are errors (WarningsAsErrors: '*').
status=0
printf '%s\n' $files | xargs -P "${JOBS:-2}" -n 1 clang-tidy -p "$dir" --quiet 2>/dev/null >"$dir/lint.log" || status=$?
grep -E "(warning|error):" "$dir/lint.log" || true
echo "lint: $(echo $files | wc -w) files in $(( $(date +%s) - start )) s: $([ $status -eq 0 ] && echo clean || echo FINDINGS)"
exit $([ $status -eq 0 ] && echo 0 || echo 1)
