// tests/equiv_gen.cpp - random local-view plan/spec pairs (tests/equiv_gen.h).
//
// The generator keeps one current value: its spec tensor (global shape [r, c]) and its plan tensor (the rank's
// local array) with a layout per mesh axis (R, S(0), S(1) or a pending sum P). Each step draws an op of the spec
// and a strategy for the plan that keeps the layout right; a dim is sharded by at most one axis. At the end every
// pending sum is resolved and the plan's output is declared with the layout the construction gives.
#include "tests/equiv_gen.h"

#include <fmt/format.h>

#include <random>
#include <vector>

namespace spmd::test {

namespace {

enum class Pl { R, S0, S1, P };

Pl shard_of(int d) { return d == 0 ? Pl::S0 : Pl::S1; }

struct Gen {
  std::mt19937_64 rng;
  std::vector<std::string> axes;
  std::vector<int> n;  // axis sizes
  std::string tensors, plan, spec;
  int counter = 0;
  bool want_bug = false;
  std::string mistake;
  std::string sv, pv;  // current spec / plan tensor
  int shape[2] = {4, 8};
  std::vector<Pl> lay;

  explicit Gen(std::uint64_t seed) : rng(seed * 0x9e3779b97f4a7c15ULL + 7) {}

  int pick(int k) { return static_cast<int>(rng() % static_cast<std::uint64_t>(k)); }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
  std::string fresh(const char* prefix) { return fmt::format("{}{}", prefix, ++counter); }
  // The axis sharding dim d (-1: none).
  int sharder(int d) const {
    for (std::size_t a = 0; a < lay.size(); ++a)
      if (lay[a] == shard_of(d)) return static_cast<int>(a);
    return -1;
  }
  bool any_p() const {
    for (Pl l : lay)
      if (l == Pl::P) return true;
    return false;
  }
  int local(int d) const {
    int a = sharder(d);
    return a < 0 ? shape[d] : shape[d] / n[static_cast<std::size_t>(a)];
  }
  // Inject the pair's mistake here? At most one per pair.
  bool inject(const char* what) {
    if (!want_bug || !mistake.empty() || !coin(0.4)) return false;
    mistake = what;
    return true;
  }
  std::string placement(const std::vector<Pl>& l) const {
    std::string s;
    for (std::size_t a = 0; a < l.size(); ++a) {
      const char* p = l[a] == Pl::R ? "R" : l[a] == Pl::S0 ? "S(0)" : l[a] == Pl::S1 ? "S(1)" : "P";
      s += fmt::format("{}{}: {}", s.empty() ? "" : ", ", axes[a], p);
    }
    return "{" + s + "}";
  }
  std::string input(int r, int c, const std::vector<Pl>& l) {
    std::string name = fresh("in");
    tensors += fmt::format("  {}: {{shape: [{}, {}], placement: {}}}\n", name, r, c, placement(l));
    return name;
  }
  void both(const std::string& op, const std::string& attrs) {
    std::string s = fresh("s"), p = fresh("p");
    spec += fmt::format("    - {{op: {}, in: [{}], out: {}{}}}\n", op, sv, s, attrs);
    plan += fmt::format("  - {{op: {}, in: [{}], out: {}{}}}\n", op, pv, p, attrs);
    sv = s;
    pv = p;
  }
  void plan_op(const std::string& op, const std::string& in, const std::string& attrs) {
    std::string p = fresh("p");
    plan += fmt::format("  - {{op: {}, in: [{}], out: {}{}}}\n", op, in, p, attrs);
    pv = p;
  }
  int other_axis(int a) const { return n.size() > 1 ? 1 - a : -1; }

  // Resolve the pending sum on axis a: AllReduce (P -> R) or ReduceScatter (P -> S(d)).
  void resolve(int a) {
    const std::string& ax = axes[static_cast<std::size_t>(a)];
    int na = n[static_cast<std::size_t>(a)];
    int d = pick(2);
    if (coin(0.4) && sharder(d) < 0 && shape[d] % na == 0 && shape[d] >= na) {
      int wrong = 1 - d;
      if (local(wrong) % na == 0 && inject("ReduceScatter along the wrong dim")) d = wrong;
      plan_op("ReduceScatter", pv, fmt::format(", axis: {}, dim: {}", ax, d));
      lay[static_cast<std::size_t>(a)] = shard_of(mistake == "ReduceScatter along the wrong dim" ? 1 - d : d);
      return;
    }
    lay[static_cast<std::size_t>(a)] = Pl::R;
    if (inject("missing AllReduce")) return;
    int b = other_axis(a);
    if (b >= 0 && inject("AllReduce over the wrong axis")) {
      plan_op("AllReduce", pv, fmt::format(", axis: {}", axes[static_cast<std::size_t>(b)]));
      return;
    }
    plan_op("AllReduce", pv, fmt::format(", axis: {}", ax));
  }

