// spatial/rules_conversion.cpp - placement and shape rules of the SPMD conversions
//
// Ops: Convert, Reinterpret, SPMDGuard. Dispatched from Checker::apply() in rules.cpp.
#include "spatial/checker.h"

namespace spmd::detail {

Placement Checker::norm_target(Placement t, int rank, bool& ok) {
  ok = true;
  if (!t.is_s()) return t;
  int d = norm_dim(t.dim, rank, "target S(" + std::to_string(t.dim) + ")", iname(0));
  if (d < 0) ok = false;
  else t.dim = static_cast<std::int16_t>(d);
  return t;
}

bool Checker::from_ok(int a) {
  if (!at().has_from) return true;
  bool ok = true;
  Placement f = norm_target(at().from, in(0).rank, ok);
  if (!ok) return false;
  if (f == pin(0, a)) return true;
  std::vector<Note> notes;
  origin_note(notes, in(0), a);
  report(CheckId::PlacementMismatch,
         fmt::format("{} expects {} to be {} over {} (`from: {}`), but it is {}", opname(), iname(0), ps(f), axn(a), ps(at().from), ps(pin(0, a))), iname(0),
         std::move(notes));
  return false;
}

void Checker::convert() {
  Value& o = out() = in(0);
  bool ok = true;
  Placement t = norm_target(at().to, in(0).rank, ok);
  if (!ok) return;
  for (int a : coll_axes(false)) {
    if (!from_ok(a)) return;
    Placement p = pin(0, a);
    std::string why = fmt::format("Convert over {} from {} to {}", axn(a), ps(p), ps(t));
    if (p == t) continue;
    // R -> P(avg|max|min): the avg, max or min of equal copies is the value, so no data moves
    bool copies = p.is_r() && t.is_p() && t.op != ReduceOp::Sum;
    bool legal = (p.is_i() && t.is_r()) || (p.is_r() && t.is_s()) || (p.is_v() && t.is_p()) || (p.is_r() && t.is_v()) || copies ||
                 (p.is_s() && t.is_p() && t.op == ReduceOp::Sum);  // S(d) -> P: the shard in its slot of a zero tensor
    if (!legal) {
      std::string hint = p.is_p()           ? fix_allreduce(iname(0), a, p)
                         : p.is_r() && t.is_p() ? "R -> P(sum) multiplies the global value by the axis size (R -> P(avg), P(max) or P(min) keeps it); "
                                                  "if that is meant, use Reinterpret"
                         : p.is_s() && t.is_r() ? fix_allgather(iname(0), a, p.dim)
                         : p.is_r() && t.is_i() ? "R -> I would drop the gradient's AllReduce; produce I directly (e.g. AllReduce with dst: I)"
                         : p.is_i()             ? fmt::format("convert I to R first ({{op: Convert, ..., axis: {}, to: R}}), then to {}", axn(a), ps(t))
                                                : "Convert takes I -> R, R -> S(d), R -> P(avg|max|min), S(d) -> P, V -> P and R -> V";
      return illegal(fmt::format("Convert over {} cannot turn {} ({}) into {} without communication", axn(a), iname(0), ps(p), ps(t)), a, hint);
    }
    if (p.is_v() && t.op == ReduceOp::Sum && whole_v(in(0), a))
      return illegal(fmt::format("Convert over {} of {} to P(sum): {} is V but holds the whole value on every rank (it was made from a replicated "
                                 "value), so its {} copies would be summands of {} times the value",
                                 axn(a), iname(0), iname(0), axsize(a), axsize(a)),
                     a, "convert to P(avg) (or P(max), P(min)), which keeps the value; R -> P(sum) is Reinterpret's job");
    if (t.is_s() && !can_add_shard(o, t.dim, a)) return;
    if (p.is_s() && t.is_p() && !can_remove_shard(o, p.dim, a)) return;  // only the innermost shard has a contiguous slot
    set_new(o, a, t, why);
  }
}

void Checker::reinterpret() {
  Value& o = out() = in(0);
  bool ok = true;
  Placement t = norm_target(at().to, in(0).rank, ok);
  if (!ok) return;
  for (int a : coll_axes(false)) {
    if (!from_ok(a)) return;
    Placement p = pin(0, a);
    if (p == t) continue;
    if (p.is_s() || t.is_s())
      return illegal(fmt::format("Reinterpret over {} cannot relabel {} ({}) as {}: a shard and a whole value have different local shapes", axn(a),
                                 iname(0), ps(p), ps(t)),
                     a, "");
    set_new(o, a, t, fmt::format("Reinterpret over {} relabels {} as {}", axn(a), ps(p), ps(t)));
  }
}

void Checker::guard() {
  const Value& x = in(0);
  if (op_->n_out) out() = x;
  const Placements& want = p_.placement_maps[at().placements];
  for (int a = 0; a < axes(); ++a) {
    bool ok = true;
    Placement t = norm_target(want[static_cast<std::size_t>(a)], x.rank, ok);
    if (!ok) return;
    if (satisfies(pin(0, a), t)) continue;
    std::vector<Note> notes;
    origin_note(notes, x, a);
    Fix f;
    if (t.is_s() && pin(0, a).is_s()) scatter_dim_fix(x, a, t.dim, notes, f);
    report(CheckId::PlacementMismatch, fmt::format("SPMDGuard expects {} to be {} over {}, but it is {}", iname(0), ps(t), axn(a), ps(pin(0, a))),
           iname(0), std::move(notes));
    diags_.back().fix = std::move(f);
    return;
  }
  if (at().shape != kNoIndex) {
    const auto& s = p_.shapes[at().shape];
    if (s.size() != x.rank)
      return report(CheckId::ShapeMismatch, fmt::format("SPMDGuard expects {} to have shape {}, but it has {}", iname(0), sstr(s), sstr(x.dims())),
                    iname(0));
    for (std::size_t d = 0; d < s.size(); ++d)
      if (!same_dim(x.shape[d], s[d], fmt::format("SPMDGuard: dim {} of {} (actual, left) differs from the declared shape {} (right)", d, iname(0), sstr(s)),
                    iname(0)))
        return;
  }
}

}  // namespace spmd::detail
