#!/usr/bin/env bash
# The link-level half of the layering check: no object file of a layer needs an
# external symbol that only a higher layer defines. The include path stops a layer
# from including a higher layer's header; this stops what a declaration written by
# hand (no include) would let through, since libinferq is one library whose link
# resolves every layer's symbols against every other's.
#
# Usage: check_layer_symbols.sh NM -- <layer> <object>... -- <layer> <object>... ...
# with the layers from the bottom up (compiled layers only). Exit 0 when clean; exit 1
# and one line per violation: object, symbol (demangled) and the layer defining it.
set -euo pipefail
export LC_ALL=C  # one collation for sort and comm
nm_tool=$1
shift
[ "${1:-}" = "--" ] || { echo "usage: $0 NM -- <layer> <object>... [-- ...]" >&2; exit 2; }

layers=()
declare -A objects=()
while [ $# -gt 0 ]; do
  shift  # the "--"
  [ $# -gt 0 ] || break
  layer=$1
  shift
  layers+=("$layer")
  objects[$layer]=""
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    objects[$layer]+="$1"$'\n'
    shift
  done
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Strong definitions (T, D, B, R: text, data, bss, read-only) of each layer; weak ones
# (inline functions, template instances) are emitted by every user and prove nothing.
for layer in "${layers[@]}"; do
  : > "$work/$layer.defined"
  while IFS= read -r obj; do
    [ -n "$obj" ] || continue
    "$nm_tool" --defined-only --extern-only "$obj" | awk '$2 ~ /^[TDBR]$/ { print $3 }' \
      >> "$work/$layer.defined"
  done <<< "${objects[$layer]}"
  sort -u -o "$work/$layer.defined" "$work/$layer.defined"
done

status=0
for ((i = 0; i < ${#layers[@]}; ++i)); do
  low=${layers[$i]}
  while IFS= read -r obj; do
    [ -n "$obj" ] || continue
    "$nm_tool" --undefined-only "$obj" | awk '{ print $NF }' | sort -u > "$work/undefined"
    for ((j = i + 1; j < ${#layers[@]}; ++j)); do
      high=${layers[$j]}
      while IFS= read -r sym; do
        [ -n "$sym" ] || continue
        echo "$(basename "$obj") (layer $low) uses $(echo "$sym" | c++filt), defined in layer $high"
        status=1
      done < <(comm -12 "$work/undefined" "$work/$high.defined")
    done
  done <<< "${objects[$low]}"
done
if [ "$status" -eq 0 ]; then
  echo "no layer uses a symbol of a higher layer (${layers[*]})"
fi
exit "$status"
