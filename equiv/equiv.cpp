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
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <sstream>
#include <utility>

#include "interp/assembly.h"
#include "interp/num.h"
#include "interp/runner.h"
#include "equiv/reduce.h"
#include "equiv/per_rank.h"
#include "equiv/pipeline.h"
#include "equiv/training.h"
#include "ir/loader.h"
#include "spatial/spatial.h"

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

// The cuts made of one point on the ranks so far, a few distinct values (a value replicated over an axis is cut on
// every rank that holds it, bit for bit the same).
struct CutMemo {
  std::vector<std::pair<Tensor, Tensor>> done;  // (value before the cut, after it)
  std::size_t next = 0;                         // the entry to replace when full
};

// What one run of model and plan gives.
struct Run {
  std::unique_ptr<Runner> plan, model;
  std::string failure;  // a run failed: why
  int failed_op = -1;
  bool plan_failed = false;
  // Recorded when asked: every op output, model: [op][k] global; plan: [op][k][rank] local.
  std::vector<std::vector<Tensor>> model_vals;
  std::vector<std::vector<std::vector<Val>>> plan_vals;
  std::vector<int> plan_order;  // recorded: plan ops in the order they first ran (a topological order across ranks)
  // Stage cuts (staged verification): each cut point's value before the cut, model global, plan per rank, kept until
  // every rank has written the point; then it is checked (cut_ok) and dropped. A point only some ranks write (per-rank
  // programs) is checked after the run (cuts_hold).
  std::vector<Tensor> model_cut;
  std::vector<std::vector<Val>> plan_cut;
  std::vector<std::int64_t> cut_left;  // ranks yet to write each point
  std::vector<char> cut_ok;
  std::vector<CutMemo> cut_memo;  // the plan's, per point while some rank has yet to write it
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
  std::vector<char> plan_final;            // per operand slot of a plan op's output: its program's last write of the name
  // Training pairs: the ops [first, last) of each program that are a derived backward (for messages).
  std::pair<std::size_t, std::size_t> plan_bwd{0, 0}, model_bwd{0, 0};
  int n_cuts = 0;
  // Shape reduction (equiv/reduce.h): the real global shapes of each op's inputs, for the plan and the model.
  const std::vector<std::vector<Shape>>* plan_real = nullptr;
  const std::vector<std::vector<Shape>>* model_real = nullptr;
  // NameId -> 1 for the values read after a run (the compared outputs): a run without records frees the others
  // once dead (Runner::free_dead).
  std::vector<char> plan_keep, model_keep;
  const equiv_detail::TrainingPair* pair = nullptr;  // a training pair: microbatch inputs and op families of a pipeline
};

bool cut_holds(const Setup& s, const std::vector<Val>& ranks, const Tensor& want);

constexpr std::uint64_t kCutKey = 0x5ea9e0c07ULL;

// The cut: the lanes of every element replaced by a random function of them, keyed by the cut point (the same in
// both runs); the double stays. Downstream of a verified cut the exact lanes see a fresh variable (degree 1); an
// exact constant (degree 0) stays as it is. A value equal bit for bit to the one `memo` (if any) holds for this point gets the same result, its evaluations counted.
void cut_lanes(Tensor& t, int c, CutMemo* memo) {
  const auto tag = static_cast<std::uint32_t>(c) + 1;  // downstream random functions are this stage's own
  const std::size_t n = t.data.size();
  if (memo)
    for (const auto& [src, out] : memo->done)
      if (src.shape == t.shape && (n == 0 || std::memcmp(src.data.data(), std::as_const(t).data.data(), n * sizeof(Num)) == 0)) {
        num::count_evaluations(tag, n);
        t = out;
        return;
      }
  const Tensor src = t;
  t = Tensor::uninit(src.shape);
  Num* o = t.data.data();
  bool plain = true;
  for (std::size_t i = 0; i < n; ++i) {
    const Num& e = src.data[i];
    if (e.deg == 0) {  // an exact constant (integer data, positions, masks of them): no degree to cut, and a
      o[i] = e;        // comparison downstream still decides on exact data (Runner::inexact_choice)
      continue;
    }
    plain &= num::plain(e);
    Num r;  // no log part, degree 1
    r.d = e.d;
    r.tag = tag;
    for (int l = 0; l < kLanes; ++l) {
      Fp x = e.pure(l);
      r.f[l] = num::rf(kCutKey + static_cast<std::uint64_t>(c), &x, 1, l, r.tag);
    }
    r.deg = 1;
    o[i] = r;
  }
  if (!memo || !plain) return;  // (a log part's purification counts evaluations of its own)
  constexpr std::size_t kKept = 8;
  if (memo->done.size() < kKept) memo->done.emplace_back(src, t);
  else memo->done[memo->next++ % kKept] = {src, t};
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
  dist.real_shapes = s.plan_real;
  one.real_shapes = s.model_real;
  try {
    for (std::size_t i = 0; i < p.tensors.size(); ++i) {
      const TensorDecl& t = p.tensors[i];
      std::int64_t range = s.ranges[static_cast<std::size_t>(t.name)];
      dist.declare(t, range, seed);
      one.declare(s.model.tensors[i], range, seed);
      if (small_ints)
        for (std::int64_t r = 0; r < dist.ranks(); ++r) round_to_small_ints(dist.at(r, t.name), t.dtype);
    }
    // A pipeline's microbatch inputs: part k of each rank's block of the batch input (the microbatch split is lineage).
    if (s.pair)
      for (const auto& mb : s.pair->microbatches)
        for (std::int64_t r = 0; r < dist.ranks(); ++r) {
          const Tensor& src = dist.at(r, mb.source).t;
          std::int64_t n = src.shape[static_cast<std::size_t>(mb.dim)];
          dist.at(r, mb.name).t = slice(src, mb.dim, n * mb.part / mb.parts, n * (mb.part + 1) / mb.parts);
        }
    for (const auto& t : p.tensors) {
      Assembled a = assemble(p, dist, t.name, t.placement, s.oo);
      if (a.ok) one.at(0, t.name).t = std::move(a.t);
    }
  } catch (const BudgetError&) {
    throw;  // too large to run: not checked (check_pair)
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
    run->cut_left.assign(static_cast<std::size_t>(s.n_cuts), dist.ranks());
    run->cut_ok.assign(static_cast<std::size_t>(s.n_cuts), 0);
    run->cut_memo.assign(static_cast<std::size_t>(s.n_cuts), {});
  }
  if (!record && !s.plan_keep.empty()) dist.free_dead(s.plan_keep), one.free_dead(s.model_keep);
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
            cut_lanes(one.at(0, n).t, c, nullptr);
          }
    };
    dist.after_op = [&, r = run.get()](int oi, std::int64_t rank) {
      const Op& op = p.ops[static_cast<std::size_t>(oi)];
      if (record) {
        auto& slot = r->plan_vals[static_cast<std::size_t>(oi)];
        if (slot.empty()) slot.assign(op.n_out, std::vector<Val>(static_cast<std::size_t>(dist.ranks()))), r->plan_order.push_back(oi);
        int k = 0;
        for (NameId n : p.outs(op)) slot[static_cast<std::size_t>(k++)][static_cast<std::size_t>(rank)] = dist.at(rank, n);
      }
      if (cut && op.kind != OpKind::Recv)  // a received value is its Send's, already cut on the sender (per-rank programs)
        for (std::size_t k = 0; k < op.n_out; ++k)
          if (NameId n = p.outs(op)[k]; s.plan_cut[static_cast<std::size_t>(n)] >= 0 && s.plan_final[op.first + op.n_in + k]) {
            int c = s.plan_cut[static_cast<std::size_t>(n)];
            auto cu = static_cast<std::size_t>(c);
            r->plan_cut[cu][static_cast<std::size_t>(rank)] = dist.at(rank, n);
            cut_lanes(dist.at(rank, n).t, c, &r->cut_memo[cu]);
            if (--r->cut_left[cu] == 0) {  // every rank has it: check it now and drop the copies
              r->cut_ok[cu] = cut_holds(s, r->plan_cut[cu], r->model_cut[cu]);
              r->plan_cut[cu].clear();
              r->model_cut[cu] = Tensor();
              r->cut_memo[cu] = CutMemo{};
            }
          }
    };
  }
  try {
    one.run(seed);
  } catch (const BudgetError&) {
    throw;
  } catch (const std::runtime_error& e) {
    run->failure = std::string("the spec's run fails: ") + e.what();
    run->failed_op = one.failed_op;
    return run;
  }
  try {
    dist.run(seed);
  } catch (const BudgetError&) {
    throw;
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
  std::vector<std::pair<int, std::int64_t>> held{};  // an output's `ranks:` (per-rank plans): read from those ranks only
};

