// bench/generator.h - builds transformer-like SPMD programs in memory (and as YAML text).
//
// One layer is a Megatron tensor-parallel block on a dp x tp mesh: LayerNorm, column-parallel
// q/k/v, head reshapes, FlashAttention over sharded heads, row-parallel output projection with its
// AllReduce, residual, LayerNorm, column/row-parallel MLP with GELU and AllReduce, residual
// (22 ops). Every program it makes is correct: the checker must report nothing.
#pragma once
#include <string>
#include <vector>

#include "ir/program.h"

namespace spmd::bench {

struct GenOptions {
  int layers = 1;
  int dp = 2, tp = 4;
  int batch = 8, seq = 512, hidden = 1024, heads = 16;
};

class Builder {
 public:
  explicit Builder(Program& p) : p_(p) {}
  NameId name(const std::string& n) { return p_.intern(n); }
  ExprId c(std::int64_t v) { return p_.exprs.constant(v); }
  void tensor(const std::string& n, std::vector<std::int64_t> shape, Placements pl) {
    TensorDecl t;
    t.name = name(n);
    for (auto d : shape) t.shape.push_back(c(d));
    t.placement = pl;
    p_.tensors.push_back(std::move(t));
  }
  Op& op(OpKind k, std::vector<NameId> ins, std::vector<NameId> outs) {
    Op o;
    o.kind = k;
    o.loc = {static_cast<std::uint32_t>(p_.ops.size() + 1), 5};
    return p_.add_op(o, ins, outs);
  }
  std::uint32_t ints(std::vector<int> v) {
    p_.int_lists.push_back(std::move(v));
    return static_cast<std::uint32_t>(p_.int_lists.size() - 1);
  }
  std::uint32_t shape(std::vector<std::int64_t> s) {
    std::vector<ExprId> e;
    for (auto d : s) e.push_back(c(d));
    p_.shapes.push_back(std::move(e));
    return static_cast<std::uint32_t>(p_.shapes.size() - 1);
  }

 private:
  Program& p_;
};

inline Program make_transformer(const GenOptions& g) {
  Program p;
  p.file = "generated.yaml";
  p.mesh.push_back({"dp", p.exprs.constant(g.dp), {}});
  p.mesh.push_back({"tp", p.exprs.constant(g.tp), {}});
  Builder b(p);
  const int B = g.batch, S = g.seq, H = g.hidden, NH = g.heads, D = H / NH, F = 4 * H;
  Placements dp0{Placement::s(0), Placement::r()};
  Placements rr{};
  Placements col{Placement::r(), Placement::s(1)};
  Placements row{Placement::r(), Placement::s(0)};
  b.tensor("x_in", {B, S, H}, dp0);
  std::uint32_t last = b.ints({-1});
  std::uint32_t split = b.shape({B, S, NH, D});
  std::uint32_t merge = b.shape({B, S, H});
  std::uint32_t swap12 = b.ints({1, 2});
  auto axis_tp = [](Op& o) { o.attrs.axes = 1u << 1; };
  std::string x = "x_in";
  for (int l = 0; l < g.layers; ++l) {
    std::string L = std::to_string(l);
    auto n = [&](const char* s) { return b.name(std::string(s) + L); };
    b.tensor("ln1_w" + L, {H}, rr);
    b.tensor("ln1_b" + L, {H}, rr);
    b.tensor("ln2_w" + L, {H}, rr);
    b.tensor("ln2_b" + L, {H}, rr);
    for (const char* w : {"wq", "wk", "wv"}) b.tensor(w + L, {H, H}, col);
    b.tensor("wo" + L, {H, H}, row);
    b.tensor("w1" + L, {H, F}, col);
    b.tensor("w2" + L, {F, H}, row);
    b.op(OpKind::LayerNorm, {b.name(x), n("ln1_w"), n("ln1_b")}, {n("h")}).attrs.dims = last;
    const char* proj[3][4] = {{"wq", "q2_", "q4_", "q_"}, {"wk", "k2_", "k4_", "k_"}, {"wv", "v2_", "v4_", "v_"}};
    for (auto& pr : proj) {
      b.op(OpKind::MatMul, {n("h"), n(pr[0])}, {n(pr[1])});
      b.op(OpKind::Reshape, {n(pr[1])}, {n(pr[2])}).attrs.shape = split;
      b.op(OpKind::Transpose, {n(pr[2])}, {n(pr[3])}).attrs.dims = swap12;
    }
    b.op(OpKind::FlashAttention, {n("q_"), n("k_"), n("v_")}, {n("ctx")}).attrs.causal = true;
    b.op(OpKind::Transpose, {n("ctx")}, {n("ctx_t")}).attrs.dims = swap12;
    b.op(OpKind::Reshape, {n("ctx_t")}, {n("ctx_m")}).attrs.shape = merge;
    b.op(OpKind::MatMul, {n("ctx_m"), n("wo")}, {n("attn_p")});
    axis_tp(b.op(OpKind::AllReduce, {n("attn_p")}, {n("attn")}));
    b.op(OpKind::Add, {b.name(x), n("attn")}, {n("r1_")});
    b.op(OpKind::LayerNorm, {n("r1_"), n("ln2_w"), n("ln2_b")}, {n("h2_")}).attrs.dims = last;
    b.op(OpKind::MatMul, {n("h2_"), n("w1")}, {n("f1_")});
    b.op(OpKind::GELU, {n("f1_")}, {n("g_")});
    b.op(OpKind::MatMul, {n("g_"), n("w2")}, {n("f2p_")});
    axis_tp(b.op(OpKind::AllReduce, {n("f2p_")}, {n("f2_")}));
    b.op(OpKind::Add, {n("r1_"), n("f2_")}, {n("x")});
    x = "x" + L;
  }
  OutputDecl out;
  out.name = b.name(x);
  out.has_placement = true;
  out.placement = dp0;
  p.outputs.push_back(out);
  return p;
}

}  // namespace spmd::bench

