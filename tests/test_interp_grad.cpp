// tests/test_interp_grad.cpp - the value kernels of the gradient ops (interp/ops_grad.cpp): each gradient against
// central differences of its forward kernel (doubles), per-rank runs (context parallel, vocab-parallel, a
// vocab-sharded table) against the single-device run, and the field lanes: the derived backward of a primitive
// composition equals the fused gradient op in every lane, and a wrong gradient does not.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <optional>

#include "autograd/autograd.h"
#include "interp/assembly.h"
#include "interp/runner.h"
#include "ir/loader.h"

using namespace spmd;
using namespace spmd::interp;

namespace {

NameId name_id(const Program& p, const std::string& n) {
  for (std::size_t i = 0; i < p.names.size(); ++i)
    if (p.names[i] == n) return static_cast<NameId>(i);
  FAIL("no name " << n);
  return -1;
}

// One run of a program: per rank on `mesh` (sizes per axis), or the single-device run (`global`, a mesh of ones
// standing for `mesh`). Inputs are drawn as the oracle draws them (integers below `range`), then `init` may
// overwrite them; `go` runs the ops.
struct Sim {
  const Program& p;
  std::vector<std::int64_t> vars;
  OracleOptions o;
  std::int64_t work = 0;
  std::unique_ptr<Runner> run;
  Sim(const Program& prog, std::vector<std::int64_t> mesh, bool global = false, std::int64_t range = 5) : p(prog) {
    std::vector<std::int64_t> sizes = global ? std::vector<std::int64_t>(mesh.size(), 1) : mesh;
    run = std::make_unique<Runner>(p, vars, sizes, global, o, work, mesh);
    for (const auto& t : p.tensors) run->declare(t, range, 17);
  }
  Tensor& t(const std::string& n, std::int64_t r = 0) { return run->at(r, name_id(p, n)).t; }
  void go() { run->run(17); }
  std::int64_t ranks() const { return run->ranks(); }
};

using Init = std::function<void(Sim&)>;

// Central differences of loss(sim) in each element of `x` on rank `xr` (with `all_ranks`, the element moves on
// every rank together: a replicated input), against `grad` (the gradient op's local value on rank `gr`).
void check_fd(const Program& p, std::vector<std::int64_t> mesh, const Init& init, const std::string& x, const std::function<double(Sim&)>& loss,
              const std::string& grad, std::int64_t xr = 0, std::int64_t gr = 0, bool all_ranks = false, std::int64_t range = 5, bool global = false) {
  Sim base(p, mesh, global, range);
  if (init) init(base);
  base.go();
  const Tensor g = base.t(grad, gr);
  const std::size_t n = base.t(x, xr).data.size();
  REQUIRE(g.data.size() == n);
  const double h = 1e-5;
  for (std::size_t i = 0; i < n; ++i) {
    double l[2];
    for (int s = 0; s < 2; ++s) {
      Sim sim(p, mesh, global, range);
      if (init) init(sim);
      for (std::int64_t r = 0; r < sim.ranks(); ++r)
        if (r == xr || all_ranks) sim.t(x, r).data[i] = Num(sim.t(x, r).data[i].d + (s ? -h : h));
      sim.go();
      l[s] = loss(sim);
    }
    double fd = (l[0] - l[1]) / (2 * h);
    INFO(grad << "[" << i << "] on rank " << gr << ": kernel " << g.data[i].d << ", central difference " << fd);
    CHECK(std::abs(fd - g.data[i].d) <= 1e-6 * std::max(1.0, std::abs(fd)));
  }
}

// sum(c * y) over every element of every listed rank's local y.
std::function<double(Sim&)> dot(const std::string& y, const std::string& c, std::vector<std::int64_t> ranks = {0}) {
  return [=](Sim& s) {
    double acc = 0;
    for (auto r : ranks) {
      const Tensor& a = s.t(y, r);
      const Tensor& b = s.t(c, r);
      REQUIRE(a.data.size() == b.data.size());
      for (std::size_t i = 0; i < a.data.size(); ++i) acc += a.data[i].d * b.data[i].d;
    }
    return acc;
  };
}

Program load(const std::string& yaml) { return load_program_string(yaml, "t.yaml"); }

// Doubles of two tensors agree (to rounding).
void check_close(const Tensor& a, const Tensor& b, const char* what) {
  REQUIRE(a.shape == b.shape);
  for (std::size_t i = 0; i < a.data.size(); ++i) {
    INFO(what << "[" << i << "]: " << a.data[i].d << " vs " << b.data[i].d);
    CHECK(std::abs(a.data[i].d - b.data[i].d) <= 1e-9 * std::max(1.0, std::abs(b.data[i].d)));
  }
}

// Every element equal in every lane (and in doubles, to rounding).
bool same_lanes(const Tensor& a, const Tensor& b) {
  if (a.shape != b.shape) return false;
  for (std::size_t i = 0; i < a.data.size(); ++i) {
    if (std::abs(a.data[i].d - b.data[i].d) > 1e-9 * std::max(1.0, std::abs(b.data[i].d))) return false;
    for (int l = 0; l < kLanes; ++l)
      if (a.data[i].pure(l) != b.data[i].pure(l)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("gradient kernels: PointwiseGrad against central differences of each pointwise op") {
  for (const char* f : {"Exp", "Log", "Sqrt", "Rsqrt", "SiLU", "GELU", "ReLU"}) {
    INFO(f);
    Program p = load(std::string("mesh: {dp: 1}\ntensors:\n  x: {shape: [3, 4]}\n  c: {shape: [3, 4]}\nops:\n") + "  - {op: " + f +
                     ", in: [x], out: y}\n  - {op: PointwiseGrad, in: [c, x], out: gx, of: " + f + "}\n");
    bool positive = std::string(f) == "Log" || std::string(f) == "Sqrt" || std::string(f) == "Rsqrt";
    Init init = [&](Sim& s) {
      for (auto& e : s.t("x").data) {
        double v = e.d;
        if (positive) v = 0.3 + std::abs(v);
        if (std::abs(v) < 0.05) v += 0.2;  // ReLU: away from the kink
        e = Num(v);
      }
    };
    check_fd(p, {1}, init, "x", dot("y", "c"), "gx");
  }
}

TEST_CASE("gradient kernels: PointwiseGrad of Dropout redraws its forward's mask, and is skipped without one") {
  const char* yaml = R"(
mesh: {dp: 2}
tensors:
  x: {shape: [4, 6], placement: {dp: S(0)}}
  c: {shape: [4, 6], placement: {dp: S(0)}}
ops:
  - {op: Dropout, in: [x], out: y, p: 0.4}
  - {op: PointwiseGrad, in: [c, x], out: gx, of: Dropout}
outputs:
  gx: {placement: {dp: S(0)}}
)";
  Program p = load(yaml);
  for (std::int64_t r = 0; r < 2; ++r) check_fd(p, {2}, nullptr, "x", dot("y", "c", {r}), "gx", r, r);
  // some elements are dropped, some kept: the check above saw both
  Sim s(p, {2});
  s.go();
  int zeros = 0;
  for (auto& e : s.t("gx", 0).data) zeros += e.d == 0;
  CHECK(zeros > 0);
  CHECK(zeros < 12);
  CHECK(run_oracle(p).verdict == OracleVerdict::Agree);
  for (const auto& op : p.ops) CHECK(has_value_kernel(p, p.ops, op));
  // no forward Dropout of x, or two of them: the mask cannot be redrawn, so the program is skipped
  for (const char* ops : {"  - {op: PointwiseGrad, in: [c, x], out: gx, of: Dropout}\n",
                          "  - {op: Dropout, in: [x], out: y}\n  - {op: Dropout, in: [x], out: y2}\n  - {op: PointwiseGrad, in: [c, x], out: gx, of: Dropout}\n"}) {
    Program q = load(std::string("mesh: {dp: 2}\ntensors:\n  x: {shape: [4, 6]}\n  c: {shape: [4, 6]}\nops:\n") + ops + "outputs:\n  gx: {placement: {dp: R}}\n");
    CHECK(!has_value_kernel(q, q.ops, q.ops.back()));
    OracleResult res = run_oracle(q);
    CHECK(res.verdict == OracleVerdict::Skipped);
    CHECK(res.message.find("PointwiseGrad") != std::string::npos);
  }
}

TEST_CASE("gradient kernels: NormGrad of LayerNorm, RMSNorm (with and without weight) and Softmax against central differences") {
  struct C {
    const char* of;
    bool weight;
    const char* dims;
    const char* eps;
  };
  for (C c : {C{"LayerNorm", false, "", ""}, C{"LayerNorm", true, "", ", eps: 0.001"}, C{"RMSNorm", false, "", ""}, C{"RMSNorm", true, "", ", eps: 0.01"},
              C{"LayerNorm", true, ", dims: [1, 2]", ""}, C{"RMSNorm", false, ", dims: [0, 2]", ", eps: 0.5"}}) {
    INFO(c.of << " weight " << c.weight << c.dims << c.eps);
    std::string wshape = std::string(c.dims) == ", dims: [1, 2]" ? "[3, 4]" : std::string(c.dims) == ", dims: [0, 2]" ? "[2, 4]" : "[4]";
    std::string yaml = "mesh: {dp: 1}\ntensors:\n  x: {shape: [2, 3, 4]}\n  c: {shape: [2, 3, 4]}\n  w: {shape: " + wshape + "}\nops:\n";
    std::string w = c.weight ? ", w" : "";
    yaml += std::string("  - {op: ") + c.of + ", in: [x" + w + "], out: y" + c.dims + c.eps + "}\n";
    yaml += std::string("  - {op: NormGrad, in: [c, x") + w + "], out: gx, of: " + c.of + c.dims + c.eps + "}\n";
    Program p = load(yaml);
    check_fd(p, {1}, nullptr, "x", dot("y", "c"), "gx");
  }
  for (const char* dim : {"-1", "0", "1"}) {
    INFO("Softmax dim " << dim);
    Program p = load(std::string("mesh: {dp: 1}\ntensors:\n  x: {shape: [3, 5]}\n  c: {shape: [3, 5]}\nops:\n  - {op: Softmax, in: [x], out: y, dim: ") + dim +
                     "}\n  - {op: NormGrad, in: [c, y], out: gx, of: Softmax, dims: [" + dim + "]}\n");
    check_fd(p, {1}, nullptr, "x", dot("y", "c"), "gx");
  }
}

namespace {

std::string attention_yaml(const char* layout, bool causal, const Shape& qs, const Shape& ks, const std::string& extra = "", const std::string& qpl = "",
                           const std::string& mesh = "{dp: 1}") {
  auto sh = [](const Shape& s) {
    std::string t = "[";
    for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
  };
  std::string y = "mesh: " + mesh + "\ntensors:\n";
  y += "  q: {shape: " + sh(qs) + qpl + "}\n  k: {shape: " + sh(ks) + "}\n  v: {shape: " + sh(ks) + "}\n  c: {shape: " + sh(qs) + qpl + "}\nops:\n";
  std::string a = std::string(", layout: ") + layout + ", causal: " + (causal ? "true" : "false") + extra;
  y += "  - {op: FlashAttention, in: [q, k, v], out: y" + a + "}\n";
  const char* wrt[] = {"q", "k", "v"};
  for (const char* w : wrt) y += std::string("  - {op: AttentionGrad, in: [c, q, k, v], out: g") + w + ", wrt: " + w + a + "}\n";
  return y;
}

}  // namespace

TEST_CASE("gradient kernels: AttentionGrad with respect to q, k and v against central differences (layouts, causal, GQA)") {
  struct C {
    const char* layout;
    bool causal;
    Shape q, k;
  };
  // bhsd [B, H, S, D], bshd [B, S, H, D], sbhd [S, B, H, D]; GQA: 4 query heads over 2 kv heads; S_q != S_k
  for (C c : {C{"bhsd", false, {1, 2, 3, 2}, {1, 2, 3, 2}}, C{"bhsd", true, {2, 2, 3, 2}, {2, 2, 3, 2}}, C{"bshd", true, {1, 3, 4, 2}, {1, 3, 2, 2}},
              C{"sbhd", false, {3, 1, 4, 2}, {2, 1, 2, 2}}, C{"sbhd", true, {3, 2, 2, 3}, {3, 2, 1, 3}}}) {
    INFO(c.layout << (c.causal ? " causal" : ""));
    Program p = load(attention_yaml(c.layout, c.causal, c.q, c.k));
    for (const char* w : {"q", "k", "v"}) check_fd(p, {1}, nullptr, w, dot("y", "c"), std::string("g") + w);
  }
}

TEST_CASE("gradient kernels: AttentionGrad's siblings share one kernel pass only while their inputs hold the same values") {
  // The wrt-q op computes the group's k gradient too (Runner::AttnGradShare); k is then rewritten under its name, so
  // the wrt-k op must not take that gradient: it equals the one computed from the new k under another name
  const std::string decls = R"(mesh: {dp: 1}
tensors:
  q: {shape: [1, 2, 3, 2]}
  k: {shape: [1, 2, 3, 2]}
  v: {shape: [1, 2, 3, 2]}
  c: {shape: [1, 2, 3, 2]}
ops:
)";
  auto grad = [](const char* k, const char* wrt) {
    return std::string("  - {op: AttentionGrad, in: [c, q, ") + k + ", v], out: g" + wrt + ", wrt: " + wrt + ", layout: bhsd, causal: true}\n";
  };
  const std::string head = decls + grad("k", "q");
  Program same = load(head + "  - {op: Multiply, in: [k], out: k, scalar: 2}\n" + grad("k", "k"));
  Program apart = load(head + "  - {op: Multiply, in: [k], out: k2, scalar: 2}\n" + grad("k2", "k"));
  Program unchanged = load(head + grad("k", "k"));
  Program alone = load(decls + grad("k", "k"));
  num::Lanes guard(num::LaneParams{5});
  Sim a(same, {1}), b(apart, {1}), u(unchanged, {1}), o(alone, {1});
  a.go(), b.go(), u.go(), o.go();
  check_close(a.t("gk"), b.t("gk"), "gk after k is rewritten");
  CHECK(same_lanes(a.t("gk"), b.t("gk")));
  check_close(a.t("gq"), b.t("gq"), "gq");
  // and with k unchanged the shared gradient is the one computed alone
  check_close(u.t("gk"), o.t("gk"), "gk shared");
  CHECK(same_lanes(u.t("gk"), o.t("gk")));
  CHECK_FALSE(same_lanes(a.t("gk"), u.t("gk")));
}

TEST_CASE("gradient kernels: AttentionGrad under context parallelism (causal, contiguous and zigzag) equals the single-device gradient") {
  for (const char* order : {"contiguous", "zigzag"}) {
    INFO(order);
    // q sharded on the sequence over cp, k and v whole: dq is each rank's rows, dk and dv are pending sums
    Program p = load(attention_yaml("bshd", true, {1, 8, 2, 2}, {1, 8, 2, 2}, std::string(", cp: cp, order: ") + order, ", placement: {cp: S(1)}", "{cp: 2}"));
    for (bool lanes : {false, true}) {  // doubles, then the field lanes too: the per-rank pieces assemble to the same expressions
      std::optional<num::Lanes> guard;
      if (lanes) guard.emplace(num::LaneParams{11});
      Sim one(p, {2}, true), dist(p, {2});
      one.go();
      dist.go();
      Tensor dq = concat({dist.t("gq", 0), dist.t("gq", 1)}, 1);
      check_close(dq, one.t("gq"), "dq");
      CHECK(same_lanes(dq, one.t("gq")));
      for (const char* g : {"gk", "gv"}) {
        Tensor sum = binary(dist.t(g, 0), dist.t(g, 1), [](const Num& a, const Num& b) { return a + b; });
        check_close(sum, one.t(g), g);
        CHECK(same_lanes(sum, one.t(g)));
      }
    }
    // the single-device gradient (the mask in the global positions of `order` over 2 ranks) against central differences
    for (const char* w : {"q", "k", "v"}) check_fd(p, {2}, nullptr, w, dot("y", "c"), std::string("g") + w, 0, 0, false, 5, true);
  }
}

TEST_CASE("gradient kernels: EmbeddingGrad against central differences, and with a vocab-sharded table") {
  const char* yaml = R"(
mesh: {tp: 2}
tensors:
  ids: {shape: [2, 5], dtype: i64}
  w: {shape: [6, 3], placement: {tp: S(0)}}
  c: {shape: [2, 5, 3]}
ops:
  - {op: Embedding, in: [ids, w], out: y}
  - {op: EmbeddingGrad, in: [c, ids, w], out: gw}
)";
  Program p = load(yaml);
  // the single-device gradient against central differences (ids repeat: 10 draws from 6 rows)
  Sim one(p, {2}, true, 6);
  one.go();
  {
    Program q = load(std::string(yaml).replace(std::string(yaml).find("placement: {tp: S(0)}"), 21, "placement: {tp: R}"));
    check_fd(q, {1}, nullptr, "w", dot("y", "c"), "gw", 0, 0, false, 6);
  }
  // each rank's block of the table gets the rows of its own ids (the masked lookup), whole dy
  Sim dist(p, {2}, false, 6);
  dist.go();
  check_close(concat({dist.t("gw", 0), dist.t("gw", 1)}, 0), one.t("gw"), "gw");
  {
    num::Lanes guard({13});
    Sim l1(p, {2}, true, 6), ld(p, {2}, false, 6);
    l1.go();
    ld.go();
    CHECK(same_lanes(concat({ld.t("gw", 0), ld.t("gw", 1)}, 0), l1.t("gw")));
  }
}

TEST_CASE("gradient kernels: CrossEntropyGrad (mean, sum, none) against central differences") {
  for (const char* red : {"mean", "sum", "none"}) {
    INFO(red);
    bool none = std::string(red) == "none";
    std::string yaml = std::string("mesh: {dp: 1}\ntensors:\n  lg: {shape: [2, 3, 5]}\n  lb: {shape: [2, 3], dtype: i64}\n  c: {shape: ") +
                       (none ? "[2, 3]" : "[]") + "}\nops:\n  - {op: CrossEntropyLoss, in: [lg, lb], out: loss, reduction: " + red +
                       "}\n  - {op: CrossEntropyGrad, in: [c, lg, lb], out: glg, reduction: " + red + "}\n";
    Program p = load(yaml);
    check_fd(p, {1}, nullptr, "lg", dot("loss", "c"), "glg");
  }
}

TEST_CASE("gradient kernels: CrossEntropyGrad with the vocab split over 2 ranks, and with the tokens split (a per-rank mean)") {
  const char* yaml = R"(
mesh: {tp: 2}
tensors:
  lg: {shape: [2, 3, 6], placement: {tp: S(2)}}
  lb: {shape: [2, 3], dtype: i64}
  c: {shape: []}
ops:
  - {op: CrossEntropyLoss, in: [lg, lb], out: loss, vocab_parallel: true}
  - {op: CrossEntropyGrad, in: [c, lg, lb], out: glg, vocab_parallel: true}
)";
  Program p = load(yaml);
  for (bool lanes : {false, true}) {
    std::optional<num::Lanes> guard;
    if (lanes) guard.emplace(num::LaneParams{12});
    Sim one(p, {2}, true, 6), dist(p, {2}, false, 6);
    one.go();
    dist.go();
    Tensor g = concat({dist.t("glg", 0), dist.t("glg", 1)}, 2);
    check_close(g, one.t("glg"), "glg");
    CHECK(same_lanes(g, one.t("glg")));
  }
  // every rank holds the whole loss: a logit on either rank moves rank 0's loss by its gradient there
  for (std::int64_t r = 0; r < 2; ++r) check_fd(p, {2}, nullptr, "lg", dot("loss", "c"), "glg", r, r, false, 6);
  // tokens split over dp: each rank's loss is the mean over its own tokens (as the forward divides), and so is
  // its gradient
  const char* tok = R"(
mesh: {dp: 2}
tensors:
  lg: {shape: [4, 5], placement: {dp: S(0)}}
  lb: {shape: [4], placement: {dp: S(0)}, dtype: i64}
  c: {shape: []}
ops:
  - {op: CrossEntropyLoss, in: [lg, lb], out: loss}
  - {op: CrossEntropyGrad, in: [c, lg, lb], out: glg}
)";
  Program q = load(tok);
  for (std::int64_t r = 0; r < 2; ++r) check_fd(q, {2}, nullptr, "lg", dot("loss", "c", {r}), "glg", r, r);
}

