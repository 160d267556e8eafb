#!/usr/bin/env bash
# bench/equiv_all.sh - issue 20's first acceptance item: `spmdcheck equiv` over every program in examples/ and
# tests/programs/ ends with exit 0, 1 or 4 (never 2 for a file `spmdcheck check` accepts, never 3), each under
# 5 s and 1 GiB. Prints one line per file that breaks a rule, then the counts and the slowest and largest runs.
# usage: bash bench/equiv_all.sh [SPMDCHECK] [TIME_LIMIT_S] [MEMORY_LIMIT_MIB]   (defaults: build/spmdcheck 5 1024)
# Exit 0 when every file keeps the rules. Wall times depend on the machine's load: the limit is checked on
# wall time, so run it on a quiet machine (or raise TIME_LIMIT_S and read the CPU column).
set -uo pipefail
bin=$(realpath "${1:-build/spmdcheck}")
limit=${2:-5}
mem=${3:-1024}
cd "$(dirname "$0")/.." || exit 2
out=$(mktemp)
trap 'rm -f "$out" "$out.t" "$out.all"' EXIT
bad=0
declare -A count
for f in $(find examples tests/programs -name '*.yaml' | sort); do
  # a generous kill bound: the rule is checked below on the measured figures
  timeout $((limit * 6)) /usr/bin/time -f '%e %U %S %M' -o "$out.t" "$bin" equiv "$f" >"$out" 2>&1
  rc=$?
  read -r wall user sys rss < <(tail -n 1 "$out.t" 2>/dev/null) || { wall=999 user=0 sys=0 rss=0; }
  [ $rc -eq 124 ] && wall=999
  cpu=$(echo "$user + $sys" | bc)
  count[$rc]=$((${count[$rc]:-0} + 1))
  echo "$rc $wall $cpu $((rss / 1024)) $f" >>"$out.all"
  why=""
  case $rc in
    0 | 1 | 4) ;;
    2) "$bin" check "$f" >/dev/null 2>&1; [ $? -ne 2 ] && why="exit 2 for a file check accepts" ;;
    *) why="exit $rc" ;;
  esac
  (($(echo "$wall > $limit" | bc))) && why="$why${why:+; }$wall s wall (cpu $cpu s)"
  ((rss / 1024 > mem)) && why="$why${why:+; }$((rss / 1024)) MiB"
  if [ -n "$why" ]; then
    echo "BAD $f: $why"
    bad=$((bad + 1))
  fi
done
echo "files: $(wc -l <"$out.all"); exits: $(for k in "${!count[@]}"; do echo -n "$k:${count[$k]} "; done)"
echo "slowest (exit wall cpu MiB file):"
sort -k2 -g -r "$out.all" | head -5 | sed 's/^/  /'
echo "largest:"
sort -k4 -g -r "$out.all" | head -3 | sed 's/^/  /'
rm -f "$out.all"
echo "files that break a rule: $bad"
[ $bad -eq 0 ]