namespace spmd::bench {

// make_transformer as a training program: every weight is a parameter, the loss is the mean of the
// last activations (P(avg) over dp, I over tp), and grad_sync averages each parameter gradient over dp
// (and sums over tp the LayerNorm weights', which are R over tp and see tp-partial gradients). Correct.
inline Program make_training(const GenOptions& g) {
  Program p = make_transformer(g);
  Builder b(p);
  for (auto& t : p.tensors) t.param = p.name(t.name) != "x_in";
  NameId last = p.outputs.back().name;
  p.outputs.clear();
  Op mean;
  mean.kind = OpKind::Mean;
  mean.loc = {static_cast<std::uint32_t>(p.ops.size() + 1), 5};
  mean.attrs.dims = b.ints({0, 1, 2});
  // The loss is the mean of the last row-parallel AllReduce's output, made invariant over tp (Megatron's g,
  // dst: I; the residual Add after it is dropped, it would mix I with R): a loss replicated over tp (R) would
  // make every gradient tp times too large.
  for (std::size_t k = p.ops.size(); k-- > 0;)
    if (p.ops[k].kind == OpKind::AllReduce) {
      p.ops[k].attrs.dst_invariant = true;
      last = p.outs(p.ops[k])[0];
      p.ops.resize(k + 1);
      break;
    }
  NameId loss = b.name("loss");
  p.add_op(mean, std::vector<NameId>{last}, std::vector<NameId>{loss});
  p.loss = loss;
  p.train = true;
  p.has_grad_sync = true;
  for (const auto& t : p.tensors) {
    if (!t.param) continue;
    NameId gr = b.name(p.name(t.name) + ".grad");
    // The mean loss makes every gradient pending an average over dp.
    Op ar;
    ar.kind = OpKind::AllReduce;
    ar.attrs.axes = 1u;
    ar.attrs.rop = ReduceOp::Avg;
    p.add_op(p.grad_sync, ar, std::vector<NameId>{gr}, std::vector<NameId>{gr});
    if (t.placement[1].is_r()) {  // the LayerNorm weights, R over tp, get tp-partial gradients: summed over tp
      ar.attrs.axes = 2u;
      ar.attrs.rop = ReduceOp::Sum;
      p.add_op(p.grad_sync, ar, std::vector<NameId>{gr}, std::vector<NameId>{gr});
    }
  }
  return p;
}

// An overlap program: `layers` steps of a data-parallel backward where each layer's weight gradient is
// all-reduced asynchronously (in place) while the next layer's backward runs on the compute stream, with a
// side stream doing independent work; all Waits come before the optimizer step. 8 ops per layer; correct.
inline Program make_overlap(int layers) {
  Program p;
  p.file = "overlap.yaml";
  p.mesh.push_back({"dp", p.exprs.constant(8), {}});
  Builder b(p);
  Placements dp0{Placement::s(0)};
  Placements rr{};
  b.tensor("d0", {64, 64}, dp0);
  std::uint32_t swap = b.ints({0, 1});
  NameId side = b.name("side");
  std::vector<NameId> handles;
  for (int l = 0; l < layers; ++l) {
    std::string L = std::to_string(l);
    auto n = [&](const char* s) { return b.name(std::string(s) + L); };
    b.tensor("a" + L, {64, 64}, dp0);
    b.tensor("w" + L, {64, 64}, rr);
    b.op(OpKind::Transpose, {n("a")}, {n("at")}).attrs.dims = swap;
    b.op(OpKind::MatMul, {n("at"), l == 0 ? b.name("d0") : b.name("d" + std::to_string(l))}, {n("g")});
    Op& ar = b.op(OpKind::AllReduce, {n("g")}, {n("g")});
    ar.attrs.axes = 1;
    ar.attrs.handle = n("h");
    handles.push_back(n("h"));
    b.op(OpKind::MatMul, {l == 0 ? b.name("d0") : b.name("d" + std::to_string(l)), n("w")}, {b.name("d" + std::to_string(l + 1))});
    b.op(OpKind::GELU, {n("a")}, {n("s")}).attrs.stream = side;
    b.op(OpKind::ReLU, {n("s")}, {n("s2")}).attrs.stream = side;
    Op& w = b.op(OpKind::Wait, {}, {});
    w.attrs.handle = n("h");
    b.op(OpKind::Sub, {n("w"), n("g")}, {n("w")});
  }
  return p;
}

}  // namespace spmd::bench

