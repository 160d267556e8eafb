// equiv/equiv.cpp - value-level equivalence of a plan and its single-device model (docs/equivalence.md).
//
// One Runner runs the model (the spec's ops, or the plan's own ops, on a mesh of ones), another the plan on the
// real mesh; the model's inputs are the plan's inputs assembled by their declared placements (the lineage), so
// both start from the same global values. Each output the spec names is assembled from the ranks by the plan's
// declared placement and compared. On a difference the runs are repeated with every op's value recorded: a plan
// op "matches" when its value, read by some placement (R, P, or S of a dim, per axis), equals some value of the
// model; the first op on the way to the differing output whose inputs match and whose own value matches nothing
// is where the plan goes wrong.
#include "equiv/equiv.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "interp/assembly.h"
#include "interp/num.h"
#include "interp/runner.h"
#include "equiv/training.h"

namespace spmd {
namespace {

using namespace interp;

constexpr double kRtol = 1e-6, kAtol = 1e-9;

double dbl(const Num& x) { return x.d; }

bool close_to(double a, double b, double tol) {
  if (a == b) return true;
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::abs(a - b) <= tol;
}

double max_abs_of(const Tensor& t) {
  double m = 0;
  for (const auto& e : t.data)
    if (std::isfinite(dbl(e))) m = std::max(m, std::abs(dbl(e)));
  return m;
}

// The first element where `a` and `b` differ in doubles (-1: none; -2: shapes differ).
std::int64_t first_difference(const Tensor& a, const Tensor& b) {
  if (a.shape != b.shape) return -2;
  double tol = kAtol + kRtol * std::max(max_abs_of(a), max_abs_of(b));
  for (std::size_t e = 0; e < a.data.size(); ++e)
    if (!close_to(dbl(a.data[e]), dbl(b.data[e]), tol)) return static_cast<std::int64_t>(e);
  return -1;
}

// The first element where the field lanes of `a` and `b` differ (-1: none, or lanes off; shapes must agree).
std::int64_t first_lane_difference(const Tensor& a, const Tensor& b) {
  if (!num::on()) return -1;
  for (std::size_t e = 0; e < a.data.size(); ++e)
    for (int l = 0; l < kLanes; ++l)
      if (a.data[e].pure(l) != b.data[e].pure(l)) return static_cast<std::int64_t>(e);
  return -1;
}

// Equal in doubles and in every lane.
bool same_value(const Tensor& a, const Tensor& b) { return first_difference(a, b) == -1 && first_lane_difference(a, b) == -1; }

std::string num_text(double x) {
  if (x == std::round(x) && std::abs(x) < 1e15) return fmt::format("{}", static_cast<long long>(x));
  return fmt::format("{:.6g}", x);
}

// A tensor's values as nested brackets (at most `cap` elements, then "...").
std::string values_text(const Tensor& t, std::size_t cap = 16) {
  if (t.shape.empty()) return t.data.empty() ? "[]" : num_text(dbl(t.data[0]));
  Shape st = strides_of(t.shape);
  std::vector<std::int64_t> block(t.shape.size());
  for (std::size_t d = 0; d < t.shape.size(); ++d) block[d] = std::max<std::int64_t>(1, st[d] * t.shape[d]);
  std::string s;
  for (std::size_t e = 0; e < t.data.size() && e < cap; ++e) {
    auto i = static_cast<std::int64_t>(e);
    for (std::size_t d = 0; d < t.shape.size(); ++d)
      if (i % block[d] == 0) s += "[";
    s += num_text(dbl(t.data[e]));
    for (std::size_t d = 0; d < t.shape.size(); ++d)
      if ((i + 1) % block[d] == 0) s += "]";
    if (e + 1 < t.data.size()) s += ", ";
  }
  if (t.data.size() > cap) s += "...";
  return s;
}

// The model: the same declarations, the spec's ops (or the plan's own), run on one device.
Program model_of(const Program& p) {
  Program m = p;
  m.local_view = false;
  m.per_rank = false;
  m.programs.clear();
  m.train = false;
  m.has_backward = false;
  m.backward.clear();
  m.has_grad_sync = false;
  m.grad_sync.clear();
  m.has_spec = false;
  m.spec_ops.clear();
  if (p.has_spec) {
    // The spec is single-device code: its inputs are whole tensors (their values are the plan's, assembled).
    for (auto& t : m.tensors) t.placement = Placements{}, t.uneven = false;
    m.ops = p.spec_ops;
    m.outputs.clear();
    for (const auto& l : p.spec_outputs) {
      OutputDecl od;
      od.name = l.spec;
      od.loc = l.loc;
      m.outputs.push_back(od);
    }
  }
  return m;
}

// What one run of model and plan gives.
struct Run {
  std::unique_ptr<Runner> plan, model;
  std::string failure;  // a run failed: why
  int failed_op = -1;
  bool plan_failed = false;
  // Recorded when asked: every op output, model: [op][k] global; plan: [op][k][rank] local.
  std::vector<std::vector<Tensor>> model_vals;
  std::vector<std::vector<std::vector<Val>>> plan_vals;
  // Stage cuts (staged verification): each cut point's value before the cut, model global, plan per rank.
  std::vector<Tensor> model_cut;
  std::vector<std::vector<Val>> plan_cut;
};

struct Setup {
  const Program& p;
  Program model;
  Instantiation inst;
  OracleOptions oo;
  std::vector<std::int64_t> ranges;
  std::string sizes;
  // Stage cut points: a value written once by the plan and once by the spec under one name (or a lineage pair);
  // NameId -> cut index or -1, for the plan's names and the model's.
  std::vector<int> plan_cut, model_cut;
  std::vector<int> plan_last, model_last;  // NameId -> the last op writing it (-1: none)
  // Training pairs: the ops [first, last) of each program that are a derived backward (for messages).
  std::pair<std::size_t, std::size_t> plan_bwd{0, 0}, model_bwd{0, 0};
  int n_cuts = 0;
};

constexpr std::uint64_t kCutKey = 0x5ea9e0c07ULL;

// The cut: the lanes of every element replaced by a random function of them, keyed by the cut point (the same in
// both runs); the double stays. Downstream of a verified cut the exact lanes see a fresh variable (degree 1).
void cut_lanes(Tensor& t, int c) {
  for (auto& e : t.data) {
    Num r;  // no log part, degree 1
    r.d = e.d;
    r.tag = static_cast<std::uint32_t>(c) + 1;  // downstream random functions are this stage's own
    for (int l = 0; l < kLanes; ++l) {
      Fp x = e.pure(l);
      r.f[l] = num::rf(kCutKey + static_cast<std::uint64_t>(c), &x, 1, l, r.tag);
    }
    r.deg = 1;
    e = r;
  }
}

void round_to_small_ints(Val& v, DType dt) {
  if (is_int(dt)) return;
  for (auto& e : v.t.data) e.d = std::clamp(std::round(e.d * 1.25), -2.0, 2.0);
}

std::unique_ptr<Run> run_once(Setup& s, std::uint64_t seed, bool small_ints, bool record, std::int64_t& work, bool cut = false) {
  auto run = std::make_unique<Run>();
  const Program& p = s.p;
  run->plan = std::make_unique<Runner>(p, s.inst.vars, s.inst.mesh, false, s.oo, work);
  run->model = std::make_unique<Runner>(s.model, s.inst.vars, std::vector<std::int64_t>(s.inst.mesh.size(), 1), true, s.oo, work, s.inst.mesh);
  Runner& dist = *run->plan;
  Runner& one = *run->model;
  try {
    for (std::size_t i = 0; i < p.tensors.size(); ++i) {
      const TensorDecl& t = p.tensors[i];
      std::int64_t range = s.ranges[static_cast<std::size_t>(t.name)];
      dist.declare(t, range, seed);
      one.declare(s.model.tensors[i], range, seed);
      if (small_ints)
        for (std::int64_t r = 0; r < dist.ranks(); ++r) round_to_small_ints(dist.at(r, t.name), t.dtype);
    }
    for (const auto& t : p.tensors) {
      Assembled a = assemble(p, dist, t.name, t.placement, s.oo);
      if (a.ok) one.at(0, t.name).t = std::move(a.t);
    }
  } catch (const std::runtime_error& e) {
    run->failure = std::string("the inputs cannot be built: ") + e.what();
    return run;
  }
  cut = cut && num::on() && s.n_cuts > 0;
  if (record) {
    run->model_vals.assign(s.model.ops.size(), {});
    run->plan_vals.assign(p.ops.size(), {});
  }
  if (cut) {
    run->model_cut.assign(static_cast<std::size_t>(s.n_cuts), {});
    run->plan_cut.assign(static_cast<std::size_t>(s.n_cuts), std::vector<Val>(static_cast<std::size_t>(dist.ranks())));
  }
  if (record || cut) {
    one.after_op = [&, r = run.get()](int oi, std::int64_t) {
      const Op& op = s.model.ops[static_cast<std::size_t>(oi)];
      if (record) {
        auto& slot = r->model_vals[static_cast<std::size_t>(oi)];
        slot.clear();
        for (NameId n : s.model.outs(op)) slot.push_back(one.at(0, n).t);
      }
      if (cut)
        for (NameId n : s.model.outs(op))
          if (int c = s.model_cut[static_cast<std::size_t>(n)]; c >= 0 && s.model_last[static_cast<std::size_t>(n)] == oi) {
            r->model_cut[static_cast<std::size_t>(c)] = one.at(0, n).t;
            cut_lanes(one.at(0, n).t, c);
          }
    };
    dist.after_op = [&, r = run.get()](int oi, std::int64_t rank) {
      const Op& op = p.ops[static_cast<std::size_t>(oi)];
      if (record) {
        auto& slot = r->plan_vals[static_cast<std::size_t>(oi)];
        if (slot.empty()) slot.assign(op.n_out, std::vector<Val>(static_cast<std::size_t>(dist.ranks())));
        int k = 0;
        for (NameId n : p.outs(op)) slot[static_cast<std::size_t>(k++)][static_cast<std::size_t>(rank)] = dist.at(rank, n);
      }
      if (cut)
        for (NameId n : p.outs(op))
          if (int c = s.plan_cut[static_cast<std::size_t>(n)]; c >= 0 && s.plan_last[static_cast<std::size_t>(n)] == oi) {
            r->plan_cut[static_cast<std::size_t>(c)][static_cast<std::size_t>(rank)] = dist.at(rank, n);
            cut_lanes(dist.at(rank, n).t, c);
          }
    };
  }
  try {
    one.run(seed);
  } catch (const std::runtime_error& e) {
    run->failure = std::string("the spec's run fails: ") + e.what();
    run->failed_op = one.failed_op;
    return run;
  }
  try {
    dist.run(seed);
  } catch (const std::runtime_error& e) {
    run->failure = std::string("the plan's run fails: ") + e.what();
    run->failed_op = dist.failed_op;
    run->plan_failed = true;
    return run;
  }
  return run;
}

// One compared output that differs.
enum class DiffKind { Form, Real, Lanes };  // shape / assembly; the doubles; only the field lanes
struct Difference {
  std::size_t link = 0;  // index into the links
  std::string what;      // the element and both values, or why it cannot be compared
  DiffKind kind = DiffKind::Form;
};

struct Link {
  NameId plan, spec;
  Loc loc;
  Placements pl{};
};

// Compares every link; `degree` receives the largest degree bound of the compared elements (plan + spec).
std::optional<Difference> compare(Setup& s, Run& run, const std::vector<Link>& links, std::uint64_t& degree) {
  degree = 0;
  for (std::size_t k = 0; k < links.size(); ++k) {
    const Link& l = links[k];
    const std::string& name = s.p.name(l.plan);
    const Val& g = run.model->at(0, l.spec);
    Assembled a = assemble(s.p, *run.plan, l.plan, l.pl, s.oo);
    Difference d;
    d.link = k;
    if (!g.defined) return d.what = "the spec never computes " + s.p.name(l.spec), d;
    if (!a.ok) {
      if (a.undefined) continue;
      return d.what = "the plan's " + name + " cannot be assembled by its placement: " + a.problem, d;
    }
    std::int64_t e = first_difference(a.t, g.t);
    if (e == -2)
      return d.what = fmt::format("the plan's {} assembles to shape {} but the spec's {} has shape {}", name, shape_text(a.t.shape), s.p.name(l.spec),
                                  shape_text(g.t.shape)),
             d;
    d.kind = DiffKind::Real;
    if (e < 0) e = first_lane_difference(a.t, g.t), d.kind = DiffKind::Lanes;
    if (e >= 0) {
      d.what = fmt::format("{}{} is {} in the plan and {} in the spec", name, index_text(g.t.shape, e), num_text(dbl(a.t.data[static_cast<std::size_t>(e)])),
                           num_text(dbl(g.t.data[static_cast<std::size_t>(e)])));
      return d;
    }
    for (std::size_t i = 0; i < a.t.data.size(); ++i) degree = std::max<std::uint64_t>(degree, std::uint64_t{a.t.data[i].deg} + g.t.data[i].deg);
  }
  return std::nullopt;
}

// ---- localization -------------------------------------------------------------------------------------------
struct SpecValue {
  const Tensor* t;
  int op;  // producing model op; -1: a declared input
  NameId name;
};

// Placements to read a plan value by: a dim the runner tracks as sharded by an axis is S(dim) there; any other axis
// may be R or a pending sum (global view); in local view any axis may also be S(d) of any dim.
std::vector<Placements> readings(const Program& p, const std::vector<Val>& ranks, bool pending = true) {
  std::size_t n_axes = p.mesh.size();
  std::vector<std::vector<Placement>> per_axis(n_axes);
  const Val& v0 = ranks[0];
  int rank = v0.t.rank();
  for (std::size_t a = 0; a < n_axes; ++a) {
    int sd = -1;
    for (std::size_t d = 0; d < v0.mask.size(); ++d)
      if (v0.mask[d] & (1u << a)) sd = static_cast<int>(d);
    if (sd >= 0) {
      per_axis[a].push_back(Placement::s(sd));
      continue;
    }
    per_axis[a].push_back(Placement::r());
    if (pending) per_axis[a].push_back(Placement::p(ReduceOp::Sum));
    if (p.local_view)
      for (int d = 0; d < rank; ++d) per_axis[a].push_back(Placement::s(d));
  }
  std::vector<Placements> out{Placements{}};
  for (std::size_t a = 0; a < n_axes; ++a) {
    std::vector<Placements> next;
    for (const auto& base : out)
      for (Placement c : per_axis[a]) {
        if (next.size() >= 512) break;
        Placements b = base;
        b[a] = c;
        next.push_back(b);
      }
    out = std::move(next);
  }
  return out;
}

// Assembles the per-rank `ranks` by every reading (with or without pending sums) until `found` accepts one.
template <class Found>
bool any_reading(const Setup& s, const std::vector<Val>& ranks, bool pending, const OracleOptions& o, Found&& found) {
  for (const Placements& pl : readings(s.p, ranks, pending)) {
    std::vector<Tensor> pieces;
    for (const auto& v : ranks) pieces.push_back(v.t);
    Assembled a = assemble_pieces(s.p, s.inst.mesh, std::move(pieces), pl, o);
    if (a.ok && found(a.t)) return true;
  }
  return false;
}

// The model value `v` equals under some reading, if any (and the reading, when `how` is given).
const SpecValue* match(const Setup& s, const std::vector<SpecValue>& table, const std::vector<Val>& ranks, Placements* how = nullptr) {
  if (ranks.empty() || !ranks[0].defined) return nullptr;
  OracleOptions quiet = s.oo;
  quiet.rtol = kRtol, quiet.atol = kAtol;
  const SpecValue* hit = nullptr;
  for (const Placements& pl : readings(s.p, ranks, true)) {
    std::vector<Tensor> pieces;
    for (const auto& v : ranks) pieces.push_back(v.t);
    Assembled a = assemble_pieces(s.p, s.inst.mesh, std::move(pieces), pl, quiet);
    if (!a.ok) continue;
    for (const auto& sv : table)
      if (sv.t->shape == a.t.shape && same_value(a.t, *sv.t)) {
        if (how) *how = pl;
        return hit = &sv;
      }
  }
  // A block of a model value (one dim cut into k equal blocks): a microbatch of the batch, read on one rank.
  for (const Placements& pl : readings(s.p, ranks, false)) {
    std::vector<Tensor> pieces;
    for (const auto& v : ranks) pieces.push_back(v.t);
    Assembled a = assemble_pieces(s.p, s.inst.mesh, std::move(pieces), pl, quiet);
    if (!a.ok) continue;
    for (const auto& sv : table) {
      const Shape& big = sv.t->shape;
      if (big.size() != a.t.shape.size()) continue;
      int d = -1;
      for (std::size_t i = 0; i < big.size(); ++i)
        if (big[i] != a.t.shape[i]) d = d < 0 && a.t.shape[i] > 0 && big[i] % a.t.shape[i] == 0 ? static_cast<int>(i) : -2;
      if (d < 0) continue;
      std::int64_t n = a.t.shape[static_cast<std::size_t>(d)], k = big[static_cast<std::size_t>(d)] / n;
      for (std::int64_t b = 0; b < k && k <= 64; ++b)
        if (same_value(a.t, slice(*sv.t, d, b * n, (b + 1) * n))) {
          if (how) *how = pl;
          return &sv;
        }
    }
  }
  return hit;
}

// Every stage cut of the run holds: the plan's value before the cut, read by some placement with no pending sum (a cut
// of per-rank summands would not be a cut of their sum), equals the model's in doubles and in every lane.
bool cuts_hold(const Setup& s, const Run& run) {
  for (std::size_t c = 0; c < run.model_cut.size(); ++c) {
    const auto& ranks = run.plan_cut[c];
    if (ranks.empty() || std::any_of(ranks.begin(), ranks.end(), [](const Val& v) { return !v.defined; })) return false;
    const Tensor& want = run.model_cut[c];
    if (!any_reading(s, ranks, false, s.oo, [&](const Tensor& t) { return t.shape == want.shape && same_value(t, want); })) return false;
  }
  return true;
}

// Kinds whose outputs are partial by design (a ring attention step without its accumulator): never blamed first.
bool partial_by_design(const Op& op) { return op.kind == OpKind::RingAttentionStep && op.n_in < 5; }

struct Culprit {
  int op = -1;         // plan op
  int spec_op = -1;    // the model op it should have matched
  int frontier = -1;   // the first op on the way whose value matches no model value, when it is not `op`
  NameId named = -1;   // when `op` is a lineage point: the model's name it differs from
  // An input of `op` that matches a model value only as a pending sum (a missing reduction before `op`).
  NameId pending_in = -1, pending_spec = -1;
  std::string pending_axes;
};

Culprit localize(Setup& s, Run& run, NameId output, const std::vector<std::pair<NameId, NameId>>& links) {
  const Program& p = s.p;
  std::vector<SpecValue> table;
  for (const auto& t : p.tensors) {
    const Val& v = run.model->at(0, t.name);
    if (v.defined) table.push_back({&v.t, -1, t.name});
  }
  for (std::size_t oi = 0; oi < s.model.ops.size(); ++oi) {
    auto outs = s.model.outs(s.model.ops[oi]);
    for (std::size_t k = 0; k < run.model_vals[oi].size() && k < outs.size(); ++k)
      table.push_back({&run.model_vals[oi][k], static_cast<int>(oi), outs[k]});
  }
  // Producers: the last writer of each name before each op.
  std::vector<std::vector<int>> producers(p.ops.size());
  std::vector<int> writer(p.names.size(), -1);
  for (std::size_t oi = 0; oi < p.ops.size(); ++oi) {
    for (NameId n : p.ins(p.ops[oi])) producers[oi].push_back(writer[static_cast<std::size_t>(n)]);
    for (NameId n : p.outs(p.ops[oi])) writer[static_cast<std::size_t>(n)] = static_cast<int>(oi);
  }
  int last = writer[static_cast<std::size_t>(output)];
  Culprit c;
  if (last < 0) return c;
  std::vector<char> in_cone(p.ops.size(), 0);
  std::vector<int> stack{last};
  while (!stack.empty()) {
    int o = stack.back();
    stack.pop_back();
    if (o < 0 || in_cone[static_cast<std::size_t>(o)]) continue;
    in_cone[static_cast<std::size_t>(o)] = 1;
    for (int q : producers[static_cast<std::size_t>(o)]) stack.push_back(q);
  }
  std::vector<const SpecValue*> matched(p.ops.size(), nullptr);
  std::vector<Placements> how(p.ops.size());
  std::vector<char> good(p.ops.size(), 0), konst(p.ops.size(), 0);
  int frontier = -1, fallback = -1;
  for (std::size_t oi = 0; oi < p.ops.size(); ++oi) {
    // a constant (computed from no input: a rank's offset, a Full) has no counterpart to match and is never blamed first
    konst[oi] = std::all_of(producers[oi].begin(), producers[oi].end(), [&](int q) { return q >= 0 && konst[static_cast<std::size_t>(q)]; });
    if (!in_cone[oi] || run.plan_vals[oi].empty()) continue;
    const SpecValue* m = match(s, table, run.plan_vals[oi][0], &how[oi]);
    matched[oi] = m;
    good[oi] = m != nullptr || konst[oi];
    if (good[oi] || partial_by_design(p.ops[oi])) continue;
    bool inputs_good = std::all_of(producers[oi].begin(), producers[oi].end(), [&](int q) { return q < 0 || good[static_cast<std::size_t>(q)]; });
    if (inputs_good && frontier < 0) frontier = static_cast<int>(oi);
    if (fallback < 0) fallback = static_cast<int>(oi);
  }
  // A value the plan and the model both name (the same name, a lineage: pair, a compared output) is a lineage
  // point the user declared: the first one that does not equal its own counterpart is where the plan goes wrong.
  std::vector<NameId> counterpart(p.names.size(), -1);
  for (std::size_t oi = 0; oi < s.model.ops.size(); ++oi)
    for (NameId n : s.model.outs(s.model.ops[oi])) counterpart[static_cast<std::size_t>(n)] = n;
  for (const auto& l : p.lineage) counterpart[static_cast<std::size_t>(l.plan)] = l.spec;
  std::vector<char> counterpart_by_link(p.names.size(), 0);  // a compared output only (no same name, no lineage: pair)
  for (const auto& [pl, sp] : links)
    if (counterpart[static_cast<std::size_t>(pl)] < 0) counterpart_by_link[static_cast<std::size_t>(pl)] = 1;
  for (const auto& [pl, sp] : links) counterpart[static_cast<std::size_t>(pl)] = sp;
  int named = -1;
  for (std::size_t oi = 0; oi < p.ops.size() && named < 0; ++oi) {
    if (!in_cone[oi] || run.plan_vals[oi].empty() || p.ops[oi].n_out == 0) continue;
    NameId out = p.outs(p.ops[oi])[0];
    NameId want = counterpart[static_cast<std::size_t>(out)];
    // a name's final values are compared (a gradient accumulated in place is partial before its last write)
    if (want < 0 || s.plan_last[static_cast<std::size_t>(out)] != static_cast<int>(oi)) continue;
    std::vector<SpecValue> own;
    for (const auto& sv : table)
      if (sv.name == want && (sv.op < 0 || sv.op == s.model_last[static_cast<std::size_t>(want)])) own.push_back(sv);
    if (!own.empty() && !match(s, own, run.plan_vals[oi][0])) named = static_cast<int>(oi), c.named = want;
  }
  int first = frontier >= 0 ? frontier : fallback;
  // The compared output's own writer is no lineage point of its own: an earlier op whose inputs match and whose value
  // matches nothing is where the plan goes wrong (a spec that shares no intermediate name, as an imported one).
  // An input that matches a model value only as a pending sum: a reduction is missing before the op that reads it.
  auto pending_input = [&](int o) {
    for (std::size_t i = 0; i < producers[static_cast<std::size_t>(o)].size() && c.pending_in < 0; ++i) {
      int q = producers[static_cast<std::size_t>(o)][i];
      if (q < 0 || !matched[static_cast<std::size_t>(q)]) continue;
      std::string axes;
      for (std::size_t a = 0; a < p.mesh.size(); ++a)
        if (how[static_cast<std::size_t>(q)][a].is_p()) axes += (axes.empty() ? "" : ", ") + p.mesh[a].name;
      if (!axes.empty()) c.pending_in = p.ins(p.ops[static_cast<std::size_t>(o)])[i], c.pending_spec = matched[static_cast<std::size_t>(q)]->name, c.pending_axes = axes;
    }
  };
  if (named >= 0) pending_input(named);
  if (named >= 0 && c.pending_in < 0 && frontier >= 0 && frontier < named && named == last &&
      counterpart_by_link[static_cast<std::size_t>(p.outs(p.ops[static_cast<std::size_t>(named)])[0])])
    named = -1, c.named = -1;
  c.op = named >= 0 ? named : first >= 0 ? first : last;
  if (first >= 0 && first < c.op) c.frontier = first;
  const Op& op = p.ops[static_cast<std::size_t>(c.op)];
  if (c.pending_in < 0) pending_input(c.op);
  // The model op it should have matched: one writing the same name (or linked by lineage), else one of the same
  // kind reading what this op's inputs matched, else the one writing the compared output.
  NameId out0 = p.outs(op).empty() ? -1 : p.outs(op)[0];
  for (const auto& l : p.lineage)
    if (l.plan == out0) out0 = l.spec;
  for (const auto& [pl, sp] : links)
    if (pl == out0) out0 = sp;
  if (out0 >= 0) c.spec_op = s.model_last[static_cast<std::size_t>(out0)];  // the op that writes its final value
  if (c.spec_op < 0) {  // a model op of the same kind reading what this op's inputs matched, else one reading any of it
    for (int pass = 0; pass < 2 && c.spec_op < 0; ++pass)
    for (std::size_t mi = 0; mi < s.model.ops.size() && c.spec_op < 0; ++mi) {
      const Op& mo = s.model.ops[mi];
      auto mins = s.model.ins(mo);
      if (pass == 1) {
        bool any = false;
        for (std::size_t i = 0; i < producers[static_cast<std::size_t>(c.op)].size(); ++i) {
          int q = producers[static_cast<std::size_t>(c.op)][i];
          NameId want = q < 0 ? p.ins(op)[i] : matched[static_cast<std::size_t>(q)] ? matched[static_cast<std::size_t>(q)]->name : -1;
          any |= want >= 0 && std::find(mins.begin(), mins.end(), want) != mins.end();
        }
        if (any) c.spec_op = static_cast<int>(mi);
        continue;
      }
      if (mo.kind != op.kind) continue;
      bool all = mins.size() == producers[static_cast<std::size_t>(c.op)].size();
      for (std::size_t i = 0; all && i < mins.size(); ++i) {
        int q = producers[static_cast<std::size_t>(c.op)][i];
        NameId want = q < 0 ? p.ins(op)[i] : matched[static_cast<std::size_t>(q)] ? matched[static_cast<std::size_t>(q)]->name : -1;
        all = want == mins[i];
      }
      if (all) c.spec_op = static_cast<int>(mi);
    }
  }
  return c;
}

std::string op_text(const Program& p, const Op& op) {
  auto outs = p.outs(op);
  std::string s = std::string(op_name(op.kind));
  if (!outs.empty()) s += " writing " + p.name(outs[0]);
  return s;
}

// The same, saying when the op is part of a derived backward (its line is the forward op's).
std::string op_text(const Setup& s, bool model, const Op& op) {
  const Program& p = model ? s.model : s.p;
  std::string t = op_text(p, op);
  auto i = static_cast<std::size_t>(&op - p.ops.data());
  auto [from, to] = model ? s.model_bwd : s.plan_bwd;
  if (i < p.ops.size() && i >= from && i < to) t += " (in the derived backward of the op on this line)";
  return t;
}

constexpr int kMaxAttempts = 8;
constexpr double kLog2Target = -40;

// log2 of one trial's false-agreement probability: per lane eps = (sum over stage tags of U_t(U_t-1)/2 + 1) D / p
// (docs/equivalence.md), two independent lanes multiply.
double trial_log2_bound(std::uint64_t degree) {
  double pairs = num::uf_pairs() + 1, d = static_cast<double>(std::max<std::uint64_t>(degree, 1));
  double total = 0;
  for (int l = 0; l < kLanes; ++l) total += std::min(0.0, std::log2(pairs) + std::log2(d) - std::log2(static_cast<double>(num::prime(l))));
  return total;
}

// What an `equivalent` verdict covers beyond the real inputs: the drawn integer inputs and dropout masks.
std::string scope_text(const Program& p) {
  std::vector<std::string> parts;
  std::string ints;
  for (const auto& t : p.tensors)
    if (is_int(t.dtype)) ints += (ints.empty() ? "" : ", ") + p.name(t.name);
  if (!ints.empty()) parts.push_back("the drawn integer inputs (" + ints + ")");
  // Value-dependent choices never reach `equivalent` (value_choice); what is left is Dropout's seeded masks.
  bool dropout = false;
  for (const auto* list : {&p.ops, &p.spec_ops})
    for (const auto& op : *list) dropout |= op.kind == OpKind::Dropout;
  if (dropout) parts.push_back("the drawn dropout masks");
  if (parts.empty()) return "";
  std::string s = ", for ";
  for (std::size_t i = 0; i < parts.size(); ++i) s += (i ? " and " : "") + parts[i];
  return s;
}

// The first op of the plan or the spec whose result depends on a choice made by comparing values (routing, a
// max/min reduction, a cast to integers), or null.
const Op* value_choice(const Program& p) {
  for (const auto* list : {&p.ops, &p.spec_ops})
    for (const auto& op : *list) {
      bool choice = op.kind == OpKind::ReduceMax || op.kind == OpKind::ReduceMin || op.kind == OpKind::TopKGate || op.kind == OpKind::MoEDispatch ||
                    op.kind == OpKind::AmaxUpdate || op.kind == OpKind::AmaxHistory ||
                    (op.kind == OpKind::Cast && op.attrs.has_dtype && is_int(op.attrs.dtype)) ||
                    (op_info(op.kind).category == OpCategory::collective && (op.attrs.rop == ReduceOp::Max || op.attrs.rop == ReduceOp::Min));
      if (choice) return &op;
    }
  return nullptr;
}

// A difference found in trial `ts`: value-mismatch (the doubles differ: a counterexample, the first plan op that goes
// wrong), or value-unproved (only the field lanes differ).
// The axes on which the plan's output of `l`, read as a pending sum there, equals the spec's value ("" when none
// does, or the run fails): a missing reduction.
std::string pending_axes(Setup& s, const Link& l, std::uint64_t ts, std::int64_t& work) {
  int w = s.plan_last[static_cast<std::size_t>(l.plan)];
  if (w < 0) return {};
  std::unique_ptr<Run> rec;
  try {
    rec = run_once(s, ts, false, true, work);
  } catch (const BudgetError&) {
    return {};
  }
  if (!rec->failure.empty() || static_cast<std::size_t>(w) >= rec->plan_vals.size()) return {};
  auto outs = s.p.outs(s.p.ops[static_cast<std::size_t>(w)]);
  const Val& want = rec->model->at(0, l.spec);
  if (!want.defined) return {};
  for (std::size_t k = 0; k < outs.size() && k < rec->plan_vals[static_cast<std::size_t>(w)].size(); ++k) {
    if (outs[k] != l.plan) continue;
    const auto& ranks = rec->plan_vals[static_cast<std::size_t>(w)][k];
    OracleOptions quiet = s.oo;
    quiet.rtol = kRtol, quiet.atol = kAtol;
    for (const Placements& pl : readings(s.p, ranks, true)) {
      std::string axes;
      for (std::size_t a = 0; a < s.p.mesh.size(); ++a)
        if (pl[a].is_p()) axes += (axes.empty() ? "" : ", ") + s.p.mesh[a].name;
      if (axes.empty()) continue;
      std::vector<Tensor> pieces;
      for (const auto& v : ranks) pieces.push_back(v.t);
      Assembled a = assemble_pieces(s.p, s.inst.mesh, std::move(pieces), pl, quiet);
      if (a.ok && a.t.shape == want.t.shape && same_value(a.t, want.t)) return axes;
    }
  }
  return {};
}

EquivResult& report_difference(Setup& s, const std::vector<Link>& links, const Difference& diff, std::uint64_t ts, std::int64_t& work, EquivResult& res) {
  const Program& p = s.p;
  const Link& bad = links[diff.link];
  Diagnostic d;
  d.id = CheckId::ValueMismatch;
  d.loc = bad.loc;
  d.tensor = p.name(bad.plan);
  if (diff.kind == DiffKind::Form) {
    d.message = diff.what;
    // An output the ranks hold as summands of the spec's value (a row-parallel layer without its all-reduce): the
    // reduction is missing after the op that wrote it, which is where the diagnostic goes.
    if (std::string axes = pending_axes(s, bad, ts, work); !axes.empty()) {
      int w = s.plan_last[static_cast<std::size_t>(bad.plan)];
      const Op& op = p.ops[static_cast<std::size_t>(w)];
      d.loc = op.loc;
      d.op = w;
      d.message = fmt::format("{}; the ranks hold summands of the spec's {} (a pending sum over {}): a reduction (AllReduce over {}) is missing after {}",
                              diff.what, p.name(bad.spec), axes, axes, op_text(s, false, op));
      if (int m = s.model_last[static_cast<std::size_t>(bad.spec)]; m >= 0)
        d.notes.push_back({s.model.ops[static_cast<std::size_t>(m)].loc, "the spec computes it whole here: " + op_text(s, true, s.model.ops[static_cast<std::size_t>(m)])});
      d.notes.push_back({bad.loc, fmt::format("output {} is compared here, read by its placement", p.name(bad.plan))});
    }
    res.verdict = EquivVerdict::Mismatch;
    res.message = d.message;
    res.diags.push_back(std::move(d));
    return res;
  }
  // A counterexample with small integer inputs when one exists, else the drawn reals; then where it goes wrong.
  std::unique_ptr<Run> rec;
  std::optional<Difference> rdiff;
  bool ints = false;
  std::uint64_t degree = 0;
  try {
    if (diff.kind == DiffKind::Real) {
      rec = run_once(s, ts, true, true, work);
      if (rec->failure.empty()) rdiff = compare(s, *rec, links, degree);
      ints = rdiff && rdiff->kind == DiffKind::Real;
    }
    if (!ints) {
      rec = run_once(s, ts, false, true, work);
      rdiff = rec->failure.empty() ? compare(s, *rec, links, degree) : std::nullopt;
    }
  } catch (const BudgetError&) {
    rec.reset();
  }
  if (!rec || !rdiff) rdiff = diff, rec.reset();
  const Link& shown = links[rdiff->link];
  Culprit c;
  if (rec) {
    std::vector<std::pair<NameId, NameId>> pairs;
    for (const auto& l : links) pairs.emplace_back(l.plan, l.spec);
    c = localize(s, *rec, shown.plan, pairs);
  }
  if (diff.kind == DiffKind::Lanes) {
    d.id = CheckId::ValueUnproved;
    d.severity = Severity::Warning;
    d.message = fmt::format(
        "equivalence not proved: the plan equals the spec in real numbers on the drawn inputs, but not in exact arithmetic ({}); the number domain lacks an "
        "identity the plan relies on (docs/equivalence.md)",
        rdiff->what);
    if (c.op >= 0) {
      const Op& op = p.ops[static_cast<std::size_t>(c.op)];
      d.notes.push_back({op.loc, "the first plan op whose exact value matches no spec value: " + op_text(s, false, op)});
    }
    res.verdict = EquivVerdict::Unknown;
    res.message = d.message;
    res.diags.push_back(std::move(d));
    return res;
  }
  std::string cex;
  if (rec)
    for (const auto& t : p.tensors) {
      const Val& v = rec->model->at(0, t.name);
      cex += fmt::format("{}{} = {}", cex.empty() ? "" : "; ", p.name(t.name), values_text(v.t));
    }
  res.verdict = EquivVerdict::Mismatch;
  if (c.op >= 0) {
    const Op& op = p.ops[static_cast<std::size_t>(c.op)];
    d.loc = op.loc;
    d.op = c.op;
    d.tensor = p.outs(op).empty() ? d.tensor : p.name(p.outs(op)[0]);
    d.message = fmt::format("the plan's output differs from the spec: {}; the first plan op that goes wrong is {}, {}", rdiff->what, op_text(s, false, op),
                            c.named >= 0 ? "whose value differs from the spec's " + p.name(c.named) + " by every placement"
                                         : std::string("whose value matches no value of the spec"));
    if (c.pending_in >= 0)
      d.message += fmt::format("; it reads {}, which holds summands of the spec's {} (a pending sum over {}): a reduction (AllReduce over {}) is missing before it",
                               p.name(c.pending_in), p.name(c.pending_spec), c.pending_axes, c.pending_axes);
    if (c.spec_op >= 0) {
      const Op& mo = s.model.ops[static_cast<std::size_t>(c.spec_op)];
      d.notes.push_back({mo.loc, "the spec computes it here: " + op_text(s, true, mo)});
    }
    if (c.frontier >= 0 && c.pending_in < 0) {  // (a pending input already says where: the reduction before op)
      const Op& fo = p.ops[static_cast<std::size_t>(c.frontier)];
      d.notes.push_back({fo.loc, fmt::format("the first value on the way with no counterpart in the spec is {}: the difference arises between there and line {}",
                                             op_text(s, false, fo), op.loc.line)});
    }
    d.notes.push_back({shown.loc, fmt::format("output {} is compared here, read by its placement", p.name(shown.plan))});
  } else {
    d.message = "the plan's output differs from the spec: " + rdiff->what;
  }
  if (!cex.empty())
    d.notes.push_back({p.tensors.empty() ? Loc{} : p.tensors[0].loc,
                       fmt::format("counterexample ({} inputs{}): {}", ints ? "small integer" : "drawn", s.sizes.empty() ? "" : ", " + s.sizes, cex)});
  res.message = d.message;
  res.diags.push_back(std::move(d));
  return res;
}

}  // namespace

const char* equiv_verdict_name(EquivVerdict v) {
  switch (v) {
    case EquivVerdict::Equivalent: return "equivalent";
    case EquivVerdict::Mismatch: return "value-mismatch";
    case EquivVerdict::Unknown: return "not proved";
    case EquivVerdict::Skipped: return "not checked";
  }
  return "?";
}

namespace {

// The check of a plan/spec pair: a forward program, or (with `pending`) the training steps of equiv/training.h, whose
// `pending` names (a pending sum at their last write) are never stage cuts.
EquivResult check_pair(const Program& p, const EquivOptions& opt, const equiv_detail::TrainingPair* pending) {
  EquivResult res;
  auto skip = [&](std::string why) {
    res.verdict = EquivVerdict::Skipped;
    res.message = "equivalence not checked: " + why;
    if (p.has_spec) {
      Diagnostic d;
      d.id = CheckId::ValueUnproved;
      d.severity = Severity::Warning;
      d.loc = p.spec_loc;
      d.message = res.message;
      res.diags.push_back(std::move(d));
    }
    return res;
  };
  if (p.schedule.present) return skip("a pipeline schedule has no single-device meaning here");
  if (p.per_rank) return skip("per-rank `programs:` are not run by the equivalence check yet");
  if (p.local_view && !p.has_spec) return skip("a local-view plan needs a `spec:` to be compared with");
  for (const auto* list : {&p.ops, &p.spec_ops})
    for (const auto& op : *list)
      if (!has_value_kernel(p, *list, op))
        return skip(fmt::format("{} (line {}) has no value semantics", op_name(op.kind), op.loc.line));
  for (const auto& t : p.tensors)
    for (std::size_t a = 0; a < p.mesh.size(); ++a)
      if (t.placement[a].is_v())
        return skip(fmt::format("input {} is V over {}: per-rank values with no single-device value to compare with", p.name(t.name), p.mesh[a].name));
  for (const auto& op : p.ops)
    if (op.kind == OpKind::Reinterpret)
      return skip(fmt::format("Reinterpret (line {}) relabels values without the promise a comparison needs", op.loc.line));
  Setup s{p, model_of(p), {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, 0};
  if (pending) s.plan_bwd = pending->plan_bwd, s.model_bwd = pending->spec_bwd;
  s.oo.seed = opt.seed;
  auto insts = instantiations(p, s.oo);
  if (insts.empty()) return skip("no small instantiation of the sizes fits the interpreter");
  s.inst = insts[opt.seed % insts.size()];
  for (std::size_t k = 0; k < p.vars.size(); ++k) s.sizes += (k ? ", " : "") + p.vars[k].name + " = " + std::to_string(s.inst.vars[k]);
  res.sizes = s.sizes;
  // A shape-only pre-run of the model (integer inputs 0) learns the ranges integer inputs must take.
  s.ranges.assign(p.names.size(), -1);
  {
    std::int64_t w0 = 0;
    Runner pre(s.model, s.inst.vars, std::vector<std::int64_t>(s.inst.mesh.size(), 1), true, s.oo, w0, s.inst.mesh);
    pre.int_range = &s.ranges;
    try {
      for (const auto& t : s.model.tensors) pre.declare(t, 1, opt.seed);
      pre.run(opt.seed);
    } catch (const std::runtime_error&) {
    }
    for (auto& r : s.ranges) r = r < 0 ? 4 : std::max<std::int64_t>(r, 1);
  }
  // What is compared: the spec's outputs with the plan's, each plan output read by its declared placement.
  std::vector<Link> links;
  auto decl_of = [&](NameId n) -> const OutputDecl* {
    for (const auto& od : p.outputs)
      if (od.name == n) return &od;
    return nullptr;
  };
  if (p.has_spec) {
    for (const auto& l : p.spec_outputs) {
      Link k{l.plan, l.spec, l.loc, {}};
      if (const OutputDecl* od = decl_of(l.plan)) {
        if (od->has_placement) k.pl = od->placement;
        k.loc = od->loc;
      }
      links.push_back(k);
    }
  } else {
    for (const auto& od : p.outputs) links.push_back({od.name, od.name, od.loc, od.has_placement ? od.placement : Placements{}});
  }
  if (links.empty()) return skip("nothing to compare (no outputs)");
  // Stage cut points: names the plan and the spec both write (the spec's name through lineage:), neither a declared
  // tensor nor a compared output, nor a pending sum in the plan; each is cut at its last write in each program
  // (a gradient accumulated in place is cut once it is whole).
  {
    s.plan_last.assign(p.names.size(), -1);
    s.model_last.assign(p.names.size(), -1);
    for (std::size_t oi = 0; oi < p.ops.size(); ++oi)
      for (NameId n : p.outs(p.ops[oi])) s.plan_last[static_cast<std::size_t>(n)] = static_cast<int>(oi);
    for (std::size_t oi = 0; oi < s.model.ops.size(); ++oi)
      for (NameId n : s.model.outs(s.model.ops[oi])) s.model_last[static_cast<std::size_t>(n)] = static_cast<int>(oi);
    s.plan_cut.assign(p.names.size(), -1);
    s.model_cut.assign(p.names.size(), -1);
    std::vector<char> excluded(p.names.size(), 0);
    for (const auto& t : p.tensors) excluded[static_cast<std::size_t>(t.name)] = 1;
    for (const auto& l : links) excluded[static_cast<std::size_t>(l.plan)] = excluded[static_cast<std::size_t>(l.spec)] = 1;
    if (pending)
      for (std::size_t n = 0; n < p.names.size() && n < pending->pending.size(); ++n) excluded[n] |= pending->pending[n];
    std::vector<NameId> spec_of(p.names.size());
    for (std::size_t n = 0; n < p.names.size(); ++n) spec_of[n] = static_cast<NameId>(n);
    for (const auto& l : p.lineage) spec_of[static_cast<std::size_t>(l.plan)] = l.spec;
    for (std::size_t n = 0; n < p.names.size() && p.has_spec; ++n) {
      auto m = static_cast<std::size_t>(spec_of[n]);
      if (s.plan_last[n] < 0 || s.model_last[m] < 0 || excluded[n] || excluded[m] || s.model_cut[m] >= 0) continue;
      s.plan_cut[n] = s.model_cut[m] = s.n_cuts++;
    }
  }

  std::int64_t work = 0;
  auto located_failure = [&](Run& r) {
    Diagnostic d;
    d.id = CheckId::ValueMismatch;
    if (!r.plan_failed) {  // the spec itself cannot run: an error in the model, not a counterexample
      d.id = CheckId::ShapeMismatch;
      const auto& list = s.model.ops;
      d.loc = r.failed_op >= 0 && static_cast<std::size_t>(r.failed_op) < list.size() ? list[static_cast<std::size_t>(r.failed_op)].loc : p.spec_loc;
      d.message = r.failure + " (the spec must run on one device with the declared global shapes)";
      res.verdict = EquivVerdict::Skipped;
      res.message = d.message;
      res.diags.push_back(std::move(d));
      return res;
    }
    const auto& list = r.plan_failed ? p.ops : s.model.ops;
    d.loc = r.failed_op >= 0 && static_cast<std::size_t>(r.failed_op) < list.size() ? list[static_cast<std::size_t>(r.failed_op)].loc : p.spec_loc;
    d.op = r.plan_failed ? r.failed_op : -1;
    d.message = r.failure;
    res.verdict = EquivVerdict::Mismatch;
    res.message = r.failure;
    res.diags.push_back(std::move(d));
    return res;
  };
  // An explicit lineage pair must fit: some placement reads the plan's value with the spec's shape.
  if (!p.lineage.empty()) {
    std::unique_ptr<Run> rec;
    try {
      rec = run_once(s, opt.seed, false, true, work);
    } catch (const BudgetError& e) {
      return skip(e.what());
    }
    if (!rec->failure.empty()) return located_failure(*rec);
    for (const auto& l : p.lineage) {
      const Val& g = rec->model->at(0, l.spec);
      int w = s.plan_last[static_cast<std::size_t>(l.plan)];
      if (!g.defined || w < 0) continue;  // an input, or a name the loader already checked
      const Op& op = p.ops[static_cast<std::size_t>(w)];
      std::size_t k = 0;
      while (k < op.n_out && p.outs(op)[k] != l.plan) ++k;
      const auto& ranks = rec->plan_vals[static_cast<std::size_t>(w)][k];
      if (any_reading(s, ranks, true, s.oo, [&](const Tensor& t) { return t.shape == g.t.shape; })) continue;
      Diagnostic d;
      d.id = CheckId::ShapeMismatch;
      d.loc = l.loc;
      d.tensor = p.name(l.plan);
      d.message = fmt::format("lineage {} -> {}: the plan's {} (shape {} on rank 0) cannot be read as the spec's {} (shape {}) by any placement", p.name(l.plan),
                              p.name(l.spec), p.name(l.plan), shape_text(ranks[0].t.shape), p.name(l.spec), shape_text(g.t.shape));
      d.notes.push_back({op.loc, "the plan computes " + p.name(l.plan) + " here: " + op_text(p, op)});
      res.verdict = EquivVerdict::Skipped;
      res.message = d.message;
      res.diags.push_back(std::move(d));
      return res;
    }
  }
  // Trials: each draws fresh primes, random functions and inputs; the error bound of agreeing trials multiplies.
  // A trial whose field arithmetic hit a zero divisor does not count.
  double log2_bound = 0;  // log2 of the probability that every agreeing trial agreed by chance
  int trials = 0;
  bool staged = false;
  std::uint64_t max_degree = 0, max_uf = 0;
  bool choices = value_choice(p) != nullptr;
  for (int attempt = 0; attempt < kMaxAttempts && (log2_bound > kLog2Target || choices); ++attempt) {
    std::uint64_t ts = attempt == 0 ? opt.seed : mix(opt.seed ^ (0x7e57ULL + static_cast<std::uint64_t>(attempt)));
    num::Lanes guard({ts});
    std::unique_ptr<Run> run;
    std::uint64_t degree = 0;
    std::optional<Difference> diff;
    try {
      // With stage cuts first; a cut that does not hold (or a difference in the lanes) is decided without them.
      run = run_once(s, ts, false, false, work, true);
      if (run->failure.empty() && !num::trial_failed() && cuts_hold(s, *run)) {
        diff = compare(s, *run, links, degree);
        if (!diff || diff->kind != DiffKind::Lanes) staged = staged || s.n_cuts > 0;
        else run.reset();
      } else {
        run.reset();
      }
      if (!run) {
        num::clear_failed();
        run = run_once(s, ts, false, false, work);
        if (run->failure.empty() && !num::trial_failed()) diff = compare(s, *run, links, degree);
      }
    } catch (const BudgetError& e) {
      return skip(e.what());
    }
    if (!run->failure.empty()) return located_failure(*run);
    if (num::trial_failed()) continue;
    if (diff) return report_difference(s, links, *diff, ts, work, res);
    ++trials;
    std::uint64_t uf = num::uf_evaluations();
    max_degree = std::max(max_degree, degree), max_uf = std::max(max_uf, uf);
    log2_bound += trial_log2_bound(degree);
  }
  std::string scope = scope_text(p);
  if (const Op* choice = value_choice(p)) {
    // The exact lanes follow the branch the doubles take, so they cannot see a choice made on the wrong values when
    // the drawn inputs happen to lead both programs to the same branch: equal on every trial is evidence, not proof.
    res.verdict = EquivVerdict::Unknown;
    res.message = fmt::format("equal to the spec on {} trials of drawn inputs, but not proved: {} (line {}) chooses by value, and the exact arithmetic "
                              "follows the choice the drawn values make",
                              trials, op_name(choice->kind), choice->loc.line);
    Diagnostic d;
    d.id = CheckId::ValueUnproved;
    d.severity = Severity::Warning;
    d.loc = choice->loc;
    d.message = "equivalence not proved: " + res.message;
    res.diags.push_back(std::move(d));
    return res;
  }
  if (staged) scope += fmt::format("; verified in stages at {} lineage point{}", s.n_cuts, s.n_cuts == 1 ? "" : "s");
  if (log2_bound > kLog2Target) {
    res.verdict = EquivVerdict::Unknown;
    res.message = fmt::format("equal to the spec in {} trial{}, but the error bound 2^{:.0f} is above 2^{} (degree bound {}, {} random-function evaluations)",
                              trials, trials == 1 ? "" : "s", log2_bound, kLog2Target, max_degree, max_uf);
    Diagnostic d;
    d.id = CheckId::ValueUnproved;
    d.severity = Severity::Warning;
    d.loc = links[0].loc;
    d.message = "equivalence not proved: " + res.message;
    d.notes.push_back({p.spec_loc, "fix: name intermediate values alike in the plan and the spec (or list them under lineage:) so the check can verify stage by stage"});
    res.diags.push_back(std::move(d));
    return res;
  }
  res.verdict = EquivVerdict::Equivalent;
  res.error_bound = std::exp2(log2_bound);
  res.message = fmt::format("{} output{} equal to the spec for all real inputs{}{} (error probability below 2^{:.0f}: {} trial{}, degree bound {}, {} random-function "
                            "evaluations; real arithmetic, floating-point rounding out of scope)",
                            links.size(), links.size() == 1 ? "" : "s", s.sizes.empty() ? "" : " at " + s.sizes, scope, log2_bound, trials,
                            trials == 1 ? "" : "s", max_degree, max_uf);
  return res;
}

}  // namespace

EquivResult check_equivalence(const Program& p, const EquivOptions& opt) {
  if (p.loss < 0 || !(p.train || p.has_backward)) return check_pair(p, opt, nullptr);
  // A training program: the plan's training step against the spec's (its gradients compared too).
  equiv_detail::TrainingPair tp = equiv_detail::training_pair(p);
  if (tp.ok) {
    EquivResult res = check_pair(tp.program, opt, &tp);
    // A parameter the spec's loss depends on that no plan gradient reaches is never updated: a mismatch whatever
    // the compared values say.
    for (const auto& m : tp.missing) {
      Diagnostic d;
      d.id = CheckId::ValueMismatch;
      d.loc = m.loc;
      d.tensor = p.name(m.param);
      d.message = fmt::format("no gradient reaches parameter {} in the plan's backward, but the spec's loss depends on it (the spec's backward writes {}.grad)",
                              p.name(m.param), p.name(m.param));
      d.notes.push_back({p.loss_loc, "the loss the gradients are taken of"});
      if (res.verdict != EquivVerdict::Mismatch) res.verdict = EquivVerdict::Mismatch, res.message = d.message, res.diags.clear();
      res.diags.push_back(std::move(d));
    }
    return res;
  }
  EquivResult res = check_pair(p, opt, nullptr);
  if (res.verdict != EquivVerdict::Equivalent) return res;
  res.verdict = EquivVerdict::Unknown;
  res.message = "the forward's outputs equal the spec's, but the gradients are not compared: " + tp.why;
  Diagnostic d;
  d.id = CheckId::ValueUnproved;
  d.severity = Severity::Warning;
  d.loc = p.loss_loc;
  d.message = "equivalence not proved: " + res.message;
  res.diags.push_back(std::move(d));
  return res;
}

}  // namespace spmd
