// tests/test_per_rank.cpp - per-rank plans and pipelined schedules in the value check and the numeric oracle:
// point-to-point FIFO, collectives across per-rank programs, outputs some ranks hold, the schedules' lowering with
// real ops, and the located errors of stages that do not chain.
#include <doctest/doctest.h>

#include <string>

#include "cli/check_file.h"
#include "equiv/equiv.h"
#include "interp/interp.h"
#include "ir/loader.h"

namespace spmd {
namespace {

EquivResult equiv(const std::string& yaml, const std::string& file = "t.yaml") { return check_equivalence(load_program_string(yaml, file)); }

std::string src(const std::string& rel) { return std::string(SPMD_SOURCE_DIR) + "/" + rel; }

// Rank {pp: 0} sends a and b to {pp: 1} in that order; {pp: 1} receives them as first and second (FIFO per pair).
std::string fifo(const char* first, const char* second) {
  return std::string(R"(mesh: {pp: 2}
tensors:
  x: {shape: [4, 8]}
programs:
  - ranks: {pp: 0}
    ops:
      - {op: GELU, in: [x], out: a}
      - {op: Exp, in: [x], out: b}
      - {op: Send, in: [)") + first + R"(], peer: {pp: 1}}
      - {op: Send, in: [)" + second + R"(], peer: {pp: 1}}
  - ranks: {pp: 1}
    ops:
      - {op: Recv, out: u, peer: {pp: 0}}
      - {op: Recv, out: v, peer: {pp: 0}}
      - {op: Sub, in: [u, v], out: d}
outputs:
  d: {ranks: {pp: 1}}
spec:
  ops:
    - {op: GELU, in: [x], out: g}
    - {op: Exp, in: [x], out: e}
    - {op: Sub, in: [g, e], out: d}
  outputs: [d]
)";
}

}  // namespace

TEST_CASE("per-rank: point-to-point transfers pair per (src, dst) in FIFO order") {
  EquivResult ok = equiv(fifo("a", "b"));
  CHECK_MESSAGE(ok.verdict == EquivVerdict::Equivalent, ok.message);
  EquivResult swapped = equiv(fifo("b", "a"));
  CHECK_MESSAGE(swapped.verdict == EquivVerdict::Mismatch, swapped.message);
}

TEST_CASE("per-rank: an output only some ranks compute is read from those ranks (`ranks:`)") {
  std::string held = fifo("a", "b");
  EquivResult ok = equiv(held);
  CHECK(ok.verdict == EquivVerdict::Equivalent);
  // Without `ranks:` every rank must hold it: rank {pp: 0} never computes d.
  std::string all = held;
  all.replace(all.find("d: {ranks: {pp: 1}}"), 19, "d: {}");
  EquivResult r = equiv(all);
  CHECK(r.verdict == EquivVerdict::Mismatch);
  CHECK(r.message.find("never computes it") != std::string::npos);
  // The oracle reads it the same way: with the spec as the model it agrees.
  OracleResult o = run_oracle(load_program_string(held, "t.yaml"));
  CHECK_MESSAGE(o.verdict == OracleVerdict::Agree, o.message);
}

TEST_CASE("per-rank: collectives match across programs by group and sequence, whatever their local names") {
  // Row-parallel MLP written per rank (as an imported per-rank graph is): each tp rank slices its own rows and
  // columns with constants of its own, and the ranks all-reduce under different local names.
  auto plan = [](int hi1) {
    return std::string(R"(mesh: {tp: 2}
view: local
tensors:
  x: {shape: [4, 8]}
  w1: {shape: [8, 8]}
  w2: {shape: [8, 4]}
programs:
  - ranks: {tp: 0}
    ops:
      - {op: Slice, in: [w1], out: c0, dim: 1, start: 0, end: 4}
      - {op: Slice, in: [w2], out: r0, dim: 0, start: 0, end: 4}
      - {op: MatMul, in: [x, c0], out: h0}
      - {op: GELU, in: [h0], out: g0}
      - {op: MatMul, in: [g0, r0], out: p0}
      - {op: AllReduce, in: [p0], out: y, axis: tp, matches: partial}
  - ranks: {tp: 1}
    ops:
      - {op: Slice, in: [w1], out: c1, dim: 1, start: 4, end: )") +
           std::to_string(hi1) + R"(}
      - {op: Slice, in: [w2], out: r1, dim: 0, start: 4, end: 8}
      - {op: MatMul, in: [x, c1], out: h1}
      - {op: GELU, in: [h1], out: g1}
      - {op: MatMul, in: [g1, r1], out: p1}
      - {op: AllReduce, in: [p1], out: y, axis: tp, matches: partial}
outputs:
  y: {}
spec:
  ops:
    - {op: MatMul, in: [x, w1], out: h}
    - {op: GELU, in: [h], out: g}
    - {op: MatMul, in: [g, w2], out: y}
  outputs: [y]
)";
  };
  EquivResult ok = equiv(plan(8));
  CHECK_MESSAGE(ok.verdict == EquivVerdict::Equivalent, ok.message);
  // A wrong constant in rank 1's program only: its slice is too short, so its run fails at the MatMul that reads it.
  EquivResult bad = equiv(plan(7));
  CHECK(bad.verdict == EquivVerdict::Mismatch);
  REQUIRE(!bad.diags.empty());
  CHECK(bad.diags[0].loc.line == 22);
}

TEST_CASE("per-rank: a wrong value in one rank's program is located there, across the collective") {
  std::string text = R"(mesh: {tp: 2}
view: local
tensors:
  x: {shape: [4, 8], placement: {tp: S(1)}}
programs:
  - ranks: {tp: 0}
    ops:
      - {op: Multiply, in: [x], out: s, scalar: 2}
      - {op: Sum, in: [s], out: p, dims: [1]}
      - {op: AllReduce, in: [p], out: y, axis: tp}
  - ranks: {tp: 1}
    ops:
      - {op: Multiply, in: [x], out: s, scalar: SCALE}
      - {op: Sum, in: [s], out: p, dims: [1]}
      - {op: AllReduce, in: [p], out: y, axis: tp}
outputs:
  y: {}
spec:
  ops:
    - {op: Multiply, in: [x], out: s, scalar: 2}
    - {op: Sum, in: [s], out: y, dims: [1]}
  outputs: [y]
)";
  auto with = [&](const char* scale) {
    std::string t = text;
    t.replace(t.find("SCALE"), 5, scale);
    return equiv(t);
  };
  CHECK(with("2").verdict == EquivVerdict::Equivalent);
  EquivResult bad = with("3");
  REQUIRE(bad.verdict == EquivVerdict::Mismatch);
  // The ranks' `s` are read together (one name in every program); rank {tp: 1}'s piece is the odd one.
  CHECK_MESSAGE(bad.diags[0].loc.line == 13, bad.message);
}

