// tests/test_spatial.cpp - every spatial check ID: a program that triggers it and a near-identical one
// that does not; plus messages, notes, fixes and Z3 counterexamples.
#include <doctest/doctest.h>

#include "tests/helpers.h"

using namespace spmd;
using namespace spmd::test;

namespace {

// A Megatron row-parallel linear: x S(2) x w S(0) -> P(sum) over tp; `tail` finishes it.
std::string row_linear(const std::string& tail, const std::string& outputs = "y: {}") {
  return R"(
mesh: {tp: 4}
tensors:
  x: {shape: [8, 16, 64], placement: {tp: S(2)}}
  w: {shape: [64, 32], placement: {tp: S(0)}}
  b: {shape: [32]}
ops:
  - {op: MatMul, in: [x, w], out: y_partial}
)" + tail + "\noutputs:\n  " + outputs + "\n";
}

}  // namespace

TEST_CASE("partial-misuse: bias before the AllReduce, nonlinear ops and norms on P") {
  CHECK(ids(row_linear("  - {op: AllReduce, in: [y_partial], out: y0, axis: tp}\n  - {op: Add, in: [y0, b], out: y}")) == none());
  CHECK(ids(row_linear("  - {op: Add, in: [y_partial, b], out: y0}\n  - {op: AllReduce, in: [y0], out: y, axis: tp}")) == one("partial-misuse"));
  CHECK(ids(row_linear("  - {op: AllReduce, in: [y_partial], out: y0, axis: tp}\n  - {op: GELU, in: [y0], out: y}")) == none());
  CHECK(ids(row_linear("  - {op: GELU, in: [y_partial], out: y0}\n  - {op: AllReduce, in: [y0], out: y, axis: tp}")) == one("partial-misuse"));
  CHECK(ids(row_linear("  - {op: SiLU, in: [y_partial], out: y0}\n  - {op: AllReduce, in: [y0], out: y, axis: tp}")) == one("partial-misuse"));
  CHECK(ids(row_linear("  - {op: Sin, in: [y_partial], out: y0}\n  - {op: AllReduce, in: [y0], out: y, axis: tp}")) == one("partial-misuse"));
  CHECK(ids(row_linear("  - {op: Cos, in: [y_partial], out: y0}\n  - {op: AllReduce, in: [y0], out: y, axis: tp}")) == one("partial-misuse"));
  CHECK(ids(row_linear("  - {op: AllReduce, in: [y_partial], out: y0, axis: tp}\n  - {op: Sin, in: [y0], out: y1}\n  - {op: Cos, in: [y1], out: y}")) == none());
  CHECK(ids(row_linear("  - {op: Softmax, in: [y_partial], out: y0}\n  - {op: AllReduce, in: [y0], out: y, axis: tp}")) == one("partial-misuse"));
  CHECK(ids(row_linear("  - {op: LayerNorm, in: [y_partial, b, b], out: y0}\n  - {op: AllReduce, in: [y0], out: y, axis: tp}")) ==
        one("partial-misuse"));
  // P + P (same op) and linear ops on P are fine.
  CHECK(ids(row_linear("  - {op: Add, in: [y_partial, y_partial], out: y0}\n  - {op: Cast, in: [y0], out: y1, dtype: bf16}\n"
                       "  - {op: LossScale, in: [y1], out: y2, scale: 0.5}\n  - {op: AllReduce, in: [y2], out: y, axis: tp}")) == none());
  // P x P and P + scalar are not.
  CHECK(ids(row_linear("  - {op: Multiply, in: [y_partial, y_partial], out: y0}\n  - {op: AllReduce, in: [y0], out: y, axis: tp}")) ==
        one("partial-misuse"));
  CHECK(ids(row_linear("  - {op: Add, in: [y_partial], out: y0, scalar: 1.0}\n  - {op: AllReduce, in: [y0], out: y, axis: tp}")) ==
        one("partial-misuse"));
  CHECK(ids(row_linear("  - {op: Multiply, in: [y_partial], out: y0, scalar: 2.0}\n  - {op: AllReduce, in: [y0], out: y, axis: tp}")) == none());
  // Rounding a pending sum to integers is not linear.
  CHECK(ids(row_linear("  - {op: Cast, in: [y_partial], out: y0, dtype: i32}\n  - {op: AllReduce, in: [y0], out: y, axis: tp}")) ==
        one("partial-misuse"));
}

