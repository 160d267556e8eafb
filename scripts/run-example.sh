#!/usr/bin/env bash
# scripts/run-example.sh - set up, build the spmdcheck binary (no test binaries), and check a correct and a buggy example.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh cli || exit 1
./build/spmdcheck check examples/tp/mlp.yaml && echo "examples/tp/mlp.yaml: ok (exit 0)"
./build/spmdcheck check "${1:-examples/tp/mlp_bias_before_allreduce.yaml}"
echo "exit code: $? (1 = the program has errors)"
