// tests/test_autograd.cpp - derived backward (one VJP test per op), duality, gradient sync, loss scaling.
#include <doctest/doctest.h>

#include <map>
#include <sstream>

#include "autograd/autograd.h"
#include "autograd/derive.h"
#include "cli/driver.h"
#include "helpers.h"
#include "ir/printer.h"

namespace spmd::test {

namespace {

std::string pl_text(const Program& p, const Placements& pl) {
  std::string s;
  for (int a = 0; a < p.axis_count(); ++a) s += (a ? "," : "") + to_string(pl[static_cast<std::size_t>(a)]);
  return s;
}

struct Trained {
  std::set<std::string> ids;
  std::map<std::string, std::string> grads;  // "<x>.grad" -> placements, one per axis, comma-separated
  std::map<std::string, int> ops;            // backward op kinds -> count
  std::string messages;
};

// Derives (or takes the hand-written) backward, checks it, and reads every declared tensor's gradient.
Trained train(const std::string& yaml) {
  Program p = load_program_string(yaml, "t.yaml");
  TrainingCheck r = check_training(p);
  Trained t;
  for (const auto& d : r.diags) {
    t.ids.insert(std::string(check_name(d.id)));
    t.messages += d.message + "\n";
  }
  if (!r.built) return t;
  SpatialTypes types;
  SpatialOptions so;
  so.types = &types;
  for (const auto& d : check_spatial(r.program, so)) t.messages += "spatial: " + d.message + "\n";
  for (std::size_t i = r.first_backward; i < r.program.ops.size(); ++i) t.ops[std::string(op_name(r.program.ops[i].kind))]++;
  for (const auto& decl : p.tensors) {
    std::string g = p.name(decl.name) + ".grad";
    bool found = false;
    for (std::size_t i = r.program.ops.size(); i-- > r.first_backward && !found;) {
      auto outs = r.program.outs(r.program.ops[i]);
      for (std::size_t k = 0; k < outs.size() && !found; ++k)
        if (r.program.name(outs[k]) == g) {
          t.grads.emplace(g, pl_text(r.program, types.out(i, static_cast<int>(k)).pl));
          found = true;  // the last writer
        }
    }
  }
  return t;
}

// Checks the derived backward is clean and gives each listed gradient the expected (dual) placement.
void expect_grads(const std::string& yaml, const std::map<std::string, std::string>& want, const std::map<std::string, int>& ops = {}) {
  Trained t = train(yaml);
  INFO(yaml);
  INFO(t.messages);
  t.ids.erase("unsynced-gradient");  // these tests are about placements; synchronization has its own
  CHECK(t.ids.empty());
  for (const auto& [g, pl] : want) {
    INFO(g);
    REQUIRE(t.grads.count(g));
    CHECK(t.grads[g] == pl);
  }
  for (const auto& [k, n] : ops) {
    INFO(k);
    CHECK(t.ops[k] == n);
  }
}

const char* kMesh = "mesh: {a: 2}\n";

}  // namespace

TEST_CASE("dual placements: R<->P, I<->I, V<->V, S(d)<->S(d)") {
  CHECK(dual(Placement::r()) == Placement::p());
  CHECK(dual(Placement::p()) == Placement::r());
  CHECK(dual(Placement::p(ReduceOp::Avg)) == Placement::r());
  CHECK(dual(Placement::i()) == Placement::i());
  CHECK(dual(Placement::v()) == Placement::v());
  CHECK(dual(Placement::s(1)) == Placement::s(1));
}

TEST_CASE("VJP MatMul: column- and row-parallel") {
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8]}
  w: {shape: [8, 16], placement: {a: S(1)}, param: true}
ops:
  - {op: MatMul, in: [x, w], out: y}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "P(sum)"}, {"w.grad", "S(1)"}});
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [2, 4, 8], placement: {a: S(2)}}
  w: {shape: [8, 16], placement: {a: S(0)}, param: true}
ops:
  - {op: MatMul, in: [x, w], out: yp}
  - {op: AllReduce, in: [yp], out: y, axis: a, dst: I}
  - {op: Sum, in: [y], out: loss, dims: [0, 1, 2]}
loss: loss
)",
               {{"x.grad", "S(2)"}, {"w.grad", "S(0)"}}, {{"AllReduce", 0}, {"Convert", 1}});
  // a batched replicated operand against a batch shard: its gradient is the shard, made a pending sum
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8, 16], placement: {a: S(0)}}
  w: {shape: [4, 16, 32]}
ops:
  - {op: MatMul, in: [x, w], out: y}
  - {op: Sum, in: [y], out: loss, dims: [0, 1, 2]}
