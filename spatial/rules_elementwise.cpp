// spatial/rules_elementwise.cpp - placement and shape rules of the pointwise compute ops
//
// Ops: SiLU/GELU/ReLU/FP8Quantize, Step, Cast/FP8Dequantize, LossScale, Dropout, Add/Sub/Multiply,
// AmaxUpdate. Dispatched from Checker::apply() in rules.cpp.
#include "spatial/checker.h"

namespace spmd::detail {

void Checker::nonlinear() {
  Value& o = out() = in(0);
  if (op_->kind == OpKind::FP8Quantize) o.dtype = at().has_dtype ? at().dtype : DType::FP8E4M3;
  for (int a = 0; a < axes(); ++a)
    if (pin(0, a).is_p())
      return partial_misuse(0, a, pin(0, a).op == ReduceOp::Sum ? "a nonlinear op on a pending sum is not the sum of its parts"
                                                                 : "a nonlinear op on a pending reduction is not the reduction of its parts");
}

// An opaque step: its output has the type of its first input; nothing is known to be linear.
void Checker::step_rule() {
  out() = in(0);
  for (int i = 0; i < n_in(); ++i)
    for (int a = 0; a < axes(); ++a)
      if (pin(i, a).is_p()) return partial_misuse(i, a, "an opaque compute step is not known to be linear in a pending sum");
}

void Checker::linear() {
  Value& o = out() = in(0);
  if (at().has_dtype) o.dtype = at().dtype;
  else if (op_->kind == OpKind::FP8Dequantize) o.dtype = DType::F32;
  bool integral = o.dtype == DType::I64 || o.dtype == DType::I32 || o.dtype == DType::I8 || o.dtype == DType::Bool;
  for (int a = 0; a < axes() && integral; ++a)
    if (pin(0, a).linear_partial())
      return partial_misuse(0, a, fmt::format("rounding to {} does not commute with the pending sum (the rounded summands need not add up "
                                              "to the rounded total)",
                                              dtype_name(o.dtype)));
}

void Checker::loss_scale() {
  Value& o = out() = in(0);
  for (int a = 0; a < axes(); ++a)
    if (pin(0, a).is_p() && !pin(0, a).linear_partial() && at().number < 0)
      return partial_misuse(0, a, "a negative scale swaps max and min, so the pending reduction changes meaning");
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
  for (int a = 0; a < axes(); ++a) {
    Placement p = pin(0, a);
    if (p.is_p()) return partial_misuse(0, a, "a random mask on a pending reduction is not the reduction of masked parts");
    if (at().rng_per_rank && (p.is_r() || p.is_i()))
      set_new(o, a, Placement::v(), fmt::format("Dropout with `rng: per_rank` draws a different mask on every rank of {}", axn(a)));
  }
}

void Checker::add_like(bool multiply) {
  const std::string op = opname();
  if (n_in() == 1) {
    out() = in(0);
    if (!at().has_number) return report(CheckId::ShapeMismatch, fmt::format("{} with one input needs `scalar:`", op), iname(0));
    for (int a = 0; a < axes(); ++a) {
      Placement p = pin(0, a);
      if (!p.is_p()) continue;
      if (multiply && p.linear_partial()) continue;
      if (multiply && at().number >= 0) continue;  // a non-negative scale keeps max and min
      if (multiply) return partial_misuse(0, a, "a negative scale swaps max and min");
      return partial_misuse(0, a, fmt::format("every rank adds the scalar, so the pending reduction counts it {} times", axsize(a)),
                            fmt::format("apply the scalar after the reduction: insert {{op: AllReduce, in: [{}], out: {}_reduced, axis: {}}} "
                                        "before this op",
                                        iname(0), iname(0), axn(a)));
    }
    return;
  }
  if (at().has_number) return report(CheckId::ShapeMismatch, fmt::format("{} takes either two inputs or one input and `scalar:`", op), iname(0));
  if (!invariant_ok({0, 1})) return;
  Value& o = out();
  if (!broadcast_shape(in(0), in(1), o)) return;
  o.dtype = in(0).dtype;
  o.uneven = in(0).uneven || in(1).uneven;
  int ro = o.rank;
  for (int a = 0; a < axes(); ++a) {
    Placement x = shift(pin(0, a), in(0).rank, ro), y = shift(pin(1, a), in(1).rank, ro);
    if (x.is_p() || y.is_p()) {
      int pi = x.is_p() ? 0 : 1, oi = 1 - pi;
      Placement other = pi == 0 ? y : x;
      Placement part = pi == 0 ? x : y;
      if (multiply) {
        if (other.is_p()) return partial_misuse(1, a, "a product of two pending sums is not the sum of the per-rank products");
        if (!part.linear_partial()) return partial_misuse(pi, a, "a product does not commute with a pending max or min");
        if (other.is_r()) {
          set_from(o, a, part, pi);
          continue;
        }
        return partial_misuse(pi, a, fmt::format("multiplying by {}, which is {} over {}, scales each summand by a different value", iname(oi),
                                                 ps(other), axn(a)));
      }
      if (other.is_p() && other == part && part.linear_partial()) {
        set_from(o, a, part, pi);
        continue;
      }
      if (other.is_p())
        return partial_misuse(pi, a, fmt::format("{} is {}; pending reductions of different kinds do not add up", iname(oi), ps(other)),
                              fmt::format("reduce both operands first ({} with reduce: {}, {} with reduce: {}), then combine them", iname(pi),
                                          reduce_name(part.op), iname(oi), reduce_name(other.op)));
      if (!part.linear_partial()) return partial_misuse(pi, a, "an addition does not commute with a pending max or min");
      std::string why = other.is_r()
                            ? fmt::format("every rank adds {} (R), so the pending sum counts it {} times (the row-parallel bias bug)", iname(oi), axsize(a))
                            : fmt::format("{} is {}; adding per-rank values to a pending sum is not affine-safe", iname(oi), ps(other));
      return partial_misuse(pi, a, why,
                            fmt::format("add {} after the reduction: insert {{op: AllReduce, in: [{}], out: {}_reduced, axis: {}}} before this op "
                                        "and add {} to its result",
                                        iname(oi), iname(pi), iname(pi), axn(a), iname(oi)));
    }
    if (x == y) {
      set_from(o, a, x, 0);
    } else if (x.is_r() || (x.is_v() && y.is_s())) {  // R (or V) with S(d): read as its local slice, so S(d)
      if (y.is_s() && !slice_ok(0, a, y.dim - (ro - in(0).rank), 1)) return;
      set_from(o, a, y, 1);
    } else if (y.is_r() || (y.is_v() && x.is_s())) {
      if (x.is_s() && !slice_ok(1, a, x.dim - (ro - in(1).rank), 0)) return;
      set_from(o, a, x, 0);
    } else if (x.is_s() && y.is_s()) {
      return layout_conflict(fmt::format("{} combines {} (S({}) over {}) with {} (S({}) over {} in the output's dims): the two are split along "
                                         "different dims, so their local pieces do not line up",
                                         op, iname(0), pin(0, a).dim, axn(a), iname(1), pin(1, a).dim, axn(a)),
                             iname(1), 1, a, fix_allgather(iname(1), a, pin(1, a).dim));
    } else {
      set_new(o, a, Placement::v(), fmt::format("{} of {} and {} gives per-rank values", op, ps(x), ps(y)));  // V with S or V
    }
  }
}

void Checker::amax() {
  Value& o = out() = in(0);
  o.rank = 0;
  o.dtype = DType::F32;
  for (int a = 0; a < axes(); ++a) {
    Placement p = pin(0, a);
    if (p.is_p()) return partial_misuse(0, a, "the max of a pending sum is not the max of its summands");
    if (p.is_s()) set_new(o, a, Placement::p(ReduceOp::Max), fmt::format("AmaxUpdate of a tensor sharded {} over {} is each rank's own max", ps(p), axn(a)));
  }
}

}  // namespace spmd::detail