TEST_CASE("partial-misuse diagnostic: position, origin note and fix") {
  auto d = diags(row_linear("  - {op: GELU, in: [y_partial], out: y0}\n  - {op: AllReduce, in: [y0], out: y, axis: tp}"));
  REQUIRE(d.size() == 1);
  CHECK(d[0].loc.line == 9);
  CHECK(d[0].loc.col == 5);
  CHECK(d[0].message.find("GELU applied to y_partial, which is P(sum) over tp") != std::string::npos);
  CHECK(d[0].tensor == "y_partial");
  CHECK(d[0].op == 1);
  REQUIRE(d[0].notes.size() == 2);
  CHECK(d[0].notes[0].loc.line == 8);
  CHECK(d[0].notes[0].message.find("became P(sum) over tp here: MatMul contracts a dim sharded S(2) x S(0) over tp") != std::string::npos);
  CHECK(d[0].notes[1].message.find("fix: reduce first, e.g. insert {op: AllReduce, in: [y_partial]") != std::string::npos);
}

TEST_CASE("partial-output vs placement-mismatch on outputs") {
  CHECK(ids(row_linear("  - {op: Cast, in: [y_partial], out: y, dtype: f32}")) == one("partial-output"));
  CHECK(ids(row_linear("  - {op: Cast, in: [y_partial], out: y, dtype: f32}", "y: {placement: {tp: P}}")) == none());
  CHECK(ids(row_linear("  - {op: ReduceScatter, in: [y_partial], out: y, axis: tp, dim: 1}", "y: {placement: {tp: S(1)}}")) == none());
  CHECK(ids(row_linear("  - {op: ReduceScatter, in: [y_partial], out: y, axis: tp, dim: 1}", "y: {placement: {tp: S(0)}}")) ==
        one("placement-mismatch"));
  auto d = diags(row_linear("  - {op: Cast, in: [y_partial], out: y, dtype: f32}", "y: {placement: {tp: S(1)}}"));
  REQUIRE(d.size() == 1);
  CHECK(d[0].notes.back().message.find("ReduceScatter") != std::string::npos);  // the fix matches the declared S(1)
}

TEST_CASE("sharded-reduction-dim: softmax, norms, cross-entropy, top-k") {
  auto prog = [](const char* pl, const char* op) {
    return std::string("mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 8, 16], placement: {tp: ") + pl + "}}\n  w: {shape: [16]}\nops:\n  - " + op +
           "\noutputs:\n  y: {placement: {tp: " + pl + "}}\n";
  };
  CHECK(ids(prog("S(1)", "{op: Softmax, in: [x], out: y}")) == none());
  CHECK(ids(prog("S(2)", "{op: Softmax, in: [x], out: y}")) == one("sharded-reduction-dim"));
  CHECK(ids(prog("S(1)", "{op: LayerNorm, in: [x, w, w], out: y}")) == none());  // sequence parallel
  CHECK(ids(prog("S(2)", "{op: LayerNorm, in: [x, w, w], out: y}")) == one("sharded-reduction-dim"));
  CHECK(ids(prog("S(2)", "{op: RMSNorm, in: [x], out: y, dims: [1]}")) == none());
  CHECK(ids(prog("S(1)", "{op: RMSNorm, in: [x], out: y, dims: [1]}")) == one("sharded-reduction-dim"));
  CHECK(ids(prog("S(0)", "{op: TopKGate, in: [x], out: [y, idx], k: 2}")) == none());
  CHECK(ids(prog("S(2)", "{op: TopKGate, in: [x], out: [y, idx], k: 2}")) == one("sharded-reduction-dim"));
}