TEST_CASE("gradient kernels: TopKGrad against central differences of TopKGate's weights") {
  for (int k : {1, 2, 3}) {
    INFO("k = " << k);
    Program p = load("mesh: {dp: 1}\ntensors:\n  x: {shape: [3, 5]}\n  c: {shape: [3, " + std::to_string(k) +
                     "]}\nops:\n  - {op: TopKGate, in: [x], out: [w, idx], k: " + std::to_string(k) + "}\n  - {op: TopKGrad, in: [c, x, idx], out: gx}\n");
    check_fd(p, {1}, nullptr, "x", dot("w", "c"), "gx");
  }
}

TEST_CASE("gradient kernels: MoEGateGrad of a dispatch and of a combine over 2 expert-parallel ranks (with dropped tokens)") {
  // 4 tokens per rank, k = 2, 4 experts, 2 slots per expert and rank: some choices are dropped (gradient 0)
  const char* head = R"(
mesh: {ep: 2}
tensors:
  x: {shape: [8, 3], placement: {ep: S(0)}}
  gi: {shape: [8, 2], placement: {ep: S(0)}, dtype: i64}
  gw: {shape: [8, 2], placement: {ep: S(0)}}
  b: {shape: [4, 4, 3], placement: {ep: S(0)}}
ops:
)";
  Program disp = load(std::string(head) + "  - {op: MoEDispatch, in: [x, gi, gw], out: y, axis: ep, buffer: [4, 4]}\n"
                                          "  - {op: MoEGateGrad, in: [x, b, gi], out: ggw, axis: ep}\n");
  Program comb = load(std::string(head) + "  - {op: MoECombine, in: [b, gi, gw], out: y, axis: ep}\n"
                                          "  - {op: MoEGateGrad, in: [x, b, gi], out: ggw, axis: ep}\n");
  int dropped = 0;
  for (const Program* p : {&disp, &comb}) {
    // the loss: sum(x' * y) with x' the coefficient of y's shape (the buffer b for a dispatch, the tokens x for a combine)
    const char* coef = p == &disp ? "b" : "x";
    for (std::int64_t r = 0; r < 2; ++r) check_fd(*p, {2}, nullptr, "gw", dot("y", coef, {0, 1}), "ggw", r, r, false, 4);
    for (bool lanes : {false, true}) {
      std::optional<num::Lanes> guard;
      if (lanes) guard.emplace(num::LaneParams{14});
      Sim one(*p, {2}, true, 4), dist(*p, {2}, false, 4);
      one.go();
      dist.go();
      Tensor g = concat({dist.t("ggw", 0), dist.t("ggw", 1)}, 0);
      check_close(g, one.t("ggw"), "ggw");
      CHECK(same_lanes(g, one.t("ggw")));
      if (!lanes)
        for (const auto& e : g.data) dropped += e.d == 0;
    }
  }
  CHECK(dropped > 0);
}

