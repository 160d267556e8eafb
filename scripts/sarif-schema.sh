#!/usr/bin/env bash
# scripts/sarif-schema.sh - puts the SARIF 2.1.0 JSON Schema where the `sarif` test reads it, and prints its path.
# The schema is not kept in this repository: it is taken from the npm registry package
# @microsoft/sarif-multitool-linux (file sarif-2.1.0.json, the schema Microsoft's SARIF validator uses), once,
# into a cache outside the tree. Idempotent: a second run downloads nothing.
set -euo pipefail
cache=${SPMD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spmdcheck}
schema="$cache/sarif-2.1.0.json"
if [ ! -s "$schema" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq npm >/dev/null
  fi
  mkdir -p "$cache"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent @microsoft/sarif-multitool-linux@5.7.0 >/dev/null 2>&1 &&
     tar xzf ./*.tgz package/sarif-2.1.0.json)
  mv "$tmp/package/sarif-2.1.0.json" "$schema.part" && mv "$schema.part" "$schema"
fi
echo "$schema"
