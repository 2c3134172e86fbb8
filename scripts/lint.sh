#!/usr/bin/env bash
# Lint: the rooms' includes against their READMEs (scripts/check-rooms.sh), the formatting
# (scripts/format.sh --check), shellcheck over
# the shell scripts, then clang-tidy (.clang-tidy at the root) over analyzer/, pool/, common/,
# preload/ and format/ (the header is checked through the sources that include it). Exit 1 on
# any finding. Installs shellcheck and clang-tidy when missing, as setup.sh installs its
# packages (not with GPUHEAP_NO_APT=1).
#   LINT_BUILD_DIR=build-lint (configured only, for compile_commands.json)   JOBS=2
set -euo pipefail
cd "$(dirname "$0")/.."
rooms_status=0
scripts/check-rooms.sh || rooms_status=1
# The formatting (.clang-format, applied by scripts/format.sh): any line it would change fails.
scripts/format.sh --check >/dev/null || { scripts/format.sh --check | tail -20; rooms_status=1; }
need=()
command -v shellcheck >/dev/null 2>&1 || need+=(shellcheck)
command -v clang-tidy >/dev/null 2>&1 || need+=(clang-tidy clang)
if [ ${#need[@]} -gt 0 ] && [ -z "${GPUHEAP_NO_APT:-}" ]; then
  echo "lint: installing ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Every shell script (-x follows what they source; run from the root, where the scripts'
# `# shellcheck source=` paths start). A check is disabled only inline, with its reason.
sh_status=0
if command -v shellcheck >/dev/null 2>&1; then
  mapfile -t sh_files < <(find scripts tests .ci -type f \( -name '*.sh' -o -path .ci/run \) | sort)
  shellcheck -x "${sh_files[@]}" || sh_status=1
  echo "lint: shellcheck, ${#sh_files[@]} scripts: $([ $sh_status -eq 0 ] && echo clean || echo FINDINGS)"
else
  echo "lint: shellcheck is needed (apt-get install shellcheck)" >&2; sh_status=1
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
printf '%s\n' "$files" | xargs -P "${JOBS:-2}" -n 1 clang-tidy -p "$dir" --quiet 2>/dev/null >"$dir/lint.log" || status=$?
grep -E "(warning|error):" "$dir/lint.log" || true
echo "lint: $(echo "$files" | wc -w) files in $(( $(date +%s) - start )) s: $([ $status -eq 0 ] && echo clean || echo FINDINGS)"
exit $(( status == 0 && sh_status == 0 && rooms_status == 0 ? 0 : 1 ))
