#!/usr/bin/env bash
# bench/loader_scale.sh - `spmdcheck check` end to end on the generated transformer at 10^5 and 10^6 ops, in the
# form a generator writes (JSON) and in block-style YAML, in one run: wall, user + sys CPU, peak RSS, and the
# 10^6 / 10^5 ratio of CPU time (issue 14: at most 12, linear growth).
#
# usage: bash bench/loader_scale.sh [BUILD_DIR] [SMALL] [LARGE]     (defaults: build 100000 1000000)
# The files go to ${TMPDIR:-/tmp}/spmd_scale (about 200 MB). On a shared machine compare CPU, not wall.
set -euo pipefail
build=${1:-build}
small=${2:-100000}
large=${3:-1000000}
dir=${TMPDIR:-/tmp}/spmd_scale
mkdir -p "$dir"
for n in "$small" "$large"; do
  [[ -s $dir/g$n.json ]] || "$build/spmd_bench" --json "$n" >"$dir/g$n.json"
  [[ -s $dir/g$n.yaml ]] || "$build/spmd_bench" --block "$n" >"$dir/g$n.yaml"
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %9s %9s %9s %9s %10s\n' form ops wall_s user_s sys_s rss_MiB
declare -A cpu
for form in json yaml; do
  for n in "$small" "$large"; do
    out=$( { /usr/bin/time -f '%e %U %S %M' "$build/spmdcheck" check "$dir/g$n.$form" >/dev/null; } 2>&1 | tail -1)
    read -r wall user sys rss <<<"$out"
    cpu[$form$n]=$(echo "$user + $sys" | bc -l)
    printf '%-6s %9s %9s %9s %9s %10d\n' "$form" "$n" "$wall" "$user" "$sys" $((rss / 1024))
  done
  ratio=$(echo "${cpu[$form$large]} / ${cpu[$form$small]}" | bc -l)
  printf '%-6s CPU ratio %s/%s ops: %.1fx (linear: %.0fx, target at most 12x)\n' "$form" "$large" "$small" "$ratio" "$(echo "$large / $small" | bc -l)"
done