loss: loss
)",
               {{"x.grad", "S(0)"}, {"w.grad", "P(sum)"}}, {{"Convert", 2}});
}

TEST_CASE("a backward op runs on its forward op's stream") {
  Program p = load_program_string(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8]}
ops:
  - {op: GELU, in: [x], out: y, stream: side}
  - {op: Sum, in: [y], out: loss, dims: [0, 1], stream: side}
loss: loss
)",
                                  "t.yaml");
  SpatialTypes ty;
  SpatialOptions so;
  so.types = &ty;
  REQUIRE(check_spatial(p, so).empty());
  Program d = derive_backward(p, ty).program;
  REQUIRE(!d.backward.empty());
  for (const auto& op : d.backward) CHECK(d.name(op.attrs.stream) == "side");
}

TEST_CASE("VJP Add, Sub, Multiply with broadcasting and scalars") {
  for (const char* op : {"Add", "Sub", "Multiply"})
    expect_grads(std::string(kMesh) + "tensors:\n  x: {shape: [4, 8], placement: {a: S(0)}}\n  b: {shape: [8], param: true}\nops:\n  - {op: " + op +
                     ", in: [x, b], out: y}\n  - {op: Sum, in: [y], out: loss, dims: [0, 1]}\nloss: loss\n",
                 {{"x.grad", "S(0)"}, {"b.grad", "P(sum)"}});
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: S(0)}}
ops:
  - {op: Multiply, in: [x], out: y, scalar: 2}
  - {op: Add, in: [y], out: z, scalar: 1}
  - {op: Sum, in: [z], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "S(0)"}});
  // R with S: the replicated operand's gradient is each rank's slice in place, a pending sum
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: S(0)}}
  s: {shape: [4, 8], param: true}
ops:
  - {op: Multiply, in: [x, s], out: y}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "S(0)"}, {"s.grad", "P(sum)"}});
}

TEST_CASE("VJP pointwise: SiLU, GELU, ReLU, Dropout") {
  for (const char* op : {"SiLU", "GELU", "ReLU", "Dropout"})
    expect_grads(std::string(kMesh) + "tensors:\n  x: {shape: [4, 8], placement: {a: S(0)}}\nops:\n  - {op: " + op +
                     ", in: [x], out: y}\n  - {op: Sum, in: [y], out: loss, dims: [0, 1]}\nloss: loss\n",
                 {{"x.grad", "S(0)"}}, {{"PointwiseGrad", 1}});
  // a per-rank mask on a replicated input: each rank's contribution is a summand of the gradient
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8]}
ops:
  - {op: Dropout, in: [x], out: y, rng: per_rank, p: 0.1}
  - {op: AllReduce, in: [y], out: z, axis: a}
  - {op: Sum, in: [z], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "P(sum)"}});
}

TEST_CASE("VJP LayerNorm and RMSNorm: weight and bias gradients sum over the sharded tokens") {
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: S(0)}}
  w: {shape: [8], param: true}
  b: {shape: [8], param: true}
ops:
  - {op: LayerNorm, in: [x, w, b], out: y}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "S(0)"}, {"w.grad", "P(sum)"}, {"b.grad", "P(sum)"}}, {{"NormGrad", 1}});
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: I}}
  w: {shape: [8], placement: {a: I}, param: true}
ops:
  - {op: RMSNorm, in: [x, w], out: y}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "I"}, {"w.grad", "I"}});
}

TEST_CASE("VJP Softmax, Sum and Mean") {
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: S(0)}}
ops:
  - {op: Softmax, in: [x], out: y}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "S(0)"}});
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: S(1)}}
ops:
  - {op: Mean, in: [x], out: m, dims: [1]}
  - {op: Sum, in: [m], out: loss, dims: [0], keepdim: true}
loss: loss
)",
               {{"x.grad", "S(1)"}}, {{"Expand", 2}, {"Convert", 1}});
}

TEST_CASE("VJP FlashAttention: heads sharded, and q sequence-sharded with whole k, v") {
  expect_grads(std::string(kMesh) + R"(tensors:
  q: {shape: [2, 4, 8, 16], placement: {a: S(1)}}
  k: {shape: [2, 4, 8, 16], placement: {a: S(1)}}
  v: {shape: [2, 4, 8, 16], placement: {a: S(1)}}
ops:
  - {op: FlashAttention, in: [q, k, v], out: o, causal: true}
  - {op: Sum, in: [o], out: loss, dims: [0, 1, 2, 3]}
loss: loss
)",
               {{"q.grad", "S(1)"}, {"k.grad", "S(1)"}, {"v.grad", "S(1)"}}, {{"AttentionGrad", 3}});
  expect_grads(std::string(kMesh) + R"(tensors:
  q: {shape: [2, 4, 8, 16], placement: {a: S(2)}}
  k: {shape: [2, 4, 8, 16]}
  v: {shape: [2, 4, 8, 16]}
ops:
  - {op: FlashAttention, in: [q, k, v], out: o}
  - {op: Sum, in: [o], out: loss, dims: [0, 1, 2, 3]}
loss: loss
)",
               {{"q.grad", "S(2)"}, {"k.grad", "P(sum)"}, {"v.grad", "P(sum)"}});
}

