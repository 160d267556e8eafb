#!/usr/bin/env bash
# scripts/setup.sh - installs the Debian packages spmdcheck needs (only those missing) and builds it.
# Idempotent: a second run installs nothing and rebuilds only what changed.
# `setup.sh cli` installs only what the build needs and builds only the spmdcheck binary (scripts/run-example.sh);
# with no argument it also installs what the tests need and builds every test binary (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(build-essential cmake ninja-build pkg-config libz3-dev libboost-graph-dev libyaml-cpp-dev libyaml-dev libfmt-dev
      doctest-dev libcli11-dev nlohmann-json3-dev)
test_pkgs=(python3 python3-yaml python3-jsonschema chromium fonts-dejavu-core)  # the sarif, schema and report tests
target=()
if [ "${1:-}" = cli ]; then
  target=(--target spmdcheck)
else
  pkgs+=("${test_pkgs[@]}")
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" "${target[@]}"