  void matmul() {
    int out = 4 << pick(2);
    std::vector<Pl> w(lay.size(), Pl::R), o(lay.size(), Pl::R);
    bool out1 = false;
    for (std::size_t a = 0; a < lay.size(); ++a) {
      switch (lay[a]) {
        case Pl::R:
          if (!out1 && out % n[a] == 0 && coin(0.5)) w[a] = o[a] = Pl::S1, out1 = true;
          break;
        case Pl::S0: o[a] = Pl::S0; break;
        case Pl::S1: w[a] = Pl::S0, o[a] = Pl::P; break;
        case Pl::P: o[a] = Pl::P; break;
      }
    }
    std::string wn = input(shape[1], out, w);
    std::string s = fresh("s"), p = fresh("p");
    spec += fmt::format("    - {{op: MatMul, in: [{}, {}], out: {}}}\n", sv, wn, s);
    plan += fmt::format("  - {{op: MatMul, in: [{}, {}], out: {}}}\n", pv, wn, p);
    sv = s, pv = p, shape[1] = out, lay = o;
  }

  void add() {
    std::vector<Pl> l = lay;
    bool bias_bug = false;
    for (std::size_t a = 0; a < l.size(); ++a)
      if (l[a] == Pl::P && !bias_bug && inject("bias added to every rank's partial sum")) l[a] = Pl::R, bias_bug = true;
    std::string b = input(shape[0], shape[1], l);
    std::string s = fresh("s"), p = fresh("p");
    spec += fmt::format("    - {{op: Add, in: [{}, {}], out: {}}}\n", sv, b, s);
    plan += fmt::format("  - {{op: Add, in: [{}, {}], out: {}}}\n", pv, b, p);
    sv = s, pv = p;
  }

  void reduce() {
    int d = pick(2);
    bool mean = coin(0.5);
    const char* op = mean ? "Mean" : "Sum";
    int a = sharder(d);
    std::string attrs = fmt::format(", dims: [{}], keepdim: true", d);
    both(op, attrs);
    if (a >= 0) {
      lay[static_cast<std::size_t>(a)] = Pl::P;
      if (mean) {
        int na = n[static_cast<std::size_t>(a)];
        double scale = 1.0 / na;
        if (inject("1/n scale of a sharded Mean missing")) scale = 0;
        else if (inject("1/n scale of a sharded Mean doubled")) scale = 1.0 / (na * na);
        if (scale != 0) plan_op("Multiply", pv, fmt::format(", scalar: {}", scale));
      }
    }
    shape[d] = 1;
  }

  void slice() {
    int d = pick(2);
    if (sharder(d) >= 0 || shape[d] < 2) return;
    int st = pick(shape[d] - 1), en = st + 1 + pick(shape[d] - st);
    both("Slice", fmt::format(", dim: {}, start: {}, end: {}", d, st, en));
    shape[d] = en - st;
  }

  // The rank keeps its block of a replicated dim: a Slice at axis_index (the spec does nothing).
  void take_block() {
    int d = pick(2);
    int a = pick(static_cast<int>(lay.size()));
    std::size_t ua = static_cast<std::size_t>(a);
    int na = n[ua];
    if (lay[ua] != Pl::R || sharder(d) >= 0 || shape[d] % na != 0) return;
    int blk = shape[d] / na;
    std::string idx = fmt::format("axis_index({})", axes[ua]);
    std::string start = fmt::format("{}*{}", idx, blk), end = fmt::format("({} + 1)*{}", idx, blk);
    int b = other_axis(a);
    if (inject("axis_index slice off by one block")) {
      start = fmt::format("({} - {})*{}", na - 1, idx, blk), end = fmt::format("({} - {})*{}", na, idx, blk);
    } else if (b >= 0 && n[static_cast<std::size_t>(b)] == na && inject("axis_index of the wrong axis")) {
      idx = fmt::format("axis_index({})", axes[static_cast<std::size_t>(b)]);
      start = fmt::format("{}*{}", idx, blk), end = fmt::format("({} + 1)*{}", idx, blk);
    }
    plan_op("Slice", pv, fmt::format(", dim: {}, start: {}, end: {}", d, start, end));
    lay[ua] = shard_of(d);
  }