// ---- the field lanes ---------------------------------------------------------------------------------------

namespace {

// The training step of a program (its derived backward after the forward).
Program step_of(const std::string& yaml) {
  TrainingCheck t = check_training(load(yaml));
  REQUIRE(t.built);
  // the derived backward checks clean (a norm's eps too); the one-rank dp mesh leaves the gradients unsynced, which is no matter here
  for (const auto& d : t.diags)
    if (d.id != CheckId::UnsyncedGradient) FAIL_CHECK(d.message);
  return std::move(t.program);
}

// Runs `p` on one device with the lanes on (seed), giving the value of `name`.
Tensor lanes_value(const Program& p, const std::string& name, std::uint64_t seed) {
  num::Lanes guard({seed});
  Sim s(p, std::vector<std::int64_t>(p.mesh.size(), 1));
  s.go();
  CHECK(!num::trial_failed());
  return s.t(name);
}

const char* kHead = "name: t\nmesh: {dp: 1}\ntrain: true\ntensors:\n  x: {shape: [3, 4], param: true}\n  c: {shape: [3, 4]}\n";
const char* kLoss = "  - {op: Multiply, in: [y, c], out: yc}\n  - {op: Sum, in: [yc], out: loss, dims: [0, 1]}\nloss: loss\n";

}  // namespace

