// tests/reduce_gen.cpp - random programs with named sizes at several scales (tests/reduce_gen.h).
//
// A family is drawn from the seed alone (mesh, blocks, mistake); the scale only multiplies the sizes and recomputes
// the numbers written from them. The plan is global-view (placements on declarations, collectives), the spec its
// single-device counterpart; both chain one activation x[B, S, H] (S(0) over dp, S(1) over cp, R over tp).
#include "tests/reduce_gen.h"

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <vector>

namespace spmd::test {
namespace {

std::string num(double x) { return fmt::format("{:.17g}", x); }

struct Gen {
  std::mt19937_64 rng;
  int k;
  int tp = 0, cp = 0, dp = 0;
  std::int64_t B, S, H, F, NH, D, V;
  bool experts = false;  // a MoE layer was drawn (the sizes E and K are declared)
  std::string tensors, plan, spec, mistake;
  bool want_bug = false;
  int n = 0;
  std::string x;        // the current activation (the same name in plan and spec: a lineage point)
  bool reduced = false; // the activation is [B, H] (after the mean over S): no block follows

  Gen(std::uint64_t seed, int scale) : rng(seed * 0x9e3779b97f4a7c15ULL + 11), k(scale) {}
  int pick(int m) { return static_cast<int>(rng() % static_cast<std::uint64_t>(m)); }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
  // The family's one mistake: decided by the rng (scale-independent), at most one.
  bool inject(const char* what) {
    if (!want_bug || !mistake.empty() || !coin(0.5)) return false;
    mistake = what;
    return true;
  }
  std::string fresh(const char* p) { return fmt::format("{}{}", p, ++n); }
  std::string act_pl() const {
    std::string s;
    if (dp) s += "dp: S(0)";
    if (cp) s += std::string(s.empty() ? "" : ", ") + "cp: S(1)";
    return "{" + s + "}";
  }
  void both(const std::string& op) { plan += "  - " + op + "\n", spec += "    - " + op + "\n"; }
  void p_op(const std::string& op) { plan += "  - " + op + "\n"; }
  void s_op(const std::string& op) { spec += "    - " + op + "\n"; }

