#!/usr/bin/env bash
# Formats gpuheap's own C, C++ and CUDA sources with the checked-in .clang-format. Vendored code
# (third_party/) and generated files (marked "@generated" or "DO NOT EDIT" in their first
# lines) are left alone.
#   scripts/format.sh              format every file in place
#   scripts/format.sh --check      change nothing: list the files that would change, with the
#                                  number of their lines that would, and exit 1 if any would
#   scripts/format.sh [--check] FILE...   only these files
#   CLANG_FORMAT=clang-format-14   the binary (the style was fitted with clang-format 14;
#                                  other versions may format a few constructs differently)
# Installs clang-format when missing, as setup.sh installs its packages (not with
# GPUHEAP_NO_APT=1).
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null 2>&1 && [ -z "${GPUHEAP_NO_APT:-}" ]; then
  echo "format: installing clang-format" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends clang-format >/dev/null
fi
command -v "$cf" >/dev/null 2>&1 || { echo "format: $cf is needed (apt-get install clang-format)" >&2; exit 2; }

if [ $# -gt 0 ]; then
  candidates=("$@")
else
  # Tracked files only (never build outputs), in the rooms of gpuheap's own code.
  specs=()
  for d in format preload analyzer pool common tests bench examples; do
    for e in c cc cpp h hpp cu cuh; do specs+=("$d/*.$e"); done
  done
  mapfile -t candidates < <(git ls-files -- "${specs[@]}" | grep -v '^third_party/' | sort)
fi
files=()
for f in "${candidates[@]}"; do
  case "$f" in third_party/*|*/third_party/*) continue ;; esac
  head -n 5 "$f" | grep -qiE '@generated|do not edit' && continue
  files+=("$f")
done
[ ${#files[@]} -gt 0 ] || { echo "format: no files" >&2; exit 2; }

if [ $check = 0 ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$cf" -i --style=file
  echo "format: ${#files[@]} files formatted with $("$cf" --version | head -1)"
  exit 0
fi
changed_files=0 changed_lines=0
for f in "${files[@]}"; do
  n=$("$cf" --style=file "$f" | diff "$f" - | grep -c '^<' || true)
  if [ "$n" -gt 0 ]; then
    echo "$f: $n lines"
    changed_files=$((changed_files + 1)); changed_lines=$((changed_lines + n))
  fi
done
echo "format: ${#files[@]} files, $changed_files would change ($changed_lines lines)"
[ $changed_files -eq 0 ]