TEST_CASE("gradient lanes: the derived backward of RMSNorm and LayerNorm written from primitives equals NormGrad in every lane") {
  std::string weight = "  w: {shape: [4], param: true}\n";
  Program prim = step_of(std::string(kHead) + weight + R"(ops:
  - {op: Multiply, in: [x, x], out: sq}
  - {op: Mean, in: [sq], out: ms, dims: [1], keepdim: true}
  - {op: Add, in: [ms], out: mse, scalar: 1e-5}
  - {op: Rsqrt, in: [mse], out: r}
  - {op: Multiply, in: [x, r], out: xn}
  - {op: Multiply, in: [xn, w], out: y}
)" + kLoss);
  Program fused = step_of(std::string(kHead) + weight + "ops:\n  - {op: RMSNorm, in: [x, w], out: y}\n" + kLoss);
  // LayerNorm as torch code writes it: (x - mean) / sqrt(var + eps), with Sqrt and Div
  Program ln_prim = step_of(std::string(kHead) + R"(ops:
  - {op: Mean, in: [x], out: mu, dims: [1], keepdim: true}
  - {op: Sub, in: [x, mu], out: xc}
  - {op: Multiply, in: [xc, xc], out: sq}
  - {op: Mean, in: [sq], out: var, dims: [1], keepdim: true}
  - {op: Add, in: [var], out: ve, scalar: 0.001}
  - {op: Sqrt, in: [ve], out: sd}
  - {op: Div, in: [xc, sd], out: y}
)" + kLoss);
  Program ln_fused = step_of(std::string(kHead) + "ops:\n  - {op: LayerNorm, in: [x], out: y, eps: 0.001}\n" + kLoss);
  int norm_grads = 0;
  for (const auto& op : fused.ops) norm_grads += op.kind == OpKind::NormGrad;
  CHECK(norm_grads == 1);
  for (std::uint64_t seed : {1, 2, 3}) {
    CHECK(same_lanes(lanes_value(prim, "x.grad", seed), lanes_value(fused, "x.grad", seed)));
    CHECK(same_lanes(lanes_value(prim, "w.grad", seed), lanes_value(fused, "w.grad", seed)));
    CHECK(same_lanes(lanes_value(ln_prim, "x.grad", seed), lanes_value(ln_fused, "x.grad", seed)));
  }
  // another eps is another function: the lanes see it
  Program other = step_of(std::string(kHead) + weight + "ops:\n  - {op: RMSNorm, in: [x, w], out: y, eps: 0.001}\n" + kLoss);
  CHECK(!same_lanes(lanes_value(prim, "x.grad", 1), lanes_value(other, "x.grad", 1)));
}

