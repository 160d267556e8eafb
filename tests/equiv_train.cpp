// tests/equiv_train.cpp - random training programs with a spec and a finite-difference ground truth (equiv_train.h).
#include "tests/equiv_train.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>

#include "autograd/autograd.h"
#include "equiv/training.h"
#include "interp/assembly.h"
#include "interp/runner.h"
#include "ir/loader.h"
#include "spatial/spatial.h"
#include "temporal/temporal.h"

namespace spmd::test {
using interp::Num;
using interp::Runner;
using interp::Tensor;
namespace {

// The mistake classes; the first ones are in the forward, those from kFirstSync on in the grad_sync.
const char* const kMistakes[] = {
    "forward constant changed",                      // 0
    "Sum instead of Mean in the plan's loss",        // 1
    "Sum instead of Mean in the spec's loss",        // 2
    "Concat blocks swapped",                         // 3
    "loss normalized by 1/dp instead of 1/(dp*cp)",  // 4 (LossScale)
    "loss scaled by an extra 1/2 (a 1/tp)",          // 5
    "row-parallel AllReduce dropped, relabeled",     // 6
    "grad_sync divides the gradient again",          // 7
    "grad_sync post-multiply constant wrong",        // 8
    "grad_sync post-multiply applied twice",         // 9
    "grad_sync reduce op swapped",                   // 10
    "grad_sync AllReduce dropped",                   // 11
    "grad_sync AllReduce relabeled by Reinterpret",  // 12
    "grad_sync AllReduce over another axis",         // 13
    "norm eps changed in the plan",                  // 14
    "Softmax over the wrong dim in the plan",        // 15
    "cross-entropy sum instead of mean in the plan", // 16
    "pre-scaled Exp input scale changed",            // 17
    "attention q pre-scaled by 1/sqrt(d) again",     // 18
    "attention causal flag flipped in the plan",     // 19
};
constexpr int kFirstSync = 7, kLastSync = 13, kClasses = 20;
// The optimizer mistake classes (TrainCase::optim_mistake).
const char* const kOptimMistakes[] = {
    "grad norm double-counted (summed over an axis the gradient is replicated on)",  // 0
    "optimizer state partitioned unlike its gradient (the wrong shard)",             // 1
    "learning rate changed in the plan",                                             // 2
    "optimizer state not written back",                                              // 3
};
bool is_sync(int m) { return m >= kFirstSync && m <= kLastSync; }

enum class Tp { None, I, R, S, Q };  // Q: sequence parallel, the token dim S(0) over tp (Megatron SP)

struct Act {
  std::string pv, sv;
  int t, f;
  Tp tp;
};

struct Gen {
  std::mt19937_64 rng;
  bool bug;
  int mistake = -1;
  bool injected = false;
  std::vector<std::string> axes;
  std::vector<int> n;
  int tp_n = 0, nd = 1;          // nd: how many blocks dp and cp cut the token dim into
  std::vector<std::string> dsh;  // dp/cp axes that shard the token dim
  std::string tensors, plan, spec;
  int counter = 0, squares = 0, softmaxes = 0;
  Act cur;
  std::vector<Act> stash;

  Gen(std::uint64_t seed, bool b) : rng(seed * 0x9e3779b97f4a7c15ULL + 0x51ed), bug(b) {}
  int pick(int k) { return static_cast<int>(rng() % static_cast<std::uint64_t>(k)); }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
  std::string fresh(const char* pre) { return fmt::format("{}{}", pre, ++counter); }
  // Whether the bug is written here (the decision never consumes randomness differently with and without bug).
  bool here(int m) {
    if (mistake != m || injected) return false;
    injected = true;
    return bug;
  }
  std::string tp_pl(Tp t, int sdim) const {
    switch (t) {
      case Tp::None:
      case Tp::R:
      case Tp::Q:
        return "";
      case Tp::I:
        return "tp: I";
      case Tp::S:
        return fmt::format("tp: S({})", sdim);
    }
    return "";
  }
  std::map<std::string, std::string> params;  // shape + placement -> a parameter, for tied weights
  std::string param(const std::string& shape, const std::string& pl) {
    std::string key = shape + " " + pl;
    bool tie = coin(0.3);
    if (auto it = params.find(key); it != params.end() && tie) return it->second;  // used again: its gradient accumulates
    std::string w = fresh("w");
    params[key] = w;
    tensors += fmt::format("  {}: {{shape: {}, placement: {{{}}}, param: true}}\n", w, shape, pl);
    return w;
  }
  void plan_op(const std::string& op, const std::string& ins, const std::string& out, const std::string& attrs = "") {
    plan += fmt::format("  - {{op: {}, in: [{}], out: {}{}}}\n", op, ins, out, attrs);
  }
  void spec_op(const std::string& op, const std::string& ins, const std::string& out, const std::string& attrs = "") {
    spec += fmt::format("    - {{op: {}, in: [{}], out: {}{}}}\n", op, ins, out, attrs);
  }
  // The same op in both, on the current value and `extra` inputs.
  void both(const std::string& op, const std::string& pextra, const std::string& sextra, const std::string& attrs = "") {
    std::string p = fresh("p"), s = fresh("s");
    plan_op(op, cur.pv + pextra, p, attrs);
    spec_op(op, cur.sv + sextra, s, attrs);
    cur.pv = p, cur.sv = s;
  }