  void gather() {
    for (int d = 0; d < 2; ++d) {
      int a = sharder(d);
      if (a < 0) continue;
      int g = d;
      if (inject("AllGather along the wrong dim")) g = 1 - d;
      plan_op("AllGather", pv, fmt::format(", axis: {}, dim: {}", axes[static_cast<std::size_t>(a)], g));
      lay[static_cast<std::size_t>(a)] = Pl::R;
      return;
    }
  }

  void concat() {
    int d = pick(2);
    if (sharder(d) >= 0 || shape[d] > 12) return;
    int extra = 2 << pick(2);
    int r = d == 0 ? extra : shape[0], c = d == 1 ? extra : shape[1];
    std::string t = input(r, c, lay);
    std::string s = fresh("s"), p = fresh("p");
    spec += fmt::format("    - {{op: Concat, in: [{}, {}], out: {}, dim: {}}}\n", sv, t, s, d);
    if (inject("Concat operands swapped"))
      plan += fmt::format("  - {{op: Concat, in: [{}, {}], out: {}, dim: {}}}\n", t, pv, p, d);
    else
      plan += fmt::format("  - {{op: Concat, in: [{}, {}], out: {}, dim: {}}}\n", pv, t, p, d);
    sv = s, pv = p, shape[d] += extra;
  }

  void transpose() {
    both("Transpose", ", dims: [0, 1]");
    std::swap(shape[0], shape[1]);
    for (Pl& l : lay) l = l == Pl::S0 ? Pl::S1 : l == Pl::S1 ? Pl::S0 : l;
  }

  // [r, c] -> [2r, c/2]: row blocks stay row blocks when dim 1 is whole.
  void reshape() {
    if (sharder(1) >= 0 || shape[1] % 2 != 0 || shape[0] * 2 > 16) return;
    int a = sharder(0);
    int lr = local(0) * 2, lc = shape[1] / 2;
    std::string s = fresh("s"), p = fresh("p");
    spec += fmt::format("    - {{op: Reshape, in: [{}], out: {}, shape: [{}, {}]}}\n", sv, s, shape[0] * 2, lc);
    plan += fmt::format("  - {{op: Reshape, in: [{}], out: {}, shape: [{}, {}]}}\n", pv, p, lr, lc);
    (void)a;
    sv = s, pv = p, shape[0] *= 2, shape[1] = lc;
  }

  // A position mask along dim d: x * (position >= t), the spec's positions 0..n-1 and the plan's global ones (its
  // block, from axis_index(a)*n/a, when the dim is sharded over a). The mistake: every rank's positions from 0.
  void position_mask() {
    int d = pick(2), a = sharder(d), len = shape[d];
    if (len < 2) return;
    int t = 1 + pick(len - 1);
    auto shp = [&](const std::string& n) { return d == 0 ? fmt::format("[{}, 1]", n) : fmt::format("[1, {}]", n); };
    std::string s1 = fresh("s"), s2 = fresh("s"), s3 = fresh("s"), s4 = fresh("s"), s5 = fresh("s");
    spec += fmt::format("    - {{op: Arange, out: {}, end: {}}}\n", s1, len);
    spec += fmt::format("    - {{op: Reshape, in: [{}], out: {}, shape: {}}}\n", s1, s2, shp(std::to_string(len)));
    spec += fmt::format("    - {{op: Ge, in: [{}], out: {}, scalar: {}}}\n", s2, s3, t);
    spec += fmt::format("    - {{op: Cast, in: [{}], out: {}, dtype: f32}}\n", s3, s4);
    spec += fmt::format("    - {{op: Multiply, in: [{}, {}], out: {}}}\n", sv, s4, s5);
    std::string blk = std::to_string(len), start = "0", end = blk;
    if (a >= 0) {
      const std::string& ax = axes[static_cast<std::size_t>(a)];
      blk = fmt::format("{}/{}", len, ax);
      start = fmt::format("axis_index({})*{}", ax, blk), end = fmt::format("(axis_index({}) + 1)*{}", ax, blk);
      if (inject("positions of a sharded dim from 0 on every rank")) start = "0", end = blk;
    }
    std::string p1 = fresh("p"), p2 = fresh("p"), p3 = fresh("p"), p4 = fresh("p"), p5 = fresh("p");
    plan += fmt::format("  - {{op: Arange, out: {}, start: {}, end: {}}}\n", p1, start, end);
    plan += fmt::format("  - {{op: Reshape, in: [{}], out: {}, shape: {}}}\n", p1, p2, shp(blk));
    plan += fmt::format("  - {{op: Ge, in: [{}], out: {}, scalar: {}}}\n", p2, p3, t);
    plan += fmt::format("  - {{op: Cast, in: [{}], out: {}, dtype: f32}}\n", p3, p4);
    plan += fmt::format("  - {{op: Multiply, in: [{}, {}], out: {}}}\n", pv, p4, p5);
    sv = s5, pv = p5;
  }