TEST_CASE("gradient lanes: the derived backward of Softmax from Exp, Sum and Div equals NormGrad(Softmax) in every lane") {
  Program prim = step_of(std::string(kHead) + R"(ops:
  - {op: Exp, in: [x], out: e}
  - {op: Sum, in: [e], out: s, dims: [1], keepdim: true}
  - {op: Div, in: [e, s], out: y}
)" + kLoss);
  Program fused = step_of(std::string(kHead) + "ops:\n  - {op: Softmax, in: [x], out: y}\n" + kLoss);
  for (std::uint64_t seed : {4, 5, 6}) CHECK(same_lanes(lanes_value(prim, "x.grad", seed), lanes_value(fused, "x.grad", seed)));
}

TEST_CASE("gradient lanes: PointwiseGrad equals the composition of its derivative from primitives, and a wrong one differs") {
  // dy * f'(x) written with the forward ops: Exp -> dy exp(x); Log -> dy / x; Sqrt -> dy sqrt(x) / (2x);
  // Rsqrt -> dy (-0.5) rsqrt(x) / x
  std::string head = "mesh: {dp: 1}\ntensors:\n  x: {shape: [3, 4]}\n  dy: {shape: [3, 4]}\nops:\n";
  struct C {
    const char* of;
    const char* prims;
  };
  for (C c : {C{"Exp", "  - {op: Exp, in: [x], out: e}\n  - {op: Multiply, in: [dy, e], out: ref}\n"},
              C{"Log", "  - {op: Div, in: [dy, x], out: ref}\n"},
              C{"Sqrt", "  - {op: Sqrt, in: [x], out: s}\n  - {op: Multiply, in: [dy, s], out: a}\n  - {op: Multiply, in: [x], out: x2, scalar: 2}\n"
                        "  - {op: Div, in: [a, x2], out: ref}\n"},
              C{"Rsqrt", "  - {op: Rsqrt, in: [x], out: s}\n  - {op: Multiply, in: [s], out: a, scalar: -0.5}\n  - {op: Div, in: [a, x], out: b}\n"
                         "  - {op: Multiply, in: [dy, b], out: ref}\n"}}) {
    INFO(c.of);
    Program p = load(head + c.prims + "  - {op: PointwiseGrad, in: [dy, x], out: g, of: " + c.of + "}\n");
    for (std::uint64_t seed : {7, 8}) CHECK(same_lanes(lanes_value(p, "g", seed), lanes_value(p, "ref", seed)));
  }
  // SiLU: the derived backward of x / (1 + exp(-x)) written from Neg, Exp, Add and Div
  Program silu_prim = step_of(std::string(kHead) + R"(ops:
  - {op: Neg, in: [x], out: nx}
  - {op: Exp, in: [nx], out: e}
  - {op: Add, in: [e], out: d, scalar: 1}
  - {op: Div, in: [x, d], out: y}
)" + kLoss);
  Program silu = step_of(std::string(kHead) + "ops:\n  - {op: SiLU, in: [x], out: y}\n" + kLoss);
  CHECK(same_lanes(lanes_value(silu_prim, "x.grad", 9), lanes_value(silu, "x.grad", 9)));
  // Sqrt then Div agrees with Rsqrt then Multiply, backward too (sqrt'(x) = sqrt(x) / (2x))
  Program by_sqrt = step_of(std::string(kHead) + "ops:\n  - {op: Exp, in: [x], out: e}\n  - {op: Sqrt, in: [e], out: s}\n  - {op: Div, in: [x, s], out: y}\n" + kLoss);
  Program by_rsqrt = step_of(std::string(kHead) + "ops:\n  - {op: Exp, in: [x], out: e}\n  - {op: Rsqrt, in: [e], out: s}\n  - {op: Multiply, in: [x, s], out: y}\n" + kLoss);
  CHECK(same_lanes(lanes_value(by_sqrt, "x.grad", 10), lanes_value(by_rsqrt, "x.grad", 10)));
  // negatives: dy * x is not the gradient of exp; GELU's and ReLU's derivatives are their own random functions
  Program wrong = load(head + "  - {op: Multiply, in: [dy, x], out: ref}\n  - {op: PointwiseGrad, in: [dy, x], out: g, of: Exp}\n");
  CHECK(!same_lanes(lanes_value(wrong, "g", 7), lanes_value(wrong, "ref", 7)));
  Program gr = load(head + "  - {op: PointwiseGrad, in: [dy, x], out: g, of: GELU}\n  - {op: PointwiseGrad, in: [dy, x], out: ref, of: ReLU}\n"
                           "  - {op: GELU, in: [x], out: gx}\n  - {op: Multiply, in: [dy, gx], out: ref2}\n");
  CHECK(!same_lanes(lanes_value(gr, "g", 7), lanes_value(gr, "ref", 7)));
  CHECK(!same_lanes(lanes_value(gr, "g", 7), lanes_value(gr, "ref2", 7)));
  // a softmax gradient without the rowsum term differs
  Program sm = load("mesh: {dp: 1}\ntensors:\n  x: {shape: [3, 4]}\n  dy: {shape: [3, 4]}\nops:\n  - {op: Softmax, in: [x], out: y}\n"
                    "  - {op: NormGrad, in: [dy, y], out: g, of: Softmax}\n  - {op: Multiply, in: [dy, y], out: ref}\n");
  CHECK(!same_lanes(lanes_value(sm, "g", 7), lanes_value(sm, "ref", 7)));
}

