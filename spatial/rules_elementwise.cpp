// spatial/rules_elementwise.cpp - placement and shape rules of the pointwise compute ops
//
// Ops: SiLU/GELU/ReLU, Step, Cast, LossScale, Dropout, Add/Sub/Multiply (the FP8 ops are in
// rules_fp8.cpp). Dispatched from Checker::apply() in rules.cpp.
#include "spatial/checker.h"

namespace spmd::detail {

// Every rank applies the pointwise map f (described by `what`) to input i's summands. On each axis where
// input i is P(op), the result is P(op') when f commutes with op (ir/placement.h, reduce_through), else
// partial-misuse. False after a report.
bool Checker::map_partials(Value& o, int i, PointwiseMap f, const std::string& what, const std::string& fix_text) {
  for (int a = 0; a < axes(); ++a) {
    Placement p = pin(i, a);
    if (!p.is_p()) continue;
    if (auto r = reduce_through(f, p.op)) {
      if (*r != p.op) set_from(o, a, Placement::p(*r), i);
      continue;
    }
    std::string lacks;
    switch (p.op) {
      case ReduceOp::Sum: lacks = "linear"; break;
      case ReduceOp::Avg: lacks = "affine"; break;
      case ReduceOp::Max:
      case ReduceOp::Min: lacks = "monotone"; break;
    }
    std::string why = fmt::format("{} is not {}, so applying it to each rank's value does not give it applied to the pending {}", what, lacks,
                                  reduce_name(p.op));
    partial_misuse(i, a, why, fix_text);
    return false;
  }
  return true;
}

void Checker::nonlinear() {
  Value& o = out() = in(0);
  // ReLU is monotone non-decreasing: it keeps a pending max or min.
  bool up = op_->kind == OpKind::ReLU;
  map_partials(o, 0, up ? PointwiseMap::monotone_up() : PointwiseMap::opaque(), opname());
}

// An opaque step: its output has the type of its first input; nothing is known to be linear.
void Checker::step_rule() {
  out() = in(0);
  for (int i = 0; i < n_in(); ++i)
    for (int a = 0; a < axes(); ++a)
      if (pin(i, a).is_p()) return partial_misuse(i, a, "an opaque compute step is not known to be linear in a pending sum");
}

// Cast. A cast to a float dtype is the identity (rounding is outside the promise); to an integer dtype it
// truncates (monotone, not affine); to bool it is x != 0 (neither).
void Checker::linear() {
  Value& o = out() = in(0);
  if (at().has_dtype) o.dtype = at().dtype;
  if (op_->kind != OpKind::Cast || !at().has_dtype) return (void)map_partials(o, 0, PointwiseMap::identity(), opname());
  DType t = o.dtype;
  if (t == DType::Bool) return (void)map_partials(o, 0, PointwiseMap::opaque(), "a cast to bool (x != 0)");
  if (t == DType::I64 || t == DType::I32 || t == DType::I8)
    return (void)map_partials(o, 0, PointwiseMap::monotone_up(), fmt::format("rounding to {}", dtype_name(t)));
  map_partials(o, 0, PointwiseMap::identity(), opname());
}

void Checker::loss_scale() {
  Value& o = out() = in(0);
  if (!map_partials(o, 0, PointwiseMap::scale(at().number), opname())) return;  // a negative scale turns max into min
  if (!at().axes) return;
  // `axis` states the normalization: divide by the ranks of these axes, turning per-rank values that are
  // pending over them into summands of the normalized loss. It must cover exactly the pending axes.
  std::uint32_t pending = 0;
  for (int a = 0; a < axes(); ++a)
    if (pin(0, a).linear_partial()) pending |= 1u << a;
  std::uint32_t missing = pending & ~at().axes, extra = at().axes & ~pending;
  std::string all = mask_names(pending);
  std::vector<std::string> list;
  for (int a = 0; a < axes(); ++a)
    if (pending & (1u << a)) list.push_back(axn(a));
  std::string axis_attr;
  for (const auto& x : list) axis_attr += (axis_attr.empty() ? "" : ", ") + x;
  if (list.size() != 1) axis_attr = "[" + axis_attr + "]";
  if (missing) {
    int a = std::countr_zero(missing);
    std::vector<Note> notes;
    origin_note(notes, in(0), a);
    notes.push_back(fix(fmt::format("normalize over every axis the loss is pending over: `axis: {}` with scale 1/({})", axis_attr, all)));
    report(CheckId::LossScaling,
           fmt::format("LossScale normalizes {} over {}, but it is {} over {} too: the pending sum over {} is never divided by its size, so "
                       "the loss and every gradient are {} times too large (Megatron's context-parallel loss scaling divided by dp instead "
                       "of dp x cp)",
                       iname(0), mask_names(at().axes), ps(pin(0, a)), mask_names(missing), mask_names(missing), dstr(mask_size(missing))),
           iname(0), std::move(notes));
    return;
  }
  if (extra) {
    int a = std::countr_zero(extra);
    report(CheckId::LossScaling,
           fmt::format("LossScale normalizes {} over {}, but it is {} over {}, not a pending sum: dividing by the size of an axis the loss is "
                       "not summed over makes it {} times too small",
                       iname(0), mask_names(at().axes), ps(pin(0, a)), axn(a), dstr(mask_size(extra))),
           iname(0), {fix(pending ? fmt::format("`axis: {}`", axis_attr) : "drop `axis` (and the division) on this LossScale")});
    return;
  }
  for (int a = 0; a < axes(); ++a)
    if (pending & (1u << a)) set_from(o, a, Placement::p(ReduceOp::Sum), 0);
}

void Checker::dropout() {
  Value& o = out() = in(0);
  // A shared mask is the same on every rank: x -> m x / (1 - p) with m in {0, 1}, linear with a non-negative
  // factor, so every pending reduction passes. Per-rank masks scale each summand differently.
  if (!at().rng_per_rank) return (void)map_partials(o, 0, PointwiseMap::scale(1), "Dropout");
  for (int a = 0; a < axes(); ++a) {
    Placement p = pin(0, a);
    if (p.is_p()) return partial_misuse(0, a, "a per-rank random mask scales each rank's summand differently");
    if (p.is_r() || p.is_i())
      set_new(o, a, Placement::v(), fmt::format("Dropout with `rng: per_rank` draws a different mask on every rank of {}", axn(a)));
  }
  o.fresh = v_axes(o);
}

void Checker::add_like(bool multiply) {
  const std::string op = opname();
  if (n_in() == 1) {
    Value& o = out() = in(0);
    if (!at().has_number) return report(CheckId::ShapeMismatch, fmt::format("{} with one input needs `scalar:`", op), iname(0));
    if (multiply) return (void)map_partials(o, 0, PointwiseMap::scale(at().number), fmt::format("multiplying by {}", at().number));
    // x + c and x - c: an offset commutes with avg, max and min; a pending sum would count it once per rank
    for (int a = 0; a < axes(); ++a)
      if (pin(0, a).is_p() && pin(0, a).op == ReduceOp::Sum)
        return partial_misuse(0, a, fmt::format("every rank adds the scalar, so the pending sum counts it {} times", axsize(a)),
                              fmt::format("apply the scalar after the reduction: insert {{op: AllReduce, in: [{}], out: {}_reduced, axis: {}}} "
                                          "before this op",
                                          iname(0), iname(0), axn(a)));
    return (void)map_partials(o, 0, PointwiseMap::offset(+1), fmt::format("adding {}", at().number));
  }
  // (NormGrad's number is its norm's eps, not a scalar operand)
  Value* po = broadcast_pair(op_->kind == OpKind::NormGrad);
  if (!po) return;
  Value& o = *po;
  int ro = o.rank;
  for (int a = 0; a < axes(); ++a) {
    Placement x = shift(pin(0, a), in(0).rank, ro), y = shift(pin(1, a), in(1).rank, ro);
    if (x.is_p() || y.is_p()) {
      int pi = x.is_p() ? 0 : 1, oi = 1 - pi;
      Placement other = pi == 0 ? y : x;
      Placement part = pi == 0 ? x : y;
      if (multiply) {
        if (other.is_p()) return partial_misuse(1, a, "a product of two pending sums is not the sum of the per-rank products");
        if (!other.is_r())
          return partial_misuse(pi, a, fmt::format("multiplying by {}, which is {} over {}, scales each summand by a different value", iname(oi),
                                                   ps(other), axn(a)));
        // x * y with y replicated: linear in x, but y's sign is unknown (a negative factor turns a max into a min)
        auto r = reduce_through(PointwiseMap::times_unknown_sign(), part.op);
        if (!r)
          return partial_misuse(pi, a, fmt::format("the sign of {} is not known, and a negative factor turns a pending {} into a {}", iname(oi),
                                                   reduce_name(part.op), part.op == ReduceOp::Max ? "min" : "max"),
                                fix_allreduce(iname(pi), a, part));
        set_from(o, a, Placement::p(*r), pi);
        continue;
      }
      if (other.is_p() && other == part && part.linear_partial()) {
        set_from(o, a, part, pi);
        continue;
      }
      if (other.is_p())
        return partial_misuse(pi, a,
                              other.op == part.op ? fmt::format("{} is {} too; the {} of per-rank sums is not the sum of the two {}s", iname(oi), ps(other),
                                                                reduce_name(part.op), reduce_name(part.op))
                                                  : fmt::format("{} is {}; pending reductions of different kinds do not add up", iname(oi), ps(other)),
                              fmt::format("reduce both operands first ({} with reduce: {}, {} with reduce: {}), then combine them", iname(pi),
                                          reduce_name(part.op), iname(oi), reduce_name(other.op)));
      bool param = false;
      for (const auto& t : p_.tensors) param |= t.param && p_.name(t.name) == iname(oi);
      bool step = op_->kind == OpKind::Sub && pi == 1 && param && other.is_r();  // w - g: an optimizer step
      std::string rop = part.op != ReduceOp::Sum ? fmt::format(", reduce: {}", reduce_name(part.op)) : "";
      // A sequence-parallel residual (S(d)) takes the ReduceScatter along its dim, not an AllReduce.
      int od = other.is_s() ? pin(oi, a).dim + (ro - in(oi).rank) - (ro - in(pi).rank) : -1;
      std::string coll, renamed;
      if (od >= 0) {
        renamed = iname(pi) + "_rs";
        coll = fmt::format("{{op: ReduceScatter, in: [{}], out: {}, axis: {}, dim: {}{}}}", iname(pi), renamed, axn(a), od, rop);
      } else {
        renamed = iname(pi) + "_reduced";
        coll = fmt::format("{{op: AllReduce, in: [{}], out: {}, axis: {}{}}}", iname(pi), renamed, axn(a), rop);
      }
      std::string text = od >= 0 ? fmt::format("reduce-scatter {} along dim {} to match {} (sequence parallelism): insert {} before this op and read {} "
                                               "here",
                                               iname(pi), od, iname(oi), coll, renamed)
                                 : fmt::format("reduce {} before combining it with {}: insert {} before this op and read {} here", iname(pi),
                                               iname(oi), coll, renamed);
      if (!other.is_r())
        return partial_misuse(pi, a, fmt::format("{} is {}; adding per-rank values to a pending reduction is not the reduction of the sums", iname(oi), ps(other)),
                              od >= 0 ? text : "reduce both operands, or convert the per-rank one explicitly, before combining them");
      // x + b, x - b (slope +1) and b - x (slope -1) with b replicated: affine, monotone; not additive
      bool negated = op_->kind == OpKind::Sub && pi == 1;
      auto r = reduce_through(PointwiseMap::offset(negated ? -1 : +1), part.op);
      if (!r)
        return partial_misuse(pi, a,
                              step ? fmt::format("{} is a replicated parameter and {} a gradient each rank holds only its own contribution to: every "
                                                 "rank would step with a different partial gradient and the replicas drift apart (the gradient's "
                                                 "reduction over {} is missing)",
                                                 iname(oi), iname(pi), axn(a))
                                   : fmt::format("every rank {} {} (R), so the pending sum counts it {} times{}",
                                                 op_->kind == OpKind::Sub && pi == 0 ? "subtracts" : "adds", iname(oi), axsize(a),
                                                 op_->kind == OpKind::Add ? " (the row-parallel bias bug)" : ""),
                              text);
      set_from(o, a, Placement::p(*r), pi);
      continue;
    }
    if (!combine_layout(o, a, 0, x, 1, y, ro)) return;
  }
}

// The start of an elementwise op of two operands (broadcast): no `scalar:` beside them (unless `number_ok`), I only
// with I, the broadcast shape. The output (the first operand's dtype, uneven when either is), or null after a report.
Value* Checker::broadcast_pair(bool number_ok) {
  if (at().has_number && !number_ok) {
    report(CheckId::ShapeMismatch, fmt::format("{} takes either two inputs or one input and `scalar:`", opname()), iname(0));
    return nullptr;
  }
  if (!invariant_ok({0, 1})) return nullptr;
  Value& o = out();
  if (!broadcast_shape(in(0), in(1), o) || !broadcast_shards_ok(o) || !orders_ok(o)) return nullptr;
  o.dtype = in(0).dtype;
  o.uneven = in(0).uneven || in(1).uneven;
  return &o;
}

// The layout on axis a of an elementwise combination of inputs i and j when neither is P there (x, y:
// their placements renumbered into the output's rank ro). False after a report.
bool Checker::combine_layout(Value& o, int a, int i, Placement x, int j, Placement y, int ro) {
  if (x == y) {
    set_from(o, a, x, i);
  } else if (x.is_r() || (x.is_v() && y.is_s())) {  // R (or V) with S(d): read as its local slice, so S(d)
    if (y.is_s() && !slice_ok(i, a, y.dim - (ro - in(i).rank), j)) return false;
    set_from(o, a, y, j);
  } else if (y.is_r() || (y.is_v() && x.is_s())) {
    if (x.is_s() && !slice_ok(j, a, x.dim - (ro - in(j).rank), i)) return false;
    set_from(o, a, x, i);
  } else if (x.is_s() && y.is_s()) {
    std::string msg = fmt::format("{} combines {} (S({}) over {}) with {} (S({}) over {} in the output's dims): the two are split along "
                                  "different dims, so their local pieces do not line up",
                                  opname(), iname(i), pin(i, a).dim, axn(a), iname(j), pin(j, a).dim, axn(a));
    // An operand whose shard a ReduceScatter / Scatter / AllToAll of this program put on the other dim: fix that op's dim.
    for (int k : {i, j}) {
      int other = k == i ? j : i, want = pin(other, a).dim + (ro - in(other).rank) - (ro - in(k).rank);
      std::vector<Note> notes;
      Fix f;
      if (!scatter_dim_fix(in(k), a, want, notes, f)) continue;
      std::vector<Note> all;
      origin_note(all, in(k), a);
      all.insert(all.end(), notes.begin(), notes.end());
      report(CheckId::LayoutConflict, msg, iname(k), std::move(all));
      diags_.back().fix = std::move(f);
      return false;
    }
    layout_conflict(msg, iname(j), j, a, fix_allgather(iname(j), a, pin(j, a).dim));
    return false;
  } else {
    set_new(o, a, Placement::v(), fmt::format("{} of {} and {} gives per-rank values", opname(), ps(x), ps(y)));  // V with S or V
  }
  return true;
}

}  // namespace spmd::detail