  void linear() {
    int f = std::vector<int>{2, 4, 8}[static_cast<std::size_t>(pick(3))];
    if (tp_n > f) f = tp_n;
    std::string shape = fmt::format("[{}, {}]", cur.f, f);
    switch (cur.tp) {
      case Tp::None: {
        std::string w = param(shape, "");
        both("MatMul", ", " + w, ", " + w);
        break;
      }
      case Tp::Q: {  // sequence parallel: the all-gather of the tokens, then a column-parallel linear
        std::string r = fresh("p");
        plan_op("AllGather", cur.pv, r, ", axis: tp, dim: 0");
        cur.pv = r;
        std::string w = param(shape, "tp: S(1)");
        both("MatMul", ", " + w, ", " + w);
        cur.tp = Tp::S;
        break;
      }
      case Tp::I:
      case Tp::R:
        if (coin(0.6)) {  // column-parallel (Megatron's f before it when the input is I)
          if (cur.tp == Tp::I) {
            std::string r = fresh("p");
            plan_op("Convert", cur.pv, r, ", axis: tp, to: R");
            cur.pv = r;
          }
          std::string w = param(shape, "tp: S(1)");
          both("MatMul", ", " + w, ", " + w);
          cur.tp = Tp::S;
        } else {
          std::string w = param(shape, tp_pl(cur.tp, 0));
          both("MatMul", ", " + w, ", " + w);
        }
        break;
      case Tp::S: {  // row-parallel, then g (AllReduce to I) or an AllReduce to R
        if (cur.f % tp_n != 0) return;
        std::string w = param(shape, "tp: S(0)");
        std::string p = fresh("p"), s = fresh("s"), y = fresh("p");
        plan_op("MatMul", cur.pv + ", " + w, p);
        spec_op("MatMul", cur.sv + ", " + w, s);
        bool to_i = coin(0.7);
        if (cur.t % (nd * tp_n) == 0 && coin(0.5)) {  // sequence parallel: reduce-scatter the tokens
          plan_op("ReduceScatter", p, y, ", axis: tp, dim: 0");
          cur.pv = y, cur.sv = s, cur.tp = Tp::Q;
          break;
        }
        if (here(6))
          plan_op("Reinterpret", p, y, fmt::format(", axis: tp, to: {}", to_i ? "I" : "R"));
        else
          plan_op("AllReduce", p, y, to_i ? ", axis: tp, dst: I" : ", axis: tp");
        cur.pv = y, cur.sv = s, cur.tp = to_i ? Tp::I : Tp::R;
        break;
      }
    }
    cur.f = f;
  }
  // A bias (Add) or a gain (Multiply) of shape [F].
  void elementwise_param() {
    std::string w = param(fmt::format("[{}]", cur.f), tp_pl(cur.tp, 0));
    both(coin(0.5) ? "Add" : "Multiply", ", " + w, ", " + w);
  }
  void scale(bool force) {
    double c = std::vector<double>{0.5, 3.0, -2.0, 0.25}[static_cast<std::size_t>(pick(4))];
    std::string p = fresh("p"), s = fresh("s");
    double pc = c;
    if (force && here(0)) pc = c * 2;
    plan_op("Multiply", cur.pv, p, fmt::format(", scalar: {}", pc));
    spec_op("Multiply", cur.sv, s, fmt::format(", scalar: {}", c));
    cur.pv = p, cur.sv = s;
  }
  void concat(bool force) {
    if (cur.tp == Tp::S || cur.f > 8) return;
    std::string pt = fresh("p"), st = fresh("s");
    plan_op("Multiply", cur.pv, pt, ", scalar: -3");
    spec_op("Multiply", cur.sv, st, ", scalar: -3");
    std::string p = fresh("p"), s = fresh("s");
    bool swap = force && here(3);
    plan_op("Concat", swap ? pt + ", " + cur.pv : cur.pv + ", " + pt, p, ", dim: 1");
    spec_op("Concat", cur.sv + ", " + st, s, ", dim: 1");
    cur.pv = p, cur.sv = s, cur.f *= 2;
  }
  // A pointwise op whose backward is a PointwiseGrad: Exp on a scaled-down input, SiLU, GELU, Sigmoid, and Sqrt,
  // Rsqrt, Log on a positive input (x*x + 1).
  int exps = 0;
  void pointwise(bool force) {
    int k = force ? 0 : pick(7);
    if (k == 6) return both("Sigmoid", "", "");
    if (k == 0) {
      if (exps >= 1 && !force) return;
      ++exps;
      double c = 0.125, pc = c;
      if (force && here(17)) pc = 0.25;
      std::string p = fresh("p"), s = fresh("s");
      plan_op("Multiply", cur.pv, p, fmt::format(", scalar: {}", pc));
      spec_op("Multiply", cur.sv, s, fmt::format(", scalar: {}", c));
      cur.pv = p, cur.sv = s;
      both("Exp", "", "");
      return;
    }
    if (k == 1) return both("SiLU", "", "");
    if (k == 2) return both("GELU", "", "");
    both("Multiply", ", " + cur.pv, ", " + cur.sv);
    both("Add", "", "", ", scalar: 1");
    both(k == 3 ? "Sqrt" : k == 4 ? "Rsqrt" : "Log", "", "");
  }
  // RMSNorm or LayerNorm over the hidden dim (whole on every rank), with a gain (and a bias) that is I or R over tp
  // as the activation is (Megatron's layernorm weights).
  void norm(bool force) {
    if (cur.tp == Tp::S || cur.f < 2) return;
    // LayerNorm over 2 elements is +-1 (times the gain) whatever the input: its input gradient is eps-small, below
    // the finite differences' resolution, so it is drawn over 4 or more.
    bool rms = coin(0.5) || cur.f < 4;
    std::string extra;
    if (coin(0.7)) {
      std::string pl = tp_pl(cur.tp, 0);
      extra += ", " + param(fmt::format("[{}]", cur.f), pl);
      if (!rms && coin(0.5)) extra += ", " + param(fmt::format("[{}]", cur.f), pl);
    }
    std::string p = fresh("p"), s = fresh("s");
    bool wrong = force && here(14);
    plan_op(rms ? "RMSNorm" : "LayerNorm", cur.pv + extra, p, wrong ? ", eps: 0.01" : ", eps: 1e-05");
    spec_op(rms ? "RMSNorm" : "LayerNorm", cur.sv + extra, s, ", eps: 1e-05");
    cur.pv = p, cur.sv = s;
  }
  // Softmax over the hidden dim; the mistake takes it over the token dim (only when that dim is whole in the plan).
  void softmax(bool force) {
    if (cur.tp == Tp::S || cur.f < 2) return;
    bool whole = dsh.empty() && cur.tp != Tp::Q && cur.t > 1;
    std::string p = fresh("p"), s = fresh("s");
    bool wrong = force && whole && here(15);
    plan_op("Softmax", cur.pv, p, wrong ? ", dim: 0" : ", dim: -1");
    spec_op("Softmax", cur.sv, s, ", dim: -1");
    cur.pv = p, cur.sv = s;
  }
  // FlashAttention (bshd, batch 1) over the tokens with q = 0.1 x, k = v = x (GQA: one kv head, the first half of
  // x), causal or not; under cp (the tokens' only sharding) the plan all-gathers k and v and masks at global
  // positions (`cp: cp`, causal), as bench/equiv_llama.h. Heads whole on every rank (tp I or R).
  void attention(bool force) {
    bool on_cp = dsh.size() == 1 && dsh[0] == "cp";
    if (!(dsh.empty() || on_cp) || cur.tp == Tp::S || cur.tp == Tp::Q || cur.f < 2 || cur.f % 2 != 0) return;
    int h = 2, d = cur.f / 2;
    bool gqa = coin(0.3), causal = on_cp || coin(0.5);
    std::string q0 = fresh("p"), sq0 = fresh("s");
    double qs = 0.1, pqs = qs;
    if (force && d >= 2 && here(18)) pqs = qs / std::sqrt(static_cast<double>(d));
    plan_op("Multiply", cur.pv, q0, fmt::format(", scalar: {}", pqs));
    spec_op("Multiply", cur.sv, sq0, fmt::format(", scalar: {}", qs));
    std::string q = fresh("p"), sq = fresh("s");
    plan_op("Reshape", q0, q, fmt::format(", shape: [1, {}, {}, {}]", cur.t, h, d));
    spec_op("Reshape", sq0, sq, fmt::format(", shape: [1, {}, {}, {}]", cur.t, h, d));
    std::string k0 = cur.pv, sk0 = cur.sv;
    int hk = h;
    if (gqa) {
      k0 = fresh("p"), sk0 = fresh("s"), hk = 1;
      plan_op("Slice", cur.pv, k0, fmt::format(", dim: 1, start: 0, end: {}", d));
      spec_op("Slice", cur.sv, sk0, fmt::format(", dim: 1, start: 0, end: {}", d));
    }
    std::string k = fresh("p"), sk = fresh("s");
    plan_op("Reshape", k0, k, fmt::format(", shape: [1, {}, {}, {}]", cur.t, hk, d));
    spec_op("Reshape", sk0, sk, fmt::format(", shape: [1, {}, {}, {}]", cur.t, hk, d));
    std::string kv = k;
    if (on_cp) {
      kv = fresh("p");
      plan_op("AllGather", k, kv, ", axis: cp, dim: 1");
    }
    bool pc = causal;
    if (force && !on_cp && here(19)) pc = !causal;
    std::string o = fresh("p"), so = fresh("s");
    plan_op("FlashAttention", q + ", " + kv + ", " + kv, o, fmt::format(", causal: {}, layout: bshd{}", pc ? "true" : "false", on_cp ? ", cp: cp" : ""));
    spec_op("FlashAttention", sq + ", " + sk + ", " + sk, so, fmt::format(", causal: {}, layout: bshd", causal ? "true" : "false"));
    std::string r = fresh("p"), sr = fresh("s");
    plan_op("Reshape", o, r, fmt::format(", shape: [{}, {}]", cur.t, cur.f));
    spec_op("Reshape", so, sr, fmt::format(", shape: [{}, {}]", cur.t, cur.f));
    cur.pv = r, cur.sv = sr;
  }
  void step(bool force_scale, bool force_concat, int force_other = -1) {
    if (force_other == 18 || force_other == 19) return attention(true), stash.push_back(cur);
    if (force_scale) return scale(true);
    if (force_concat) return concat(true);
    if (force_other == 14) return norm(true), stash.push_back(cur);
    if (force_other == 15) return softmax(true), stash.push_back(cur);
    if (force_other == 17) return pointwise(true), stash.push_back(cur);
    if (cur.tp == Tp::S && coin(0.5)) return linear(), stash.push_back(cur);  // a column-parallel linear is usually followed by its row-parallel one
    switch (pick(14)) {
      case 13:
        attention(false);
        break;
      case 10:
        pointwise(false);
        break;
      case 11:
        norm(false);
        break;
      case 12:
        if (softmaxes < 1) ++softmaxes, softmax(false);
        break;
      case 0:
      case 1:
        linear();
        break;
      case 2:
        elementwise_param();
        break;
      case 3:
        if (squares < 2) ++squares, both("Multiply", ", " + cur.pv, ", " + cur.sv);
        break;
      case 4:
        scale(false);
        break;
      case 5:
        coin(0.5) ? both("Neg", "", "") : both("Div", "", "", ", scalar: 4");
        break;
      case 6:
        for (const Act& a : stash)
          if (a.t == cur.t && a.f == cur.f && a.tp == cur.tp && a.pv != cur.pv) {
            bool add = coin(0.5);
            both(add ? "Add" : "Sub", ", " + a.pv, ", " + a.sv);
            break;
          }
        break;
      case 7:
        concat(false);
        break;
      case 8:
        if (cur.tp != Tp::S && cur.f >= 2 && cur.f % 2 == 0) {
          int h = cur.f / 2, st = coin(0.5) ? 0 : h;
          both("Slice", "", "", fmt::format(", dim: 1, start: {}, end: {}", st, st + h));
          cur.f = h;
        }
        break;
      case 9:
        if (cur.tp != Tp::S && cur.f % 2 == 0 && cur.f >= 2 && cur.t * 2 <= 16) {
          both("Reshape", "", "", fmt::format(", shape: [{}, {}]", cur.t * 2, cur.f / 2));
          cur.t *= 2, cur.f /= 2;
        }
        break;
    }
    stash.push_back(cur);
  }
};

std::string placement_text(const std::vector<std::string>& parts) {
  std::string s;
  for (const auto& p : parts)
    if (!p.empty()) s += (s.empty() ? "" : ", ") + p;
  return "{" + s + "}";
}

}  // namespace

TrainCase generate_train(std::uint64_t seed, bool bug) {
  Gen g(seed, bug);
  TrainCase c;
  g.mistake = g.pick(kClasses);
  {  // the optimizer step, from its own stream; half of the programs with one get their mistake there
    std::mt19937_64 orng(seed * 0x2545f4914f6cdd1dULL + 77);
    c.optim = static_cast<int>(orng() % 3);
    c.clip = c.optim && orng() % 2;
    int om = static_cast<int>(orng() % 8);
    if (c.optim && om < 4) c.optim_mistake = om, g.mistake = -1;
  }
  c.predivide = g.coin(0.3);
  c.variant = g.pick(4);
  // The mesh: a non-empty subset of dp, cp, tp.
  int which = 1 + g.pick(7);
  if (which & 1) g.axes.push_back("dp"), g.n.push_back(2);
  if (which & 2) g.axes.push_back("cp"), g.n.push_back(2);
  if (which & 4) g.tp_n = g.axes.empty() && g.coin(0.3) ? 4 : 2, g.axes.push_back("tp"), g.n.push_back(g.tp_n);
  int T = 4 << g.pick(2), H = 2 << g.pick(2);
  std::vector<std::string> xpl;
  for (const auto& a : g.axes)
    if (a != "tp" && g.coin(0.85)) g.dsh.push_back(a), xpl.push_back(a + ": S(0)"), g.nd *= 2;
  if (g.tp_n) xpl.push_back(g.coin(0.8) ? "tp: I" : "");
  g.tensors = fmt::format("  x: {{shape: [{}, {}], placement: {}}}\n", T, H, placement_text(xpl));
  g.cur = {"x", "x", T, H, g.tp_n ? (xpl.back().empty() ? Tp::R : Tp::I) : Tp::None};
  if (g.coin(0.25)) {  // an Embedding first: ids sharded as the tokens, the table [4, H] R or vocab-sharded over tp
    std::vector<std::string> ipl;
    for (const auto& a : g.dsh) ipl.push_back(a + ": S(0)");
    g.tensors = fmt::format("  ids: {{shape: [{}], dtype: i64, placement: {}}}\n", T, placement_text(ipl));
    bool vs = g.tp_n && g.coin(0.6);
    std::string w = g.fresh("w");
    g.tensors += fmt::format("  {}: {{shape: [4, {}], placement: {{{}}}, param: true}}\n", w, H, vs ? "tp: S(0)" : "");
    std::string p = g.fresh("p"), s = g.fresh("s");
    g.plan_op("Embedding", "ids, " + w, p);
    g.spec_op("Embedding", "ids, " + w, s);
    g.cur = {p, s, T, H, g.tp_n ? Tp::R : Tp::None};
    if (vs) {  // the masked lookup is P(sum) over tp: Megatron's AllReduce (to I, or to R)
      bool to_i = g.coin(0.7);
      std::string y = g.fresh("p");
      g.plan_op("AllReduce", p, y, to_i ? ", axis: tp, dst: I" : ", axis: tp");
      g.cur.pv = y, g.cur.tp = to_i ? Tp::I : Tp::R;
    }
  }
  g.stash.push_back(g.cur);
  int steps = 2 + g.pick(4);
  int force_at = g.pick(steps);
  for (int i = 0; i < steps; ++i) g.step(i == force_at && g.mistake == 0, i == force_at && g.mistake == 3, i == force_at ? g.mistake : -1);
  // Every program has a parameter: a last linear when none was drawn.
  if (g.tensors.find("param: true") == std::string::npos) g.linear();
  // A cross-entropy loss sometimes (labels an integer input, the logits' last dim the vocab), vocab-parallel over tp
  // when the logits are S(1) there (Megatron's), else the logits resolved first.
  bool ce = g.cur.f >= 2 && g.coin(0.3);
  bool vp = ce && g.cur.tp == Tp::S && g.coin(0.7);
  // Resolve tp for the loss.
  if (!vp && (g.cur.tp == Tp::S || g.cur.tp == Tp::Q)) {
    bool to_i = g.coin(0.7);
    std::string p = g.fresh("p");
    const char* dim = g.cur.tp == Tp::S ? "1" : "0";
    g.plan_op("AllGather", g.cur.pv, p, fmt::format(", axis: tp, dim: {}{}", dim, to_i ? ", dst: I" : ""));
    g.cur.pv = p, g.cur.tp = to_i ? Tp::I : Tp::R;
  }
  // The loss: Mean or Sum over all dims; P over the sharding axes, then left (DDP), all-reduced, or LossScale'd.
  bool spec_mean = g.coin(0.7);
  int mode = g.dsh.empty() ? 0 : g.pick(3);
  bool token_norm = spec_mean && mode == 2 && g.coin(0.5);  // plan: local Sum, LossScale(1/T)
  bool plan_mean = spec_mean && !token_norm;
  if (g.mistake == 1 && plan_mean && g.here(1)) plan_mean = false;
  if (g.mistake == 16 && ce && plan_mean && g.here(16)) plan_mean = false;
  bool spec_mean_w = spec_mean;
  if (g.mistake == 2 && spec_mean && g.here(2)) spec_mean_w = false;
  std::string l0 = g.fresh("p");
  if (ce) {
    // Logits scaled down first: a saturated softmax has a gradient below the finite differences' resolution, which
    // would make a real mistake look numerically harmless.
    std::string pz = g.fresh("p"), sz = g.fresh("s");
    g.plan_op("Multiply", g.cur.pv, pz, ", scalar: 0.1");
    g.spec_op("Multiply", g.cur.sv, sz, ", scalar: 0.1");
    g.cur.pv = pz, g.cur.sv = sz;
    std::vector<std::string> lab;
    for (const auto& a : g.dsh) lab.push_back(a + ": S(0)");
    g.tensors += fmt::format("  labels: {{shape: [{}], dtype: i64, placement: {}}}\n", g.cur.t, placement_text(lab));
    g.plan_op("CrossEntropyLoss", g.cur.pv + ", labels", l0, fmt::format(", reduction: {}{}", plan_mean ? "mean" : "sum", vp ? ", vocab_parallel: true, axis: tp, dst: I" : ""));
    g.spec_op("CrossEntropyLoss", g.cur.sv + ", labels", "loss", fmt::format(", reduction: {}", spec_mean_w ? "mean" : "sum"));
    if (vp) g.cur.tp = Tp::I;
  } else {
    std::string dims = ", dims: [0, 1]";
    g.plan_op(plan_mean ? "Mean" : "Sum", g.cur.pv, l0, dims);
    g.spec_op(spec_mean_w ? "Mean" : "Sum", g.cur.sv, "loss", dims);
  }
  std::string axis_list;
  int nd = g.nd;
  for (std::size_t k = 0; k < g.dsh.size(); ++k) axis_list += (k ? ", " : "") + g.dsh[k];
  std::vector<std::string> lpl;
  std::string cur = l0;
  if (mode == 1) {
    std::string p = g.fresh("p");
    g.plan_op("AllReduce", cur, p, fmt::format(", axis: [{}]{}", axis_list, plan_mean ? ", reduce: avg" : ""));
    cur = p;
  } else if (mode == 2) {
    double s = token_norm ? 1.0 / (ce ? g.cur.t : g.cur.t * g.cur.f) : spec_mean ? 1.0 / nd : 1.0;
    if (!token_norm && g.dsh.size() == 2 && g.here(4)) s = 0.5;
    std::string p = g.fresh("p");
    g.plan_op("LossScale", cur, p, fmt::format(", scale: {}, axis: [{}]", s, axis_list));
    cur = p;
  }
  for (const auto& a : g.axes) {
    if (a == "tp") {
      lpl.push_back(g.cur.tp == Tp::I ? "tp: I" : "");
      continue;
    }
    bool sh = std::find(g.dsh.begin(), g.dsh.end(), a) != g.dsh.end();
    if (!sh || mode == 1) continue;
    lpl.push_back(a + (mode == 2 || !plan_mean ? ": P" : ": P(avg)"));
  }
  bool extra = g.mistake == 5 && g.here(5);
  g.plan_op("Multiply", cur, "loss", fmt::format(", scalar: {}", extra ? 0.5 : 1));
  std::string mesh;
  for (std::size_t a = 0; a < g.axes.size(); ++a) mesh += fmt::format("{}{}: {}", a ? ", " : "", g.axes[a], g.n[a]);
  c.forward = fmt::format(
      "name: train_gen_{}\nmesh: {{{}}}\ntensors:\n{}ops:\n{}loss: loss\ntrain: true\noutputs:\n  loss: {{placement: {}}}\nspec:\n  ops:\n{}  "
      "outputs: [loss]\n",
      seed, mesh, g.tensors, g.plan, placement_text(lpl), g.spec);
  if (is_sync(g.mistake)) {
    c.grad_sync_mistake = true;
    if ((g.mistake == 8 || g.mistake == 9) && !c.predivide) c.predivide = true;
    c.mistake = bug ? kMistakes[g.mistake] : "";
    c.variant = g.mistake;
  } else if (c.optim_mistake >= 0) {
    c.mistake = bug ? kOptimMistakes[c.optim_mistake] : "";
  } else {
    c.mistake = g.injected && bug ? kMistakes[g.mistake] : "";
  }
  return c;
}


std::vector<Diagnostic> type_errors(const Program& p) {
  std::vector<Diagnostic> out;
  auto keep = [&](std::vector<Diagnostic> ds) {
    for (auto& d : ds)
      if (d.severity == Severity::Error) out.push_back(std::move(d));
  };
  SpatialTypes fwd;
  SpatialOptions so;
  so.types = &fwd;
  keep(check_spatial(p, so));
  bool fok = out.empty();
  keep(check_temporal(p));
  if (p.loss >= 0 && (p.train || p.has_backward)) {
    TrainingOptions to;
    to.forward_types = &fwd;
    to.forward_ok = fok;
    TrainingCheck t = check_training(p, to);
    keep(std::move(t.diags));
    if (t.built) {
      auto td = check_temporal(t.program);
      for (auto& d : td)
        if (d.op >= static_cast<int>(t.first_backward) && d.severity == Severity::Error) out.push_back(std::move(d));
    }
  }
  return out;
}

bool with_grad_sync(const TrainCase& c, bool bug, std::string& text, std::string& why) {
  Program p;
  try {
    p = load_program_string(c.forward, "train_gen.yaml");
  } catch (const LoadError& e) {
    why = std::string("does not load: ") + e.what();
    if (std::getenv("SPMD_TRAIN_DEBUG")) fmt::print("{}\n{}\n", e.what(), c.forward);
    return false;
  }
  std::vector<Diagnostic> errs;
  try {
    errs = type_errors(p);
  } catch (const LoadError& e) {
    why = std::string("no backward: ") + e.what();
    return false;
  }
  std::vector<std::string> fixes;
  for (const auto& d : errs) {
    if (d.id != CheckId::UnsyncedGradient) {
      why = fmt::format("{}: {}", check_name(d.id), d.message.substr(0, 80));
      return false;
    }
    for (const auto& nt : d.notes) {
      auto a = nt.message.find("insert {"), b = nt.message.find("} into");
      if (nt.message.rfind("fix: ", 0) != 0 || a == std::string::npos || b == std::string::npos) continue;
      // One op, or several joined by " and ".
      for (std::size_t k = a; (k = nt.message.find("{op:", k)) != std::string::npos && k < b;) {
        int depth = 0;
        std::size_t e = k;
        for (; e < nt.message.size(); ++e) {
          depth += nt.message[e] == '{' ? 1 : nt.message[e] == '}' ? -1 : 0;
          if (depth == 0) break;
        }
        fixes.push_back(nt.message.substr(k, e - k + 1));
        k = e;
      }
    }
  }
  std::vector<std::string> lines;
  for (const auto& f : fixes) {
    auto a = f.find("in: ["), b = f.find(']', a);
    std::string g = f.substr(a + 5, b - a - 5);
    if (c.predivide) lines.push_back(fmt::format("{{op: Multiply, in: [{}], out: {}, scalar: 0.25}}", g, g));
    lines.push_back(f);
    if (c.predivide) lines.push_back(fmt::format("{{op: Multiply, in: [{}], out: {}, scalar: 4}}", g, g));
  }
  if (bug && c.grad_sync_mistake && !fixes.empty()) {
    std::size_t ar = c.predivide ? 1 : 0;  // the first AllReduce line
    std::string& l = lines[ar];
    auto a = l.find("in: ["), b = l.find(']', a);
    std::string g = l.substr(a + 5, b - a - 5);
    switch (c.variant) {
      case 7:
        lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(ar) + 1, fmt::format("{{op: Multiply, in: [{}], out: {}, scalar: 0.5}}", g, g));
        break;
      case 8:
        lines[ar + 1] = fmt::format("{{op: Multiply, in: [{}], out: {}, scalar: 2}}", g, g);
        break;
      case 9:
        lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(ar) + 1, lines[ar + 1]);
        break;
      case 10:
        if (auto r = l.find(", reduce: avg"); r != std::string::npos)
          l.erase(r, 13);
        else
          l.insert(l.size() - 1, ", reduce: avg");
        break;
      case 11:
        lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(ar));
        break;
      case 12: {
        auto x = l.find("axis: "), y = l[x + 6] == '[' ? l.find(']', x) + 1 : l.find_first_of(",}", x);
        std::string ax = l.substr(x, y - x);
        l = fmt::format("{{op: Reinterpret, in: [{}], out: {}, {}, to: R}}", g, g, ax);
        break;
      }
      case 13: {
        auto x = l.find("axis: "), y = l[x + 6] == '[' ? l.find(']', x) + 1 : l.find_first_of(",}", x);
        std::string ax = l.substr(x + 6, y - x - 6);
        std::string other;
        for (const auto& m : p.mesh)
          if (ax.find(m.name) == std::string::npos) other = m.name;
        if (other.empty()) return why = "not applicable", false;
        l = l.substr(0, x + 6) + other + l.substr(y);
        break;
      }
      default:
        break;
    }
  } else if (bug && c.grad_sync_mistake) {
    return why = "not applicable", false;
  }
  text = c.forward;
  if (!lines.empty()) {
    std::string gs = "grad_sync:\n";
    for (const auto& l : lines) gs += "  - " + l + "\n";
    text.insert(text.find("outputs:\n"), gs);
  }
  if (c.optim && !with_optimizer(c, bug, text)) return why = "not applicable", false;
  return true;
}

