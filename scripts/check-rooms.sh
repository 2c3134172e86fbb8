#!/usr/bin/env bash
# Checks that every room's includes match its README.md (ctest RoomIncludes, scripts/lint.sh).
#   scripts/check-rooms.sh [ROOT]     (ROOT: the source tree, default: this one)
#   scripts/check-rooms.sh --self-test  plants a forbidden include and an unused room in a
#                                       copy and fails unless the check catches both
# A room is a folder under format/, common/, pool/, preload/ or analyzer/ whose README.md
# has a line "May use: ROOM, ROOM..." ("nothing" for none), ROOM being a folder path from
# the root (analyzer/base, pool, preload/core). A source file belongs to the deepest room
# above it; each of its #include "X" that names a file of another room must name one its
# room may use, and each room its README lists must be included somewhere in the room, so
# that the README says what the code does. Rooms outside preload/ must form no cycle (the
# analyzer's rooms are static libraries linked in that order; preload/'s rooms are linked
# into one .so and call each other through the headers their READMEs name).
set -euo pipefail

if [ "${1:-}" = "--self-test" ]; then
  src=$(cd "$(dirname "$0")/.." && pwd)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  for d in format common pool preload analyzer; do cp -r "$src/$d" "$tmp/$d"; done
  cp -r "$src/scripts" "$tmp/scripts"
  "$tmp/scripts/check-rooms.sh" "$tmp" >/dev/null || { echo "self-test: the clean tree fails" >&2; exit 1; }
  # A forbidden edge: base may not use the CLI.
  echo '#include "analyzer/cli/commands.h"' >>"$tmp/analyzer/base/units.cpp"
  out=$("$tmp/scripts/check-rooms.sh" "$tmp" 2>&1) && { echo "self-test: forbidden include passed" >&2; exit 1; }
  grep -q 'analyzer/base/units.cpp:.*analyzer/cli' <<<"$out" || { echo "self-test: wrong message: $out" >&2; exit 1; }
  sed -i '$d' "$tmp/analyzer/base/units.cpp"
  # A README that lists a room no file uses.
  sed -i 's/^May use: format$/May use: format, common/' "$tmp/analyzer/base/README.md"
  out=$("$tmp/scripts/check-rooms.sh" "$tmp" 2>&1) && { echo "self-test: unused room passed" >&2; exit 1; }
  grep -q 'analyzer/base/README.md: May use lists common' <<<"$out" || { echo "self-test: wrong message: $out" >&2; exit 1; }
  # preload/ may never be used by the analyzer, even through a listed room.
  sed -i 's/^May use: format, common$/May use: format/' "$tmp/analyzer/base/README.md"
  echo '#include "preload/core/options.h"' >>"$tmp/analyzer/base/units.cpp"
  "$tmp/scripts/check-rooms.sh" "$tmp" >/dev/null 2>&1 && { echo "self-test: analyzer -> preload passed" >&2; exit 1; }
  echo "check-rooms self-test: forbidden include, unused room and analyzer -> preload all caught"
  exit 0
fi

root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
cd "$root"

declare -A may   # room -> " a b c " (allowed rooms)
declare -A used  # room -> " a b " (rooms actually included)
rooms=()
while IFS= read -r readme; do
  room=${readme%/README.md}
  line=$(grep -m1 '^May use:' "$readme" || true)
  [ -n "$line" ] || { echo "$readme: no 'May use:' line" >&2; exit 1; }
  list=${line#May use:}
  list=${list//,/ }
  read -r -a words <<< "$list"
  list="${words[*]}"
  [ "$list" = "nothing" ] && list=""
  may[$room]=" $list "
  used[$room]=" "
  rooms+=("$room")
done < <(find format common pool preload analyzer -name README.md 2>/dev/null | sort)

# The deepest room containing path $1 (a file path from the root), or "".
room_of() {
  local p=$1 best="" r
  for r in "${rooms[@]}"; do
    case "$p" in "$r"/*) [ ${#r} -gt ${#best} ] && best=$r ;; esac
  done
  echo "$best"
}

fail=0
for r in "${rooms[@]}"; do
  for u in ${may[$r]}; do
    [ -n "${may[$u]+x}" ] || { echo "$r/README.md: May use names '$u', which is no room" >&2; fail=1; }
    case "$r:$u" in analyzer/*:preload*) echo "$r/README.md: the analyzer never uses preload/ ($u)" >&2; fail=1 ;; esac
  done
done

while IFS= read -r f; do
  own=$(room_of "$f")
  [ -n "$own" ] || { echo "$f: in no room (no README.md with 'May use:' above it)" >&2; fail=1; continue; }
  while IFS=: read -r n inc; do
    target=$(room_of "$inc")
    [ -n "$target" ] || continue  # a system or third-party header, or one beside the file
    [ "$target" = "$own" ] && continue
    case "${may[$own]}" in
      *" $target "*) used[$own]="${used[$own]}$target " ;;
      *) echo "$f:$n: includes $inc of $target, which $own/README.md does not allow (May use:${may[$own]})" >&2; fail=1 ;;
    esac
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" | sed -E 's/^([0-9]+):[^"]*"([^"]*)".*/\1:\2/')
done < <(find "${rooms[@]}" -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.c' -o -name '*.cc' -o -name '*.cpp' \) | sort -u)

edges=""
for r in "${rooms[@]}"; do
  for u in ${may[$r]}; do
    case "${used[$r]}" in
      *" $u "*) ;;
      *) echo "$r/README.md: May use lists $u, but no file of $r ever includes it (remove it)" >&2; fail=1 ;;
    esac
    case "$r $u" in preload/*" "preload*) ;; *) edges+="$u $r"$'\n' ;; esac
  done
done
if ! printf '%s' "$edges" | tsort >/dev/null 2>&1; then
  echo "rooms: the 'May use:' lines outside preload/ form a cycle:" >&2
  printf '%s' "$edges" | tsort 2>&1 >/dev/null | sed 's/^/  /' >&2
  fail=1
fi

[ "$fail" = 0 ] && echo "rooms: ${#rooms[@]} rooms, every include allowed by its README, every listed room used"
exit "$fail"