TEST_CASE("cross-entropy: vocab-parallel and Megatron #7452") {
  auto prog = [](const char* extra_op, const char* ce_attrs) {
    return std::string(R"(
mesh: {tp: 4}
tensors:
  logits: {shape: [8, 128, 32000], placement: {tp: S(2)}}
  labels: {shape: [8, 128], dtype: i64}
ops:
)") + extra_op + "  - {op: CrossEntropyLoss, in: [lg, labels], out: loss" + ce_attrs + "}\noutputs:\n  loss: {}\n";
  };
  const char* keep = "  - {op: Cast, in: [logits], out: lg, dtype: f32}\n";
  const char* gather = "  - {op: AllGather, in: [logits], out: lg, axis: tp, dim: 2}\n";
  CHECK(ids(prog(keep, ", vocab_parallel: true")) == none());
  CHECK(ids(prog(gather, ", vocab_parallel: true")) == one("placement-mismatch"));
  CHECK(ids(prog(gather, ", vocab_parallel: true, axis: tp")) == one("placement-mismatch"));
  CHECK(ids(prog(gather, "")) == none());
  CHECK(ids(prog(keep, "")) == one("sharded-reduction-dim"));
}

TEST_CASE("layout-conflict: block-diagonal matmul, S(i)+S(j), ring-less sequence attention, embedding") {
  auto mm = [](const char* xp, const char* wp) {
    return std::string("mesh: {ep: 4}\ntensors:\n  x: {shape: [64, 32], placement: {ep: ") + xp + "}}\n  w: {shape: [32, 16], placement: {ep: " + wp +
           "}}\nops:\n  - {op: MatMul, in: [x, w], out: y}\noutputs:\n  y: {placement: {ep: S(0)}}\n";
  };
  CHECK(ids(mm("S(0)", "R")) == none());
  CHECK(ids(mm("S(0)", "S(1)")) == one("layout-conflict"));
  CHECK(ids(mm("S(0)", "S(0)")) == one("shape-mismatch"));  // x's k whole, w's k split: local shapes differ
  CHECK(ids(mm("R", "S(0)")) == one("shape-mismatch"));
  auto add = [](const char* yp) {
    return std::string("mesh: {tp: 2}\ntensors:\n  a: {shape: [4, 8], placement: {tp: S(0)}}\n  b: {shape: [4, 8], placement: {tp: ") + yp +
           "}}\nops:\n  - {op: Add, in: [a, b], out: c}\noutputs:\n  c: {placement: {tp: S(0)}}\n";
  };
  CHECK(ids(add("S(0)")) == none());
  CHECK(ids(add("R")) == none());
  CHECK(ids(add("S(1)")) == one("layout-conflict"));
  auto attn = [](const char* kp, const char* causal) {
    return std::string("mesh: {cp: 2}\ntensors:\n  q: {shape: [2, 4, 64, 16], placement: {cp: S(2)}}\n  k: {shape: [2, 4, 64, 16], placement: {cp: ") +
           kp + "}}\n  v: {shape: [2, 4, 64, 16], placement: {cp: " + kp + "}}\nops:\n  - {op: FlashAttention, in: [q, k, v], out: o" + causal +
           "}\noutputs:\n  o: {placement: {cp: S(2)}}\n";
  };
  CHECK(ids(attn("R", "")) == none());
  CHECK(ids(attn("S(2)", "")) == one("layout-conflict"));
  CHECK(ids(attn("R", ", causal: true")) == one("layout-conflict"));  // the causal mask needs the global offset
  auto emb = [](const char* idp, const char* out) {
    return std::string("mesh: {tp: 4}\ntensors:\n  ids: {shape: [8, 16], dtype: i64, placement: {tp: ") + idp +
           "}}\n  w: {shape: [32000, 64], placement: {tp: S(0)}}\nops:\n  - {op: Embedding, in: [ids, w], out: e}\n  - {op: AllReduce, in: [e], out: y, axis: tp}\n"
           "outputs:\n  y: {placement: {tp: " + out + "}}\n";
  };
  CHECK(ids(emb("R", "R")) == none());
  CHECK(ids(emb("S(0)", "R")) == one("layout-conflict"));
}