TEST_CASE("per-rank: without a spec the value check says it has nothing to compare with") {
  std::string text = fifo("a", "b");
  text = text.substr(0, text.find("spec:"));
  EquivResult r = equiv(text);
  CHECK(r.verdict == EquivVerdict::Skipped);
  CHECK(r.message.find("need a `spec:`") != std::string::npos);
  // The oracle runs it and checks only that the ranks agree on replicated outputs.
  OracleResult o = run_oracle(load_program_string(text, "t.yaml"));
  CHECK(o.verdict == OracleVerdict::Agree);
  CHECK(o.rank_checked == 1);
}

TEST_CASE("pipeline: examples/pipeline bugs are found at the right op, fixed versions are proved") {
  struct Case {
    const char* file;
    EquivVerdict verdict;
    int line;  // the diagnostic's line (0: any)
  };
  for (const Case& c : {Case{"pp_loss_normalized_after_backward_bug.yaml", EquivVerdict::Mismatch, 33},
                        Case{"pp_loss_normalized_after_backward_fixed.yaml", EquivVerdict::Equivalent, 0},
                        Case{"pp_grad_accum_rescaled_bug.yaml", EquivVerdict::Mismatch, 32},
                        Case{"pp_grad_accum_rescaled_fixed.yaml", EquivVerdict::Equivalent, 0},
                        Case{"megatron_loss_divided_twice_bug.yaml", EquivVerdict::Mismatch, 33},
                        Case{"megatron_loss_divided_twice_fixed.yaml", EquivVerdict::Equivalent, 0},
                        Case{"grad_sync_before_last_backward_bug.yaml", EquivVerdict::Mismatch, 41},
                        Case{"grad_sync_before_last_backward_fixed.yaml", EquivVerdict::Equivalent, 0},
                        Case{"shuffled_microbatches_bug.yaml", EquivVerdict::Mismatch, 28},
                        Case{"shuffled_microbatches_fixed.yaml", EquivVerdict::Equivalent, 0},
                        Case{"pp_1f1b_adamw.yaml", EquivVerdict::Equivalent, 0},
                        Case{"pp_clip_grad_norm_one_stage_bug.yaml", EquivVerdict::Mismatch, 42},
                        Case{"pp_clip_grad_norm_fixed.yaml", EquivVerdict::Equivalent, 0},
                        Case{"pp_adamw_step_counts_accumulation_bug.yaml", EquivVerdict::Mismatch, 46},
                        Case{"pp_adamw_accumulation_fixed.yaml", EquivVerdict::Equivalent, 0}}) {
    std::string path = src(std::string("examples/pipeline/") + c.file);
    EquivResult r = check_equivalence(load_program_file(path));
    INFO(c.file << ": " << r.message);
    CHECK(r.verdict == c.verdict);
    if (c.line && !r.diags.empty()) CHECK(r.diags[0].loc.line == static_cast<std::uint32_t>(c.line));
  }
}

