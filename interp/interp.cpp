// interp/interp.cpp - the numeric oracle: per-rank and single-device runs of a program, assembled and compared.
//
// Both runs go through one Runner: the single-device run is the same program on a mesh whose every axis
// has size 1, so every collective and conversion is the identity there by construction. Per-rank values
// carry the layout a real runtime would track (the global shape and, per dim, the mesh axes that shard it;
// DTensor keeps the same metadata): elementwise ops read a whole operand as its local slice, Reshape
// computes local target shapes, a vocab-sharded Embedding masks its lookup. The layout is only a means to
// run the ops; the verdict comes from the assembled numbers, so a wrong layout decision shows up as a
// difference, never as agreement.
#include "interp/interp.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <numeric>
#include <sstream>

#include "interp/assembly.h"
#include "interp/runner.h"
#include "interp/tensor.h"

namespace spmd {

std::string_view verdict_name(OracleVerdict v) {
  switch (v) {
    case OracleVerdict::Agree: return "agree";
    case OracleVerdict::Differ: return "differ";
    case OracleVerdict::GlobalError: return "single-device run fails";
    case OracleVerdict::Skipped: return "skipped";
  }
  return "?";
}

namespace interp {  // shared with equiv/ through interp/assembly.h

using namespace interp;

// ---- size instantiation ---------------------------------------------------------------------------


bool has_value_kernel(const Program& p, const std::vector<Op>& ops, const Op& op) {
  if (op.kind == OpKind::OverlapRegion || op.kind == OpKind::Step) return false;
  if (op.kind == OpKind::PointwiseGrad)  // of Dropout: only with its forward's mask to redraw
    return op_info(op.kind).find_attr("of")->choices[op.attrs.choice] != "Dropout" || dropout_forward(p, ops, op) >= 0;
  return true;
}

std::vector<Instantiation> instantiations(const Program& p, const OracleOptions& o) {
  std::vector<std::vector<std::int64_t>> cand;
  for (const auto& v : p.vars) {
    std::vector<std::int64_t> c;
    if (!v.in.empty()) {
      for (auto x : v.in)
        if (x >= v.min && x <= v.max && x % v.multiple_of == 0) c.push_back(x);
    } else {
      std::int64_t first = (v.min + v.multiple_of - 1) / v.multiple_of * v.multiple_of;
      for (std::int64_t x = first, k = 0; x <= v.max && k < 4; x += v.multiple_of, ++k) c.push_back(x);
    }
    if (c.size() > 6) c.resize(6);
    cand.push_back(std::move(c));
  }
  // Every combination (capped), smallest first.
  std::vector<std::vector<int>> combos{{}};
  for (const auto& c : cand) {
    std::vector<std::vector<int>> next;
    for (const auto& base : combos)
      for (int i = 0; i < static_cast<int>(c.size()) && next.size() < 4096; ++i) {
        auto b = base;
        b.push_back(i);
        next.push_back(std::move(b));
      }
    combos = std::move(next);
  }
  std::stable_sort(combos.begin(), combos.end(), [](const auto& a, const auto& b) {
    return std::accumulate(a.begin(), a.end(), 0) < std::accumulate(b.begin(), b.end(), 0);
  });
  std::vector<Instantiation> out;
  for (const auto& cb : combos) {
    Instantiation in;
    for (std::size_t k = 0; k < cb.size(); ++k) in.vars.push_back(cand[k][static_cast<std::size_t>(cb[k])]);
    bool ok = true;
    std::int64_t ranks = 1;
    for (const auto& ax : p.mesh) {
      auto v = p.exprs.eval(ax.size, in.vars);
      if (!v || *v < 1) ok = false;
      else in.mesh.push_back(*v), ranks *= *v;
    }
    if (!ok || ranks > o.max_ranks) continue;
    // Declared shapes must fit the interpreter; one that has no value (an inexact division) is kept: the
    // single-device run then fails there, which is the evidence.
    for (const auto& t : p.tensors) {
      std::int64_t elems = 1;
      for (std::size_t d = 0; d < t.shape.size(); ++d) {
        auto v = p.exprs.eval(t.shape[d], in.vars);
        if (!v || *v < 1) {
          in.even = false;
          continue;
        }
        elems = std::min(elems * *v, o.max_elements + 1);
        std::int64_t parts = 1;
        for (std::size_t a = 0; a < p.mesh.size(); ++a)
          if (t.placement[a].is_s(static_cast<int>(d))) parts *= in.mesh[a];
        if (!t.uneven && *v % parts != 0) in.even = false;
      }
      if (elems > o.max_elements) ok = false;
    }
    if (ok) out.push_back(std::move(in));
    if (out.size() >= 64) break;
  }
  return out;
}

// ---- assembly ---------------------------------------------------------------------------------------


bool close(double a, double b, double tol) {
  if (a == b) return true;  // equal infinities (a division by zero on both sides) agree; inf - inf would be NaN
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::abs(a - b) <= tol;
}
double max_abs(const Tensor& t) {
  double m = 0;
  for (const Num& e : t.data)
    if (std::isfinite(e.d)) m = std::max(m, std::abs(e.d));
  return m;
}

Assembled assemble(const Program& p, Runner& run, NameId name, const Placements& pl, const OracleOptions& o,
                   const std::vector<std::pair<int, std::int64_t>>& held) {
  std::vector<Tensor> pieces;
  std::vector<std::int64_t> sizes = run.sizes(), counts = run.value_sizes();
  for (auto [a, c] : held) sizes[static_cast<std::size_t>(a)] = counts[static_cast<std::size_t>(a)] = 1;
  for (std::int64_t r = 0; r < run.ranks(); ++r) {
    auto coords = run.coords(r);
    if (!std::all_of(held.begin(), held.end(), [&](const auto& h) { return coords[static_cast<std::size_t>(h.first)] == h.second; })) continue;
    const Val& v = run.at(r, name);
    if (!v.defined) {
      Assembled res;
      res.problem = "rank " + coord_text(p, run.coords(r)) + " never computes it";
      return res;
    }
    pieces.push_back(v.t);
  }
  return assemble_pieces(p, sizes, std::move(pieces), pl, o, counts != sizes ? &counts : nullptr);
}

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

Assembled assemble_pieces(const Program& p, const std::vector<std::int64_t>& sizes, std::vector<Tensor> cur, const Placements& pl, const OracleOptions& o,
                          const std::vector<std::int64_t>* counts) {
  Assembled res;
  std::size_t axes = sizes.size();
  // cur: pieces over the remaining (outer) axes, row-major
  int rank = cur[0].rank();
  for (int a = static_cast<int>(axes) - 1; a >= 0; --a) {
    std::int64_t n = sizes[static_cast<std::size_t>(a)];
    Placement pa = pl[static_cast<std::size_t>(a)];
    const std::string& an = p.mesh[static_cast<std::size_t>(a)].name;
    if (pa.is_v()) return res.undefined = true, res.problem = "it is V over " + an + ", which has no assembled value", res;
    std::vector<Tensor> next;
    for (std::size_t g = 0; g < cur.size(); g += static_cast<std::size_t>(n)) {
      const std::vector<Tensor> members(cur.begin() + static_cast<std::ptrdiff_t>(g), cur.begin() + static_cast<std::ptrdiff_t>(g) + n);
      auto where = [&](std::int64_t m) {
        // coordinates of member m: the outer axes from the group index, this axis m, inner axes already assembled
        std::vector<std::string> parts;
        std::int64_t gi = static_cast<std::int64_t>(g) / n;
        std::vector<std::int64_t> outer(static_cast<std::size_t>(a));
        for (int b = a - 1; b >= 0; --b) outer[static_cast<std::size_t>(b)] = gi % sizes[static_cast<std::size_t>(b)], gi /= sizes[static_cast<std::size_t>(b)];
        std::string s = "{";
        for (int b = 0; b < a; ++b) s += p.mesh[static_cast<std::size_t>(b)].name + ": " + std::to_string(outer[static_cast<std::size_t>(b)]) + ", ";
        s += an + ": " + std::to_string(m);
        for (std::size_t b = static_cast<std::size_t>(a) + 1; b < axes; ++b) s += ", " + p.mesh[b].name + ": *";
        return s + "}";
      };
      if (pa.is_s()) {
        int d = pa.dim < 0 ? pa.dim + rank : pa.dim;
        if (d < 0 || d >= rank) return res.problem = "it is declared S(" + std::to_string(pa.dim) + ") over " + an + " but has rank " + std::to_string(rank), res;
        try {
          next.push_back(concat(members, d));
        } catch (const InterpError& e) {
          return res.problem = std::string("its pieces over ") + an + " do not concatenate: " + e.what(), res;
        }
      } else if (pa.is_p()) {
        Tensor acc = members[0];
        for (std::int64_t m = 1; m < n; ++m)
          if (members[static_cast<std::size_t>(m)].shape != acc.shape)
            return res.problem = "ranks " + where(0) + " and " + where(m) + " hold pieces of different shapes (" + shape_text(acc.shape) + " and " +
                                 shape_text(members[static_cast<std::size_t>(m)].shape) + ") for a P value",
                   res;
        if ((pa.op == ReduceOp::Max || pa.op == ReduceOp::Min) && num::sets()) {  // num.h, set_extreme
          std::vector<const Num*> at(static_cast<std::size_t>(n));
          for (std::size_t e = 0; e < acc.data.size(); ++e) {
            for (std::size_t m = 0; m < at.size(); ++m) at[m] = &members[m].data[e];
            acc.data[e] = num::set_extreme(at.data(), at.size(), pa.op == ReduceOp::Max);
          }
        } else {
          for (std::int64_t m = 1; m < n; ++m)
            for (std::size_t e = 0; e < acc.data.size(); ++e) {
              const Num& x = members[static_cast<std::size_t>(m)].data[e];
              acc.data[e] = pa.op == ReduceOp::Max ? pick_max(acc.data[e], x) : pa.op == ReduceOp::Min ? pick_min(acc.data[e], x) : acc.data[e] + x;
            }
        }
        if (pa.op == ReduceOp::Avg) {
          const Num nn = static_cast<double>(counts ? (*counts)[static_cast<std::size_t>(a)] : n);
          for (auto& e : acc.data) e /= nn;
        }
        next.push_back(std::move(acc));
      } else {  // R or I: every rank must hold the same value
        double tol = o.atol + o.rtol * max_abs(members[0]);
        for (std::int64_t m = 1; m < n; ++m) {
          const Tensor& x = members[static_cast<std::size_t>(m)];
          if (x.shape != members[0].shape)
            return res.problem = "ranks " + where(0) + " and " + where(m) + " hold different shapes (" + shape_text(members[0].shape) + " and " +
                                 shape_text(x.shape) + ") of a value that is " + to_string(pa) + " over " + an,
                   res;
          for (std::size_t e = 0; e < x.data.size(); ++e)
            if (!close(x.data[e].d, members[0].data[e].d, tol)) {
              std::ostringstream s;
              res.disagree = true;
              s << "ranks " << where(0) << " and " << where(m) << " disagree on a value that is " << to_string(pa) << " over " << an << ": element " << e
                << " is " << members[0].data[e].d << " vs " << x.data[e].d;
              return res.problem = s.str(), res;
            }
        }
        next.push_back(members[0]);
      }
    }
    cur = std::move(next);
  }
  // The pieces went in mesh order; a dim cut in another shard order (`order:`, ir/placement.h) has its blocks
  // moved to their places: the block of coordinates c sits at c flattened in the dim's order, not mesh order.
  int n_axes = static_cast<int>(axes);
  for (int d = 0; d < rank && has_strided(pl.data(), n_axes); ++d) {
    int ord[kMaxAxes];
    int k = shard_order(pl.data(), n_axes, d, ord);
    if (k < 2 || !pl[static_cast<std::size_t>(ord[0])].ord) continue;
    std::vector<int> mesh(ord, ord + k);  // (a vector: GCC 12 warns, wrongly, that sorting an array reads past it)
    std::sort(mesh.begin(), mesh.end());
    std::int64_t n = 1;
    for (int i = 0; i < k; ++i) n *= sizes[static_cast<std::size_t>(mesh[i])];
    const Tensor& g = cur[0];
    std::int64_t len = g.shape[static_cast<std::size_t>(d)];
    // Each piece's block: the dim cut by the axes in its order, each axis cutting the block the ones before it left
    // (torch.chunk's blocks when uneven: Runner::block); the pieces lie in mesh order in g, one after another.
    std::vector<std::pair<std::int64_t, Tensor>> blocks;  // (where the block starts, the piece)
    std::vector<std::int64_t> c(axes, 0);
    std::int64_t at = 0;
    for (std::int64_t km = 0; km < n; ++km) {
      std::int64_t r = km;
      for (int i = k - 1; i >= 0; --i) c[static_cast<std::size_t>(mesh[i])] = r % sizes[static_cast<std::size_t>(mesh[i])], r /= sizes[static_cast<std::size_t>(mesh[i])];
      std::int64_t lo, hi;
      nested_chunk(len, ord, k, sizes.data(), c.data(), lo, hi);
      if (at + (hi - lo) > len) return res.problem = "the ranks' pieces of an uneven dim cut in a shard order do not add up to it", res;
      blocks.emplace_back(lo, slice(g, d, at, at + (hi - lo)));
      at += hi - lo;
    }
    if (at != len) return res.problem = "the ranks' pieces of an uneven dim cut in a shard order do not add up to it", res;
    std::stable_sort(blocks.begin(), blocks.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<Tensor> pieces;
    for (auto& [lo, t] : blocks) pieces.push_back(std::move(t));
    cur[0] = concat(pieces, d);
  }
  res.ok = true;
  res.t = std::move(cur[0]);
  return res;
}

// Which ranks hold element `flat` of an output assembled by `pl` (for messages).
std::string holders(const Program& p, const std::vector<std::int64_t>& sizes, const Shape& gshape, std::int64_t flat, const Placements& pl) {
  Shape st = strides_of(gshape), idx(gshape.size());
  for (std::size_t d = 0; d < gshape.size(); ++d) idx[d] = st[d] ? (flat / st[d]) % std::max<std::int64_t>(gshape[d], 1) : 0;
  // Each sharded dim's axes in its shard order (mesh order by default), each narrowing the block the ones before
  // it left (torch.chunk's blocks when uneven): the coordinate of each axis that holds the element.
  std::vector<std::string> coord(sizes.size());
  const int n_axes = static_cast<int>(sizes.size());
  for (std::size_t d = 0; d < gshape.size(); ++d) {
    int order[kMaxAxes];
    int k = shard_order(pl.data(), n_axes, static_cast<int>(d), order);
    std::int64_t lo = 0, hi = gshape[d];
    for (int i = 0; i < k; ++i) {
      auto a = static_cast<std::size_t>(order[i]);
      for (std::int64_t c = 0; c < sizes[a]; ++c) {
        std::int64_t l, h;
        chunk_range(hi - lo, sizes[a], c, l, h);
        if (idx[d] >= lo + l && idx[d] < lo + h) {
          coord[a] = std::to_string(c);
          hi = lo + h, lo += l;
          break;
        }
      }
    }
  }
  std::string s = "{";
  for (std::size_t a = 0; a < sizes.size(); ++a) {
    Placement pa = pl[a];
    std::string v = pa.is_s() ? coord[a] : pa.is_p() ? "all (" + to_string(pa) + ")" : "any";
    s += (a ? ", " : "") + p.mesh[a].name + ": " + v;
  }
  return s + "}";
}

std::string index_text(const Shape& gshape, std::int64_t flat) {
  Shape st = strides_of(gshape);
  std::string s = "[";
  for (std::size_t d = 0; d < gshape.size(); ++d) s += (d ? ", " : "") + std::to_string(st[d] ? (flat / st[d]) % std::max<std::int64_t>(gshape[d], 1) : 0);
  return s + "]";
}

std::string op_where(const Program& p, int oi) {
  if (oi < 0) return "the inputs";
  const Op& op = p.ops[static_cast<std::size_t>(oi)];
  return "op " + std::to_string(oi) + " (" + std::string(op_name(op.kind)) + ", line " + std::to_string(op.loc.line) + ")";
}

}  // namespace interp

using namespace interp;

namespace {

OracleResult run_oracle_unbounded(const Program& p, const OracleOptions& o);

}  // namespace

OracleResult run_oracle(const Program& p, const OracleOptions& o) {
  try {
    return run_oracle_unbounded(p, o);
  } catch (const BudgetError& e) {  // an interpreter limit reached anywhere (the runs, the assembly): not checked
    OracleResult res;
    res.message = e.what();
    return res;
  }
}

namespace {

// run_oracle without the catch of the interpreter's limits.
OracleResult run_oracle_unbounded(const Program& p, const OracleOptions& o) {
  OracleResult res;
  // What the oracle cannot run is skipped with the reason (never counted as agreement): a schedule's opaque
  // steps, and ops with no numeric kernel.
  if (p.schedule.present) {
    res.message = p.schedule.stages.empty() ? "a pipeline schedule has opaque steps and no single-device meaning"
                                            : "a schedule with stages is run against its spec by `spmdcheck equiv` (docs/equivalence.md, \"Pipelines\")";
    return res;
  }
  for (const auto& op : p.ops)
    if (!has_value_kernel(p, p.ops, op)) {
      res.message = std::string(op_name(op.kind)) + " (line " + std::to_string(op.loc.line) + ") has no numeric kernel in the oracle";
      return res;
    }
  auto insts = instantiations(p, o);
  if (insts.empty()) {
    res.message = "no small instantiation of the sizes fits the interpreter (at most " + std::to_string(o.max_ranks) + " ranks and " +
                  std::to_string(o.max_elements) + " elements per tensor)";
    return res;
  }
  // Seed k runs the k-th smallest instantiation: for a program the checker proves for every allowed size
  // all of them are valid; for one with a counterexample, some seed reaches it.
  const Instantiation& inst = insts[o.seed % insts.size()];
  for (std::size_t k = 0; k < p.vars.size(); ++k) res.sizes += (k ? ", " : "") + p.vars[k].name + " = " + std::to_string(inst.vars[k]);
  std::int64_t work = 0;
  // Per-rank programs have no single-device run of their own: their model is the spec when there is one (its outputs
  // the spec tensors `spec.outputs` names); without one, outputs are only checked for agreement across ranks.
  const bool spec_model = p.per_rank && p.has_spec;
  const Program model = spec_model ? model_of(p) : Program{};
  const Program& mp = spec_model ? model : p;
  auto model_name = [&](NameId n) {
    if (spec_model)
      for (const auto& l : p.spec_outputs)
        if (l.plan == n) return l.spec;
    return n;
  };
  Runner dist(p, inst.vars, inst.mesh, false, o, work);
  Runner one(mp, inst.vars, std::vector<std::int64_t>(inst.mesh.size(), 1), true, o, work, inst.mesh);
  // A shape-only pre-run (integer inputs all 0) learns the ranges integer inputs must take.
  std::vector<std::int64_t> ranges(p.names.size(), -1);
  {
    std::int64_t w0 = 0;
    Runner pre(mp, inst.vars, std::vector<std::int64_t>(inst.mesh.size(), 1), true, o, w0, inst.mesh);
    pre.int_range = &ranges;
    pre.free_dead({});
    try {
      for (const auto& t : p.tensors) pre.declare(t, 1, o.seed);
      pre.run(o.seed);
    } catch (const std::runtime_error&) {
    }
    for (auto& r : ranges) r = r < 0 ? 4 : std::max<std::int64_t>(r, 1);
  }
  // The single-device run first: if the program itself fails there, per-rank numbers mean nothing.
  try {
    for (std::size_t i = 0; i < p.tensors.size(); ++i) {
      const TensorDecl& t = p.tensors[i];
      one.declare(mp.tensors[i], ranges[static_cast<std::size_t>(t.name)], o.seed);
      dist.declare(t, ranges[static_cast<std::size_t>(t.name)], o.seed);
    }
  } catch (const BudgetError& e) {
    res.message = e.what();
    return res;
  } catch (const InterpError& e) {
    res.verdict = OracleVerdict::GlobalError;
    res.message = std::string("the inputs cannot be built under ") + (res.sizes.empty() ? "these sizes" : res.sizes) + ": " + e.what();
    return res;
  }
  // The single-device inputs are the assembly of the per-rank ones (so P and V inputs get their global value).
  for (const auto& t : p.tensors) {
    Val& g = one.at(0, t.name);
    Assembled a = assemble(p, dist, t.name, t.placement, o);
    if (a.ok) g.t = std::move(a.t);
    else if (g.taint.empty()) g.taint = p.name(t.name) + " has no single-device value (" + a.problem + ")";
  }
  // Values nothing reads after their last reader are freed as the runs go; the outputs are compared afterwards.
  std::vector<char> keep(p.names.size(), 0);
  for (const auto& od : p.outputs) keep[static_cast<std::size_t>(od.name)] = 1;
  one.free_dead(keep);
  dist.free_dead(keep);
  std::string one_failed;  // local view: the single-device run failed (no single-device meaning, not an error)
  try {
    if (!p.per_rank || spec_model) one.run(o.seed);
  } catch (const BudgetError& e) {
    res.message = e.what();
    return res;
  } catch (const InterpError& e) {
    res.verdict = OracleVerdict::GlobalError;
    res.message = "the single-device run fails at " + (spec_model ? "spec op " + std::to_string(one.failed_op) : op_where(p, one.failed_op)) + ": " + e.what();
    if (!p.local_view) return res;
    res.verdict = OracleVerdict::Skipped;
    one_failed = res.message;
  }
  try {
    dist.run(o.seed);
  } catch (const BudgetError& e) {
    res.message = e.what();
    return res;
  } catch (const InterpError& e) {
    res.verdict = OracleVerdict::Differ;
    res.message = "the per-rank run fails at " + op_where(p, dist.failed_op) + ": " + e.what();
    res.failed_op = dist.failed_op;
    res.failed_rank = coord_text(p, dist.coords(dist.failed_rank));
    res.failure = e.what();
    return res;
  }
  if (!one_failed.empty()) {
    res.message = "local view: " + one_failed + ", so the program has no single-device meaning to compare with";
    return res;
  }
  bool differ = false;
  for (std::size_t k = 0; k < p.outputs.size(); ++k) {
    const OutputDecl& od = p.outputs[k];
    const std::string& name = p.name(od.name);
    Placements pl{};
    if (k < o.assemble.size() && o.assemble[k]) pl = *o.assemble[k];
    else if (od.has_placement) pl = od.placement;
    Val none;
    if (p.per_rank && !spec_model) none.defined = false;
    const Val& g = p.per_rank && !spec_model ? none : one.at(0, model_name(od.name));
    if (g.defined && !g.taint.empty() && g.taint[0] == kExcluded) {
      res.notes.push_back("output " + name + " is not compared: " + g.taint.substr(1));
      continue;
    }
    const Assembled a = assemble(p, dist, od.name, pl, o, od.ranks);  // (const: reading a shared buffer never copies it)
    if (!a.ok) {
      if (a.undefined) {
        res.notes.push_back("output " + name + " is not compared: " + a.problem);
        continue;
      }
      res.verdict = OracleVerdict::Differ;
      res.message = "output " + name + " cannot be assembled by its placement: " + a.problem;
      return res;
    }
    if (!g.defined || !g.taint.empty()) {
      ++res.rank_checked;
      res.notes.push_back("output " + name + " is compared across ranks only: its single-device value is undefined (" +
                          (g.defined ? g.taint : p.per_rank && !spec_model ? std::string("per-rank programs without a `spec:`") : std::string("never computed")) + ")");
      continue;
    }
    if (p.local_view && a.t.shape != g.t.shape) {
      res.notes.push_back("output " + name + " is not compared: it assembles to shape " + shape_text(a.t.shape) + " but the single-device run gives " +
                          shape_text(g.t.shape) + " (local view: no single-device meaning at these sizes)");
      continue;
    }
    ++res.compared;
    if (a.t.shape != g.t.shape) {
      res.verdict = OracleVerdict::Differ;
      res.message = "output " + name + " assembles to shape " + shape_text(a.t.shape) + " but the single-device value has shape " + shape_text(g.t.shape);
      return res;
    }
    double tol = o.atol + o.rtol * std::max(max_abs(g.t), max_abs(a.t));
    double worst = 0;
    std::int64_t first = -1;
    for (std::size_t e = 0; e < g.t.data.size(); ++e) {
      double x = a.t.data[e].d, y = g.t.data[e].d;
      double d = x == y ? 0.0 : std::isnan(x) != std::isnan(y) ? INFINITY : std::isnan(x) ? 0.0 : std::abs(x - y);
      worst = std::max(worst, d);
      if (first < 0 && !close(x, y, tol)) first = static_cast<std::int64_t>(e);
    }
    res.max_diff = std::max(res.max_diff, worst);
    if (first >= 0 && !differ) {
      differ = true;
      std::ostringstream s;
      s.precision(6);
      s << "output " << name << " differs at " << index_text(g.t.shape, first) << ": per-rank " << a.t.data[static_cast<std::size_t>(first)].d
        << ", single-device " << g.t.data[static_cast<std::size_t>(first)].d << " (held by ranks " << holders(p, dist.sizes(), g.t.shape, first, pl)
        << "); largest difference " << worst;
      res.message = s.str();
    }
  }
  if (differ) {
    res.verdict = OracleVerdict::Differ;
    return res;
  }
  if (res.compared + res.rank_checked == 0) {
    res.message = p.outputs.empty() ? "the program declares no outputs" : "no output has a comparable value";
    return res;
  }
  res.verdict = OracleVerdict::Agree;
  res.message = std::to_string(res.compared) + " output" + (res.compared == 1 ? " agrees" : "s agree");
  if (res.rank_checked) res.message += ", " + std::to_string(res.rank_checked) + " checked across ranks only";
  return res;
}

}  // namespace

}  // namespace spmd
