#!/usr/bin/env bash
# scripts/test.sh - set up, build, and run every test (doctest units, the golden runner, the numeric oracle).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cd build && ctest --output-on-failure
