#!/usr/bin/env bash
# bench/equiv_llama.sh - issue 11 benchmark: generate the Llama stack (spmd_bench --equiv-llama L) for L=32 and
# L=64, forward only and as a training program (forward and derived backward, `train`), and time
# `spmdcheck equiv` on each (wall, user+sys CPU, peak RSS from /usr/bin/time -v).
# Targets: 32 layers under 10 s and 2 GiB; the 64-layer time at most 2.2x the 32-layer time.
# usage: bash bench/equiv_llama.sh [BUILD_DIR] [LAYERS...]   (default: build 32 64)
set -euo pipefail
build=${1:-build}
shift || true
layers=("$@")
[ ${#layers[@]} -eq 0 ] && layers=(32 64)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
for mode in "" train; do
  for l in "${layers[@]}"; do
    "$build/spmd_bench" --equiv-llama "$l" $mode > "$tmp/llama$l.yaml"
    /usr/bin/time -v "$build/spmdcheck" equiv "$tmp/llama$l.yaml" > "$tmp/out$l" 2> "$tmp/time$l" || true
    wall=$(grep 'Elapsed (wall' "$tmp/time$l" | awk '{print $NF}')
    user=$(grep 'User time' "$tmp/time$l" | awk '{print $NF}')
    sys=$(grep 'System time' "$tmp/time$l" | awk '{print $NF}')
    rss=$(grep 'Maximum resident' "$tmp/time$l" | awk '{print $NF}')
    echo "L=$l ${mode:-forward} ops=$(grep -c '{op:' "$tmp/llama$l.yaml") wall=$wall user=${user}s sys=${sys}s peak_rss=$((rss / 1024))MiB"
    sed 's/^[^:]*: /  /' "$tmp/out$l"
  done
done
