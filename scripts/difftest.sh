#!/usr/bin/env bash
# scripts/difftest.sh [COUNT] [SEED] - the long differential run: COUNT random programs (default 100000) from SEED,
# each judged by the checker and by the numeric oracle on 3 value seeds. Exit 1 if the checker passes a program
# whose numbers differ (printed minimized); false-alarm candidates are counted and listed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
./build/spmd_difftest_run --count "${1:-100000}" --seed "${2:-1}" --seeds 3