TEST_CASE("VJP Embedding: vocab-parallel table and data-parallel ids") {
  expect_grads(std::string(kMesh) + R"(tensors:
  ids: {shape: [4, 8], dtype: i64}
  w: {shape: [32, 16], placement: {a: S(0)}, param: true}
ops:
  - {op: Embedding, in: [ids, w], out: ep}
  - {op: AllReduce, in: [ep], out: e, axis: a, dst: I}
  - {op: Sum, in: [e], out: loss, dims: [0, 1, 2]}
loss: loss
)",
               {{"w.grad", "S(0)"}}, {{"EmbeddingGrad", 1}});
  expect_grads(std::string(kMesh) + R"(tensors:
  ids: {shape: [4, 8], placement: {a: S(0)}, dtype: i64}
  w: {shape: [32, 16], param: true}
ops:
  - {op: Embedding, in: [ids, w], out: e}
  - {op: Sum, in: [e], out: loss, dims: [0, 1, 2]}
loss: loss
)",
               {{"w.grad", "P(sum)"}});
}

TEST_CASE("VJP CrossEntropyLoss: token-sharded and vocab-parallel") {
  expect_grads(std::string(kMesh) + R"(tensors:
  logits: {shape: [4, 32], placement: {a: S(0)}}
  labels: {shape: [4], placement: {a: S(0)}, dtype: i64}
ops:
  - {op: CrossEntropyLoss, in: [logits, labels], out: loss}
loss: loss
)",
               {{"logits.grad", "S(0)"}}, {{"CrossEntropyGrad", 1}});
  // the loss is whole over the vocab axis, so its gradient is P there and is reduced first
  expect_grads(std::string(kMesh) + R"(tensors:
  logits: {shape: [4, 32], placement: {a: S(1)}}
  labels: {shape: [4], dtype: i64}
ops:
  - {op: CrossEntropyLoss, in: [logits, labels], out: loss, vocab_parallel: true}
loss: loss
)",
               {{"logits.grad", "S(1)"}}, {{"AllReduce", 1}});
}

TEST_CASE("VJP TopKGate, Cast, LossScale, FP8Quantize, FP8Dequantize, Reshape, Transpose, SPMDGuard, Expand") {
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: S(0)}}
ops:
  - {op: TopKGate, in: [x], out: [w, idx], k: 2}
  - {op: Cast, in: [w], out: c, dtype: bf16}
  - {op: LossScale, in: [c], out: l, scale: 0.5}
  - {op: FP8Quantize, in: [l], out: q}
  - {op: FP8Dequantize, in: [q], out: dq}
  - {op: Reshape, in: [dq], out: r, shape: [8]}
  - {op: Reshape, in: [r], out: r2, shape: [4, 2]}
  - {op: Transpose, in: [r2], out: t, dims: [0, 1]}
  - {op: SPMDGuard, in: [t], out: g, placement: {a: S(1)}}
  - {op: Sum, in: [g], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "S(0)"}}, {{"TopKGrad", 1}, {"SPMDGuard", 1}});
  expect_grads(std::string(kMesh) + R"(tensors:
  b: {shape: [8], param: true}
  x: {shape: [4, 8], placement: {a: S(0)}}
ops:
  - {op: Expand, in: [b], out: e, shape: [4, 8]}
  - {op: Multiply, in: [e, x], out: y}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"b.grad", "P(sum)"}, {"x.grad", "S(0)"}});
}

TEST_CASE("VJP Sigmoid, CumSum, Detach, the masks and counts, and FlashAttention's scale") {
  // Sigmoid -> PointwiseGrad of Sigmoid; CumSum -> CumSum the other way; the Detach branch and the mask and count
  // branches give no gradient (the loss still reaches x through the first branch)
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: S(0)}, param: true}
  ids: {shape: [4], dtype: i64, placement: {a: S(0)}}