// ---- Sigmoid, CumSum, the attention scale, masks and counts (issues 21 and 23) ---------------------------------

TEST_CASE("gradient kernels: PointwiseGrad of Sigmoid, CumSum's reverse sum and AttentionGrad with `scale` against central differences") {
  Program sig = load("mesh: {dp: 1}\ntensors:\n  x: {shape: [3, 4]}\n  c: {shape: [3, 4]}\nops:\n  - {op: Sigmoid, in: [x], out: y}\n"
                     "  - {op: PointwiseGrad, in: [c, x], out: gx, of: Sigmoid}\n");
  check_fd(sig, {1}, nullptr, "x", dot("y", "c"), "gx");
  for (const char* dim : {"0", "1", "-1"})
    for (bool rev : {false, true}) {
      INFO("CumSum dim " << dim << (rev ? " reverse" : ""));
      std::string r = rev ? "true" : "false", back = rev ? "false" : "true";
      Program p = load(std::string("mesh: {dp: 1}\ntensors:\n  x: {shape: [3, 4]}\n  c: {shape: [3, 4]}\nops:\n  - {op: CumSum, in: [x], out: y, dim: ") + dim +
                       ", reverse: " + r + "}\n  - {op: CumSum, in: [c], out: gx, dim: " + dim + ", reverse: " + back + "}\n");
      check_fd(p, {1}, nullptr, "x", dot("y", "c"), "gx");
    }
  for (bool causal : {false, true}) {
    INFO("scale 0.37" << (causal ? " causal" : ""));
    Program p = load(attention_yaml("bshd", causal, {1, 3, 4, 2}, {1, 3, 2, 2}, ", scale: 0.37"));
    for (const char* w : {"q", "k", "v"}) check_fd(p, {1}, nullptr, w, dot("y", "c"), std::string("g") + w);
  }
  // the scale is the kernel's: 0.37 and the default 1/sqrt(2) give different outputs
  Program a = load(attention_yaml("bhsd", false, {1, 2, 3, 2}, {1, 2, 3, 2}, ", scale: 0.37"));
  Program b = load(attention_yaml("bhsd", false, {1, 2, 3, 2}, {1, 2, 3, 2}));
  Sim sa(a, {1}), sb(b, {1});
  sa.go();
  sb.go();
  CHECK(std::abs(sa.t("y").data[0].d - sb.t("y").data[0].d) > 1e-6);
}

TEST_CASE("gradient lanes: the derived backward of 1 / (1 + exp(-x)) equals PointwiseGrad(Sigmoid) in every lane") {
  Program prim = step_of(std::string(kHead) + R"(ops:
  - {op: Neg, in: [x], out: nx}
  - {op: Exp, in: [nx], out: e}
  - {op: Add, in: [e], out: d, scalar: 1}
  - {op: Multiply, in: [x], out: z, scalar: 0}
  - {op: Add, in: [z], out: one, scalar: 1}
  - {op: Div, in: [one, d], out: y}
)" + kLoss);
  Program fused = step_of(std::string(kHead) + "ops:\n  - {op: Sigmoid, in: [x], out: y}\n" + kLoss);
  for (std::uint64_t seed : {21, 22}) {
    CHECK(same_lanes(lanes_value(prim, "y", seed), lanes_value(fused, "y", seed)));
    CHECK(same_lanes(lanes_value(prim, "x.grad", seed), lanes_value(fused, "x.grad", seed)));
  }
  // SiLU's gradient is not Sigmoid's
  Program silu = step_of(std::string(kHead) + "ops:\n  - {op: SiLU, in: [x], out: y}\n" + kLoss);
  CHECK(!same_lanes(lanes_value(silu, "x.grad", 21), lanes_value(fused, "x.grad", 21)));
}