namespace spmd::bench {

// A pipeline program: `stages` per-rank programs on a pp x dp mesh (dp symmetric), GPipe order,
// `microbatches` forwards then as many backwards. Each stage receives its activation (async Recv on
// the comm stream, then Wait), computes on the compute stream, sends forward with an isend; the
// backward mirrors it; every isend is waited before the step ends, and the weight gradient is
// all-reduced over dp at the end. About 12 ops per microbatch per stage; correct under both models.
inline Program make_pipeline(int stages, int microbatches) {
  Program p;
  p.file = "pipeline.yaml";
  p.per_rank = true;
  p.mesh.push_back({"pp", p.exprs.constant(stages), {}});
  p.mesh.push_back({"dp", p.exprs.constant(4), {}});
  Builder b(p);
  Placements rr{};
  Placements dpp{Placement::r(), Placement::p()};
  b.tensor("x", {16, 64}, rr);
  b.tensor("w", {64, 64}, rr);
  b.tensor("gw", {64, 64}, dpp);
  auto peer = [&](int s) {
    p.coords.push_back({{0, s}});
    return static_cast<std::uint32_t>(p.coords.size() - 1);
  };
  for (int s = 0; s < stages; ++s) {
    RankProgram rp;
    rp.selector = {{0, s}};
    rp.first_op = static_cast<std::uint32_t>(p.ops.size());
    std::uint32_t prev = s > 0 ? peer(s - 1) : kNoIndex, next = s + 1 < stages ? peer(s + 1) : kNoIndex;
    std::vector<NameId> sends;
    auto wait = [&](NameId h) { b.op(OpKind::Wait, {}, {}).attrs.handle = h; };
    // An async receive waited at once, and an isend waited at the end of the step.
    auto recv = [&](NameId into, std::uint32_t from, NameId h) {
      Op& r = b.op(OpKind::Recv, {}, {into});
      r.attrs.coords = from;
      r.attrs.handle = h;
      wait(h);
    };
    auto send = [&](NameId what, std::uint32_t to, NameId h) {
      Op& sd = b.op(OpKind::Send, {what}, {});
      sd.attrs.coords = to;
      sd.attrs.handle = h;
      sends.push_back(h);
    };
    for (int m = 0; m < microbatches; ++m) {
      std::string M = std::to_string(m);
      NameId in = b.name("x");
      if (prev != kNoIndex) {
        in = b.name("a_in" + M);
        recv(in, prev, b.name("hr" + M));
      }
      b.op(OpKind::MatMul, {in, b.name("w")}, {b.name("z" + M)});
      b.op(OpKind::GELU, {b.name("z" + M)}, {b.name("a_out" + M)});
      if (next != kNoIndex) {
        send(b.name("a_out" + M), next, b.name("hs" + M));
      }
    }
    for (int m = 0; m < microbatches; ++m) {
      std::string M = std::to_string(m);
      NameId g = b.name("a_out" + M);
      if (next != kNoIndex) {
        g = b.name("g_in" + M);
        recv(g, next, b.name("hgr" + M));
      }
      b.op(OpKind::Multiply, {g, b.name("z" + M)}, {b.name("dz" + M)});
      b.op(OpKind::MatMul, {b.name("dz" + M), b.name("w")}, {b.name("g_out" + M)});
      if (prev != kNoIndex) {
        send(b.name("g_out" + M), prev, b.name("hgs" + M));
      }
    }
    for (NameId h : sends) wait(h);
    Op& ar = b.op(OpKind::AllReduce, {b.name("gw")}, {b.name("gw_sum")});
    ar.attrs.axes = 2;
    rp.n_ops = static_cast<std::uint32_t>(p.ops.size()) - rp.first_op;
    p.programs.push_back(rp);
  }
  return p;
}

}  // namespace spmd::bench

