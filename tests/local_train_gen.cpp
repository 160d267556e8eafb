// tests/local_train_gen.cpp - random local-view training steps with a hand-written backward (tests/local_train_gen.h).
//
// Megatron's tensor-parallel MLP blocks as their ranks run them: ColumnParallelLinear (w1 S(1) over tp) behind the
// f operator (forward identity, backward AllReduce over tp), an activation, RowParallelLinear (w2 S(0) over tp)
// followed by the g operator (forward AllReduce over tp, backward identity), an optional residual; data parallel
// rows when the mesh has dp. The loss is each rank's mean (or sum) of y*y over its rows; grad_sync averages (sums)
// every weight gradient over dp. The backward is written op by op as a Megatron author writes it; a mistake, when
// drawn, is one a hand-written backward makes.
#include "tests/local_train_gen.h"

#include <fmt/format.h>

#include <random>
#include <vector>

namespace spmd::test {

namespace {

struct Gen {
  std::mt19937_64 rng;
  bool dp = false, mean = true, want_bug = false;
  int tp = 2, B = 4, H = 4, F = 8;
  std::string mistake;
  std::string tensors, fwd, bwd, sync, spec;

  explicit Gen(std::uint64_t seed) : rng(seed * 0x2545f4914f6cdd1dULL + 11) {}
  int pick(int k) { return static_cast<int>(rng() % static_cast<std::uint64_t>(k)); }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
  bool inject(const char* what) {
    if (!want_bug || !mistake.empty() || !coin(0.3)) return false;
    mistake = what;
    return true;
  }
  int rows() const { return dp ? B / 2 : B; }
};

}  // namespace

LocalTrainProgram generate_local_train(std::uint64_t seed) {
  Gen g(seed);
  g.dp = g.coin(0.5);
  g.tp = g.coin(0.25) ? 4 : 2;
  g.mean = g.coin(0.7);
  g.want_bug = g.coin(0.5);
  g.B = 4 << g.pick(2);
  g.H = 4;
  g.F = g.tp * (2 << g.pick(2));
  const int layers = 1 + g.pick(3);
  const int Bl = g.rows(), Fl = g.F / g.tp;
  g.tensors += fmt::format("  x: {{shape: [{}, {}]{}}}\n", g.B, g.H, g.dp ? ", placement: {dp: S(0)}" : "");
  struct Layer {
    std::string act;  // "", GELU, SiLU
    bool residual = false;
  };
  std::vector<Layer> ls(static_cast<std::size_t>(layers));
  std::string in = "x", sin = "x";
  for (int l = 0; l < layers; ++l) {
    Layer& L = ls[static_cast<std::size_t>(l)];
    L.act = g.pick(3) == 0 ? "" : g.coin(0.5) ? "GELU" : "SiLU";
    L.residual = g.coin(0.5);
    g.tensors += fmt::format("  w1_{0}: {{shape: [{1}, {2}], placement: {{tp: S(1)}}, param: true}}\n", l, g.H, g.F);
    g.tensors += fmt::format("  w2_{0}: {{shape: [{1}, {2}], placement: {{tp: S(0)}}, param: true}}\n", l, g.F, g.H);
    std::string h = fmt::format("h{}", l), a = fmt::format("a{}", l), yp = fmt::format("yp{}", l), y = fmt::format("y{}", l), o = fmt::format("o{}", l);
    g.fwd += fmt::format("  - {{op: MatMul, in: [{}, w1_{}], out: {}}}\n", in, l, h);
    g.spec += fmt::format("    - {{op: MatMul, in: [{}, w1_{}], out: {}}}\n", sin, l, h);
    if (L.act.empty()) {
      g.fwd += fmt::format("  - {{op: Multiply, in: [{}], out: {}, scalar: 1}}\n", h, a);
      g.spec += fmt::format("    - {{op: Multiply, in: [{}], out: {}, scalar: 1}}\n", h, a);
    } else {
      g.fwd += fmt::format("  - {{op: {}, in: [{}], out: {}}}\n", L.act, h, a);
      g.spec += fmt::format("    - {{op: {}, in: [{}], out: {}}}\n", L.act, h, a);
    }
    g.fwd += fmt::format("  - {{op: MatMul, in: [{}, w2_{}], out: {}}}\n", a, l, yp);
    g.fwd += fmt::format("  - {{op: AllReduce, in: [{}], out: {}, axis: tp}}\n", yp, y);
    g.spec += fmt::format("    - {{op: MatMul, in: [{}, w2_{}], out: {}}}\n", a, l, y);
    // scaled by 1/8 (keeps the activations off their flat tails, where two functions' derivatives agree to 1e-5)
    std::string ys = fmt::format("ys{}", l);
    g.fwd += fmt::format("  - {{op: Multiply, in: [{}], out: {}, scalar: 0.125}}\n", y, ys);
    g.spec += fmt::format("    - {{op: Multiply, in: [{}], out: {}, scalar: 0.125}}\n", y, ys);
    if (L.residual) {
      g.fwd += fmt::format("  - {{op: Add, in: [{}, {}], out: {}}}\n", ys, in, o);
      g.spec += fmt::format("    - {{op: Add, in: [{}, {}], out: {}}}\n", ys, sin, o);
    } else {
      g.fwd += fmt::format("  - {{op: Multiply, in: [{}], out: {}, scalar: 1}}\n", ys, o);
      g.spec += fmt::format("    - {{op: Multiply, in: [{}], out: {}, scalar: 1}}\n", ys, o);
    }
    in = sin = o;
  }
  const std::string red = g.mean ? "Mean" : "Sum";
  g.fwd += fmt::format("  - {{op: Multiply, in: [{0}, {0}], out: sq}}\n  - {{op: {1}, in: [sq], out: loss, dims: [0, 1]}}\n", in, red);
  g.spec += fmt::format("    - {{op: Multiply, in: [{0}, {0}], out: sq}}\n    - {{op: {1}, in: [sq], out: loss, dims: [0, 1]}}\n", in, red);

  // The backward, written by hand.
  double scale = g.mean ? 1.0 / (Bl * g.H) : 1.0;
  if (g.mean && g.dp && g.inject("the mean's gradient divided by the global row count")) scale = 1.0 / (g.B * g.H);
  g.bwd += fmt::format("  - {{op: Expand, in: [loss.grad], out: sq.grad, shape: [{}, {}], scale: {}}}\n", Bl, g.H, scale);
  g.bwd += fmt::format("  - {{op: Multiply, in: [sq.grad, {}], out: t.grad}}\n  - {{op: Multiply, in: [t.grad], out: {}.grad, scalar: 2}}\n", in, in);
  for (int l = layers - 1; l >= 0; --l) {
    const Layer& L = ls[static_cast<std::size_t>(l)];
    std::string o = fmt::format("o{}", l), x = l == 0 ? "x" : fmt::format("o{}", l - 1);
    std::string h = fmt::format("h{}", l), a = fmt::format("a{}", l), yp = fmt::format("yp{}", l);
    // the scale's backward, then the g operator's: the identity (each rank holds the whole output gradient)
    std::string ys = fmt::format("ys{}", l);
    g.bwd += fmt::format("  - {{op: Multiply, in: [{}.grad], out: {}.grad, scalar: 0.125}}\n", o, ys);
    if (g.inject("the g operator's backward all-reduces the output gradient"))
      g.bwd += fmt::format("  - {{op: AllReduce, in: [{}.grad], out: {}.grad, axis: tp}}\n", ys, yp);
    else
      g.bwd += fmt::format("  - {{op: Multiply, in: [{}.grad], out: {}.grad, scalar: 1}}\n", ys, yp);
    g.bwd += fmt::format("  - {{op: Transpose, in: [{0}], out: {0}.T, dims: [-1, -2]}}\n  - {{op: MatMul, in: [{0}.T, {1}.grad], out: w2_{2}.grad}}\n", a, yp, l);
    g.bwd += fmt::format("  - {{op: Transpose, in: [w2_{0}], out: w2_{0}.T, dims: [-1, -2]}}\n  - {{op: MatMul, in: [{1}.grad, w2_{0}.T], out: {2}.grad}}\n", l, yp, a);
    if (L.act.empty()) g.bwd += fmt::format("  - {{op: Multiply, in: [{}.grad], out: {}.grad, scalar: 1}}\n", a, h);
    else {
      std::string of = L.act;
      if (g.inject("the activation's derivative of the other function")) of = L.act == "GELU" ? "SiLU" : "GELU";
      g.bwd += fmt::format("  - {{op: PointwiseGrad, in: [{}.grad, {}], out: {}.grad, of: {}}}\n", a, h, h, of);
    }
    g.bwd += fmt::format("  - {{op: Transpose, in: [{0}], out: {0}.T, dims: [-1, -2]}}\n  - {{op: MatMul, in: [{0}.T, {1}.grad], out: w1_{2}.grad}}\n", x, h, l);
    if (l == 0) continue;  // x's gradient is not needed
    // the f operator's backward: the input gradient's partial sums all-reduced over tp
    g.bwd += fmt::format("  - {{op: Transpose, in: [w1_{0}], out: w1_{0}.T, dims: [-1, -2]}}\n  - {{op: MatMul, in: [{1}.grad, w1_{0}.T], out: {2}.gp}}\n", l, h, x);
    if (g.inject("the f operator's backward all-reduce missing"))
      g.bwd += fmt::format("  - {{op: Multiply, in: [{0}.gp], out: {0}.gm, scalar: 1}}\n", x);
    else
      g.bwd += fmt::format("  - {{op: AllReduce, in: [{0}.gp], out: {0}.gm, axis: tp}}\n", x);
    if (L.residual) g.bwd += fmt::format("  - {{op: Add, in: [{0}.gm, {1}.grad], out: {0}.grad}}\n", x, o);
    else g.bwd += fmt::format("  - {{op: Multiply, in: [{0}.gm], out: {0}.grad, scalar: 1}}\n", x);
  }
  if (g.dp)
    for (int l = 0; l < layers; ++l)
      for (const char* w : {"w1", "w2"}) {
        if (g.inject("a weight gradient not synchronized over dp")) continue;
        std::string rop = g.mean ? "avg" : "sum";
        if (g.inject("grad_sync sums where the mean's gradients need the average")) rop = g.mean ? "sum" : "avg";
        g.sync += fmt::format("  - {{op: AllReduce, in: [{0}_{1}.grad], out: {0}_{1}.grad, axis: dp, reduce: {2}}}\n", w, l, rop);
      }
  LocalTrainProgram out;
  out.mistake = g.mistake;
  std::string mesh = g.dp ? fmt::format("{{dp: 2, tp: {}}}", g.tp) : fmt::format("{{tp: {}}}", g.tp);
  std::string loss_pl = g.dp ? (g.mean ? "{dp: P(avg)}" : "{dp: P(sum)}") : "{}";
  out.text = fmt::format(
      "name: local_train_gen_{}\nview: local\nmesh: {}\ntensors:\n{}ops:\n{}loss: loss\nbackward:\n{}{}outputs:\n  loss: {{placement: {}}}\nspec:\n  ops:\n{}  "
      "outputs: [loss]\n",
      seed, mesh, g.tensors, g.fwd, g.bwd, g.sync.empty() ? "" : "grad_sync:\n" + g.sync, loss_pl, g.spec);
  return out;
}

}  // namespace spmd::test
