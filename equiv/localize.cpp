// equiv/localize.cpp - comparing values across the plan and the spec: a plan value read by every placement (R, P,
// S of a dim, per axis; the pieces of the ranks that hold it), the layouts a name may be held in (keepdim, padding,
// zigzag, a block of a spec value), stage cuts, and the first plan op that goes wrong on the way to a differing
// output (docs/equivalence.md).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "equiv/equiv_impl.h"
#include "interp/num.h"

namespace spmd::equiv_detail {

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

namespace {

bool same_lanes(const Num& x, const Num& y) {
  for (int l = 0; l < kLanes; ++l)
    if (x.pure(l) != y.pure(l)) return false;
  return true;
}

// The first element whose doubles are apart past the tolerance and for which `counts(e)` holds (-1: none; -2: shapes
// differ).
template <class Counts>
std::int64_t first_apart(const Tensor& a, const Tensor& b, Counts counts) {
  if (a.shape != b.shape) return -2;
  double tol = kAtol + kRtol * std::max(max_abs_of(a), max_abs_of(b));
  for (std::size_t e = 0; e < a.data.size(); ++e)
    if (!close_to(dbl(a.data[e]), dbl(b.data[e]), tol) && counts(e)) return static_cast<std::int64_t>(e);
  return -1;
}

}  // namespace

// The first element where `a` and `b` differ in doubles (-1: none; -2: shapes differ).
std::int64_t first_difference(const Tensor& a, const Tensor& b) {
  return first_apart(a, b, [](std::size_t) { return true; });
}

// The first element where the field lanes of `a` and `b` differ (-1: none, or lanes off; shapes must agree).
std::int64_t first_lane_difference(const Tensor& a, const Tensor& b) {
  if (!num::on()) return -1;
  for (std::size_t e = 0; e < a.data.size(); ++e)
    if (!same_lanes(a.data[e], b.data[e])) return static_cast<std::int64_t>(e);
  return -1;
}

std::int64_t first_real_difference(const Tensor& a, const Tensor& b) {
  if (!num::on()) return first_difference(a, b);
  return first_apart(a, b, [&](std::size_t e) { return !same_lanes(a.data[e], b.data[e]); });
}

// Equal in doubles and in every lane.
bool same_value(const Tensor& a, const Tensor& b) { return first_difference(a, b) == -1 && first_lane_difference(a, b) == -1; }

std::string num_text(double x) {
  if (x == std::round(x) && std::abs(x) < 1e15) return fmt::format("{}", static_cast<long long>(x));
  return fmt::format("{:.6g}", x);
}

// A tensor's values as nested brackets (at most `cap` elements, then "...").
std::string values_text(const Tensor& t, std::size_t cap) {
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

// Placements to read a plan value by: a dim the runner tracks as sharded by an axis is S(dim) there; any other axis
// may be R or a pending sum (global view); in local view any axis may also be S(d) of any dim.
std::vector<Placements> readings(const Program& p, const Val& v0, bool pending) {
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

namespace {

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
const SpecValue* match(const Setup& s, const std::vector<SpecValue>& table, const std::vector<Val>& ranks, bool zigzag = false,
                       Placements* how = nullptr) {
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

}  // namespace

// A stage cut holds: the plan's value after the cut, read by some placement with no pending sum (a cut of per-rank
// summands would not be a cut of their sum), equals the model's in doubles and in every lane (the cut's random
// function of different lanes agrees only by a collision the error bound counts). Each point is checked
// as soon as every rank of the plan has written it (run_once); one only some ranks write (the ranks whose program
// writes it) after the run. Per-rank plans: the ranks that hold the value are read (any_reading).
bool cut_holds(const Setup& s, const std::vector<Val>& ranks, const Tensor& want) {
  if (ranks.empty()) return false;
  return any_reading(s, ranks, false, s.oo, [&](const Tensor& t) { return t.shape == want.shape && same_value(t, want); });
}

// A pipeline's point, microbatch k: the instances are whole per microbatch, so microbatch k's global value (its
// instances read over the ranks) is part k of each rank block of the spec's value along the batch dim (the microbatch
// split), or the spec's value itself when it has no batch dim. Every dim is tried: a cut is sound under any
// arrangement that pairs each instance element with an equal spec element.
void mb_cut_step(const Setup& s, MbCut& m, std::size_t k, const Tensor& want) {
  std::vector<Val> ranks = std::move(m.inst[k]);
  m.inst[k] = {};
  if (m.failed) return;
  std::vector<Tensor> held;
  std::vector<std::int64_t> sizes;
  const Val* first = nullptr;
  if (!held_pieces(s.inst.mesh, ranks, held, sizes, &first)) return void(m.failed = true);
  const int rank = want.rank();
  const std::size_t arr = 1 + static_cast<std::size_t>(std::max(rank, 0));
  const auto n_mb = static_cast<std::int64_t>(m.inst.size());
  std::vector<Placements> rd = readings(s.p, *first, false);
  if (m.checked == 0) m.readings = rd, m.live.assign(rd.size() * arr, 1);
  if (rd != m.readings) return void(m.failed = true);
  bool any = false;
  for (std::size_t i = 0; i < rd.size(); ++i) {
    if (!std::any_of(m.live.begin() + static_cast<std::ptrdiff_t>(i * arr), m.live.begin() + static_cast<std::ptrdiff_t>((i + 1) * arr),
                     [](char c) { return c != 0; }))
      continue;
    Assembled a = assemble_pieces(s.p, sizes, held, rd[i], s.oo);
    for (std::size_t j = 0; j < arr; ++j) {
      char& alive = m.live[i * arr + j];
      if (!alive) continue;
      alive = 0;
      if (!a.ok || a.t.rank() != rank) continue;
      if (j == 0) {
        alive = a.t.shape == want.shape && same_value(a.t, want);
      } else {
        const int d = static_cast<int>(j - 1);
        const auto du = static_cast<std::size_t>(d);
        Shape sh = a.t.shape;
        sh[du] *= n_mb;
        if (sh != want.shape) continue;
        std::int64_t blocks = 1;  // the rank blocks along d: the held mesh's axes that read d as S(d)
        for (std::size_t x = 0; x < sizes.size(); ++x)
          if (rd[i][x].is_s(d)) blocks *= sizes[x];
        if (a.t.shape[du] % blocks) continue;
        const std::int64_t n = a.t.shape[du] / blocks, kk = static_cast<std::int64_t>(k);
        std::vector<Tensor> part;
        for (std::int64_t bl = 0; bl < blocks; ++bl) part.push_back(slice(want, d, (bl * n_mb + kk) * n, (bl * n_mb + kk + 1) * n));
        Tensor expect = blocks == 1 ? std::move(part[0]) : concat(part, d);
        alive = same_value(a.t, expect);
      }
      any |= alive != 0;
    }
  }
  ++m.checked;
  if (!any) m.failed = true;
}

bool cuts_hold(const Setup& s, const Run& run) {
  for (std::size_t c = 0; c < run.cut_ok.size(); ++c) {
    if (run.cut_ok[c]) continue;
    // (checked when the last rank wrote it; a pipeline's point when its last instance was written)
    if (run.cut_left[c] == 0 || (c < s.cut_mb.size() && s.cut_mb[c]) || !cut_holds(s, run.plan_cut[c], run.model_cut[c])) return false;
  }
  return true;
}

bool generated_op(const Setup& s, int oi) {
  return s.pair && static_cast<std::size_t>(oi) < s.pair->generated.size() && s.pair->generated[static_cast<std::size_t>(oi)];
}

bool received_copy(const Setup& s, int oi) {
  auto o = static_cast<std::size_t>(oi);
  return s.pair && o < s.pair->family.size() && s.pair->family[o] >= 0 && s.pair->mb[o] >= 0 && s.p.ops[o].kind == OpKind::Recv;
}

namespace {

// Kinds whose outputs are partial by design (a ring attention step without its accumulator): never blamed first.
bool partial_by_design(const Op& op) { return op.kind == OpKind::RingAttentionStep && op.n_in < 5; }

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
  // Instances of one microbatch on other ranks (a value and its copy received by the next stage) are one value, read
  // where it is written: its copies are not pieces of it (on a stage and the next of four pipeline ranks they cover no
  // sub-mesh, and on two they would read as a sum or a concatenation of the copies).
  std::vector<std::vector<int>> by_mb;
  for (std::size_t k = 0; k < instances.size(); ++k) {
    int mb = s.pair->mb[static_cast<std::size_t>(instances[k])];
    if (k == 0 || mb != s.pair->mb[static_cast<std::size_t>(instances[k - 1])]) by_mb.emplace_back();
    by_mb.back().push_back(instances[k]);
  }
  for (auto& group : by_mb) {
    auto copy = [&](int i) { return received_copy(s, i); };
    if (!std::all_of(group.begin(), group.end(), copy)) group.erase(std::remove_if(group.begin(), group.end(), copy), group.end());
  }
  if (by_mb.size() < 2) {
    const auto& one = by_mb[0];
    return match(s, table, std::find(one.begin(), one.end(), oi) != one.end() ? merged : run.plan_vals[static_cast<std::size_t>(one[0])][0], zigzag, how);
  }
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
        if (ok && piece.shape == merged[r].t.shape && same_value(piece, merged[r].t))
          ++good;
        else if (bad < 0)
          bad = static_cast<int>(r);
      }
      if (bad < 0) return op;  // every piece is the spec's under this reading: no program is odd
      if (good > best) best = good, best_bad = bad;
    }
  if (best_bad < 0) return op;
  for (int q : peers)
    if (!run.plan_vals[static_cast<std::size_t>(q)].empty() &&
        run.plan_vals[static_cast<std::size_t>(q)][0][static_cast<std::size_t>(best_bad)].defined)
      return q;
  return op;
}

}  // namespace

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
    return s.pair && static_cast<std::size_t>(oi) < s.pair->family.size() && s.pair->mb[static_cast<std::size_t>(oi)] >= 0
               ? s.pair->family[static_cast<std::size_t>(oi)]
               : -1;
  };
  for (int oi : run.plan_order)
    if (int f = family_of(oi); f >= 0) family[f].push_back(oi);
  for (auto& [f, v] : family)
    std::stable_sort(v.begin(), v.end(),
                     [&](int a, int b) { return s.pair->mb[static_cast<std::size_t>(a)] < s.pair->mb[static_cast<std::size_t>(b)]; });
  static const std::vector<int> alone;
  auto instances = [&](int oi) -> const std::vector<int>& {
    int f = family_of(oi);
    return f >= 0 ? family[f] : alone;
  };
  // Per-rank programs: the same value written by other programs (the same name, the same write) is read with it.
  // A pipeline's received copies are no such peers (received_copy).
  std::vector<std::vector<int>> peers = equiv_detail::name_peers(p);
  for (auto& v : peers) v.erase(std::remove_if(v.begin(), v.end(), [&](int q) { return received_copy(s, q); }), v.end());
  auto values_of = [&](int oi) {
    std::vector<Val> v = run.plan_vals[static_cast<std::size_t>(oi)][0];
    for (int q : peers[static_cast<std::size_t>(oi)])
      if (!run.plan_vals[static_cast<std::size_t>(q)].empty())
        for (std::size_t r = 0; r < v.size(); ++r)
          if (!v[r].defined && run.plan_vals[static_cast<std::size_t>(q)][0][r].defined) v[r] = run.plan_vals[static_cast<std::size_t>(q)][0][r];
    return v;
  };
  std::unordered_map<int, const SpecValue*> family_match;
  if (run.windowed)  // an op not recorded computes a cut point that holds, or a value from such points only: right
    for (std::size_t o = 0; o < p.ops.size(); ++o) good[o] = run.plan_vals[o].empty();
  for (int oi : run.plan_order) {
    auto o = static_cast<std::size_t>(oi);
    // a constant (computed from no input: a rank's offset, a Full) has no counterpart to match and is never blamed first
    konst[o] = std::all_of(producers[o].begin(), producers[o].end(), [&](int q) { return q >= 0 && konst[static_cast<std::size_t>(q)]; });
    if (!in_cone[o] || run.plan_vals[o].empty()) continue;
    int f = family_of(oi);
    if (auto it = family_match.find(f); f >= 0 && it != family_match.end())
      matched[o] = it->second;
    else
      matched[o] = match_op(s, table, run, oi, instances(oi), values_of(oi), zigzag, &how[o]);
    if (f >= 0) family_match[f] = matched[o];
    good[o] = matched[o] != nullptr || konst[o];
  }
  // Values in an MoE dispatch's expert-major layout (the buffer and what the experts compute on it, up to the combine
  // or the gate gradient that reads it back by token) have no counterpart in a spec that routes otherwise (a dense
  // one-hot): matching nothing there is no sign of a wrong op.
  // A derived backward's transpose or reshape is a fixed rearrangement the spec's own backward need not hold (the
  // expert weights' transposes): right when its forward op is, so never blamed first either.
  std::vector<char> dispatched(p.ops.size(), 0), moved(p.ops.size(), 0);
  for (int oi : run.plan_order) {
    auto o = static_cast<std::size_t>(oi);
    const OpKind k = p.ops[o].kind;
    const bool derived = (o >= s.plan_bwd.first && o < s.plan_bwd.second) || (s.pair && o < s.pair->derived.size() && s.pair->derived[o]);
    moved[o] = derived && (k == OpKind::Transpose || k == OpKind::Reshape);
    dispatched[o] = k == OpKind::MoEDispatch ||
                    (k != OpKind::MoECombine && k != OpKind::MoEGateGrad &&
                     std::any_of(producers[o].begin(), producers[o].end(), [&](int q) { return q >= 0 && dispatched[static_cast<std::size_t>(q)]; }));
  }
  int frontier = -1, fallback = -1;
  for (int oi : run.plan_order) {
    auto o = static_cast<std::size_t>(oi);
    if (!in_cone[o] || run.plan_vals[o].empty() || good[o] || partial_by_design(p.ops[o]) || generated_op(s, oi) || dispatched[o] || moved[o]) continue;
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
      if (!axes.empty())
        c.pending_in = p.ins(p.ops[static_cast<std::size_t>(o)])[i], c.pending_spec = matched[static_cast<std::size_t>(q)]->name,
        c.pending_axes = axes;
    }
  };
  if (named >= 0) pending_input(named);
  if (named >= 0 && c.pending_in < 0 && frontier >= 0 && position[static_cast<std::size_t>(frontier)] < position[static_cast<std::size_t>(named)] &&
      named == last && counterpart_by_link[static_cast<std::size_t>(p.outs(p.ops[static_cast<std::size_t>(named)])[0])])
    named = -1, c.named = -1;
  c.op = named >= 0 ? named : first >= 0 ? first : last;
  // A pipeline's values are per microbatch and read as families, a per-rank plan's names are its programs' own (an
  // imported graph's): there the frontier, when it comes first, is the op.
  if ((!family.empty() || p.per_rank) && frontier >= 0 && named >= 0 &&
      position[static_cast<std::size_t>(frontier)] < position[static_cast<std::size_t>(named)])
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

}  // namespace spmd::equiv_detail