TEST_CASE("invariant-mix: I with R needs an explicit Convert") {
  auto prog = [](const char* tail) {
    return std::string(
               "mesh: {tp: 2}\ntensors:\n  a: {shape: [4, 8], placement: {tp: I}}\n  b: {shape: [4, 8]}\nops:\n") +
           tail + "outputs:\n  c: {}\n";
  };
  CHECK(ids(prog("  - {op: Add, in: [a, b], out: c}\n")) == one("invariant-mix"));
  CHECK(ids(prog("  - {op: Convert, in: [a], out: ar, axis: tp, to: R}\n  - {op: Add, in: [ar, b], out: c}\n")) == none());
  CHECK(ids(prog("  - {op: Convert, in: [a], out: ar, axis: tp, to: R, from: R}\n  - {op: Add, in: [ar, b], out: c}\n")) == one("placement-mismatch"));
}

TEST_CASE("illegal-collective: the input kinds each collective takes") {
  auto prog = [](const char* pl, const char* op, const char* outp = "R") {
    return std::string("mesh: {dp: 2, tp: 4}\ntensors:\n  x: {shape: [8, 16], placement: {tp: ") + pl + "}}\nops:\n  - " + op +
           "\noutputs:\n  y: {placement: {tp: " + outp + "}}\n";
  };
  CHECK(ids(prog("P", "{op: AllReduce, in: [x], out: y, axis: tp}")) == none());
  CHECK(ids(prog("V", "{op: AllReduce, in: [x], out: y, axis: tp}")) == none());
  CHECK(ids(prog("R", "{op: AllReduce, in: [x], out: y, axis: tp}")) == one("illegal-collective"));
  CHECK(ids(prog("S(0)", "{op: AllReduce, in: [x], out: y, axis: tp}")) == one("illegal-collective"));
  CHECK(ids(prog("P(avg)", "{op: AllReduce, in: [x], out: y, axis: tp, reduce: avg}")) == none());
  CHECK(ids(prog("P(avg)", "{op: AllReduce, in: [x], out: y, axis: tp}")) == one("illegal-collective"));
  CHECK(ids(prog("P", "{op: AllReduce, in: [x], out: y, axis: tp, dst: I}", "I")) == none());
  CHECK(ids(prog("S(1)", "{op: AllGather, in: [x], out: y, axis: tp, dim: 1}")) == none());
  CHECK(ids(prog("S(1)", "{op: AllGather, in: [x], out: y, axis: tp, dim: 0}")) == one("illegal-collective"));
  CHECK(ids(prog("P", "{op: ReduceScatter, in: [x], out: y, axis: tp, dim: 0}", "S(0)")) == none());
  CHECK(ids(prog("R", "{op: ReduceScatter, in: [x], out: y, axis: tp, dim: 0}", "S(0)")) == one("illegal-collective"));
  CHECK(ids(prog("V", "{op: Broadcast, in: [x], out: y, axis: tp, src: 0}")) == none());
  CHECK(ids(prog("P", "{op: Broadcast, in: [x], out: y, axis: tp, src: 0}")) == one("illegal-collective"));
  CHECK(ids(prog("R", "{op: Broadcast, in: [x], out: y, axis: tp, src: 4}")) == one("illegal-collective"));
  CHECK(ids(prog("S(1)", "{op: AllToAll, in: [x], out: y, axis: tp, split_dim: 0, concat_dim: 1}", "S(0)")) == none());
  CHECK(ids(prog("S(0)", "{op: AllToAll, in: [x], out: y, axis: tp, split_dim: 0, concat_dim: 1}", "S(0)")) == one("illegal-collective"));
  CHECK(ids(prog("R", "{op: Convert, in: [x], out: y, axis: tp, to: S(1)}", "S(1)")) == none());
  CHECK(ids(prog("S(1)", "{op: Convert, in: [x], out: y, axis: tp, to: R}")) == one("illegal-collective"));
  CHECK(ids(prog("R", "{op: Reinterpret, in: [x], out: y, axis: tp, to: P}", "P")) == none());
}