TEST_CASE("mask kernels: per-rank masks, one-hots and counts assemble to the single-device values; a choice on float data is recorded") {
  const char* yaml = R"(
mesh: {dp: 2}
tensors:
  ids: {shape: [6, 2], dtype: i64, placement: {dp: S(0)}}
  lo: {shape: [6, 2], dtype: i64, placement: {dp: S(0)}}
  x: {shape: [6, 2], placement: {dp: S(0)}}
ops:
  - {op: Ge, in: [ids, lo], out: ge}
  - {op: Ne, in: [ids], out: ne, scalar: 2}
  - {op: And, in: [ge, ne], out: m}
  - {op: Not, in: [m], out: nm}
  - {op: Or, in: [nm, ge], out: o}
  - {op: OneHot, in: [ids], out: oh, classes: 5}
  - {op: Bincount, in: [ids], out: cnt, length: 5}
  - {op: CumSum, in: [ids], out: cs, dim: 1}
outputs:
  o: {placement: {dp: S(0)}}
  oh: {placement: {dp: S(0)}}
  cnt: {placement: {dp: P}}
  cs: {placement: {dp: S(0)}}
)";
  Program p = load(yaml);
  OracleResult res = run_oracle(p);
  INFO(res.message);
  CHECK(res.verdict == OracleVerdict::Agree);
  CHECK(res.compared == 4);
  // the values: ids drawn below 5; the counts over both ranks add up to the 12 ids, each row of oh has one 1
  Sim one(p, {2}, true, 5), dist(p, {2}, false, 5);
  one.go();
  dist.go();
  double total = 0;
  for (std::int64_t r = 0; r < 2; ++r)
    for (const auto& e : dist.t("cnt", r).data) total += e.d;
  CHECK(total == 12);
  const Tensor& oh = one.t("oh");
  const Tensor& ids = one.t("ids");
  for (std::size_t i = 0; i < ids.data.size(); ++i)
    for (std::size_t j = 0; j < 5; ++j) CHECK(oh.data[i * 5 + j].d == (static_cast<double>(j) == ids.data[i].d ? 1.0 : 0.0));
  // with the lanes on, masks of integer data are exact (no choice recorded); a comparison of float data is a choice
  {
    num::Lanes guard({31});
    Sim s(p, {2});
    s.go();
    CHECK(s.run->inexact_choice == -1);
    std::string with_float = yaml;
    with_float.insert(with_float.find("outputs:"), "  - {op: Gt, in: [x], out: fx, scalar: 0}\n");
    Program f = load(with_float);
    Sim sf(f, {2});
    sf.go();
    CHECK(sf.run->inexact_choice == static_cast<int>(f.ops.size()) - 1);
  }
  // an id outside [0, classes) fails the run with the reason
  Program bad = load("mesh: {dp: 1}\ntensors:\n  ids: {shape: [4], dtype: i64}\nops:\n  - {op: OneHot, in: [ids], out: oh, classes: 2}\n");
  Sim sb(bad, {1}, false, 5);
  for (auto& e : sb.t("ids").data) e = Num(4.0);
  CHECK_THROWS_WITH_AS(sb.go(), doctest::Contains("OneHot id value 4"), InterpError);
}

TEST_CASE("local view: AllToAll with explicit split sizes and a per-rank scalar") {
  const char* yaml = R"(
view: local
mesh: {sp: 2}
tensors:
  x: {shape: [4, 4], placement: {sp: S(0)}}
  ids: {shape: [4], dtype: i64}
ops:
  - {op: AllToAll, in: [x], out: y, axis: sp, split_dim: 1, concat_dim: 0, split_sizes: [3, 1]}
  - {op: Sub, in: [ids], out: shifted, scalar: axis_index(sp)*10}
outputs:
  y: {placement: {sp: S(1)}}
)";
  Program p = load(yaml);
  Sim s(p, {2});
  s.go();
  CHECK(s.t("y", 0).shape == Shape{4, 3});  // 3 columns from each rank's 2 rows
  CHECK(s.t("y", 1).shape == Shape{4, 1});
  // rank 0's y: rows 0-1 are x's rows 0-1 (its own), columns 0-2; rows 2-3 rank 1's rows, columns 0-2
  const Tensor& y0 = s.t("y", 0);
  const Tensor& x0 = s.t("x", 0);
  const Tensor& x1 = s.t("x", 1);
  CHECK(y0.data[0].d == x0.data[0].d);
  CHECK(y0.data[2].d == x0.data[2].d);
  CHECK(y0.data[6].d == x1.data[0].d);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(s.t("shifted", 0).data[i].d == s.t("ids", 0).data[i].d);
    CHECK(s.t("shifted", 1).data[i].d == s.t("ids", 1).data[i].d - 10);
  }
}