TEST_CASE("pipeline: stage cuts at the instances of a step value, read per microbatch as the spec's whole-batch value") {
  // A name the stages and the spec both write is a lineage point whose plan side is its instances `<name>@mb<k>`:
  // proved in stages. A per-microbatch loss is no part of the whole-batch loss: that point does not hold and is left
  // uncut (pp_grad_accum_rescaled_fixed), the others still verified; a bug stays a mismatch (a cut that does not
  // hold is never trusted).
  for (const char* file : {"pp_1f1b_adamw.yaml", "shuffled_microbatches_fixed.yaml", "pp_grad_accum_rescaled_fixed.yaml"}) {
    EquivResult r = check_equivalence(load_program_file(src(std::string("examples/pipeline/") + file)));
    INFO(file << ": " << r.message);
    CHECK(r.verdict == EquivVerdict::Equivalent);
    CHECK(r.message.find("verified in stages at") != std::string::npos);
  }
  for (const char* file : {"shuffled_microbatches_bug.yaml", "pp_grad_accum_rescaled_bug.yaml"}) {
    EquivResult r = check_equivalence(load_program_file(src(std::string("examples/pipeline/") + file)));
    INFO(file << ": " << r.message);
    CHECK(r.verdict == EquivVerdict::Mismatch);
  }
}

TEST_CASE("pipeline: every generated schedule kind lowers to the same step") {
  std::string text = R"(mesh: {pp: 2, dp: 2}
sizes: {B: 16, H: 4}
tensors:
  x: {shape: [B, H], placement: {dp: S(0)}}
  y: {shape: [B, H], placement: {dp: S(0)}}
  w0: {shape: [H, H], param: true}
  w1: {shape: [H, H], param: true}
  w2: {shape: [H, H], param: true}
  w3: {shape: [H, H], param: true}
modules:
  layer:
    in: [x, w]
    out: [h]
    ops:
      - {op: MatMul, in: [x, w], out: a}
      - {op: SiLU, in: [a], out: h}
  head:
    in: [h, w, y]
    out: [loss]
    ops:
      - {op: MatMul, in: [h, w], out: o}
      - {op: Sub, in: [o, y], out: e}
      - {op: Multiply, in: [e, e], out: e2}
      - {op: Sum, in: [e2], out: s, dims: [0, 1]}
      - {op: LossScale, in: [s], out: loss, scale: 1/B}
schedule:
  kind: KIND
  axis: pp
  microbatches: 4
  VIRTUAL
  batch: {x: 0, y: 0}
  stages: STAGES
  merge: {loss: sum}
loss: loss
grad_sync:
  - {op: AllReduce, in: [w0.grad], out: w0.grad, axis: dp}
  - {op: AllReduce, in: [w1.grad], out: w1.grad, axis: dp}
  GRAD_SYNC
outputs:
  loss: {placement: {dp: P}}
spec:
  ops:
    - {op: MatMul, in: [x, w0], out: a0}
    - {op: SiLU, in: [a0], out: h0}
    LAYERS
    - {op: MatMul, in: [HLAST, WLAST], out: o}
    - {op: Sub, in: [o, y], out: e}
    - {op: Multiply, in: [e, e], out: e2}
    - {op: Sum, in: [e2], out: s, dims: [0, 1]}
    - {op: LossScale, in: [s], out: loss, scale: 1/B}
  outputs: [loss]
)";
  auto fill = [&](const std::string& kind, bool four) {
    std::string t = text;
    auto put = [&](const std::string& key, const std::string& v) { t.replace(t.find(key), key.size(), v); };
    put("KIND", kind);
    put("VIRTUAL", four ? "virtual_stages: 2" : "");
    put("STAGES", four ? "[{use: layer, name: s0, in: [x, w0], out: [h0]}, {use: layer, name: s1, in: [h0, w1], out: [h1]}, "
                         "{use: layer, name: s2, in: [h1, w2], out: [h2]}, {use: head, in: [h2, w3, y], out: [loss]}]"
                       : "[{use: layer, in: [x, w0], out: [h0]}, {use: head, in: [h0, w1, y], out: [loss]}]");
    put("GRAD_SYNC", four ? "- {op: AllReduce, in: [w2.grad], out: w2.grad, axis: dp}\n  - {op: AllReduce, in: [w3.grad], out: w3.grad, axis: dp}" : "");
    put("LAYERS", four ? "- {op: MatMul, in: [h0, w1], out: a1}\n    - {op: SiLU, in: [a1], out: h1}\n    - {op: MatMul, in: [h1, w2], out: a2}\n"
                         "    - {op: SiLU, in: [a2], out: h2}"
                       : "");
    put("HLAST", four ? "h2" : "h0");
    put("WLAST", four ? "w3" : "w1");
    if (!four) {  // the 2-stage spec has no w2, w3 to differentiate: drop them
      t.erase(t.find("  w2: {shape: [H, H], param: true}\n"), 35);
      t.erase(t.find("  w3: {shape: [H, H], param: true}\n"), 35);
    }
    return t;
  };
  for (const char* kind : {"GPipe", "1F1B", "ZBH1"}) {
    EquivResult r = equiv(fill(kind, false));
    CHECK_MESSAGE(r.verdict == EquivVerdict::Equivalent, kind << ": " << r.message);
  }
  EquivResult r = equiv(fill("Interleaved1F1B", true));
  CHECK_MESSAGE(r.verdict == EquivVerdict::Equivalent, "Interleaved1F1B: " << r.message);
}