  // A running sum along a whole dim (the mistake: along a sharded one, each rank summing only its block).
  void cumsum() {
    int d = pick(2);
    if (sharder(d) >= 0 && !inject("CumSum along a sharded dim (no prefix carried in)")) return;
    both("CumSum", fmt::format(", dim: {}{}", d, coin(0.3) ? ", reverse: true" : ""));
  }

  // Megatron's vocab-parallel shift (tensor_parallel/cross_entropy.py) along dim d: m = the max along d (of a sharded
  // dim: each rank's block max, then AllReduce max), then exp(x - m), or log(sum exp(x - m)) + m (all-reduced). The
  // value check proves these with max as a function of sets (docs/equivalence.md). The mistakes: the block max not
  // all-reduced (each rank shifts by its own), or all-reduced over the other axis.
  void shifted_max() {
    if (any_p()) return;
    int d = pick(2), a = sharder(d);
    bool lse = coin(0.5);
    const std::string attrs = fmt::format(", dims: [{}], keepdim: true", d);
    const std::string xs = sv, xp = pv;
    const bool is_max = coin(0.8);
    both(is_max ? "ReduceMax" : "ReduceMin", attrs);
    const std::string ms = sv;
    const char* rop = is_max ? "max" : "min";
    if (a >= 0) {
      int b = other_axis(a);
      if (inject("block max of a sharded dim not all-reduced")) {
      } else if (b >= 0 && inject("block max all-reduced over the wrong axis")) {
        plan_op("AllReduce", pv, fmt::format(", axis: {}, reduce: {}", axes[static_cast<std::size_t>(b)], rop));
      } else {
        plan_op("AllReduce", pv, fmt::format(", axis: {}, reduce: {}", axes[static_cast<std::size_t>(a)], rop));
      }
    }
    const std::string mp = pv;
    std::string s = fresh("s"), p = fresh("p");
    spec += fmt::format("    - {{op: Sub, in: [{}, {}], out: {}}}\n", xs, ms, s);
    plan += fmt::format("  - {{op: Sub, in: [{}, {}], out: {}}}\n", xp, mp, p);
    sv = s, pv = p;
    both("Exp", "");
    if (!lse) return;
    both("Sum", attrs);
    if (a >= 0) plan_op("AllReduce", pv, fmt::format(", axis: {}", axes[static_cast<std::size_t>(a)]));
    both("Log", "");
    s = fresh("s"), p = fresh("p");
    spec += fmt::format("    - {{op: Add, in: [{}, {}], out: {}}}\n", sv, ms, s);
    plan += fmt::format("  - {{op: Add, in: [{}, {}], out: {}}}\n", pv, mp, p);
    sv = s, pv = p, shape[d] = 1;
    if (a >= 0) lay[static_cast<std::size_t>(a)] = Pl::R;
  }

