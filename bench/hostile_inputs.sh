#!/usr/bin/env bash
# bench/hostile_inputs.sh - the bad-input campaign of issue 23 (docs/reliability.md, "Hostile inputs"): writes
# each hostile input, runs spmdcheck on it under a time limit and prints how it ends: exit code, wall seconds,
# peak RSS, and the first bytes of the message. Every input must end with exit 2 (or 1 for a finding), in
# bounded time and memory; exit 3, a signal or the time limit is a defect.
#
# usage: bash bench/hostile_inputs.sh [SPMDCHECK] [TIME_LIMIT_S] [MEMORY_LIMIT_GIB]   (defaults: build/spmdcheck 120 4)
# Each run is capped by both limits (an older binary reads /dev/zero on standard input until memory runs out).
# The files go to ${TMPDIR:-/tmp}/spmd_hostile (a 2 GiB sparse file takes no disk space).
set -uo pipefail
bin=$(realpath "${1:-build/spmdcheck}")
limit=${2:-120}
mem_gib=${3:-4}
dir=${TMPDIR:-/tmp}/spmd_hostile
rm -rf "$dir"
mkdir -p "$dir/inc" "$dir/diamond" "$dir/tree"
cd "$dir" || exit 1

module() {  # module NAME BODY_OPS [TENSORS]
  printf '  %s:\n    in: [a]\n    out: [b]\n%s    ops:\n%s\n' "$1" "${3:-}" "$2"
}
# A program tensor and an instance's weight with one name (a false pass before: the GELU read an R tensor).
cat >clash.yaml <<'EOF'
mesh: {tp: 2}
tensors:
  x: {shape: [4, 8]}
  i.w: {shape: [4, 8], placement: {tp: P}}
modules:
  m:
    in: [a]
    out: [b]
    tensors: {w: {shape: [4, 8]}}
    ops: [{op: Add, in: [a, w], out: b}]
ops:
  - {use: m, name: i, in: [x], out: [y]}
  - {op: GELU, in: [i.w], out: z}
outputs: {z: {placement: {tp: R}}}
EOF
printf 'mesh: {tp: 2}\ntensors: {x: {shape: [4]}}\nmodules:\n  m: {in: [a], out: [b], ops: [{use: m, in: [a], out: [b]}]}\nops: [{op: GELU, in: [x], out: y}]\n' >recursive.yaml
# repeat of a module that declares tensors: quadratic before (100 s at 100,000).
for n in 16000 64000 100000; do
  printf 'mesh: {tp: 2}\ntensors: {x: {shape: [4, 8]}}\nmodules:\n  m:\n    in: [a]\n    out: [b]\n    tensors: {w: {shape: [4, 8]}}\n    ops: [{op: Add, in: [a, w], out: b}]\nops:\n  - {repeat: %d, use: m, name: l, in: [x], out: [y]}\n' "$n" >"repeat_tensors_$n.yaml"