// Compares every link; `degree` receives the largest degree bound of the compared elements (plan + spec).
std::optional<Difference> compare(Setup& s, Run& run, const std::vector<Link>& links, std::uint64_t& degree) {
  degree = 0;
  for (std::size_t k = 0; k < links.size(); ++k) {
    const Link& l = links[k];
    const std::string& name = s.p.name(l.plan);
    const Val& g = run.model->at(0, l.spec);
    const Assembled a = assemble(s.p, *run.plan, l.plan, l.pl, s.oo, l.held);  // (const: reading a shared buffer never copies it)
    Difference d;
    d.link = k;
    if (!g.defined) return d.what = "the spec never computes " + s.p.name(l.spec), d;
    if (!a.ok) {
      if (a.undefined) continue;
      d.kind = a.disagree ? DiffKind::Real : DiffKind::Form;  // ranks holding different values: a counterexample, located
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
std::vector<Placements> readings(const Program& p, const Val& v0, bool pending = true) {
  std::size_t n_axes = p.mesh.size();
  std::vector<std::vector<Placement>> per_axis(n_axes);
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
// Per-rank plans: only the ranks that hold the value (the ranks of the programs that compute it) are read.
template <class Found>
bool any_reading(const Setup& s, const std::vector<Val>& ranks, bool pending, const OracleOptions& o, Found&& found) {
  std::vector<Tensor> held;
  std::vector<std::int64_t> sizes;
  const Val* first = nullptr;
  if (!equiv_detail::held_pieces(s.inst.mesh, ranks, held, sizes, &first)) return false;
  for (const Placements& pl : readings(s.p, *first, pending)) {
    Assembled a = assemble_pieces(s.p, sizes, held, pl, o);
    if (!a.ok) continue;
    if constexpr (std::is_invocable_v<Found, const Tensor&, const Placements&>) {
      if (found(a.t, pl)) return true;
    } else if (found(a.t)) {
      return true;
    }
  }
  return false;
}

// Dim d of t from zigzag order over a ring of n (LoadBalance: block r holds chunks r and 2n-1-r of 2n) back to
// the natural order.
Tensor unzigzag(const Tensor& t, int d, std::int64_t n) {
  std::int64_t c = t.shape[static_cast<std::size_t>(d)] / (2 * n);
  std::vector<Tensor> parts;
  for (std::int64_t i = 0; i < 2 * n; ++i) {
    std::int64_t at = i < n ? 2 * i : 2 * (2 * n - 1 - i) + 1;  // where natural chunk i sits
    parts.push_back(slice(t, d, at * c, (at + 1) * c));
  }
  return concat(parts, d);
}

// Whether plan value t can be `want` in some layout the plan may hold it in: the same elements with size-1 dims
// aside (keepdim), or a padded copy (no dim shorter, `want` its leading block). 1: equal, 0: comparable but
// different, -1: not comparable (another shape).
int layout_equal(const Tensor& t, const Tensor& want) {
  if (t.shape == want.shape) return same_value(t, want) ? 1 : 0;
  auto squeeze = [](Shape sh) {
    sh.erase(std::remove(sh.begin(), sh.end(), std::int64_t{1}), sh.end());
    return sh;
  };
  if (t.data.size() == want.data.size() && squeeze(t.shape) == squeeze(want.shape)) return same_value(interp::reshape(t, want.shape), want) ? 1 : 0;
  if (t.shape.size() != want.shape.size()) return -1;
  Tensor cut = t;
  for (std::size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] < want.shape[d]) return -1;
    if (t.shape[d] > want.shape[d]) cut = slice(cut, static_cast<int>(d), 0, want.shape[d]);
  }
  return same_value(cut, want) ? 1 : 0;
}

// The same, trying also every dim in zigzag order over every mesh axis when the program may reorder a dim so
// (`zigzag`: LoadBalance, or a local-view program): a value between the reorder and its inverse is the spec's
// value in that order.
int layout_equal(const Setup& s, bool zigzag, const Tensor& t, const Tensor& want) {
  int r = layout_equal(t, want);
  if (r == 1 || !zigzag) return r;
  for (int d = 0; d < t.rank(); ++d)
    for (std::int64_t n : s.inst.mesh) {
      std::int64_t len = t.shape[static_cast<std::size_t>(d)];
      if (n < 2 || len % (2 * n)) continue;
      int z = layout_equal(unzigzag(t, d, n), want);
      if (z == 1) return 1;
      r = std::max(r, z);
    }
  return r;
}

// The model value `v` equals under some reading (and layout, layout_equal), if any, and the reading when `how` is
// given; else a block of a model value (one dim cut into k equal blocks: a microbatch of the batch, read on one rank
// of an imported per-rank graph).
const SpecValue* match(const Setup& s, const std::vector<SpecValue>& table, const std::vector<Val>& ranks, bool zigzag = false, Placements* how = nullptr) {
  if (ranks.empty()) return nullptr;  // (per-rank plans: only the ranks that hold the value are read)
  OracleOptions quiet = s.oo;
  quiet.rtol = kRtol, quiet.atol = kAtol;
  const SpecValue* hit = nullptr;
  any_reading(s, ranks, true, quiet, [&](const Tensor& t, const Placements& pl) {
    for (const auto& sv : table)
      if (layout_equal(s, zigzag, t, *sv.t) == 1) {
        if (how) *how = pl;
        return hit = &sv, true;
      }
    return false;
  });
  if (hit) return hit;
  any_reading(s, ranks, false, quiet, [&](const Tensor& t, const Placements& pl) {
    for (const auto& sv : table) {
      const Shape& big = sv.t->shape;
      if (big.size() != t.shape.size()) continue;
      int d = -1;
      for (std::size_t i = 0; i < big.size(); ++i)
        if (big[i] != t.shape[i]) d = d < 0 && t.shape[i] > 0 && big[i] % t.shape[i] == 0 ? static_cast<int>(i) : -2;
      if (d < 0) continue;
      std::int64_t n = t.shape[static_cast<std::size_t>(d)], k = big[static_cast<std::size_t>(d)] / n;
      for (std::int64_t b = 0; b < k && k <= 64; ++b)
        if (same_value(t, slice(*sv.t, d, b * n, (b + 1) * n))) {
          if (how) *how = pl;
          return hit = &sv, true;
        }
    }
    return false;
  });
  return hit;
}

// Whether some reading of the plan value gives a tensor comparable with `want` (layout_equal >= 0): a name the
// plan and the spec share is a lineage point only then (a padded, per-block or otherwise other-shaped value of
// the same name is another value).
bool comparable(const Setup& s, const std::vector<Val>& ranks, const Tensor& want, bool zigzag) {
  if (ranks.empty()) return false;
  OracleOptions quiet = s.oo;
  quiet.rtol = kRtol, quiet.atol = kAtol;
  return any_reading(s, ranks, true, quiet, [&](const Tensor& t) { return layout_equal(s, zigzag, t, want) >= 0; });
}

// A stage cut holds: the plan's value before the cut, read by some placement with no pending sum (a cut of per-rank
// summands would not be a cut of their sum), equals the model's in doubles and in every lane. Each point is checked
// as soon as every rank of the plan has written it (run_once); one only some ranks write (the ranks whose program
// writes it) after the run. Per-rank plans: the ranks that hold the value are read (any_reading).
bool cut_holds(const Setup& s, const std::vector<Val>& ranks, const Tensor& want) {
  if (ranks.empty()) return false;
  return any_reading(s, ranks, false, s.oo, [&](const Tensor& t) { return t.shape == want.shape && same_value(t, want); });
}

bool cuts_hold(const Setup& s, const Run& run) {
  for (std::size_t c = 0; c < run.cut_ok.size(); ++c) {
    if (run.cut_ok[c]) continue;
    if (run.cut_left[c] == 0 || !cut_holds(s, run.plan_cut[c], run.model_cut[c])) return false;  // (checked when the last rank wrote it)
  }
  return true;
}

// Kinds whose outputs are partial by design (a ring attention step without its accumulator): never blamed first.
bool partial_by_design(const Op& op) { return op.kind == OpKind::RingAttentionStep && op.n_in < 5; }
// And ops a pipeline's lowering made (gradient accumulation, merges over microbatches): correct by construction.
bool generated_op(const Setup& s, int oi) { return s.pair && static_cast<std::size_t>(oi) < s.pair->generated.size() && s.pair->generated[static_cast<std::size_t>(oi)]; }

// A pipelined plan: the instances of one op of the one-microbatch step (one per microbatch) are read together, as the
// spec sees them: concatenated along a dim (the microbatch split), summed or averaged (a loss or a gradient per
// microbatch), or one of them when all agree; then by placement over the mesh. Other ops: their value alone.
const SpecValue* match_op(const Setup& s, const std::vector<SpecValue>& table, const Run& run, int oi, const std::vector<int>& instances,
                          const std::vector<Val>& merged, bool zigzag = false, Placements* how = nullptr) {
  const auto& own = run.plan_vals[static_cast<std::size_t>(oi)];
  if (instances.size() < 2) return match(s, table, merged, zigzag, how);
  std::size_t ranks = own[0].size();
  int rank = -1;
  for (const Val& v : own[0])
    if (v.defined && rank < 0) rank = v.t.rank();
  // Instances of one microbatch on other ranks (a value and its copy received by the next stage) are one value.
  std::vector<std::vector<int>> by_mb;
  for (std::size_t k = 0; k < instances.size(); ++k) {
    int mb = s.pair->mb[static_cast<std::size_t>(instances[k])];
    if (k == 0 || mb != s.pair->mb[static_cast<std::size_t>(instances[k - 1])]) by_mb.emplace_back();
    by_mb.back().push_back(instances[k]);
  }
  if (by_mb.size() < 2) return match(s, table, merged, zigzag, how);
  // A scalar of the backward (the gradient of a microbatch's loss) is read as the same value in every microbatch (the
  // dual of a loss read as their sum): summed, the gradients of wrongly scaled losses could add up to the right one.
  bool same_only = rank == 0 && static_cast<std::size_t>(oi) < s.pair->derived.size() && s.pair->derived[static_cast<std::size_t>(oi)];
  auto combined = [&](auto&& combine) -> std::vector<Val> {
    std::vector<Val> out(ranks);
    for (std::size_t r = 0; r < ranks; ++r) {
      std::vector<const Tensor*> parts;
      const Val* first = nullptr;
      for (const auto& group : by_mb)
        for (int i : group) {
          const Val& v = run.plan_vals[static_cast<std::size_t>(i)][0][r];
          if (!v.defined) continue;
          if (!first) first = &v;
          parts.push_back(&v.t);
          break;
        }
      if (!first) continue;
      if (parts.size() != by_mb.size()) return {};
      out[r] = *first;
      if (!combine(parts, out[r].t)) return {};
    }
    return out;
  };
  auto try_reading = [&](const std::vector<Val>& vals) { return vals.empty() ? nullptr : match(s, table, vals, zigzag); };
  auto add = [&](const std::vector<const Tensor*>& parts, Tensor& t, bool mean) {
    for (std::size_t k = 1; k < parts.size(); ++k) {
      if (parts[k]->shape != t.shape) return false;
      for (std::size_t e = 0; e < t.data.size(); ++e) t.data[e] = t.data[e] + parts[k]->data[e];
    }
    if (mean) {
      const Num n = static_cast<double>(parts.size());
      for (auto& e : t.data) e = e / n;
    }
    return true;
  };
  if (!same_only) {
    if (auto* m = try_reading(combined([&](const auto& parts, Tensor& t) { return add(parts, t, false); }))) return m;
    if (auto* m = try_reading(combined([&](const auto& parts, Tensor& t) { return add(parts, t, true); }))) return m;
  }
  for (int d = 0; d < rank; ++d) {
    auto cat = combined([&](const auto& parts, Tensor& t) {
      if (d >= t.rank()) return false;
      std::vector<Tensor> ts;
      for (const Tensor* x : parts) ts.push_back(*x);
      try {
        t = concat(ts, d);
      } catch (const std::runtime_error&) {
        return false;
      }
      return true;
    });
    if (auto* m = try_reading(cat)) return m;
  }
  auto same = combined([&](const auto& parts, Tensor&) {
    return std::all_of(parts.begin(), parts.end(), [&](const Tensor* x) { return x->shape == parts[0]->shape && same_value(*x, *parts[0]); });
  });
  return try_reading(same);
}

struct Culprit {
  int op = -1;         // plan op
  int spec_op = -1;    // the model op it should have matched
  int frontier = -1;   // the first op on the way whose value matches no model value, when it is not `op`
  NameId named = -1;   // when `op` is a lineage point: the model's name it differs from
  // An input of `op` that matches a model value only as a pending sum (a missing reduction before `op`).
  NameId pending_in = -1, pending_spec = -1;
  std::string pending_axes;
};

// Of the ops of several per-rank programs that compute one value (`op` and its peers), the one whose ranks hold pieces
// that differ from a spec value of `wants` under the reading most ranks agree with; `op` when none tells.
int odd_program(const Setup& s, const Run& run, int op, const std::vector<int>& peers, const std::vector<Val>& merged,
                const std::vector<const Tensor*>& wants) {
  const Val* v0 = nullptr;
  for (const auto& v : merged)
    if (v.defined && !v0) v0 = &v;
  if (!v0 || std::any_of(merged.begin(), merged.end(), [](const Val& v) { return !v.defined; })) return op;
  const auto& mesh = s.inst.mesh;
  int best = 0, best_bad = -1;
  for (const Tensor* wp : wants)
    for (const Placements& pl : readings(s.p, *v0, false)) {
    const Tensor& want = *wp;
    if (want.rank() != v0->t.rank()) continue;
    int good = 0, bad = -1;
    for (std::size_t r = 0; r < merged.size(); ++r) {
      // Rank r's piece of `want` under `pl`: each dim cut by its S axes, outer major.
      std::vector<std::int64_t> c(mesh.size());
      for (std::int64_t x = static_cast<std::int64_t>(r), a = static_cast<std::int64_t>(mesh.size()) - 1; a >= 0; --a)
        c[static_cast<std::size_t>(a)] = x % mesh[static_cast<std::size_t>(a)], x /= mesh[static_cast<std::size_t>(a)];
      Tensor piece = want;
      bool ok = true;
      for (int d = 0; d < piece.rank() && ok; ++d) {
        std::int64_t n = 1, idx = 0;
        for (std::size_t a = 0; a < mesh.size(); ++a)
          if (pl[a].is_s(d)) n *= mesh[a], idx = idx * mesh[a] + c[a];
        if (n == 1) continue;
        std::int64_t lo, hi;
        chunk_range(piece.shape[static_cast<std::size_t>(d)], n, idx, lo, hi);
        piece = slice(piece, d, lo, hi);
      }
      if (ok && piece.shape == merged[r].t.shape && same_value(piece, merged[r].t)) ++good;
      else if (bad < 0) bad = static_cast<int>(r);
    }
    if (bad < 0) return op;  // every piece is the spec's under this reading: no program is odd
    if (good > best) best = good, best_bad = bad;
    }
  if (best_bad < 0) return op;
  for (int q : peers)
    if (!run.plan_vals[static_cast<std::size_t>(q)].empty() && run.plan_vals[static_cast<std::size_t>(q)][0][static_cast<std::size_t>(best_bad)].defined) return q;
  return op;
}

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
  // Producers: the last writer of each name before each op in its program (and across programs: a Recv's Send, a
  // collective's partners). Ops are walked in the order they ran, a topological order across ranks.
  std::vector<std::vector<int>> producers = equiv_detail::plan_producers(p);
  int last = s.plan_last[static_cast<std::size_t>(output)];
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
  // values in zigzag order: made by LoadBalance, or by hand in the local view (each rank slices its two chunks)
  bool zigzag = p.local_view || std::any_of(p.ops.begin(), p.ops.end(), [](const Op& op) { return op.kind == OpKind::LoadBalance; });
  std::vector<const SpecValue*> matched(p.ops.size(), nullptr);
  std::vector<char> good(p.ops.size(), 0), konst(p.ops.size(), 0);
  std::vector<Placements> how(p.ops.size());
  std::vector<int> position(p.ops.size(), -1);
  for (std::size_t k = 0; k < run.plan_order.size(); ++k) position[static_cast<std::size_t>(run.plan_order[k])] = static_cast<int>(k);
  // A pipelined plan: an op of the one-microbatch step has an instance per microbatch, matched together (match_op).
  std::unordered_map<int, std::vector<int>> family;
  auto family_of = [&](int oi) {
    return s.pair && static_cast<std::size_t>(oi) < s.pair->family.size() && s.pair->mb[static_cast<std::size_t>(oi)] >= 0 ? s.pair->family[static_cast<std::size_t>(oi)] : -1;
  };
  for (int oi : run.plan_order)
    if (int f = family_of(oi); f >= 0) family[f].push_back(oi);
  for (auto& [f, v] : family)
    std::stable_sort(v.begin(), v.end(), [&](int a, int b) { return s.pair->mb[static_cast<std::size_t>(a)] < s.pair->mb[static_cast<std::size_t>(b)]; });
  static const std::vector<int> alone;
  auto instances = [&](int oi) -> const std::vector<int>& {
    int f = family_of(oi);
    return f >= 0 ? family[f] : alone;
  };
  // Per-rank programs: the same value written by other programs (the same name, the same write) is read with it.
  std::vector<std::vector<int>> peers = equiv_detail::name_peers(p);
  auto values_of = [&](int oi) {
    std::vector<Val> v = run.plan_vals[static_cast<std::size_t>(oi)][0];
    for (int q : peers[static_cast<std::size_t>(oi)])
      if (!run.plan_vals[static_cast<std::size_t>(q)].empty())
        for (std::size_t r = 0; r < v.size(); ++r)
          if (!v[r].defined && run.plan_vals[static_cast<std::size_t>(q)][0][r].defined) v[r] = run.plan_vals[static_cast<std::size_t>(q)][0][r];
    return v;
  };
  std::unordered_map<int, const SpecValue*> family_match;
  for (int oi : run.plan_order) {
    auto o = static_cast<std::size_t>(oi);
    // a constant (computed from no input: a rank's offset, a Full) has no counterpart to match and is never blamed first
    konst[o] = std::all_of(producers[o].begin(), producers[o].end(), [&](int q) { return q >= 0 && konst[static_cast<std::size_t>(q)]; });
    if (!in_cone[o] || run.plan_vals[o].empty()) continue;
    int f = family_of(oi);
    if (auto it = family_match.find(f); f >= 0 && it != family_match.end()) matched[o] = it->second;
    else matched[o] = match_op(s, table, run, oi, instances(oi), values_of(oi), zigzag, &how[o]);
    if (f >= 0) family_match[f] = matched[o];
    good[o] = matched[o] != nullptr || konst[o];
  }
  int frontier = -1, fallback = -1;
  for (int oi : run.plan_order) {
    auto o = static_cast<std::size_t>(oi);
    if (!in_cone[o] || run.plan_vals[o].empty() || good[o] || partial_by_design(p.ops[o]) || generated_op(s, oi)) continue;
    bool inputs_good = std::all_of(producers[o].begin(), producers[o].end(), [&](int q) { return q < 0 || good[static_cast<std::size_t>(q)]; });
    if (inputs_good && frontier < 0) frontier = oi;
    if (fallback < 0) fallback = oi;
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
  for (int oi : run.plan_order) {
    auto o = static_cast<std::size_t>(oi);
    const Op& po = p.ops[o];
    if (named >= 0) break;
    if (!in_cone[o] || run.plan_vals[o].empty() || po.n_out == 0 || generated_op(s, oi)) continue;
    NameId out = p.outs(po)[0];
    // An instance for one microbatch (`h@mb3`) stands for the step's value of its base name (`h`).
    if (family_of(oi) >= 0) {
      const std::string& nm = p.name(out);
      auto at = nm.rfind("@mb");
      auto it = at == std::string::npos ? p.name_ids.end() : p.name_ids.find(nm.substr(0, at));
      if (it == p.name_ids.end() || instances(oi).empty() || instances(oi)[0] != oi) continue;
      out = it->second;
    }
    NameId want = counterpart[static_cast<std::size_t>(out)];
    // a name's final values are compared (a gradient accumulated in place is partial before its last write)
    if (want < 0 || !s.plan_final[po.first + po.n_in]) continue;
    std::vector<SpecValue> own;
    for (const auto& sv : table)
      if (sv.name == want && (sv.op < 0 || sv.op == s.model_last[static_cast<std::size_t>(want)])) own.push_back(sv);
    // a name the spec shares but with another layout (a padded gather, a per-block mask) is not a lineage point
    if (own.empty()) continue;
    std::vector<Val> vals = values_of(oi);
    if (instances(oi).size() < 2 && !comparable(s, vals, *own[0].t, zigzag)) continue;
    if (!match_op(s, own, run, oi, instances(oi), vals, zigzag)) named = oi, c.named = want;
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
  if (named >= 0 && c.pending_in < 0 && frontier >= 0 && position[static_cast<std::size_t>(frontier)] < position[static_cast<std::size_t>(named)] && named == last &&
      counterpart_by_link[static_cast<std::size_t>(p.outs(p.ops[static_cast<std::size_t>(named)])[0])])
    named = -1, c.named = -1;
  c.op = named >= 0 ? named : first >= 0 ? first : last;
  // A pipeline's values are per microbatch and read as families, a per-rank plan's names are its programs' own (an
  // imported graph's): there the frontier, when it comes first, is the op.
  if ((!family.empty() || p.per_rank) && frontier >= 0 && named >= 0 && position[static_cast<std::size_t>(frontier)] < position[static_cast<std::size_t>(named)])
    c.op = frontier, c.named = -1;
  if (first >= 0 && position[static_cast<std::size_t>(first)] < position[static_cast<std::size_t>(c.op)]) c.frontier = first;
  // Per-rank programs computing one value under one name: the program whose ranks' pieces differ from the spec's value
  // (its counterpart, else the spec value most ranks' pieces are blocks of).
  auto refine = [&](int op) {
    if (op < 0 || peers[static_cast<std::size_t>(op)].empty() || !p.ops[static_cast<std::size_t>(op)].n_out) return op;
    NameId want = counterpart[static_cast<std::size_t>(p.outs(p.ops[static_cast<std::size_t>(op)])[0])];
    std::vector<const Tensor*> cands;
    for (const auto& sv : table)
      if (want < 0 || (sv.name == want && (sv.op < 0 || sv.op == s.model_last[static_cast<std::size_t>(want)]))) cands.push_back(sv.t);
    return odd_program(s, run, op, peers[static_cast<std::size_t>(op)], values_of(op), cands);
  };
  c.op = refine(c.op);
  c.frontier = refine(c.frontier);
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
  bool derived = !model && s.pair && i < s.pair->derived.size() && s.pair->derived[i];  // a pipeline's stage backward
  if (i < p.ops.size() && ((i >= from && i < to) || derived)) t += " (in the derived backward of the op on this line)";
  return t;
}

constexpr int kMaxAttempts = 8;
constexpr int kMinIntTrials = 3;
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
  for (const auto& t : p.tensors)  // (a pipeline's microbatch inputs, `ids@mb3`, are parts of the ones named)
    if (is_int(t.dtype) && p.name(t.name).find("@mb") == std::string::npos) ints += (ints.empty() ? "" : ", ") + p.name(t.name);
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
// max/min reduction, an input pending a max or min), or null. A comparison, a count or a cast to integers is a
// choice only on data that is not an exact constant: the runs report that (Runner::inexact_choice).
const Op* value_choice(const Program& p) {
  // an input pending a max or min: its global value is the largest (smallest) summand, chosen by value; the first
  // op that reads it stands for the choice
  for (const auto& t : p.tensors)
    if (std::any_of(t.placement.begin(), t.placement.end(), [](Placement pl) { return pl.is_p() && (pl.op == ReduceOp::Max || pl.op == ReduceOp::Min); }))
      for (const auto& op : p.ops) {
        auto ins = p.ins(op);
        if (std::find(ins.begin(), ins.end(), t.name) != ins.end()) return &op;
      }
  for (const auto* list : {&p.ops, &p.spec_ops})
    for (const auto& op : *list) {
      bool choice = op.kind == OpKind::ReduceMax || op.kind == OpKind::ReduceMin || op.kind == OpKind::TopKGate || op.kind == OpKind::MoEDispatch ||
                    op.kind == OpKind::AmaxUpdate || op.kind == OpKind::AmaxHistory ||
                    (op_info(op.kind).category == OpCategory::collective && (op.attrs.rop == ReduceOp::Max || op.attrs.rop == ReduceOp::Min));
      if (choice) return &op;
    }
  return nullptr;
}

// Every value the spec computed in run `r` and both sides of the compared link are real numbers (no inf or
// NaN): a counterexample whose inputs divide by zero somewhere shows no real difference.
bool stays_real(Setup& s, Run& r, const Link& l) {
  auto finite = [](const Tensor& t) { return std::all_of(t.data.begin(), t.data.end(), [](const Num& e) { return std::isfinite(e.d); }); };
  for (const auto& op : r.model_vals)
    for (const auto& t : op)
      if (!finite(t)) return false;
  Assembled a = assemble(s.p, *r.plan, l.plan, l.pl, s.oo);
  return (!a.ok || finite(a.t)) && finite(r.model->at(0, l.spec).t);
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
    std::string found;
    any_reading(s, ranks, true, quiet, [&](const Tensor& t, const Placements& pl) {
      std::string axes;
      for (std::size_t a = 0; a < s.p.mesh.size(); ++a)
        if (pl[a].is_p()) axes += (axes.empty() ? "" : ", ") + s.p.mesh[a].name;
      if (axes.empty() || t.shape != want.t.shape || !same_value(t, want.t)) return false;
      found = axes;
      return true;
    });
    if (!found.empty()) return found;
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
      // small integers can hit a zero divisor (x / 0, log 0): such a run has no real value, so the drawn reals
      // give the counterexample instead
      ints = rdiff && rdiff->kind == DiffKind::Real && stays_real(s, *rec, links[rdiff->link]);
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
    try {
      c = localize(s, *rec, shown.plan, pairs);
    } catch (const BudgetError&) {  // reading the recorded values by every placement is too large: no place named
      c = Culprit{};
    }
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
      if (s.pair && std::any_of(s.pair->microbatches.begin(), s.pair->microbatches.end(), [&](const auto& m) { return m.name == t.name; })) continue;
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
    // The compared output's writer holding summands of the spec's value (ranks that disagree on an R output, a
    // row-parallel layer without its all-reduce): the reduction is missing after it.
    std::string out_axes;
    if (c.pending_in < 0 && c.op == s.plan_last[static_cast<std::size_t>(shown.plan)]) out_axes = pending_axes(s, shown, ts, work);
    if (!out_axes.empty())
      d.message += fmt::format("; the ranks hold summands of the spec's {} (a pending sum over {}): a reduction (AllReduce over {}) is missing after {}",
                               p.name(shown.spec), out_axes, out_axes, op_text(s, false, op));
    if (c.spec_op >= 0) {
      const Op& mo = s.model.ops[static_cast<std::size_t>(c.spec_op)];
      d.notes.push_back({mo.loc, (out_axes.empty() ? "the spec computes it here: " : "the spec computes it whole here: ") + op_text(s, true, mo)});
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

// Not checked, and why; a program with a spec, which claims a comparison, gets a value-unproved warning at its spec.
EquivResult not_checked(const Program& p, const std::string& why) {
  EquivResult res;
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
}

// The check of a plan/spec pair: a forward program, or (with `pending`) the training steps of equiv/training.h, whose
// `pending` names (a pending sum at their last write) are never stage cuts.
// A run at reduced sizes (equiv/reduce.h): the sizes, the real shapes the value-using kernels read, and what the verdict covers.
struct Reduced {
  equiv_detail::Reduction r;
  std::vector<std::vector<Shape>> plan_real, model_real;
  mutable bool run_failed = false;  // set by check_pair when the spec fails at the reduced sizes (then: as declared)
};

EquivResult check_pair(const Program& p, const EquivOptions& opt, const equiv_detail::TrainingPair* pending, const Reduced* red) {
  EquivResult res;
  auto skip = [&](std::string why, Loc at = {}) {
    EquivResult r = not_checked(p, why);
    r.sizes = res.sizes;
    if (at.line)
      for (auto& d : r.diags) d.loc = at;
    return r;
  };
  if (p.schedule.present) return skip("a pipeline schedule has no single-device meaning here");
  if (p.per_rank && !p.has_spec) return skip("per-rank `programs:` need a `spec:` to be compared with (they have no single-device run of their own)");
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
  Setup s{p, model_of(p), {}, {}, {}, {}, {}, {}, {}, {}, {}, {0, 0}, {0, 0}, 0, nullptr, nullptr, {}, {}, nullptr};
  if (pending) s.plan_bwd = pending->plan_bwd, s.model_bwd = pending->spec_bwd, s.pair = pending;
  s.oo.seed = opt.seed;
  if (opt.max_bytes > 0) s.oo.max_bytes = opt.max_bytes;
  std::string covers;  // with a reduction: what the verdict covers
  if (red) {
    s.inst.vars = red->r.vars;
    for (const auto& ax : p.mesh) s.inst.mesh.push_back(p.exprs.eval(ax.size, s.inst.vars).value_or(1));
    s.plan_real = &red->plan_real;
    s.model_real = &red->model_real;
    std::string declared;
    for (std::size_t k = 0; k < p.vars.size(); ++k)
      if (p.vars[k].general) declared += fmt::format("{}{} = {}", declared.empty() ? "" : ", ", p.vars[k].name, p.vars[k].in.front());
    std::string symbolic;
    for (std::size_t k = 0; k < p.vars.size(); ++k)
      if (!p.vars[k].general) symbolic += fmt::format("{}{} = {}", symbolic.empty() ? "" : ", ", p.vars[k].name, s.inst.vars[k]);
    covers = fmt::format(" at the declared sizes {}{} (run at reduced sizes that keep every partition: {}", declared,
                         symbolic.empty() ? "" : " and " + symbolic, red->r.text);
    for (const auto& k : red->r.kept) covers += "; kept " + k;
    covers += ")";
    std::int64_t ranks = 1;
    for (auto m : s.inst.mesh) ranks *= m;
    if (ranks > s.oo.max_ranks) return skip(fmt::format("the mesh has {} ranks, more than the interpreter's {}", ranks, s.oo.max_ranks));
    for (const auto& t : p.tensors) {
      std::int64_t elems = 1;
      for (ExprId e : t.shape) elems = std::min<std::int64_t>(elems * p.exprs.eval(e, s.inst.vars).value_or(1), s.oo.max_elements + 1);
      if (elems > s.oo.max_elements)
        return skip(fmt::format("{} has more than {} elements even at the reduced sizes ({})", p.name(t.name), s.oo.max_elements, red->r.text));
    }
  } else {
    auto insts = instantiations(p, s.oo);
    if (insts.empty()) return skip("no small instantiation of the sizes fits the interpreter");
    s.inst = insts[opt.seed % insts.size()];
  }
  for (std::size_t k = 0; k < p.vars.size(); ++k) s.sizes += (k ? ", " : "") + p.vars[k].name + " = " + std::to_string(s.inst.vars[k]);
  res.sizes = s.sizes;
  res.reduction = red ? red->r.text : "";
  // A shape-only pre-run of the model (integer inputs 0) learns the ranges integer inputs must take.
  s.ranges.assign(p.names.size(), -1);
  {
    std::int64_t w0 = 0;
    Runner pre(s.model, s.inst.vars, std::vector<std::int64_t>(s.inst.mesh.size(), 1), true, s.oo, w0, s.inst.mesh);
    pre.int_range = &s.ranges;
    pre.free_dead({});
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
        k.held = od->ranks;
      }
      links.push_back(k);
    }
  } else {
    for (const auto& od : p.outputs) links.push_back({od.name, od.name, od.loc, od.has_placement ? od.placement : Placements{}, od.ranks});
  }
  if (links.empty()) return skip("nothing to compare (no outputs)");
  s.plan_keep.assign(p.names.size(), 0);
  s.model_keep.assign(p.names.size(), 0);
  for (const auto& l : links) s.plan_keep[static_cast<std::size_t>(l.plan)] = s.model_keep[static_cast<std::size_t>(l.spec)] = 1;
  // Stage cut points: names the plan and the spec both write (the spec's name through lineage:), neither a declared
  // tensor nor a compared output, nor a pending sum in the plan; each is cut at its last write in each program
  // (a gradient accumulated in place is cut once it is whole).
  {
    s.plan_last.assign(p.names.size(), -1);
    s.model_last.assign(p.names.size(), -1);
    for (std::size_t oi = 0; oi < p.ops.size(); ++oi)
      for (NameId n : p.outs(p.ops[oi])) s.plan_last[static_cast<std::size_t>(n)] = static_cast<int>(oi);
    s.plan_final = equiv_detail::final_writes(p);
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
    // A run failing at reduced sizes means the reduction missed a shape relation the program relies on (a value
    // with a type error has none to see, a local-view plan is not typed): the check is then made as declared, where
    // a plan that fails while the spec runs is a finding.
    if (red)
      return red->run_failed = true, skip(fmt::format("the run fails at the reduced sizes {} ({})", s.sizes, r.failure));
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
      return skip(e.what(), e.loc);
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
      bool fits = false;
      try {
        fits = any_reading(s, ranks, true, s.oo, [&](const Tensor& t) { return t.shape == g.t.shape; });
      } catch (const BudgetError& e) {
        return skip(e.what(), e.loc);
      }
      if (fits) continue;
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
  const Op* choice = value_choice(p);  // a choice by value: static (routing, max/min), or met by a mask of float data in a run
  bool choices = choice != nullptr;
  // A pipeline's integer inputs cut into microbatches (labels, ids): the verdict holds for the drawn values, and a
  // shuffled or dropped microbatch of few small labels can leave one draw unchanged; three draws at least.
  int min_trials = 1;
  // At reduced sizes integer inputs have fewer elements and a smaller range, so a draw that hides a difference (every
  // id alike, keys equal at every position) is likelier: three draws at least there too.
  if (red && std::any_of(p.tensors.begin(), p.tensors.end(), [](const TensorDecl& t) { return is_int(t.dtype); })) min_trials = kMinIntTrials;
  if (s.pair)
    for (const auto& mb : s.pair->microbatches)
      for (const auto& t : p.tensors)
        if (t.name == mb.name && is_int(t.dtype)) min_trials = kMinIntTrials;
  for (int attempt = 0; attempt < kMaxAttempts && (log2_bound > kLog2Target || choices || trials < min_trials); ++attempt) {
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
      return skip(e.what(), e.loc);
    }
    if (!run->failure.empty()) return located_failure(*run);
    if (num::trial_failed()) continue;
    if (diff) return report_difference(s, links, *diff, ts, work, res);
    if (!choice && run->plan->inexact_choice >= 0) choice = &p.ops[static_cast<std::size_t>(run->plan->inexact_choice)];
    if (!choice && run->model->inexact_choice >= 0) choice = &s.model.ops[static_cast<std::size_t>(run->model->inexact_choice)];
    choices = choice != nullptr;
    ++trials;
    std::uint64_t uf = num::uf_evaluations();
    max_degree = std::max(max_degree, degree), max_uf = std::max(max_uf, uf);
    log2_bound += trial_log2_bound(degree);
  }
  std::string scope = scope_text(p);
  if (choice) {
    // The exact lanes follow the branch the doubles take, so they cannot see a choice made on the wrong values when
    // the drawn inputs happen to lead both programs to the same branch: equal on every trial is evidence, not proof.
    res.verdict = EquivVerdict::Unknown;
    res.message = fmt::format("equal to the spec on {} trials of drawn inputs{}, but not proved: {} (line {}) chooses by value, and the exact arithmetic "
                              "follows the choice the drawn values make",
                              trials, covers, op_name(choice->kind), choice->loc.line);
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
    res.message = fmt::format("equal to the spec in {} trial{}{}, but the error bound 2^{:.0f} is above 2^{} (degree bound {}, {} random-function evaluations)",
                              trials, trials == 1 ? "" : "s", covers, log2_bound, kLog2Target, max_degree, max_uf);
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
                            links.size(), links.size() == 1 ? "" : "s", !covers.empty() ? covers : s.sizes.empty() ? "" : " at " + s.sizes, scope, log2_bound, trials,
                            trials == 1 ? "" : "s", max_degree, max_uf);
  return res;
}

}  // namespace

namespace {

using equiv_detail::TypedOps;

// `p` with its concrete sizes as variables (LoadOptions::generalize_sizes) and the value each variable has without a
// reduction (declared, or the small instantiation of a symbolic size); nullopt when it cannot be had (a program built
// in code, one edited after it was loaded, no concrete size to reduce).
std::optional<Program> generalized(const Program& p, const EquivOptions& opt, std::vector<std::int64_t>& base) {
  std::optional<Program> g;
  if (p.generalized) {
    g = p;
  } else {
    if (!p.source) return std::nullopt;
    try {
      LoadOptions lo;
      lo.generalize_sizes = true;
      g = load_program_string(*p.source, p.file, lo);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  if (std::none_of(g->vars.begin(), g->vars.end(), [](const SizeVar& v) { return v.general; })) return std::nullopt;
  OracleOptions any;
  any.seed = opt.seed;
  any.max_elements = kMaxValue;
  auto insts = instantiations(*g, any);
  if (insts.empty()) return std::nullopt;
  base = insts[opt.seed % insts.size()].vars;
  if (!p.generalized && !equiv_detail::same_program(p, *g, base)) return std::nullopt;
  return g;
}

// Every value typed alike (placements, rank, whether it has a type) in two checks of one op list.
bool same_types(const SpatialTypes& a, const SpatialTypes& b) {
  auto same = [](const ValueType& x, const ValueType& y) { return x.ok == y.ok && x.rank == y.rank && x.pl == y.pl && x.uneven == y.uneven; };
  if (a.decls.size() != b.decls.size() || a.outs.size() != b.outs.size()) return false;
  for (std::size_t i = 0; i < a.decls.size(); ++i)
    if (!same(a.decls[i], b.decls[i])) return false;
  for (std::size_t i = 0; i < a.outs.size(); ++i)
    if (!same(a.outs[i], b.outs[i])) return false;
  return true;
}

// The reduction of `g` (its forward typed here, the training pair's steps when `tp`), checked: the program at the
// reduced sizes must type-check exactly as at the declared ones (the same findings, the same placement for every
// value), or it is not used. False: nothing to reduce, or the reduction does not hold.
bool prepare_reduction(const Program& g, const std::vector<std::int64_t>& base, const equiv_detail::TrainingPair* tp, Reduced& red) {
  Program model = model_of(g);
  SpatialTypes pt, mt;
  std::vector<ShapeClaim> pc, mc;
  std::vector<TypedOps> lists;
  bool plan_typed = !g.local_view;
  std::vector<Diagnostic> pd, md;
  try {
    if (plan_typed) {
      SpatialOptions so;
      so.types = &pt;
      so.claims = &pc;
      pd = check_spatial(g, so);
      lists.push_back({&g, &g.ops, &pt, &pc});
    } else {
      lists.push_back({&g, &g.ops, nullptr, nullptr});
    }
    if (g.has_spec) {
      SpatialOptions so;
      so.types = &mt;
      so.claims = &mc;
      md = check_spatial(model, so);
      lists.push_back({&model, &model.ops, &mt, &mc});
    }
    red.r = equiv_detail::choose_reduction(g, base, lists);
    if (!red.r.applied) return false;
    // The reduced program must type-check exactly as the declared one.
    auto recheck = [&](const Program& q, const std::vector<Diagnostic>& before, const SpatialTypes& types) {
      Program at = equiv_detail::at_sizes(q, red.r.vars);
      SpatialTypes t2;
      SpatialOptions so;
      so.types = &t2;
      auto d2 = check_spatial(at, so);
      auto key = [](const std::vector<Diagnostic>& ds) {
        std::vector<std::tuple<int, std::uint32_t, std::uint32_t>> k;
        for (const auto& d : ds) k.emplace_back(static_cast<int>(d.id), d.loc.line, d.loc.col);
        std::sort(k.begin(), k.end());
        return k;
      };
      return key(d2) == key(before) && same_types(types, t2);
    };
    if (plan_typed && !recheck(g, pd, pt)) return false;
    if (g.has_spec && !recheck(model, md, mt)) return false;
  } catch (const std::exception&) {
    return false;
  }
  // The real shapes the value-using kernels read.
  if (tp) {
    const Program& c = tp->program;
    Program cm = model_of(c);
    red.plan_real = equiv_detail::real_shapes(c, c.ops, {&c, &tp->plan_typed, &tp->plan_types, nullptr}, base);
    red.model_real = equiv_detail::real_shapes(cm, cm.ops, {&c, &tp->spec_typed, &tp->spec_types, nullptr}, base);
  } else {
    if (plan_typed) red.plan_real = equiv_detail::real_shapes(g, g.ops, lists[0], base);
    if (g.has_spec) red.model_real = equiv_detail::real_shapes(model, model.ops, lists.back(), base);
    else if (plan_typed) red.model_real = equiv_detail::real_shapes(model, model.ops, {&g, &g.ops, &pt, nullptr}, base);
  }
  return true;
}

}  // namespace

EquivResult check_built_pair(const equiv_detail::TrainingPair& tp, const EquivOptions& opt) { return check_pair(tp.program, opt, &tp, nullptr); }

EquivResult check_equivalence(const Program& p, const EquivOptions& opt) {
  bool pipelined = p.schedule.present && !p.schedule.stages.empty();
  bool training = p.loss >= 0 && (p.train || p.has_backward);
  // Shape reduction: the program with its sizes as variables, run at the smallest sizes with its partition structure
  // (not yet for per-rank programs and pipelines: those run at their declared sizes).
  std::vector<std::int64_t> base;
  std::optional<Program> g = opt.reduce && !pipelined && !p.per_rank ? generalized(p, opt, base) : std::nullopt;
  Reduced red;
  equiv_detail::TrainingPair tp;
  bool reduced = false;
  if (g) {
    // every size at one value (the declared ones, symbolic ones at their instantiation): the checks below decide
    // their claims by evaluation, never by the solver
    g = equiv_detail::at_sizes(*g, base);
    if (training) tp = equiv_detail::training_pair(*g);
    // a training step that does not build with its sizes as variables is checked as declared (where it may)
    reduced = !(training && !tp.ok) && prepare_reduction(*g, base, training ? &tp : nullptr, red);
    if (!reduced) tp = equiv_detail::TrainingPair{};
  }
  const Program& q = reduced ? *g : p;
  const Reduced* rp = reduced ? &red : nullptr;
  // A difference found at reduced sizes is confirmed as declared when that run fits the interpreter: an identity the
  // declared sizes make exact (the normalized values of a LayerNorm sum to 0) is not exact over fewer elements
  // divided by the declared count, so a plan that differs from its spec only inside such an identity would be a
  // false alarm. Too large as declared: the reduced counterexample stands.
  // (The confirmation is cheap or not made: at most 64 MiB of values.)
  EquivOptions confirm_opt = opt;
  confirm_opt.max_bytes = opt.max_bytes > 0 ? std::min<std::int64_t>(opt.max_bytes, 64 << 20) : 64 << 20;
  auto confirmed = [&](EquivResult reduced_res, auto&& declared) {
    if (!reduced || !opt.confirm || red.run_failed || reduced_res.verdict != EquivVerdict::Mismatch) return reduced_res;
    EquivResult as_declared = declared();
    return as_declared.verdict == EquivVerdict::Skipped ? reduced_res : as_declared;
  };
  if (!pipelined && !training) {
    EquivResult res = confirmed(check_pair(q, opt, nullptr, rp), [&] { return check_pair(p, confirm_opt, nullptr, nullptr); });
    if (!red.run_failed) return res;
    return check_pair(p, opt, nullptr, nullptr);  // the reduced sizes do not fit: as declared (within the interpreter's limits)
  }
  // A training program: the plan's training step against the spec's (its gradients compared too). A pipelined
  // schedule: its per-rank programs with each stage's forward and backward per microbatch (equiv/pipeline.h).
  if (pipelined) tp = equiv_detail::pipeline_pair(p);
  else if (p.per_rank) tp.why = "the backward of per-rank `programs:` is not derived (a pipeline's is: write it as a `schedule:` with stages)";
  else if (!reduced) tp = equiv_detail::training_pair(p);
  if (pipelined && !tp.ok) return not_checked(p, tp.why);
  if (tp.ok) {
    EquivResult res = confirmed(check_pair(tp.program, opt, &tp, rp), [&] {
      equiv_detail::TrainingPair declared = equiv_detail::training_pair(p);
      return declared.ok ? check_pair(declared.program, confirm_opt, &declared, nullptr) : not_checked(p, declared.why);
    });
    if (red.run_failed) {  // the reduced sizes do not fit: as declared (within the interpreter's limits)
      tp = equiv_detail::training_pair(p);
      if (tp.ok) res = check_pair(tp.program, opt, &tp, nullptr);
    }
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
  EquivResult res = confirmed(check_pair(q, opt, nullptr, rp), [&] { return check_pair(p, confirm_opt, nullptr, nullptr); });
  if (red.run_failed) res = check_pair(p, opt, nullptr, nullptr);
  if (res.verdict == EquivVerdict::Skipped && p.outputs.empty() && p.spec_outputs.empty()) {  // nothing but the gradients to compare
    res.message += "; the gradients are not compared: " + tp.why;
    for (auto& d : res.diags) d.message = res.message;
  }
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