TEST_CASE("pipeline: stages that do not chain are a located error") {
  std::string head = R"(mesh: {pp: 3}
tensors:
  x: {shape: [4, 4]}
  w0: {shape: [4, 4], param: true}
  w1: {shape: [4, 4], param: true}
  w2: {shape: [4, 4], param: true}
modules:
  layer: {in: [x, w], out: [h], ops: [{op: MatMul, in: [x, w], out: h}]}
  head: {in: [h, w], out: [loss], ops: [{op: MatMul, in: [h, w], out: o}, {op: Sum, in: [o], out: loss, dims: [0, 1]}]}
schedule:
  kind: GPipe
  microbatches: 2
  batch: {x: 0}
  stages:
)";
  auto err = [&](const std::string& stages) -> std::string {
    try {
      load_program_string(head + stages + "loss: loss\n", "t.yaml");
    } catch (const LoadError& e) {
      return std::to_string(e.loc.line) + ": " + e.what();
    }
    return "";
  };
  // Stage 2 reads stage 0's output, skipping stage 1.
  std::string skip = err("    - {use: layer, name: s0, in: [x, w0], out: [h0]}\n    - {use: layer, name: s1, in: [h0, w1], out: [h1]}\n"
                         "    - {use: head, in: [h0, w2], out: [loss]}\n");
  CHECK_MESSAGE(skip.find("17: stage modules do not chain: stage 2 reads 'h0', an output of stage 0") == 0, skip);
  // Stage 1 reads a name nothing defines.
  std::string undefined = err("    - {use: layer, name: s0, in: [x, w0], out: [h0]}\n    - {use: layer, name: s1, in: [hx, w1], out: [h1]}\n"
                              "    - {use: head, in: [h1, w2], out: [loss]}\n");
  CHECK_MESSAGE(undefined.find("16: stage modules do not chain: stage 1 reads 'hx'") == 0, undefined);
  // Stage 1 does not read stage 0's output.
  std::string unread = err("    - {use: layer, name: s0, in: [x, w0], out: [h0]}\n    - {use: layer, name: s1, in: [x, w1], out: [h1]}\n"
                           "    - {use: head, in: [h1, w2], out: [loss]}\n");
  CHECK_MESSAGE(unread.find("stage modules do not chain: stage 1 reads none of the outputs of stage 0") != std::string::npos, unread);
  // The loss must be the last stage's.
  std::string loss = err("    - {use: layer, name: s0, in: [x, w0], out: [h0]}\n    - {use: layer, name: s1, in: [h0, w1], out: [h1]}\n"
                         "    - {use: head, in: [h1, w2], out: [loss]}\n");
  CHECK(loss.empty());
}

TEST_CASE("pipeline: `spmdcheck check` reports the early gradient sync, `equiv` the value it breaks") {
  Options opt;
  FileResult bug = check_file(src("examples/pipeline/grad_sync_before_last_backward_bug.yaml"), opt);
  REQUIRE(!bug.load_failed);
  bool early = false;
  for (const auto& d : bug.diags) early |= d.id == CheckId::GradSyncEarly;
  CHECK(early);
  FileResult fixed = check_file(src("examples/pipeline/grad_sync_before_last_backward_fixed.yaml"), opt);
  REQUIRE(!fixed.load_failed);
  CHECK(fixed.diags.empty());
}

}  // namespace spmd