ops:
  - {op: Sigmoid, in: [x], out: s}
  - {op: CumSum, in: [s], out: c, dim: 1}
  - {op: Detach, in: [x], out: d}
  - {op: Gt, in: [x], out: m, scalar: 0}
  - {op: Cast, in: [m], out: mf, dtype: f32}
  - {op: Multiply, in: [c, d], out: cd}
  - {op: Multiply, in: [cd, mf], out: y}
  - {op: OneHot, in: [ids], out: oh, classes: 8, dtype: f32}
  - {op: Multiply, in: [y, oh], out: yo}
  - {op: Sum, in: [yo], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "S(0)"}}, {{"PointwiseGrad", 1}, {"CumSum", 1}});
  // the attention scale reaches every AttentionGrad
  Program p = load_program_string(std::string(kMesh) + R"(tensors:
  q: {shape: [1, 2, 4, 8], placement: {a: S(1)}, param: true}
  k: {shape: [1, 2, 4, 8], placement: {a: S(1)}, param: true}
  v: {shape: [1, 2, 4, 8], placement: {a: S(1)}, param: true}
ops:
  - {op: FlashAttention, in: [q, k, v], out: o, scale: 0.25}
  - {op: Sum, in: [o], out: loss, dims: [0, 1, 2, 3]}
loss: loss
)",
                                  "t.yaml");
  TrainingCheck r = check_training(p);
  REQUIRE(r.built);
  int grads = 0;
  for (std::size_t i = r.first_backward; i < r.program.ops.size(); ++i) {
    const Op& op = r.program.ops[i];
    if (op.kind != OpKind::AttentionGrad) continue;
    ++grads;
    CHECK(op.attrs.has_number);
    CHECK(op.attrs.number == 0.25);
  }
  CHECK(grads == 3);
}

TEST_CASE("VJP FP8 with scales: straight-through to the data, nothing to the scale or the amax") {
  // A per-rank scale (the amax of the a-shard, not reduced) on data that stays local: the gradient passes
  // through both ops; AmaxUpdate, FP8Scale and the scale get no gradient.
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: S(0)}}
  h: {shape: [4]}
ops:
  - {op: AmaxUpdate, in: [x], out: amax}
  - {op: AmaxHistory, in: [h, amax], out: h2}
  - {op: FP8Scale, in: [h2], out: s, margin: 1}
  - {op: FP8Quantize, in: [x, s], out: q, dtype: fp8_e5m2}
  - {op: FP8Dequantize, in: [q, s], out: dq}
  - {op: Sum, in: [dq], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "S(0)"}}, {{"AllReduce", 0}});
  // The FP8 all-gather of a weight with a shared scale: its backward is the reduce-scatter of the gradient.
  expect_grads(std::string(kMesh) + R"(tensors:
  w: {shape: [8, 4], placement: {a: S(0)}, param: true}
  x: {shape: [2, 8], placement: {a: S(0)}}
ops:
  - {op: AmaxUpdate, in: [w], out: amax}
  - {op: AllReduce, in: [amax], out: amax, axis: a, reduce: max}
  - {op: FP8Scale, in: [amax], out: s}
  - {op: FP8Quantize, in: [w, s], out: q}
  - {op: AllGather, in: [q], out: qf, axis: a, dim: 0}
  - {op: FP8Dequantize, in: [qf, s], out: wf}
  - {op: MatMul, in: [x, wf], out: y}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"w.grad", "S(0)"}}, {{"ReduceScatter", 1}});
}

TEST_CASE("VJP MoE: dispatch and combine are each other's gradient, the gate weights get MoEGateGrad, experts MatMul's") {
  const char* body = R"(mesh: {ep: 2, tp: 2}
tensors:
  x:      {shape: [8, 4], placement: {ep: S(0)}}
  router: {shape: [4, 4], param: true}
  w1:     {shape: [4, 4, 6], placement: {ep: S(0), tp: S(2)}, param: true}
  w2:     {shape: [4, 6, 4], placement: {ep: S(0), tp: S(1)}, param: true}
ops:
  - {op: MatMul, in: [x, router], out: logits}
  - {op: TopKGate, in: [logits], out: [gw, gi], k: 2}
  - {op: MoEDispatch, in: [x, gi], out: buf, axis: ep, buffer: [4, 8], dropless: true}
  - {op: ExpertCompute, in: [buf, w1], out: h}
  - {op: SiLU, in: [h], out: a}
  - {op: ExpertCompute, in: [a, w2], out: yb}
  - {op: MoECombine, in: [yb, gi, gw], out: yp, axis: ep}
  - {op: AllReduce, in: [yp], out: y, axis: tp, dst: I}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)";
  // The expert weights' gradients stay split over ep (the backward all-to-all summed every ep rank's tokens);
  // the router's is pending over ep (tokens) and tp (the experts' output was pending at the combine).
  expect_grads(body, {{"x.grad", "S(0),P(sum)"}, {"w1.grad", "S(0),S(2)"}, {"w2.grad", "S(0),S(1)"}, {"router.grad", "P(sum),P(sum)"}},
               {{"MoEDispatch", 1}, {"MoECombine", 1}, {"MoEGateGrad", 1}, {"TopKGrad", 1}});
}