// The optimizer kernels (interp/ops_optim.cpp) against torch.optim's formulas written out here in doubles, on each
// rank's pieces (ZeRO: the parameter, gradient and states sharded alike).
TEST_CASE("optimizer kernels: AdamWUpdate, SGDUpdate, GradNormSq and ClipCoef against torch.optim's formulas") {
  Program p = load_program_string(R"(
mesh: {dp: 2}
tensors:
  w: {shape: [4, 2], placement: {dp: S(0)}}
  g: {shape: [4, 2], placement: {dp: S(0)}}
  m: {shape: [4, 2], placement: {dp: S(0)}}
  v: {shape: [4, 2], placement: {dp: S(0)}}
  w2: {shape: [4, 2]}
  g2: {shape: [4, 2]}
  buf: {shape: [4, 2]}
ops:
  - {op: AdamWUpdate, in: [w, g, m, v], out: [w_new, m_new, v_new], lr: 0.01, beta1: 0.8, beta2: 0.9, eps: 0.001, weight_decay: 0.1, step: 3}
  - {op: SGDUpdate, in: [w2, g2, buf], out: [w2_new, buf_new], lr: 0.1, momentum: 0.9, weight_decay: 0.01, dampening: 0.5}
  - {op: GradNormSq, in: [g], out: nsq, axis: dp}
  - {op: GradNormSq, in: [g2], out: nsq_rep}
  - {op: GradNormSq, in: [g2], out: nsq_twice, axis: dp}
  - {op: ClipCoef, in: [nsq], out: coef, max_norm: 0.5}
)",
                                  "optim.yaml");
  Sim s(p, {2});
  s.go();
  double total = 0, rep = 0;
  for (std::int64_t r = 0; r < 2; ++r)
    for (const auto& x : s.t("g", r).data) total += x.d * x.d;
  for (const auto& x : s.t("g2", 0).data) rep += x.d * x.d;
  for (std::int64_t r = 0; r < 2; ++r) {
    const double lr = 0.01, b1 = 0.8, b2 = 0.9, eps = 0.001, wd = 0.1;
    const int step = 3;
    for (std::size_t k = 0; k < s.t("w", r).data.size(); ++k) {
      double w = s.t("w", r).data[k].d, g = s.t("g", r).data[k].d, m = s.t("m", r).data[k].d, v = s.t("v", r).data[k].d;
      double m1 = b1 * m + (1 - b1) * g, v1 = b2 * v + (1 - b2) * g * g;
      double denom = std::sqrt(v1) / std::sqrt(1 - std::pow(b2, step)) + eps;
      double w1 = w * (1 - lr * wd) - lr / (1 - std::pow(b1, step)) * m1 / denom;
      CHECK(s.t("m_new", r).data[k].d == doctest::Approx(m1));
      CHECK(s.t("v_new", r).data[k].d == doctest::Approx(v1));
      CHECK(s.t("w_new", r).data[k].d == doctest::Approx(w1));
    }
    for (std::size_t k = 0; k < s.t("w2", r).data.size(); ++k) {
      double w = s.t("w2", r).data[k].d, g = s.t("g2", r).data[k].d, b = s.t("buf", r).data[k].d;
      double gg = g + 0.01 * w, nb = 0.9 * b + 0.5 * gg;
      CHECK(s.t("buf_new", r).data[k].d == doctest::Approx(nb));
      CHECK(s.t("w2_new", r).data[k].d == doctest::Approx(w - 0.1 * nb));
    }
    CHECK(s.t("nsq", r).data[0].d == doctest::Approx(total));
    CHECK(s.t("nsq_rep", r).data[0].d == doctest::Approx(rep));
    CHECK(s.t("nsq_twice", r).data[0].d == doctest::Approx(2 * rep));  // Megatron's sum of local norms counts a replica per rank
    CHECK(s.t("coef", r).data[0].d == doctest::Approx(std::min(1.0, 0.5 / (std::sqrt(total) + 1e-6))));
  }
}

TEST_CASE("index_extent: the extent each index-reading kernel notes, from its inputs' global shapes") {
  // (positive) the ids of Embedding and EmbeddingGrad index the table's rows, the labels of a cross-entropy the logits'
  // last dim
  CHECK(index_extent(OpKind::Embedding, 0, {{4, 3}, {11, 6}}) == 11);
  CHECK(index_extent(OpKind::EmbeddingGrad, 1, {{4, 3, 6}, {4, 3}, {11, 6}}) == 11);
  CHECK(index_extent(OpKind::CrossEntropyLoss, 1, {{4, 3, 9}, {4, 3}}) == 9);
  CHECK(index_extent(OpKind::CrossEntropyGrad, 2, {{4, 3}, {4, 3, 9}, {4, 3}}) == 9);
  // (negative) other inputs, ops that read no indices or whose extent no shape gives, and shapes not known
  CHECK(index_extent(OpKind::Embedding, 1, {{4, 3}, {11, 6}}) == -1);
  CHECK(index_extent(OpKind::CrossEntropyLoss, 0, {{4, 3, 9}, {4, 3}}) == -1);
  CHECK(index_extent(OpKind::OneHot, 0, {{4, 3}}) == -1);
  CHECK(index_extent(OpKind::Add, 0, {{4, 3}, {4, 3}}) == -1);
  CHECK(index_extent(OpKind::Embedding, 0, {{4, 3}, {}}) == -1);
  CHECK(index_extent(OpKind::CrossEntropyGrad, 2, {{4, 3}}) == -1);
  // and a run notes the same ranges for the declared integer inputs that such kernels read
  Program p = load(R"(
mesh: {dp: 1}
tensors:
  ids: {shape: [2, 3], dtype: i64, placement: {dp: R}}
  labels: {shape: [2, 3], dtype: i64, placement: {dp: R}}
  emb: {shape: [7, 4], placement: {dp: R}}
  w: {shape: [4, 5], placement: {dp: R}}
  dl: {shape: [], placement: {dp: R}}
ops:
  - {op: Embedding, in: [ids, emb], out: x}
  - {op: MatMul, in: [x, w], out: logits}
  - {op: CrossEntropyLoss, in: [logits, labels], out: loss, reduction: sum}
  - {op: CrossEntropyGrad, in: [dl, logits, labels], out: dlogits, reduction: sum}
  - {op: EmbeddingGrad, in: [x, ids, emb], out: demb}
outputs: {loss: {placement: {dp: R}}, dlogits: {placement: {dp: R}}, demb: {placement: {dp: R}}}
)");
  std::vector<std::int64_t> ranges(p.names.size(), -1);
  Sim s(p, {1}, true, 1);
  s.run->int_range = &ranges;
  s.go();
  CHECK(ranges[static_cast<std::size_t>(name_id(p, "ids"))] == 7);
  CHECK(ranges[static_cast<std::size_t>(name_id(p, "labels"))] == 5);
  CHECK(ranges[static_cast<std::size_t>(name_id(p, "emb"))] == -1);
}