  void step() {
    switch (pick(14)) {
      case 13: shifted_max(); break;
      case 11: position_mask(); break;
      case 12: cumsum(); break;
      case 0:
      case 1: matmul(); break;
      case 2: add(); break;
      case 3: both("Multiply", fmt::format(", scalar: {}", pick(2) ? 0.5 : 3.0)); break;
      case 4:
        if (any_p()) {
          for (std::size_t a = 0; a < lay.size(); ++a)
            if (lay[a] == Pl::P) {
              resolve(static_cast<int>(a));
              break;
            }
        }
        else if (sharder(0) < 0 && sharder(1) < 0) take_block();
        else both(pick(3) == 0 ? "Sigmoid" : pick(2) ? "GELU" : "SiLU", "");
        break;
      case 5:
        if (any_p() && inject("nonlinear op on a partial sum (reduced after it)")) both(pick(2) ? "GELU" : "SiLU", "");
        for (std::size_t a = 0; a < lay.size(); ++a)
          if (lay[a] == Pl::P) resolve(static_cast<int>(a));
        if (coin(0.5)) both(pick(2) ? "GELU" : "SiLU", "");
        else {
          int d = pick(2);
          if (sharder(d) >= 0) gather();
          if (sharder(d) < 0) both("Softmax", fmt::format(", dim: {}", d));
        }
        break;
      case 6: reduce(); break;
      case 7:
        if (sharder(0) >= 0 || sharder(1) >= 0) gather();
        slice();
        break;
      case 8: concat(); break;
      case 9: transpose(); break;
      case 10:
        if (coin(0.5)) reshape();
        else take_block();
        break;
    }
  }
};

}  // namespace

LocalPair generate_local_pair(std::uint64_t seed) {
  Gen g(seed);
  if (g.coin(0.6)) g.axes = {"tp"}, g.n = {g.coin(0.25) ? 4 : 2};
  else g.axes = {"dp", "tp"}, g.n = {2, 2};
  g.want_bug = g.coin(0.5);
  g.shape[0] = 4 << g.pick(2);
  g.shape[1] = 4 << g.pick(2);
  g.lay.assign(g.axes.size(), Pl::R);
  bool used[2] = {false, false};
  for (std::size_t a = 0; a < g.lay.size(); ++a) {
    int d = g.pick(3);
    if (d < 2 && !used[d] && g.shape[d] % g.n[a] == 0) g.lay[a] = shard_of(d), used[d] = true;
  }
  std::string x = g.input(g.shape[0], g.shape[1], g.lay);
  g.sv = g.pv = x;
  int steps = 2 + g.pick(5);
  for (int i = 0; i < steps; ++i) g.step();
  for (std::size_t a = 0; a < g.lay.size(); ++a)
    if (g.lay[a] == Pl::P) g.resolve(static_cast<int>(a));
  // The plan's output: a Multiply by 1 names it `y` (the spec's output is compared by mapping).
  std::string mesh;
  for (std::size_t a = 0; a < g.axes.size(); ++a) mesh += fmt::format("{}{}: {}", a ? ", " : "", g.axes[a], g.n[a]);
  LocalPair out;
  out.mistake = g.mistake;
  out.text = fmt::format(
      "name: local_gen_{}\nview: local\nmesh: {{{}}}\ntensors:\n{}ops:\n{}outputs:\n  {}: {{placement: {}}}\nspec:\n  ops:\n{}  outputs: {{{}: {}}}\n",
      seed, mesh, g.tensors, g.plan, g.pv, g.placement(g.lay), g.spec, g.pv, g.sv);
  if (g.pv == g.sv || g.plan.empty() || g.spec.empty()) out.text.clear();  // nothing to compare
  // per-rank programs: rank by rank (row-major over the axes), the plan's ops with this rank's coordinates
  std::string programs;
  int ranks = 1;
  for (int n : g.n) ranks *= n;
  for (int r = 0; r < ranks; ++r) {
    std::vector<int> c(g.axes.size());
    for (int a = static_cast<int>(g.axes.size()) - 1, q = r; a >= 0; --a) c[static_cast<std::size_t>(a)] = q % g.n[static_cast<std::size_t>(a)], q /= g.n[static_cast<std::size_t>(a)];
    std::string coords, ops = g.plan;
    for (std::size_t a = 0; a < g.axes.size(); ++a) {
      coords += fmt::format("{}{}: {}", a ? ", " : "", g.axes[a], c[a]);
      const std::string call = "axis_index(" + g.axes[a] + ")";
      for (std::size_t at = ops.find(call); at != std::string::npos; at = ops.find(call, at)) ops.replace(at, call.size(), std::to_string(c[a]));
    }
    std::string indented;
    for (std::size_t at = 0; at < ops.size();) {
      std::size_t nl = ops.find('\n', at);
      indented += "    " + ops.substr(at, nl - at + 1);
      at = nl + 1;
    }
    programs += fmt::format("  - ranks: {{{}}}\n    ops:\n{}", coords, indented);
  }
  if (!out.text.empty())
    out.per_rank = fmt::format(
        "name: local_gen_{}_per_rank\nview: local\nmesh: {{{}}}\ntensors:\n{}programs:\n{}outputs:\n  {}: {{placement: {}}}\nspec:\n  ops:\n{}  outputs: {{{}: {}}}\n",
        seed, mesh, g.tensors, programs, g.pv, g.placement(g.lay), g.spec, g.pv, g.sv);
  return out;
}

}  // namespace spmd::test