TEST_CASE("VJP collectives map to their duals") {
  // AllReduce P -> I (Megatron's g): identity backward, typed I -> R
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: P}}
ops:
  - {op: AllReduce, in: [x], out: y, axis: a, dst: I}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "R"}}, {{"AllReduce", 0}, {"Convert", 1}});
  // AllGather <-> ReduceScatter
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: S(0)}}
ops:
  - {op: AllGather, in: [x], out: y, axis: a, dim: 0}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "S(0)"}}, {{"ReduceScatter", 1}});
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: S(0)}}
ops:
  - {op: AllGather, in: [x], out: y, axis: a, dim: 0, dst: I}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "S(0)"}}, {{"ReduceScatter", 0}, {"Convert", 2}});
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: P}}
ops:
  - {op: ReduceScatter, in: [x], out: y, axis: a, dim: 0}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "R"}}, {{"AllGather", 1}});
  // AllToAll to its transpose
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: S(1)}}
ops:
  - {op: AllToAll, in: [x], out: y, axis: a, split_dim: 0, concat_dim: 1}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "S(1)"}}, {{"AllToAll", 1}});
  // Broadcast <-> Reduce
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: V}}
ops:
  - {op: Broadcast, in: [x], out: y, axis: a, src: 0}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "V"}}, {{"Reduce", 1}});
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: P}}
ops:
  - {op: Reduce, in: [x], out: y, axis: a, dst: 0}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "R"}}, {{"Broadcast", 1}});
  // Scatter <-> Gather
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8]}
ops:
  - {op: Scatter, in: [x], out: y, axis: a, dim: 0}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "P(sum)"}}, {{"Gather", 1}});
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: S(0)}}
ops:
  - {op: Gather, in: [x], out: y, axis: a, dim: 0}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "S(0)"}}, {{"Scatter", 1}});
}

TEST_CASE("VJP conversions: Convert I->R (f) is an AllReduce, R->S(d) is S(d)->P, V<->P, Reinterpret R->P") {
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: I}}
  w: {shape: [8, 16], placement: {a: S(1)}, param: true}
ops:
  - {op: Convert, in: [x], out: xr, axis: a, to: R}
  - {op: MatMul, in: [xr, w], out: y}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "I"}, {"w.grad", "S(1)"}}, {{"AllReduce", 1}});
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8]}
ops:
  - {op: Convert, in: [x], out: y, axis: a, to: S(0)}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "P(sum)"}}, {{"AllGather", 0}});
  expect_grads(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8], placement: {a: V}}
  r: {shape: [4, 8]}
ops:
  - {op: Convert, in: [x], out: y, axis: a, to: P}
  - {op: Convert, in: [r], out: rv, axis: a, to: V}
  - {op: Multiply, in: [rv, x], out: rx}
  - {op: Convert, in: [rx], out: rp, axis: a, to: P}
  - {op: Add, in: [y, rp], out: z}
  - {op: Reinterpret, in: [r], out: rr, axis: a, to: P}
  - {op: Add, in: [z, rr], out: s}
  - {op: Sum, in: [s], out: loss, dims: [0, 1]}
loss: loss
)",
               {{"x.grad", "V"}, {"r.grad", "P(sum)"}});
}

TEST_CASE("ops without a VJP are a located error") {
  Program p = load_program_string(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8]}
  d: {shape: [4, 8]}
ops:
  - {op: PointwiseGrad, in: [d, x], out: y, of: GELU}
  - {op: Sum, in: [y], out: loss, dims: [0, 1]}
loss: loss
)",
                                  "t.yaml");
  try {
    check_training(p);
    FAIL("expected a LoadError");
  } catch (const LoadError& e) {
    CHECK(e.loc.line == 6);
    CHECK(std::string(e.what()).find("has no VJP") != std::string::npos);
  }
}

TEST_CASE("a value overwritten in place that the backward needs is a located error") {
  Program p = load_program_string(std::string(kMesh) + R"(tensors:
  x: {shape: [4, 8]}
  w: {shape: [8, 8], param: true}
ops:
  - {op: MatMul, in: [x, w], out: h}
  - {op: GELU, in: [h], out: h}
  - {op: Sum, in: [h], out: loss, dims: [0, 1]}
loss: loss
)",
                                  "t.yaml");
  CHECK_THROWS_AS(check_training(p), LoadError);
}