  void mlp() {
    std::string w1 = fresh("w"), b1 = fresh("b"), w2 = fresh("w"), b2 = fresh("b");
    tensors += fmt::format("  {}: {{shape: [H, F], placement: {}, param: true}}\n", w1, tp ? "{tp: S(1)}" : "{}");
    tensors += fmt::format("  {}: {{shape: [F], placement: {}, param: true}}\n", b1, tp ? "{tp: S(0)}" : "{}");
    tensors += fmt::format("  {}: {{shape: [F, H], placement: {}, param: true}}\n", w2, tp ? "{tp: S(0)}" : "{}");
    tensors += fmt::format("  {}: {{shape: [H], param: true}}\n", b2);
    std::string h = fresh("h"), hb = fresh("hb"), a = fresh("a"), yp = fresh("yp"), ys = fresh("ys"), y = fresh("x");
    const char* act = pick(2) ? "GELU" : "SiLU";
    both(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", x, w1, h));
    both(fmt::format("{{op: Add, in: [{}, {}], out: {}}}", h, b1, hb));
    both(fmt::format("{{op: {}, in: [{}], out: {}}}", act, hb, a));
    both(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", a, w2, yp));
    if (!tp) {
      both(fmt::format("{{op: Add, in: [{}, {}], out: {}}}", yp, b2, y));
    } else if (inject("bias added before the AllReduce")) {
      p_op(fmt::format("{{op: Add, in: [{}, {}], out: {}}}", yp, b2, ys));
      p_op(fmt::format("{{op: AllReduce, in: [{}], out: {}, axis: tp}}", ys, y));
      s_op(fmt::format("{{op: Add, in: [{}, {}], out: {}}}", yp, b2, y));
    } else {
      bool avg = inject("the row-parallel AllReduce averages");
      p_op(fmt::format("{{op: AllReduce, in: [{}], out: {}, axis: tp{}}}", yp, ys, avg ? ", reduce: avg" : ""));
      p_op(fmt::format("{{op: Add, in: [{}, {}], out: {}}}", ys, b2, y));
      s_op(fmt::format("{{op: Add, in: [{}, {}], out: {}}}", yp, b2, y));
    }
    x = y;
  }

  void norm() {
    std::string g = fresh("g"), y = fresh("x");
    tensors += fmt::format("  {}: {{shape: [H], param: true}}\n", g);
    if (coin(0.5)) {  // a library norm on both sides
      const char* kind = pick(2) ? "RMSNorm" : "LayerNorm";
      bool eps = inject("norm eps changed in the plan");
      p_op(fmt::format("{{op: {}, in: [{}, {}], out: {}{}}}", kind, x, g, y, eps ? ", eps: 0.001" : ""));
      s_op(fmt::format("{{op: {}, in: [{}, {}], out: {}}}", kind, x, g, y));
    } else {  // the plan writes RMSNorm out with its 1/H as a number
      double inv = 1.0 / static_cast<double>(H);
      if (inject("the mean of squares divides by H/2")) inv = 2.0 / static_cast<double>(H);
      else if (inject("the mean of squares divides by 4 (right only at the smallest H)")) inv = 0.25;
      std::string sq = fresh("sq"), ss = fresh("ss"), ms = fresh("ms"), ve = fresh("ve"), r = fresh("r"), xn = fresh("xn");
      p_op(fmt::format("{{op: Multiply, in: [{}, {}], out: {}}}", x, x, sq));
      p_op(fmt::format("{{op: Sum, in: [{}], out: {}, dims: [-1], keepdim: true}}", sq, ss));
      p_op(fmt::format("{{op: Multiply, in: [{}], out: {}, scalar: {}}}", ss, ms, num(inv)));
      p_op(fmt::format("{{op: Add, in: [{}], out: {}, scalar: 0.00001}}", ms, ve));
      p_op(fmt::format("{{op: Rsqrt, in: [{}], out: {}}}", ve, r));
      p_op(fmt::format("{{op: Multiply, in: [{}, {}], out: {}}}", x, r, xn));
      p_op(fmt::format("{{op: Multiply, in: [{}, {}], out: {}}}", xn, g, y));
      s_op(fmt::format("{{op: RMSNorm, in: [{}, {}], out: {}}}", x, g, y));
    }
    x = y;
  }

  // The mean over the sequence: the plan sums (its cp shards add up) and scales by 1/S written as a number.
  void seq_mean() {
    std::string sm = fresh("sm"), sr = fresh("sr"), y = fresh("x");
    double inv = 1.0 / static_cast<double>(S);
    if (cp && inject("1/S forgets the cp factor")) inv = static_cast<double>(cp) / static_cast<double>(S);
    else if (inject("the mean scales by 1/4 (right only at the smallest S)")) inv = 0.25;
    p_op(fmt::format("{{op: Sum, in: [{}], out: {}, dims: [1]}}", x, sm));
    if (cp) p_op(fmt::format("{{op: AllReduce, in: [{}], out: {}, axis: cp}}", sm, sr));
    else sr = sm;
    p_op(fmt::format("{{op: Multiply, in: [{}], out: {}, scalar: {}}}", sr, y, num(inv)));
    s_op(fmt::format("{{op: Mean, in: [{}], out: {}, dims: [1]}}", x, y));
    x = y;
    reduced = true;
  }

  // Attention written out in the plan (scores scaled by 1/sqrt(D) as a number), FlashAttention in the spec.
  void attention() {
    std::string wq = fresh("wq"), wk = fresh("wk"), wv = fresh("wv"), wo = fresh("wo");
    const char* col = tp ? "{tp: S(1)}" : "{}";
    tensors += fmt::format("  {}: {{shape: [H, NH*D], placement: {}, param: true}}\n", wq, col);
    tensors += fmt::format("  {}: {{shape: [H, NH*D], placement: {}, param: true}}\n", wk, col);
    tensors += fmt::format("  {}: {{shape: [H, NH*D], placement: {}, param: true}}\n", wv, col);
    tensors += fmt::format("  {}: {{shape: [NH*D, H], placement: {}, param: true}}\n", wo, tp ? "{tp: S(0)}" : "{}");
    std::string xin = x;
    if (cp) {  // attention needs the whole sequence: gather it (the spec has it whole)
      xin = fresh("xg");
      p_op(fmt::format("{{op: AllGather, in: [{}], out: {}, axis: cp, dim: 1}}", x, xin));
    }
    std::string q2 = fresh("q"), k2 = fresh("k"), v2 = fresh("v"), q = fresh("q"), kk = fresh("k"), v = fresh("v");
    for (auto [w, o2, o] : {std::tuple{wq, q2, q}, {wk, k2, kk}, {wv, v2, v}}) {
      p_op(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", xin, w, o2));
      s_op(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", x, w, o2));
      both(fmt::format("{{op: Reshape, in: [{}], out: {}, shape: [B, S, NH, D]}}", o2, o));
    }
    double scale = 1.0 / std::sqrt(static_cast<double>(D));
    if (inject("attention scores scaled by 1/D instead of 1/sqrt(D)")) scale = 1.0 / static_cast<double>(D);
    else if (inject("attention scores scaled by 1/sqrt(2) (right only at the smallest D)")) scale = 1.0 / std::sqrt(2.0);
    std::string qt = fresh("qt"), kt = fresh("kt"), ktt = fresh("ktt"), vt = fresh("vt"), sc = fresh("sc"), ss = fresh("ss"), pr = fresh("pr"),
                ot = fresh("ot"), o = fresh("o"), o2 = fresh("o"), yp = fresh("yp"), y = fresh("x");
    p_op(fmt::format("{{op: Transpose, in: [{}], out: {}, dims: [1, 2]}}", q, qt));
    p_op(fmt::format("{{op: Transpose, in: [{}], out: {}, dims: [1, 2]}}", kk, kt));
    p_op(fmt::format("{{op: Transpose, in: [{}], out: {}, dims: [2, 3]}}", kt, ktt));
    p_op(fmt::format("{{op: Transpose, in: [{}], out: {}, dims: [1, 2]}}", v, vt));
    p_op(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", qt, ktt, sc));
    p_op(fmt::format("{{op: Multiply, in: [{}], out: {}, scalar: {}}}", sc, ss, num(scale)));
    p_op(fmt::format("{{op: Softmax, in: [{}], out: {}, dim: -1}}", ss, pr));
    p_op(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", pr, vt, ot));
    p_op(fmt::format("{{op: Transpose, in: [{}], out: {}, dims: [1, 2]}}", ot, o));
    s_op(fmt::format("{{op: FlashAttention, in: [{}, {}, {}], out: {}, layout: bshd}}", q, kk, v, o));
    both(fmt::format("{{op: Reshape, in: [{}], out: {}, shape: [B, S, NH*D]}}", o, o2));
    p_op(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", o2, wo, yp));
    std::string last = yp;
    if (tp) {
      std::string r = fresh("yr");
      p_op(fmt::format("{{op: AllReduce, in: [{}], out: {}, axis: tp}}", yp, r));
      last = r;
    }
    if (cp) {
      std::string c = fresh("yc");
      p_op(fmt::format("{{op: Convert, in: [{}], out: {}, axis: cp, from: R, to: S(1)}}", last, c));
      last = c;
    }
    p_op(fmt::format("{{op: Add, in: [{}, {}], out: {}}}", x, last, y));
    s_op(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", o2, wo, yp));
    s_op(fmt::format("{{op: Add, in: [{}, {}], out: {}}}", x, yp, y));
    x = y;
  }

  // A mixture-of-experts layer with expert parallelism over tp (no cp): the plan routes its tokens, split over tp, by
  // a dropless MoEDispatch to the experts split over tp and back by MoECombine (a mesh reduction runs tp 4 at 2
  // ranks: the dispatch treats ranks alike); the spec runs every token through every expert, weighted by a one-hot
  // of its routing.
  void moe() {
    experts = true;
    std::string rt = fresh("rt"), eg = fresh("eg"), ed = fresh("ed");
    tensors += fmt::format("  {}: {{shape: [H, E], param: true}}\n", rt);
    tensors += fmt::format("  {}: {{shape: [E, H, F], placement: {{tp: S(0)}}, param: true}}\n", eg);
    tensors += fmt::format("  {}: {{shape: [E, F, H], placement: {{tp: S(0)}}, param: true}}\n", ed);
    std::string xs = fresh("xs"), lg = fresh("lg"), gw = fresh("gw"), gi = fresh("gi"), buf = fresh("buf"), eh = fresh("eh"), ea = fresh("ea"),
                eo = fresh("eo"), rs = fresh("rs"), ro = fresh("ro"), y = fresh("x");
    p_op(fmt::format("{{op: Convert, in: [{}], out: {}, axis: tp, to: S(1)}}", x, xs));
    p_op(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", xs, rt, lg));
    s_op(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", x, rt, lg));
    both(fmt::format("{{op: TopKGate, in: [{}], out: [{}, {}], k: K}}", lg, gw, gi));
    bool twice = inject("the gate weights applied in the dispatch and again in the combine");
    p_op(fmt::format("{{op: MoEDispatch, in: [{}, {}{}], out: {}, axis: tp, buffer: [E, S], dropless: true}}", xs, gi, twice ? ", " + gw : "", buf));
    p_op(fmt::format("{{op: ExpertCompute, in: [{}, {}], out: {}}}", buf, eg, eh));
    p_op(fmt::format("{{op: SiLU, in: [{}], out: {}}}", eh, ea));
    p_op(fmt::format("{{op: ExpertCompute, in: [{}, {}], out: {}}}", ea, ed, eo));
    bool unweighted = !twice && inject("the combine drops the gate weights");
    p_op(fmt::format("{{op: MoECombine, in: [{}, {}{}], out: {}, axis: tp}}", eo, gi, unweighted ? "" : ", " + gw, rs));
    p_op(fmt::format("{{op: AllGather, in: [{}], out: {}, axis: tp, dim: 1}}", rs, ro));
    p_op(fmt::format("{{op: Add, in: [{}, {}], out: {}}}", x, ro, y));
    std::string oh = fresh("oh"), gw4 = fresh("gw"), ohw = fresh("ohw"), gd = fresh("gd"), egt = fresh("egt"), eg2 = fresh("eg"), eh2 = fresh("eh"),
                ea2 = fresh("ea"), ea3 = fresh("ea"), eat = fresh("eat"), eo2 = fresh("eo"), eot = fresh("eot"), gd3 = fresh("gd"), ro3 = fresh("ro"),
                rr = fresh("ro");
    s_op(fmt::format("{{op: OneHot, in: [{}], out: {}, classes: E, dtype: f32}}", gi, oh));
    s_op(fmt::format("{{op: Reshape, in: [{}], out: {}, shape: [B, S, K, 1]}}", gw, gw4));
    s_op(fmt::format("{{op: Multiply, in: [{}, {}], out: {}}}", oh, gw4, ohw));
    s_op(fmt::format("{{op: Sum, in: [{}], out: {}, dims: [2]}}", ohw, gd));
    s_op(fmt::format("{{op: Transpose, in: [{}], out: {}, dims: [0, 1]}}", eg, egt));
    s_op(fmt::format("{{op: Reshape, in: [{}], out: {}, shape: [H, E*F]}}", egt, eg2));
    s_op(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", x, eg2, eh2));
    s_op(fmt::format("{{op: SiLU, in: [{}], out: {}}}", eh2, ea2));
    s_op(fmt::format("{{op: Reshape, in: [{}], out: {}, shape: [B*S, E, F]}}", ea2, ea3));
    s_op(fmt::format("{{op: Transpose, in: [{}], out: {}, dims: [0, 1]}}", ea3, eat));
    s_op(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", eat, ed, eo2));
    s_op(fmt::format("{{op: Transpose, in: [{}], out: {}, dims: [0, 1]}}", eo2, eot));
    s_op(fmt::format("{{op: Reshape, in: [{}], out: {}, shape: [B*S, 1, E]}}", gd, gd3));
    s_op(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", gd3, eot, ro3));
    s_op(fmt::format("{{op: Reshape, in: [{}], out: {}, shape: [B, S, H]}}", ro3, rr));
    s_op(fmt::format("{{op: Add, in: [{}, {}], out: {}}}", x, rr, y));
    x = y;
  }

  // RoPE at global positions: under cp each rank reads its block of Arange(S).
  void rope() {
    std::string wr = fresh("wr"), wo = fresh("wo");
    tensors += fmt::format("  {}: {{shape: [H, NH*D], param: true}}\n", wr);
    tensors += fmt::format("  {}: {{shape: [NH*D, H], param: true}}\n", wo);
    std::string q2 = fresh("q"), q = fresh("q"), pos = fresh("pos"), ps = fresh("ps"), qr = fresh("qr"), o = fresh("o"), y = fresh("x");
    both(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", x, wr, q2));
    both(fmt::format("{{op: Reshape, in: [{}], out: {}, shape: [B, S, NH, D]}}", q2, q));
    bool off = inject("RoPE positions off by one");
    p_op(fmt::format("{{op: Arange, out: {}, {}end: {}}}", pos, off ? "start: 1, " : "", off ? "S + 1" : "S"));
    s_op(fmt::format("{{op: Arange, out: {}, end: S}}", pos));
    if (cp) p_op(fmt::format("{{op: Convert, in: [{}], out: {}, axis: cp, from: R, to: S(0)}}", pos, ps));
    else ps = pos;
    p_op(fmt::format("{{op: RoPE, in: [{}, {}], out: {}}}", q, ps, qr));
    s_op(fmt::format("{{op: RoPE, in: [{}, {}], out: {}}}", q, pos, qr));
    both(fmt::format("{{op: Reshape, in: [{}], out: {}, shape: [B, S, NH*D]}}", qr, o));
    both(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", o, wo, y));
    x = y;
  }

  // A vocab-parallel cross-entropy summed and divided by the token count written as a number.
  void cross_entropy() {
    std::string wv = fresh("wv"), lab = fresh("labels");
    tensors += fmt::format("  {}: {{shape: [H, V], placement: {}, param: true}}\n", wv, tp ? "{tp: S(1)}" : "{}");
    tensors += fmt::format("  {}: {{shape: [B, S], dtype: i64, placement: {}}}\n", lab, [&] {
      std::string s;
      if (dp) s += "dp: S(0)";
      if (cp) s += std::string(s.empty() ? "" : ", ") + "cp: S(1)";
      return "{" + s + "}";
    }());
    std::string lg = fresh("logits"), ls = fresh("ls"), y = fresh("loss");
    both(fmt::format("{{op: MatMul, in: [{}, {}], out: {}}}", x, wv, lg));
    double inv = 1.0 / static_cast<double>(B * S);
    if (inject("the token count forgets the batch")) inv = 1.0 / static_cast<double>(S);
    p_op(fmt::format("{{op: CrossEntropyLoss, in: [{}, {}], out: {}, reduction: sum{}}}", lg, lab, ls, tp ? ", vocab_parallel: true, axis: tp" : ""));
    std::string cur = ls;
    for (const char* ax : {"dp", "cp"}) {
      if ((std::string(ax) == "dp" && !dp) || (std::string(ax) == "cp" && !cp)) continue;
      std::string r = fresh("lr");
      // (a mesh reduction runs dp 4 at 2 ranks: an average over dp still divides by 4, so a factor written for
      // 2 ranks stays wrong)
      if (std::string(ax) == "dp" && dp > 2 && inject("the dp sum written as an average times 2 (right only at dp 2)")) {
        std::string m = fresh("lm");
        p_op(fmt::format("{{op: AllReduce, in: [{}], out: {}, axis: dp, reduce: avg}}", cur, m));
        p_op(fmt::format("{{op: Multiply, in: [{}], out: {}, scalar: 2}}", m, r));
      } else {
        p_op(fmt::format("{{op: AllReduce, in: [{}], out: {}, axis: {}}}", cur, r, ax));
      }
      cur = r;
    }
    p_op(fmt::format("{{op: Multiply, in: [{}], out: {}, scalar: {}}}", cur, y, num(inv)));
    s_op(fmt::format("{{op: CrossEntropyLoss, in: [{}, {}], out: {}}}", lg, lab, y));
    x = y;
    reduced = true;
  }
};

}  // namespace

ScaledProgram generate_scaled(std::uint64_t seed, int scale) {
  Gen g(seed, scale);
  static const std::vector<std::vector<std::pair<const char*, int>>> meshes = {
      {{"tp", 2}}, {{"tp", 4}}, {{"dp", 2}, {"tp", 2}}, {{"cp", 2}, {"tp", 2}}, {{"cp", 2}}, {{"dp", 2}}, {{"dp", 4}}, {{"dp", 4}, {"tp", 4}}};
  const auto& mesh = meshes[static_cast<std::size_t>(g.pick(static_cast<int>(meshes.size())))];
  std::string mesh_text;
  for (const auto& [ax, n] : mesh) {
    mesh_text += fmt::format("{}{}: {}", mesh_text.empty() ? "" : ", ", ax, n);
    if (std::string(ax) == "tp") g.tp = n;
    if (std::string(ax) == "cp") g.cp = n;
    if (std::string(ax) == "dp") g.dp = n;
  }
  std::int64_t t = std::max(g.tp, 1), k = scale;
  g.B = 2 * k * std::max<std::int64_t>(g.dp / 2, 1), g.S = 4 * k, g.H = 4 * k * t, g.F = 4 * k * t, g.NH = t * k, g.D = 2 * k, g.V = 2 * t * k;
  const std::int64_t experts = 2 * t * k;  // (top-2 routing: K stays 2 at every scale)
  g.want_bug = g.coin(0.5);
  g.x = "x0";
  g.tensors = fmt::format("  x0: {{shape: [B, S, H], placement: {}}}\n", g.act_pl());
  int blocks = 1 + g.pick(3);
  for (int b = 0; b < blocks && !g.reduced; ++b) {
    switch (g.pick(4)) {
      case 0:
        if (g.tp && !g.cp && g.coin(0.5)) g.moe();  // (drawn after the family's other choices of this block)
        else g.mlp();
        break;
      case 1: g.norm(); break;
      case 2: g.attention(); break;
      case 3: g.rope(); break;
    }
  }
  if (!g.reduced && g.coin(0.5)) {
    if (g.pick(2) && !g.dp) g.seq_mean();
    else g.cross_entropy();
  }
  std::string out_pl = g.reduced ? (g.x.rfind("loss", 0) == 0 ? "{}" : (g.dp ? "{dp: S(0)}" : "{}")) : g.act_pl();
  ScaledProgram r;
  r.mistake = g.mistake;
  r.text = fmt::format(
      "# reduce_gen seed {} scale {}{}\nmesh: {{{}}}\nsizes: {{B: {}, S: {}, H: {}, F: {}, NH: {}, D: {}, V: {}{}}}\ntensors:\n{}ops:\n{}outputs:\n  {}: "
      "{{placement: {}}}\nspec:\n  ops:\n{}  outputs: [{}]\n",
      seed, scale, r.mistake.empty() ? "" : " (mistake: " + r.mistake + ")", mesh_text, g.B, g.S, g.H, g.F, g.NH, g.D, g.V,
      g.experts ? fmt::format(", E: {}, K: 2", experts) : "", g.tensors, g.plan, g.x, out_pl, g.spec, g.x);
  return r;
}

}  // namespace spmd::test