namespace {

Tensor global_of(const Program& p, Runner& run, NameId n, const Placements& pl, const OracleOptions& oo, std::string& problem) {
  interp::Assembled a = interp::assemble(p, run, n, pl, oo);
  if (!a.ok) problem = a.undefined ? "undefined" : a.problem;
  return a.t;
}

}  // namespace

Truth gradient_truth(const Program& p, std::size_t max_elements) {
  Truth tr;
  OracleOptions oo;
  oo.seed = 5;
  Program t;
  std::map<NameId, Placements> grad_pl;  // with an optimizer step: each gradient's placement as grad_sync left it
  if (p.local_view) {  // the plan's step is its own forward, hand-written backward and grad_sync, rank by rank
    equiv_detail::TrainingPair lp = equiv_detail::local_training_pair(p);
    if (!lp.ok) return tr.failed = true, tr.what = lp.why, tr;
    t = std::move(lp.program);
  } else {
    TrainingCheck tc;
    SpatialTypes st;
    TrainingOptions to;
    to.step_types = &st;
    try {
      tc = check_training(p, to);
    } catch (const LoadError& e) {
      return tr.failed = true, tr.what = e.what(), tr;
    }
    if (!tc.built) return tr.failed = true, tr.what = "no training step", tr;
    t = std::move(tc.program);
    // The optimizer step (from tc.first_optim): a gradient it rewrites (clipped in place) is renamed there, so that
    // `<param>.grad` holds what grad_sync left, read by the placement grad_sync left it in (a reduce-scattered shard).
    for (std::size_t i = 0; i < tc.first_optim && i < t.ops.size(); ++i) {
      auto outs = t.outs(t.ops[i]);
      for (std::size_t k = 0; k < outs.size(); ++k)
        if (t.name(outs[k]).ends_with(".grad") && st.out(i, static_cast<int>(k)).ok) grad_pl[outs[k]] = st.out(i, static_cast<int>(k)).pl;
    }
    equiv_detail::rename_optimizer_grads(t, t.ops, tc.first_optim);
  }
  auto sit = t.name_ids.find(p.name(p.loss) + ".grad");
  if (sit == t.name_ids.end()) return tr.failed = true, tr.what = "no seed", tr;
  NameId seed = sit->second;
  for (auto& d : t.tensors)
    if (d.name == seed) d.placement = Placements{};  // every rank seeds its backward with the same value
  auto insts = interp::instantiations(t, oo);
  if (insts.empty()) return tr.failed = true, tr.what = "no instantiation", tr;
  const auto& inst = insts[0];
  std::int64_t work = 0;
  Runner dist(t, inst.vars, inst.mesh, false, oo, work);
  std::vector<std::pair<NameId, Tensor>> inputs;  // the declared tensors, global
  try {
    for (const auto& d : t.tensors) dist.declare(d, t.name(d.name) == "ids" ? 4 : 2, 7);  // integer inputs: ids in [0, 4), labels in [0, 2)
    for (std::int64_t r = 0; r < dist.ranks(); ++r)
      for (auto& e : dist.at(r, seed).t.data) e = Num(1.0);
    for (const auto& d : p.tensors) {
      std::string prob;
      inputs.push_back({d.name, global_of(t, dist, d.name, d.placement, oo, prob)});
      if (!prob.empty()) return tr.failed = true, tr.what = "inputs: " + prob, tr;
    }
    dist.run(7);
  } catch (const std::runtime_error& e) {
    return tr.failed = true, tr.differs = true, tr.what = std::string("the plan's step fails: ") + e.what(), tr;
  }
  auto plan_value = [&](NameId n, const Placements& pl, std::string& prob) {
    auto it = grad_pl.find(n);  // only with an optimizer step, and only a synchronized gradient (a pending one stays read as its parameter)
    bool own = p.has_optimizer && it != grad_pl.end() &&
               std::none_of(it->second.begin(), it->second.begin() + t.axis_count(), [](const Placement& q) { return q.is_p() || q.is_v(); });
    return global_of(t, dist, n, own ? it->second : pl, oo, prob);
  };
  return compare_with_spec(p, t, inst, inputs, plan_value, max_elements);
}