const char* kDp = R"(mesh: {dp: 2}
tensors:
  x: {shape: [4, 8], placement: {dp: S(0)}}
  w: {shape: [8, 8], param: true}
ops:
  - {op: MatMul, in: [x, w], out: y}
  - {op: Mean, in: [y], out: loss, dims: [0, 1]}
loss: loss
train: true
)";

TEST_CASE("unsynced-gradient: a replicated parameter's P gradient must be all-reduced before the optimizer") {
  Trained bad = train(kDp);
  CHECK(bad.ids == one("unsynced-gradient"));
  CHECK(bad.messages.find("parameter w is R over dp") != std::string::npos);
  // the loss is a per-rank mean (P(avg) over dp) and autograd seeds 1 on each rank's loss: DDP averages
  Trained ok = train(std::string(kDp) + "grad_sync:\n  - {op: AllReduce, in: [w.grad], out: w.grad, axis: dp, reduce: avg}\n");
  CHECK(ok.ids.empty());
  Trained summed = train(std::string(kDp) + "grad_sync:\n  - {op: AllReduce, in: [w.grad], out: w.grad, axis: dp}\n");
  CHECK(summed.ids == one("illegal-collective"));
  CHECK(summed.messages.find("P(avg) over dp") != std::string::npos);
  // a summed loss (P(sum) over dp) gives summands of a sum: AllReduce(sum) is right, avg is not
  std::string sum_loss = kDp;
  sum_loss.replace(sum_loss.find("Mean"), 4, "Sum");
  CHECK(train(sum_loss + "grad_sync:\n  - {op: AllReduce, in: [w.grad], out: w.grad, axis: dp}\n").ids.empty());
  CHECK(train(sum_loss + "grad_sync:\n  - {op: AllReduce, in: [w.grad], out: w.grad, axis: dp, reduce: avg}\n").ids == one("illegal-collective"));
  // all-reduced over the other axis only: still unsynced over dp
  Trained wrong = train(std::string("mesh: {dp: 2, tp: 2}\n") + std::string(kDp).substr(std::string(kDp).find("tensors")) +
                        "grad_sync:\n  - {op: AllReduce, in: [w.grad], out: w.grad, axis: tp, reduce: avg}\n");
  CHECK(wrong.ids == one("unsynced-gradient"));
  CHECK(wrong.messages.find("still P(avg) over dp") != std::string::npos);
  // the loss is R over tp: every tp rank seeds 1 on its own copy, so each holds the whole gradient and summing
  // over tp makes it tp times too large
  Trained tp_sum = train(std::string("mesh: {dp: 2, tp: 2}\n") + std::string(kDp).substr(std::string(kDp).find("tensors")) +
                         "grad_sync:\n  - {op: AllReduce, in: [w.grad], out: w.grad, axis: [dp, tp]}\n");
  CHECK(tp_sum.ids == one("illegal-collective"));
  // the fix names the AllReduce, the axis and where
  auto d = check_training(load_program_string(kDp, "t.yaml")).diags;
  REQUIRE(d.size() == 1);
  REQUIRE(d[0].notes.size() == 2);
  CHECK(d[0].notes[1].message ==
        "fix: insert {op: AllReduce, in: [w.grad], out: w.grad, axis: dp, reduce: avg} into `grad_sync:` (after the backward, before the optimizer step)");
}

const char* kSp = R"(mesh: {tp: 2}
tensors:
  x: {shape: [2, 8, 16], placement: {tp: S(1)}}
  ln: {shape: [16], param: true}
  w1: {shape: [16, 32], placement: {tp: S(1)}, param: true}
  w2: {shape: [32, 16], placement: {tp: S(0)}, param: true}
ops:
  - {op: LayerNorm, in: [x, ln], out: h}
  - {op: AllGather, in: [h], out: hf, axis: tp, dim: 1}
  - {op: MatMul, in: [hf, w1], out: a}
  - {op: MatMul, in: [a, w2], out: yp}
  - {op: ReduceScatter, in: [yp], out: y, axis: tp, dim: 1}
  - {op: Sum, in: [y], out: loss, dims: [0, 1, 2]}
loss: loss
)";