TEST_CASE("multi-axis shards keep mesh order") {
  auto prog = [](const char* op, const char* outp) {
    return std::string("mesh: {dp: 2, tp: 4}\ntensors:\n  x: {shape: [16, 8], placement: {dp: S(0), tp: S(0)}}\nops:\n  - ") + op +
           "\noutputs:\n  y: {placement: " + outp + "}\n";
  };
  CHECK(ids(prog("{op: AllGather, in: [x], out: y, axis: tp, dim: 0}", "{dp: S(0)}")) == none());
  CHECK(ids(prog("{op: AllGather, in: [x], out: y, axis: dp, dim: 0}", "{tp: S(0)}")) == one("illegal-collective"));
  CHECK(ids(prog("{op: AllGather, in: [x], out: y, axis: [dp, tp], dim: 0}", "{}")) == none());
  // Local size is global / (dp x tp): 12 rows do not split 8 ways.
  CHECK(ids("mesh: {dp: 2, tp: 4}\ntensors:\n  x: {shape: [12, 8], placement: {dp: S(0), tp: S(0)}}\nops: []\n") == one("shape-mismatch"));
  CHECK(ids("mesh: {dp: 2, tp: 4}\ntensors:\n  x: {shape: [12, 8], placement: {dp: S(0), tp: S(0)}, uneven: true}\nops: []\n") == none());
}

TEST_CASE("undefined-tensor: read before any definition, with did-you-mean and the later writer") {
  auto d = diags("mesh: {tp: 2}\ntensors:\n  hidden: {shape: [4]}\nops:\n  - {op: GELU, in: [hiden], out: a}\n  - {op: GELU, in: [b], out: c}\n"
                 "  - {op: GELU, in: [hidden], out: b}\n");
  REQUIRE(d.size() == 2);
  CHECK(check_name(d[0].id) == "undefined-tensor");
  CHECK(d[0].message.find("did you mean 'hidden'?") != std::string::npos);
  REQUIRE(d[1].notes.size() == 1);
  CHECK(d[1].notes[0].loc.line == 7);
  CHECK(ids("mesh: {tp: 2}\ntensors:\n  hidden: {shape: [4]}\nops:\n  - {op: GELU, in: [hidden], out: a}\n") == none());
}

TEST_CASE("shape-mismatch: contraction dims, reshape counts, divisibility") {
  auto mm = [](const char* k) {
    return std::string("mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 8]}\n  w: {shape: [") + k + ", 16]}\nops:\n  - {op: MatMul, in: [x, w], out: y}\n";
  };
  CHECK(ids(mm("8")) == none());
  CHECK(ids(mm("6")) == one("shape-mismatch"));
  auto rs = [](const char* shape) {
    return std::string("mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 8, 6], placement: {tp: S(0)}}\nops:\n  - {op: Reshape, in: [x], out: y, shape: ") +
           shape + "}\n";
  };
  CHECK(ids(rs("[32, 6]")) == none());           // merge, shard on the leftmost dim
  CHECK(ids(rs("[4, 48]")) == none());           // straight through
  CHECK(ids(rs("[4, 8, 5]")) == one("shape-mismatch"));
  CHECK(ids(rs("[2, 2, 8, 6]")) == none());      // split: the first sub-dim (2) divides over tp = 2
  CHECK(ids("mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 8], placement: {tp: S(1)}}\nops:\n  - {op: Reshape, in: [x], out: y, shape: [32]}\n") ==
        one("layout-conflict"));                 // the shard is not on the leftmost merged dim
  CHECK(ids("mesh: {tp: 4}\ntensors:\n  x: {shape: [6, 8], placement: {tp: S(0)}}\nops: []\n") == one("shape-mismatch"));
}