done
# 10^18 instances of modules with no ops (ran forever), and 11 million ops from 2 lines.
printf 'mesh: {tp: 2}\ntensors: {x: {shape: [4]}}\nmodules:\n  e: {in: [a], out: [], ops: []}\n  m1: {in: [a], out: [], ops: [{repeat: 1000000, use: e, in: [a], out: []}]}\n  m2: {in: [a], out: [], ops: [{repeat: 1000000, use: m1, in: [a], out: []}]}\nops: [{repeat: 1000000, use: m2, in: [x], out: []}]\n' >nested_repeat.yaml
python3 - <<'EOF'
ops = "\n".join(f"      - {{op: GELU, in: [{'a' if i == 0 else f'h{i-1}'}], out: {'b' if i == 10 else f'h{i}'}}}" for i in range(11))
open("repeat_11m_ops.yaml", "w").write(f"mesh: {{tp: 2}}\ntensors: {{x: {{shape: [4]}}}}\nmodules:\n  m:\n    in: [a]\n    out: [b]\n    ops:\n{ops}\nops:\n  - {{repeat: 1000000, use: m, in: [x], out: [y]}}\n")
n = 20000  # a chain of 20,000 modules (a stack overflow before), and the same as an unused cycle
mods = "".join(f"  m{i}: {{in: [a], out: [b], ops: [{{use: m{i+1}, in: [a], out: [b]}}]}}\n" for i in range(n))
open("deep_modules.yaml", "w").write("mesh: {tp: 2}\ntensors: {x: {shape: [4]}}\nmodules:\n" + mods + f"  m{n}: {{in: [a], out: [b], ops: [{{op: GELU, in: [a], out: b}}]}}\nops: [{{use: m0, in: [x], out: [y]}}]\n")
mods = "".join(f"  m{i}: {{in: [a], out: [b], ops: [{{use: m{(i+1)%n}, in: [a], out: [b]}}]}}\n" for i in range(n))
open("cycle_modules.yaml", "w").write("mesh: {tp: 2}\ntensors: {x: {shape: [4]}}\nmodules:\n" + mods + "ops: [{op: GELU, in: [x], out: y}]\n")
for i in range(3000):  # a 3,000-file include chain (49 s before)
    inc = f"include: f{i+1}.yaml\n" if i < 2999 else ""
    open(f"inc/f{i}.yaml", "w").write(f"mesh: {{tp: 2}}\n{inc}modules:\n  m{i}: {{in: [a], out: [b], ops: [{{op: GELU, in: [a], out: b}}]}}\nops: []\n")
open("inc/main.yaml", "w").write("mesh: {tp: 2}\ninclude: f0.yaml\ntensors: {x: {shape: [4]}}\nops: [{use: m2999, in: [x], out: [y]}]\n")
for i in range(40):  # 2^40 include paths through 80 files (each file read once now)
    nxt = f"include: [a{i+1}.yaml, b{i+1}.yaml]\n" if i < 39 else ""
    for p in "ab":
        open(f"diamond/{p}{i}.yaml", "w").write(f"mesh: {{tp: 2}}\n{nxt}ops: []\n")
open("diamond/main.yaml", "w").write("mesh: {tp: 2}\ninclude: [a0.yaml, b0.yaml]\ntensors: {x: {shape: [4]}}\nops: [{op: GELU, in: [x], out: y}]\n")
open("cell.csv", "w").write("0F0,1" + "Q" * (1 << 20) + "\n")  # a 1 MB cell (echoed whole before)
open("commas.csv", "w").write("0F0" + "," * (60 << 20) + "0B0\n")  # 60 million empty cells
open("bad_utf8.json", "wb").write(b'{"mesh": {"tp": 2}, "ops": [{"op": "GELU", "in": ["x\xff"], "out": "y"}]}\n')
open("nul_name.yaml", "w").write('mesh: {tp: 2}\nops:\n  - {op: "Ge\\0LU", in: [x], out: y}\n')
open("huge_number.yaml", "w").write("mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 1" + "0" * 400 + "]}\nops: []\n")
open("min_int.yaml", "w").write("mesh: {tp: 2}\ntensors:\n  x: {shape: [4, -9223372036854775808]}\nops: []\n")
open("div_zero.yaml", "w").write("mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 8/0]}\nops: []\n")
open("expect_huge.yaml", "w").write("# expect-error: 99999999999999999999:1: x\nmesh: {tp: 2}\nops: []\n")
open("ranks.yaml", "w").write("mesh: {pp: 256, dp: 257}\ntensors: {x: {shape: [4]}}\nprograms:\n  - ranks: {pp: 0, dp: 0}\n    ops: [{op: GELU, in: [x], out: y}]\n  - ranks: {}\n    ops: [{op: GELU, in: [x], out: y}]\n")
open("stages.yaml", "w").write("mesh: {pp: 65537}\nschedule: {kind: GPipe, axis: pp, microbatches: 1}\n")
open("deep_pipeline.yaml", "w").write("mesh: {pp: 65536}\nschedule: {kind: GPipe, axis: pp, microbatches: 3}\n")
open("deep_pipeline_1mb.yaml", "w").write("mesh: {pp: 10000}\nschedule: {kind: GPipe, axis: pp, microbatches: 1}\n")
n = 8000  # per-rank programs: a chain of sends to the last rank and back (1.4 MB; the clocks grow with the square of the ranks)
chain = "- {ranks: {a: 0}, ops: [{op: Send, in: [x], peer: {a: 1}},{op: Recv, out: z, peer: {a: 1}}]}\n"
chain += "".join(f"- {{ranks: {{a: {i}}}, ops: [{{op: Recv, out: y, peer: {{a: {i-1}}}}},{{op: Send, in: [y], peer: {{a: {i+1}}}}},"
                 f"{{op: Recv, out: z, peer: {{a: {i+1}}}}},{{op: Send, in: [z], peer: {{a: {i-1}}}}}]}}\n" for i in range(1, n - 1))