namespace spmd::bench {

// A transformer whose every layer has its own symbolic hidden size (a model assembled from differently
// sized blocks): on a dp x tp mesh with tp = T in {1, 2, 4, 8} and NH in {8, 16, 32} heads, layer l has
// hidden size H<l> (a multiple of 64, at least 64) and head_dim H<l>/NH. Per layer: q/k/v projections, the
// heads split and merge reshapes (exact division and element-count obligations), FlashAttention, the output
// projection, a column/row-parallel MLP of width 4*H<l> over tp with its AllReduce, and a residual add
// (17 ops). Correct for every allowed size, so the checker must prove every obligation and report nothing.
// With `wrong`, the last layer's hidden size is only a multiple of 4 (H = 4, NH = 8 is not an exact split).
// With `z3`, every layer also declares a tensor of length H<l> - 32, whose positivity (H<l> >= 64) no
// arithmetic shortcut proves: one Z3 query per layer, to time the solver path.
inline Program make_symbolic(int layers, bool wrong = false, bool z3 = false) {
  Program p;
  p.file = "symbolic.yaml";
  auto var = [&](const std::string& n, std::int64_t mn, std::int64_t mx, std::int64_t mult, std::vector<std::int64_t> in) {
    SizeVar v;
    v.name = n;
    v.min = mn, v.max = mx, v.multiple_of = mult, v.in = std::move(in);
    p.vars.push_back(v);
    ExprId e = p.exprs.var(static_cast<int>(p.vars.size() - 1));
    p.sizes[n] = e;
    return e;
  };
  ExprId T = var("T", 1, kMaxSize, 1, {1, 2, 4, 8});
  ExprId NH = var("NH", 1, kMaxSize, 1, {8, 16, 32});
  p.mesh.push_back({"dp", p.exprs.constant(2), {}});
  p.mesh.push_back({"tp", T, {}});
  Builder b(p);
  // Small batch and sequence: the obligations are the same, and the numeric oracle can run the test copies.
  ExprId B = p.exprs.constant(2), S = p.exprs.constant(8), four = p.exprs.constant(4);
  Placements dp0{Placement::s(0), Placement::r()};
  Placements rr{};
  Placements col{Placement::r(), Placement::s(1)};
  Placements row{Placement::r(), Placement::s(0)};
  auto tensor = [&](const std::string& n, std::vector<ExprId> shape, Placements pl) {
    TensorDecl t;
    t.name = b.name(n);
    t.shape = std::move(shape);
    t.placement = pl;
    p.tensors.push_back(std::move(t));
  };
  auto shape = [&](std::vector<ExprId> s) {
    p.shapes.push_back(std::move(s));
    return static_cast<std::uint32_t>(p.shapes.size() - 1);
  };
  std::uint32_t swap12 = b.ints({1, 2});
  for (int l = 0; l < layers; ++l) {
    std::string L = std::to_string(l);
    bool bad = wrong && l + 1 == layers;
    ExprId H = var("H" + L, bad ? 4 : 64, 1 << 16, bad ? 4 : 64, {});
    ExprId D = p.exprs.div(H, NH), F = p.exprs.mul(four, H);
    auto n = [&](const char* s) { return b.name(std::string(s) + L); };
    tensor("x" + L, {B, S, H}, dp0);
    if (z3) tensor("pad" + L, {p.exprs.sub(H, p.exprs.constant(32))}, rr);
    for (const char* w : {"wq", "wk", "wv", "wo"}) tensor(w + L, {H, H}, rr);
    tensor("w1" + L, {H, F}, col);
    tensor("w2" + L, {F, H}, row);
    std::uint32_t split = shape({B, S, NH, D}), merge = shape({B, S, H});
    const char* proj[3][4] = {{"wq", "q2_", "q4_", "q_"}, {"wk", "k2_", "k4_", "k_"}, {"wv", "v2_", "v4_", "v_"}};
    for (auto& pr : proj) {
      b.op(OpKind::MatMul, {n("x"), n(pr[0])}, {n(pr[1])});
      b.op(OpKind::Reshape, {n(pr[1])}, {n(pr[2])}).attrs.shape = split;
      b.op(OpKind::Transpose, {n(pr[2])}, {n(pr[3])}).attrs.dims = swap12;
    }
    b.op(OpKind::FlashAttention, {n("q_"), n("k_"), n("v_")}, {n("ctx")}).attrs.causal = true;
    b.op(OpKind::Transpose, {n("ctx")}, {n("ctx_t")}).attrs.dims = swap12;
    b.op(OpKind::Reshape, {n("ctx_t")}, {n("ctx_m")}).attrs.shape = merge;
    b.op(OpKind::MatMul, {n("ctx_m"), n("wo")}, {n("attn")});
    b.op(OpKind::Add, {n("x"), n("attn")}, {n("r")});
    b.op(OpKind::MatMul, {n("r"), n("w1")}, {n("f1_")});
    b.op(OpKind::GELU, {n("f1_")}, {n("g_")});
    b.op(OpKind::MatMul, {n("g_"), n("w2")}, {n("f2p_")});
    b.op(OpKind::AllReduce, {n("f2p_")}, {n("f2_")}).attrs.axes = 1u << 1;
    b.op(OpKind::Add, {n("r"), n("f2_")}, {n("y")});
    OutputDecl out;
    out.name = n("y");
    out.has_placement = true;
    out.placement = dp0;
    p.outputs.push_back(out);
  }
  return p;
}

}  // namespace spmd::bench