TEST_CASE("symbolic sizes: proved for every value, or a counterexample") {
  auto prog = [](const char* tvals, const char* f) {
    return std::string("mesh: {tp: T}\nsizes:\n  T: {in: [") + tvals + "]}\n  H: {min: 64, max: 8192, multiple_of: 64}\ntensors:\n"
           "  x: {shape: [8, H]}\n  w1: {shape: [H, " + f + "], placement: {tp: S(1)}}\nops:\n  - {op: MatMul, in: [x, w1], out: h}\n"
           "outputs:\n  h: {placement: {tp: S(1)}}\n";
  };
  CHECK(ids(prog("1, 2, 4, 8", "4*H")) == none());
  auto d = diags(prog("1, 2, 3, 4", "4*H"));
  REQUIRE(d.size() == 1);
  CHECK(check_name(d[0].id) == "shape-mismatch");
  CHECK(d[0].message.find("fails when T = 3, H = ") != std::string::npos);
  CHECK(d[0].message.find("is not divisible by 3") != std::string::npos);
  CHECK(ids(prog("1, 2, 4, 8", "H + 8")) == none());                     // 64k + 8 is always a multiple of 8
  CHECK(ids(prog("1, 2, 4, 8", "H + 2")) == one("shape-mismatch"));      // 64k + 2 is not a multiple of 4
  CHECK(ids(prog("1, 2, 4", "H/2")) == none());                          // H/2 exact for every H that is a multiple of 64
  CHECK(ids(prog("1, 2, 4", "H - 64")) == one("shape-mismatch"));        // H - 64 is 0 when H = 64
  // Unbounded symbolic divisor: still decided by Z3.
  CHECK(ids("mesh: {tp: 4}\nsizes:\n  H: {min: 1}\ntensors:\n  x: {shape: [H], placement: {tp: S(0)}}\nops: []\n") == one("shape-mismatch"));
  CHECK(ids("mesh: {tp: 4}\nsizes:\n  H: {min: 4, multiple_of: 4}\ntensors:\n  x: {shape: [H], placement: {tp: S(0)}}\nops: []\n") == none());
}

TEST_CASE("symbolic sizes: many sizes are proved one query at a time, and a timeout is never a pass") {
  // Each layer with its own hidden size: every obligation mentions one layer's size (and the shared NH, T), so
  // it is proved in a query of its own; none may come back undecided because other layers' sizes pile up.
  auto layers = [](int n, bool wrong) {
    std::string y = "mesh: {tp: T}\nsizes:\n  T: {in: [1, 2, 4, 8]}\n  NH: {in: [8, 16, 32]}\n";
    for (int l = 0; l < n; ++l)
      y += "  H" + std::to_string(l) + (wrong && l + 1 == n ? ": {min: 4, multiple_of: 4}\n" : ": {min: 64, max: 65536, multiple_of: 64}\n");
    y += "tensors:\n";
    for (int l = 0; l < n; ++l) {
      std::string L = std::to_string(l);
      y += "  x" + L + ": {shape: [8, H" + L + "]}\n  w" + L + ": {shape: [H" + L + ", 4*H" + L + "], placement: {tp: S(1)}}\n";
    }
    y += "ops:\n";
    for (int l = 0; l < n; ++l) {
      std::string L = std::to_string(l);
      y += "  - {op: Reshape, in: [x" + L + "], out: s" + L + ", shape: [8, NH, H" + L + "/NH]}\n";
      y += "  - {op: Reshape, in: [s" + L + "], out: m" + L + ", shape: [8, H" + L + "]}\n";
      y += "  - {op: MatMul, in: [m" + L + ", w" + L + "], out: h" + L + "}\n";
    }
    return y;
  };
  for (const auto& d : diags(layers(24, false))) FAIL_CHECK(d.message);
  auto d = diags(layers(24, true));
  REQUIRE(!d.empty());
  for (const auto& x : d) {
    CHECK(check_name(x.id) == "shape-mismatch");
    CHECK(x.message.find("H23") != std::string::npos);
    CHECK(x.message.find("but it fails when") != std::string::npos);  // a counterexample, not "could not decide"
  }
  // Identities are proved without the solver only when every division in them is known to be exact.
  auto contraction = [](const char* h) {
    return std::string("mesh: {tp: 2}\nsizes:\n  H: ") + h + "\ntensors:\n  x: {shape: [8, H]}\n  w: {shape: [H/2*2, 4]}\n" +
           "ops:\n  - {op: MatMul, in: [x, w], out: y}\n";
  };
  CHECK(ids(contraction("{min: 2, max: 1024, multiple_of: 2}")) == none());
  auto odd = diags(contraction("{min: 2, max: 1024}"));  // an odd H: H/2 is inexact, and H/2*2 != H
  REQUIRE(odd.size() == 2);
  for (const auto& x : odd) CHECK(x.message.find("but it fails when H = ") != std::string::npos);
  CHECK(odd[1].message.find("MatMul contracts") != std::string::npos);
  // A claim Z3 cannot settle in time (A^3 - A is always a multiple of 3) is reported as undecided, never passed.
  SpatialOptions o;
  o.z3_timeout_ms = 50;
  auto t = check_spatial(load_program_string("mesh: {tp: 3}\nsizes:\n  A: {min: 2, max: 1000000000}\ntensors:\n"
                                             "  x: {shape: [A*A*A - A], placement: {tp: S(0)}}\nops: []\n",
                                             "t.yaml"),
                         o);
  REQUIRE(t.size() == 1);
  CHECK(t[0].message.find("could not decide") != std::string::npos);
  CHECK(t[0].message.find("this is not a pass") != std::string::npos);
}

