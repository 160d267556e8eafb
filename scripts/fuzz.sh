#!/usr/bin/env bash
# scripts/fuzz.sh MINUTES - builds the libFuzzer target with Debian clang (ASan + UBSan) and fuzzes the loader,
# every check and the oracle for MINUTES minutes, seeded from examples/, tests/ and docs/tutorial/.
# A crash, hang (>10 s per input), leak or sanitizer report stops it with the input saved as build-fuzz/crash-*.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-5}
[ "$minutes" -ge 1 ] 2>/dev/null || { echo "usage: scripts/fuzz.sh MINUTES (at least 1)"; exit 2; }
command -v clang++ >/dev/null || { echo "scripts/fuzz.sh needs clang (apt-get install clang)"; exit 2; }
CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPMD_FUZZ=ON >/dev/null
cmake --build build-fuzz --target spmd_fuzz -j "${JOBS:-2}"
corpus=build-fuzz/corpus
mkdir -p "$corpus"
find examples tests/programs tests/bad_input docs/tutorial -name '*.yaml' -exec cp {} "$corpus"/ \;
cd build-fuzz
ASAN_OPTIONS=detect_leaks=1 ./spmd_fuzz corpus -dict=../fuzz/program.dict -max_total_time=$((minutes * 60)) -timeout=10 -rss_limit_mb=2048 \
  -max_len=8192 -print_final_stats=1 2>&1 | tee fuzz.log | grep -E "^#[0-9]+ +(pulse|DONE|NEW)|ERROR|SUMMARY|stat::" | tail -25