namespace spmd::bench {

// Per-rank programs with rank-local names: a `ranks`-stage pipeline (`mesh: {pp: ranks}`), one program
// per stage, each with its own weight w<r> and its own value names (a<r>, z<r>, ...), as a generator
// that writes one program per rank does. Forward: receive the activation from the previous stage (the
// first stage reads its input), MatMul and GELU, send to the next; backward: receive the gradient from
// the next stage (the last stage starts from its output), Multiply and MatMul, send it back. 7-8 ops per
// rank, blocking point-to-point (no handles); correct under both models.
inline Program make_rank_local(int ranks) {
  Program p;
  p.file = "rank_local.yaml";
  p.per_rank = true;
  p.mesh.push_back({"pp", p.exprs.constant(ranks), {}});
  Builder b(p);
  Placements rr{};
  b.tensor("x", {16, 64}, rr);
  auto peer = [&](int s) {
    p.coords.push_back({{0, s}});
    return static_cast<std::uint32_t>(p.coords.size() - 1);
  };
  for (int r = 0; r < ranks; ++r) b.tensor("w" + std::to_string(r), {64, 64}, rr);
  for (int r = 0; r < ranks; ++r) {
    std::string R = std::to_string(r);
    auto n = [&](const char* s) { return b.name(std::string(s) + R); };
    RankProgram rp;
    rp.selector = {{0, r}};
    rp.first_op = static_cast<std::uint32_t>(p.ops.size());
    NameId in = b.name("x");
    if (r > 0) {
      in = n("a_in");
      b.op(OpKind::Recv, {}, {in}).attrs.coords = peer(r - 1);
    }
    b.op(OpKind::MatMul, {in, n("w")}, {n("z")});
    b.op(OpKind::GELU, {n("z")}, {n("a_out")});
    if (r + 1 < ranks) b.op(OpKind::Send, {n("a_out")}, {}).attrs.coords = peer(r + 1);
    NameId g = n("a_out");
    if (r + 1 < ranks) {
      g = n("g_in");
      b.op(OpKind::Recv, {}, {g}).attrs.coords = peer(r + 1);
    }
    b.op(OpKind::Multiply, {g, n("z")}, {n("dz")});
    b.op(OpKind::MatMul, {n("dz"), n("w")}, {n("g_out")});
    if (r > 0) b.op(OpKind::Send, {n("g_out")}, {}).attrs.coords = peer(r - 1);
    rp.n_ops = static_cast<std::uint32_t>(p.ops.size()) - rp.first_op;
    p.programs.push_back(rp);
  }
  return p;
}

}  // namespace spmd::bench