std::string hand(const char* ag_backward) {
  return std::string(kSp) + R"(backward:
  - {op: Reshape, in: [loss.grad], out: l1, shape: [1, 1, 1]}
  - {op: Expand, in: [l1], out: yw, shape: [2, 8, 16]}
  - {op: Convert, in: [yw], out: y.grad, axis: tp, to: S(1)}
  - {op: AllGather, in: [y.grad], out: yp.grad, axis: tp, dim: 1}
  - {op: Transpose, in: [w2], out: w2t, dims: [-1, -2]}
  - {op: MatMul, in: [yp.grad, w2t], out: a.grad}
  - {op: Transpose, in: [w1], out: w1t, dims: [-1, -2]}
  - {op: MatMul, in: [a.grad, w1t], out: hf.grad}
  - )" + std::string(ag_backward) + R"(
  - {op: NormGrad, in: [h.grad, x, ln], out: x.grad, of: LayerNorm}
  - {op: LayerNorm, in: [x], out: xh}
  - {op: Multiply, in: [h.grad, xh], out: lg}
  - {op: Sum, in: [lg], out: ln.grad, dims: [0, 1]}
grad_sync:
  - {op: AllReduce, in: [ln.grad], out: ln.grad, axis: tp}
)";
}

TEST_CASE("hand-written backward: duals pass, a non-dual, missing or extra collective is gradient-duality") {
  CHECK(train(hand("{op: ReduceScatter, in: [hf.grad], out: h.grad, axis: tp, dim: 1}")).ids.empty());
  Trained ag = train(hand("{op: AllGather, in: [hf.grad], out: h.grad, axis: tp, dim: 1}"));
  CHECK(ag.ids == one("gradient-duality"));
  CHECK(ag.messages.find("its dual is ReduceScatter over tp (dim 1)") != std::string::npos);
  Trained wrong_dim = train(hand("{op: ReduceScatter, in: [hf.grad], out: h.grad, axis: tp, dim: 0}"));
  CHECK(wrong_dim.ids == one("gradient-duality"));
  Trained missing = train(hand("{op: Convert, in: [hf.grad], out: h.grad, axis: tp, to: S(1)}"));
  CHECK(missing.ids.count("gradient-duality"));
  CHECK(missing.messages.find("no dual of this AllGather") != std::string::npos);
  std::string extra = hand("{op: ReduceScatter, in: [hf.grad], out: h.grad, axis: tp, dim: 1}");
  extra.insert(extra.find("  - {op: NormGrad"), "  - {op: AllReduce, in: [w1t], out: w1t2, axis: tp}\n");
  Trained ex = train(extra);
  CHECK(ex.ids == one("gradient-duality"));
  CHECK(ex.messages.find("dual of no forward collective") != std::string::npos);
}

TEST_CASE("the derived backward of the sequence-parallel block: the LayerNorm weight gradient is P over tp") {
  Trained t = train(std::string(kSp) + "train: true\n");
  CHECK(t.ids == one("unsynced-gradient"));
  CHECK(t.grads["ln.grad"] == "P(sum)");
  CHECK(t.grads["w1.grad"] == "S(1)");
  CHECK(t.grads["w2.grad"] == "S(0)");
  CHECK(train(std::string(kSp) + "train: true\ngrad_sync:\n  - {op: AllReduce, in: [ln.grad], out: ln.grad, axis: tp}\n").ids.empty());
}

TEST_CASE("loss-scaling: the LossScale normalization covers exactly the axes the loss is P over") {
  const char* base = R"(mesh: {dp: 2, cp: 2}
tensors:
  lg: {shape: [4, 8, 16], placement: {dp: S(0), cp: S(1)}}
  lb: {shape: [4, 8], placement: {dp: S(0), cp: S(1)}, dtype: i64}
ops:
  - {op: CrossEntropyLoss, in: [lg, lb], out: l}
)";
  CHECK(ids(std::string(base) + "  - {op: LossScale, in: [l], out: loss, scale: 0.25, axis: [dp, cp]}\n").empty());
  CHECK(ids(std::string(base) + "  - {op: LossScale, in: [l], out: loss, scale: 0.5, axis: dp}\n") == one("loss-scaling"));
  CHECK(ids(std::string(base) + "  - {op: AllReduce, in: [l], out: r, axis: cp, reduce: avg}\n  - {op: LossScale, in: [r], out: loss, scale: 0.25, axis: [dp, cp]}\n") ==
        one("loss-scaling"));
  CHECK(ids(std::string(base) + "  - {op: LossScale, in: [l], out: loss, scale: 0.5}\n").empty());  // no stated normalization
}

