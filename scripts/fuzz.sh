#!/usr/bin/env bash
# scripts/fuzz.sh [import] MINUTES - builds a libFuzzer target with Debian clang (ASan + UBSan) and fuzzes it for
# MINUTES minutes. Default: the loader, every check and the oracle, seeded from examples/, tests/ and docs/tutorial/.
# `import`: the captured-graph parsers and their lowering (fuzz/fuzz_import.cpp), seeded from the FX and HLO texts
# the tests write (tests/data/graphs) and, when present, ../shared/data/fx.
# A crash, hang (>10 s per input), leak or sanitizer report stops it with the input saved as build-fuzz/crash-*.
set -euo pipefail
cd "$(dirname "$0")/.."
target=spmd_fuzz
if [ "${1:-}" = import ]; then
  target=spmd_fuzz_import
  shift
fi
minutes=${1:-5}
[ "$minutes" -ge 1 ] 2>/dev/null || { echo "usage: scripts/fuzz.sh [import] MINUTES (at least 1)"; exit 2; }
command -v clang++ >/dev/null || { echo "scripts/fuzz.sh needs clang (apt-get install clang)"; exit 2; }
CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPMD_FUZZ=ON >/dev/null
cmake --build build-fuzz --target "$target" -j "${JOBS:-2}"
corpus=build-fuzz/corpus-$target
mkdir -p "$corpus"
if [ "$target" = spmd_fuzz ]; then
  find examples tests/programs tests/bad_input docs/tutorial -name '*.yaml' -exec cp {} "$corpus"/ \;
  dict=(-dict=../fuzz/program.dict)
else
  find tests/data/graphs -type f \( -name '*.py' -o -name '*.hlo' \) -exec cp --backup=numbered {} "$corpus"/ \; 2>/dev/null || true
  if [ -d ../shared/data/fx ]; then  # one rank's graph of each corpus folder (small ones)
    find ../shared/data/fx -type f \( -name 'fw.g0.r0.py' -o -name 'graph.0.hlo' \) -size -64k -exec cp --backup=numbered {} "$corpus"/ \;
  fi
  dict=()
fi
cd build-fuzz
ASAN_OPTIONS=detect_leaks=1 ./"$target" "corpus-$target" "${dict[@]}" -max_total_time=$((minutes * 60)) -timeout=10 -rss_limit_mb=2048 \
  -max_len=65536 -print_final_stats=1 2>&1 | tee fuzz.log | grep -E "^#[0-9]+ +(pulse|DONE|NEW)|ERROR|SUMMARY|stat::" | tail -25