Truth compare_with_spec(const Program& p, const Program& t, const interp::Instantiation& inst, const std::vector<std::pair<NameId, Tensor>>& inputs,
                        const std::function<Tensor(NameId, const Placements&, std::string&)>& plan_value, std::size_t max_elements) {
  Truth tr;
  OracleOptions oo;
  oo.seed = 5;
  // The spec's forward on one device.
  Program s = p;
  s.ops = p.spec_ops;
  s.spec_ops.clear();
  s.has_spec = s.train = s.has_backward = s.has_grad_sync = false;
  s.per_rank = false, s.programs.clear(), s.schedule = ScheduleSpec{};
  s.grad_sync.clear();
  s.outputs.clear();
  s.spec_outputs.clear();
  for (auto& d : s.tensors) d.placement = Placements{};
  NameId spec_loss = p.loss;
  for (const auto& l : p.spec_outputs)
    if (l.plan == p.loss) spec_loss = l.spec;
  std::vector<std::int64_t> ones(inst.mesh.size(), 1);
  auto loss_at = [&](NameId pn, std::size_t k, double delta) {
    std::int64_t w = 0;
    Runner one(s, inst.vars, ones, true, oo, w, inst.mesh);
    for (const auto& d : s.tensors) one.declare(d, s.name(d.name) == "ids" ? 4 : 2, 7);
    for (const auto& [n, v] : inputs) one.at(0, n).t = v;
    if (pn >= 0) one.at(0, pn).t.data[k].d += delta;
    one.run(7);
    return one.at(0, spec_loss).t.data.at(0).d;
  };
  double l0;
  try {
    l0 = loss_at(-1, 0, 0);
  } catch (const std::runtime_error& e) {
    return tr.failed = true, tr.what = std::string("the spec's forward fails: ") + e.what(), tr;
  }
  // The plan's loss, by its declared output placement.
  for (const auto& od : p.outputs)
    if (od.name == p.loss) {
      std::string prob;
      Tensor pl = plan_value(od.name, od.has_placement ? od.placement : Placements{}, prob);
      if (!prob.empty()) return tr.differs = true, tr.what = "the plan's loss: " + prob, tr;
      double x = pl.data.at(0).d;
      if (std::abs(x - l0) > 1e-11 * std::max(1.0, std::abs(l0)))  // doubles in another order: about 1e-15
        return tr.differs = true, tr.what = fmt::format("loss is {} in the plan, {} in the spec", x, l0), tr;
    }
  std::map<NameId, std::vector<double>> fd_grads;  // the finite-difference gradients computed in full
  for (const auto& d : p.tensors) {
    if (!d.param) continue;
    auto it = t.name_ids.find(p.name(d.name) + ".grad");
    if (it == t.name_ids.end()) continue;
    std::string prob;
    Tensor g = plan_value(it->second, d.placement, prob);
    if (!prob.empty()) return tr.differs = true, tr.what = fmt::format("{}.grad: {}", p.name(d.name), prob), tr;
    std::size_t nel = g.data.size();
    // The elements compared: all, or `max_elements` spread evenly (a large program's finite differences cost a
    // forward run per element and step).
    std::vector<std::size_t> ks;
    std::size_t stride = max_elements > 0 && nel > max_elements ? (nel + max_elements - 1) / max_elements : 1;
    for (std::size_t k = 0; k < nel; k += stride) ks.push_back(k);
    std::vector<double> fd(nel);
    // Tolerance: 1e-5 of this parameter's largest gradient, plus the differences' own noise (about 1e-12 of the
    // loss per 1e-3 step, taken as 1e-9): relative to the loss alone, a small gradient (a saturated softmax, a
    // norm's eps) would hide a mistake that scales it.
    double scale = 0;
    auto richardson = [&](std::size_t k, double h) {
      double d1 = (loss_at(d.name, k, h) - loss_at(d.name, k, -h)) / (2 * h);
      double d2 = (loss_at(d.name, k, h / 2) - loss_at(d.name, k, -h / 2)) / h;
      return (4 * d2 - d1) / 3;
    };
    for (std::size_t k : ks) {
      fd[k] = richardson(k, 1e-3);  // (1e-2 is too coarse once attention and norms make the loss far from polynomial)
      scale = std::max({scale, std::abs(fd[k]), std::abs(g.data[k].d)});
    }
    double tol = 1e-5 * scale + 1e-9 * std::max(1.0, std::abs(l0));
    if (stride == 1) fd_grads[it->second] = fd;  // every element: the optimizer's truth can use it
    for (std::size_t k : ks) {
      ++tr.compared;
      // A deep stack (a pipeline of residual layers) can leave the step's truncation error above the tolerance: an
      // element that differs is differentiated again with a step 10 times smaller, and differs only if that does too
      // (the smaller step is closer to the derivative; its rounding, about 1e-12 of the loss, is far below the tolerance).
      if (std::abs(g.data[k].d - fd[k]) > tol && std::abs(g.data[k].d - (fd[k] = richardson(k, 1e-4))) > tol)
        return tr.differs = true,
               tr.what = fmt::format("{}.grad[{}] is {} in the plan, {} by finite differences", p.name(d.name), k, g.data[k].d, fd[k]), tr;
    }
  }
  optimizer_truth(p, inputs, fd_grads, plan_value, tr);
  return tr;
}

}  // namespace spmd::test