TEST_CASE("training keys: located errors for a missing loss and unknown names") {
  Loc l;
  CHECK(load_error("mesh: {a: 2}\ntensors:\n  x: {shape: [2]}\nops: []\ntrain: true\n", &l).find("needs a `loss:`") != std::string::npos);
  CHECK(l.line == 5);
  CHECK(load_error("mesh: {a: 2}\ntensors:\n  x: {shape: [2]}\nops: []\nloss: lose\n", &l).find("did you mean 'x'") == std::string::npos);
  CHECK(load_error("mesh: {a: 2}\ntensors:\n  loss: {shape: [2]}\nops: []\nloss: lose\n", &l).find("did you mean 'loss'") != std::string::npos);
  std::string e = load_error("mesh: {a: 2}\ntensors:\n  loss: {shape: [2]}\nops: []\nloss: loss\nbackward:\n  - {op: Cast, in: [los.grad], out: g, dtype: f32}\n", &l);
  CHECK(e.find("reads 'los.grad'") != std::string::npos);
  CHECK(e.find("did you mean 'loss.grad'") != std::string::npos);
  CHECK(l.line == 7);
  CHECK(load_error("mesh: {a: 2}\nops: []\nbackward: []\n", &l).find("needs a `loss:`") != std::string::npos);
}

TEST_CASE("spmdcheck backward prints a program that loads and checks like the original") {
  Program p = load_program_string(std::string(kSp) + "grad_sync:\n  - {op: AllReduce, in: [ln.grad], out: ln.grad, axis: tp}\n", "t.yaml");
  SpatialTypes ty;
  SpatialOptions so;
  so.types = &ty;
  REQUIRE(check_spatial(p, so).empty());
  std::string text = print_program(derive_backward(p, ty).program);
  Program back = load_program_string(text, "printed.yaml");
  CHECK(back.has_backward);
  CHECK(back.backward.size() > 10);
  CHECK(check_training(back).diags.empty());
  CHECK(print_program(back) == text);
  std::ostringstream out, err;
  CHECK(run_cli({"check", "--backward", SPMD_SOURCE_DIR "/examples/tp/mlp.yaml"}, out, err) == 2);  // no loss
  CHECK(out.str().find("needs a `loss:`") != std::string::npos);
}

// check_training_in_place turns the program itself into the step; restore_forward gives the forward back
// as it was (the printed text, the names and their table), with check_training's findings, also after a LoadError.
TEST_CASE("training in place: the same findings as check_training, and the forward given back unchanged") {
  std::vector<std::string> programs = {std::string(kSp) + "train: true\n", std::string(kDp),
                                       hand("{op: AllGather, in: [hf.grad], out: h.grad, axis: tp, dim: 1}"),
                                       hand("{op: ReduceScatter, in: [hf.grad], out: h.grad, axis: tp, dim: 1}")};
  for (const auto& yaml : programs) {
    Program p = load_program_string(yaml, "t.yaml");
    std::string before = print_program(p);
    std::size_t names = p.names.size(), ops = p.ops.size(), tensors = p.tensors.size();
    std::size_t seed_named = p.name_ids.count(p.name(p.loss) + ".grad");
    TrainingCheck copy = check_training(p);
    ForwardUndo undo;
    TrainingCheck in_place = check_training_in_place(p, undo);
    CHECK(in_place.built == copy.built);
    if (copy.built) CHECK(p.ops.size() == copy.program.ops.size());
    REQUIRE(in_place.diags.size() == copy.diags.size());
    for (std::size_t i = 0; i < copy.diags.size(); ++i) {
      CHECK(in_place.diags[i].message == copy.diags[i].message);
      CHECK(in_place.diags[i].op == copy.diags[i].op);
    }
    restore_forward(p, undo);
    CHECK(print_program(p) == before);
    CHECK(p.names.size() == names);
    CHECK(p.ops.size() == ops);
    CHECK(p.tensors.size() == tensors);
    for (std::size_t n = 0; n < p.names.size(); ++n) CHECK(p.name_ids.find(p.names[n])->second == static_cast<NameId>(n));
    CHECK(p.name_ids.count(p.name(p.loss) + ".grad") == seed_named);
  }
  // An op with no VJP: the LoadError leaves, and the program is the forward again.
  Program p = load_program_string("mesh: {a: 2}\ntensors:\n  x: {shape: [4]}\nops:\n  - {op: Exp, in: [x], out: e}\n  - {op: ReduceMax, in: [e], out: "
                                  "m, dims: [0]}\nloss: m\ntrain: true\n",
                                  "t.yaml");
  std::string before = print_program(p);
  ForwardUndo undo;
  CHECK_THROWS_AS(check_training_in_place(p, undo), LoadError);
  CHECK(print_program(p) == before);
  CHECK(p.names.size() == 3);
}

}  // namespace spmd::test