TEST_CASE("per-rank programs: each program sees its own names and the tensors it uses") {
  // Value tables are per program (the names its ops use): a name another program defines is still undefined
  // here, with a "did you mean" among this program's names; a declared tensor reaches every program using it.
  auto prog = [](const char* second) {
    return std::string("mesh: {pp: 2}\ntensors:\n  x: {shape: [4, 8]}\n  w0: {shape: [8, 8]}\n  w1: {shape: [8, 8]}\n"
                       "programs:\n  - ranks: {pp: 0}\n    ops:\n      - {op: MatMul, in: [x, w0], out: a0}\n"
                       "      - {op: GELU, in: [a0], out: b0}\n  - ranks: {pp: 1}\n    ops:\n") +
           second + "outputs:\n  b0: {}\n  b1: {}\n";
  };
  CHECK(ids(prog("      - {op: MatMul, in: [x, w1], out: a1}\n      - {op: GELU, in: [a1], out: b1}\n")) == none());
  auto d = diags(prog("      - {op: MatMul, in: [x, w1], out: a1}\n      - {op: GELU, in: [a0], out: b1}\n"));
  REQUIRE(d.size() == 1);
  CHECK(check_name(d[0].id) == "undefined-tensor");
  CHECK(d[0].message.find("did you mean 'a1'") != std::string::npos);
  // An output is checked in the program that holds it (b1 is a summand over pp on rank 1 only).
  CHECK(ids(prog("      - {op: MatMul, in: [x, w1], out: a1}\n      - {op: Reinterpret, in: [a1], out: b1, axis: pp, to: P}\n")) ==
        one("partial-output"));
}

TEST_CASE("no cascades: a value with an error is not reported again") {
  CHECK(ids(row_linear("  - {op: GELU, in: [y_partial], out: g}\n  - {op: GELU, in: [g], out: y}")) == one("partial-misuse"));
}

namespace spmd {

TEST_CASE("attention with an uneven head cut: checked rank by rank, within a bound on the pairs it checks") {
  auto gqa = [](const std::string& nh, const std::string& nkv) {
    return "mesh: {tp: 3}\ntensors:\n  q: {shape: [1, " + nh + ", 1, 1], placement: {tp: S(1)}, uneven: true}\n  k: {shape: [1, " + nkv +
           ", 1, 1], placement: {tp: S(1)}, uneven: true}\n  v: {shape: [1, " + nkv +
           ", 1, 1], placement: {tp: S(1)}, uneven: true}\nops:\n  - {op: FlashAttention, in: [q, k, v], out: o}\n";
  };
  // 8 query heads over 4 kv heads, tp 3: 3, 3, 2 and 2, 2, 0: rank 0 pairs query head 2 with kv head 1 (whole: 1) but
  // its 3 query heads over 2 kv heads cannot be grouped
  CHECK(ids(gqa("8", "4")) == one("layout-conflict"));
  // 4 million query heads in pairs, cut 1333334, 1333334, 1333332 and 666667, 666667, 666666: each rank's query heads
  // are its kv heads' groups, checked one by one
  CHECK(ids(gqa("4000000", "2000000")) == none());
  // 40 million: past the pairs checked one by one (2^24), so not proved right (a cap on the count alone rejected the
  // one above; with none, a 40-billion-head program took minutes)
  CHECK(ids(gqa("40000000", "20000000")) == one("layout-conflict"));
  // as many heads cut alike: the same blocks, accepted whatever the count
  CHECK(ids(gqa("40000000001", "40000000001")) == none());
}

}  // namespace spmd