chain += f"- {{ranks: {{a: {n-1}}}, ops: [{{op: Recv, out: y, peer: {{a: {n-2}}}}},{{op: Send, in: [y], peer: {{a: {n-2}}}}}]}}\n"
open("rank_chain.yaml", "w").write(f"mesh: {{a: {n}}}\ntensors: {{x: {{shape: [4]}}}}\nprograms:\n" + chain)
open("long_schedule.yaml", "w").write("mesh: {pp: 4}\nschedule: {kind: 1F1B, axis: pp, microbatches: 312500}\n")
open("scaled.yaml", "w").write("# a comment\nmesh: {tp: 4}\nsizes:\n  B: 64\n  H: 36\ntensors:\n  x: {shape: [B, H], placement: {tp: S(1)}, uneven: true}\n\nops:\n  - {op: Concat, in: [x, x], out: c, dim: 1}\n  - {op: AllGather, in: [c], out: y, axis: tp, dim: 1}\noutputs: {y: {}}\n")
EOF
mkfifo fifo.yaml
printf 'mesh: {tp: 2}\ntensors: {x: {shape: [4]}}\nops: [{op: GELU, in: [x], out: y}]\n' >ok.yaml
truncate -s 2G sparse.yaml
mkdir -p tree/sub && printf 'mesh: {tp: 2}\nops: []\n' >tree/ok.yaml && mkfifo tree/sub/pipe.yaml

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-44s %4s %8s %8s  %s\n' input exit wall_s rss_MiB message
case_() {  # case_ LABEL STDIN ARGS...
  local label=$1 input=$2
  shift 2
  /usr/bin/time -o "$dir/time.txt" -f '%x %e %M' timeout -s KILL "$limit" prlimit --as=$((mem_gib << 30)) "$bin" "$@" <"$input" >"$dir/out.txt" 2>&1
  local code wall rss
  read -r code wall rss < <(tail -1 "$dir/time.txt")
  rss=$((rss / 1024))
  if (($(echo "$wall >= $limit" | bc) )); then code=time rss=-; fi  # killed at the time limit
  local msg
  msg=$(grep -a -m1 -E 'error|FAIL|differ|agree' "$dir/out.txt" | tr -d '\0' | cut -c1-110)
  printf '%-44s %4s %8s %8s  %s\n' "$label" "$code" "$wall" "$rss" "$msg"
}
case_ "name clash with an instance's tensor" /dev/null check clash.yaml
case_ "unused recursive module" /dev/null check recursive.yaml
for n in 16000 64000 100000; do case_ "repeat $n of a module with tensors:" /dev/null check "repeat_tensors_$n.yaml"; done
case_ "nested repeat, 10^18 empty instances" /dev/null check nested_repeat.yaml
case_ "repeat to 11,000,000 ops (2 lines)" /dev/null check repeat_11m_ops.yaml
case_ "20,000 modules nested" /dev/null check deep_modules.yaml
case_ "20,000-module cycle, unused" /dev/null check cycle_modules.yaml
case_ "3,000-file include chain" /dev/null check inc/main.yaml
case_ "2^40 include paths (80 files)" /dev/null check diamond/main.yaml
case_ "report /dev/zero" /dev/null report /dev/zero -o "$dir/r.html"
case_ "report a FIFO" /dev/null report fifo.yaml -o "$dir/r.html"
case_ "report a 2 GiB sparse file" /dev/null report sparse.yaml -o "$dir/r.html"
case_ "check - < /dev/zero" /dev/zero check -
case_ "test a FIFO" /dev/null test fifo.yaml
case_ "test a directory (FIFO inside)" /dev/null test tree
case_ "test, expect-error 99999999999999999999:1" /dev/null test expect_huge.yaml
case_ "--dump-hb /dev/full" /dev/null check --dump-hb /dev/full ok.yaml
case_ "JSON with invalid UTF-8" /dev/null check bad_utf8.json
case_ "NUL byte in a name" /dev/null check nul_name.yaml
case_ "size 10^400" /dev/null check huge_number.yaml
case_ "size -2^63" /dev/null check min_int.yaml
case_ "size 8/0" /dev/null check div_zero.yaml
case_ "a missing file" /dev/null check missing.yaml
case_ "CSV with a 1 MB cell" /dev/null check cell.csv
case_ "CSV with 60 million empty cells" /dev/null check commas.csv
case_ "programs distinguishing 65,792 ranks" /dev/null check ranks.yaml
case_ "per-rank chain through 8,000 ranks and back" /dev/null check rank_chain.yaml
case_ "schedule on 65,537 pipeline ranks" /dev/null check stages.yaml
case_ "GPipe on 65,536 ranks, 3 microbatches" /dev/null check deep_pipeline.yaml
case_ "GPipe on 10,000 ranks, 1 microbatch" /dev/null check deep_pipeline_1mb.yaml
case_ "1F1B with 2,500,000 actions (2 lines)" /dev/null check long_schedule.yaml
case_ "run: scaled copy of an uneven program" /dev/null run scaled.yaml
# HLO: 24 computations, each calling the previous one twice (2^24 instructions once inlined)
mkdir -p hlo_calls/seq hlo_calls/ranks
printf 'HloModule s\n\nENTRY %%main () -> f32[2] {\n  %%x = f32[2]{0} parameter(0)\n  ROOT %%y = f32[2]{0} negate(%%x)\n}\n' >hlo_calls/seq/graph.0.hlo
{
  printf 'HloModule m, replica_count=2\n\n%%c0 (p: f32[2]) -> f32[2] {\n  %%p = f32[2]{0} parameter(0)\n  ROOT %%r = f32[2]{0} negate(%%p)\n}\n'
  for k in $(seq 1 24); do
    printf '%%c%d (p: f32[2]) -> f32[2] {\n  %%p = f32[2]{0} parameter(0)\n  %%a = f32[2]{0} call(%%p), to_apply=%%c%d\n  ROOT %%b = f32[2]{0} call(%%a), to_apply=%%c%d\n}\n' "$k" $((k - 1)) $((k - 1))
  done
  printf 'ENTRY %%main () -> f32[2] {\n  %%x = f32[2]{0} parameter(0)\n  ROOT %%y = f32[2]{0} call(%%x), to_apply=%%c24\n}\n'
} >hlo_calls/ranks/graph.0.hlo
case_ "HLO: calls doubling 24 times (2^24 instructions inlined)" /dev/null check hlo_calls/seq hlo_calls/ranks
rm -f fifo.yaml tree/sub/pipe.yaml sparse.yaml
