// spatial/rules_math.cpp - placement and shape rules of the value ops of issue 10
//
// Ops: Neg/Exp/Log/Sqrt/Rsqrt/Sigmoid, Div/Maximum/Minimum, Where. Which pending reductions pass each map is
// decided by reduce_through (ir/placement.h); docs/semantics.md, section 1, says why. Dispatched from
// Checker::apply() in rules.cpp.
#include "spatial/checker.h"

namespace spmd::detail {

// Neg is linear (x -> -x: sum and avg stay, max and min swap); Exp, Log, Sqrt and Sigmoid are monotone increasing
// on their domain (max and min stay), Rsqrt decreasing (they swap); none of the four is additive.
void Checker::math_unary() {
  Value& o = out() = in(0);
  PointwiseMap f = op_->kind == OpKind::Neg     ? PointwiseMap::scale(-1)
                   : op_->kind == OpKind::Rsqrt ? PointwiseMap::monotone_down()
                                                : PointwiseMap::monotone_up();  // Exp, Log, Sqrt, Sigmoid
  map_partials(o, 0, f, opname());
}

// Div, Maximum, Minimum: two operands (broadcast) or one with `scalar`.
void Checker::div_minmax() {
  const std::string op = opname();
  bool div = op_->kind == OpKind::Div;
  ReduceOp own = op_->kind == OpKind::Maximum ? ReduceOp::Max : ReduceOp::Min;
  if (n_in() == 1) {
    Value& o = out() = in(0);
    if (!at().has_number) return report(CheckId::ShapeMismatch, fmt::format("{} with one input needs `scalar:`", op), iname(0));
    // x / c is x times 1/c (the loader rejects c = 0); max(x, c) and min(x, c) are monotone increasing, not affine
    if (div) return (void)map_partials(o, 0, PointwiseMap::scale(1 / at().number), fmt::format("dividing by {}", at().number));
    return (void)map_partials(o, 0, PointwiseMap::monotone_up(), fmt::format("{} with {}", op, at().number));
  }
  Value* po = broadcast_pair(false);
  if (!po) return;
  Value& o = *po;
  int ro = o.rank;
  for (int a = 0; a < axes(); ++a) {
    Placement x = shift(pin(0, a), in(0).rank, ro), y = shift(pin(1, a), in(1).rank, ro);
    if (!x.is_p() && !y.is_p()) {
      if (!combine_layout(o, a, 0, x, 1, y, ro)) return;
      continue;
    }
    if (div) {
      if (y.is_p())
        return partial_misuse(1, a, fmt::format("the reciprocal of a pending {} is not the {} of the per-rank reciprocals", reduce_name(y.op), reduce_name(y.op)));
      if (!y.is_r())
        return partial_misuse(0, a, fmt::format("dividing by {}, which is {} over {}, scales each summand by a different value", iname(1), ps(y), axn(a)));
      // x / y with y replicated: linear in x, but the sign of y is unknown (a negative divisor turns a max into a min)
      auto r = reduce_through(PointwiseMap::times_unknown_sign(), x.op);
      if (!r)
        return partial_misuse(0, a, fmt::format("the sign of {} is not known, and a negative divisor turns a pending {} into a {}", iname(1),
                                                reduce_name(x.op), x.op == ReduceOp::Max ? "min" : "max"),
                              fix_allreduce(iname(0), a, x));
      set_from(o, a, Placement::p(*r), 0);
      continue;
    }
    int pi = x.is_p() ? 0 : 1, oi = 1 - pi;
    Placement part = pi == 0 ? x : y, other = pi == 0 ? y : x;
    if (other.is_p()) {
      // max(max_r a_r, max_r b_r) = max_r max(a_r, b_r); no other pair of pending reductions combines
      if (part.op == own && other.op == own) {
        set_from(o, a, part, pi);
        continue;
      }
      return partial_misuse(part.op == own ? oi : pi, a,
                            fmt::format("{} is {} and {} is {}; only two pending {}s combine under {}", iname(0), ps(x), iname(1), ps(y),
                                        reduce_name(own), op),
                            fmt::format("reduce both operands first ({} with reduce: {}, {} with reduce: {}), then combine them", iname(0),
                                        reduce_name(x.op), iname(1), reduce_name(y.op)));
    }
    if (!other.is_r())
      return partial_misuse(pi, a, fmt::format("{} is {}; a per-rank operand does not commute with the pending reduction", iname(oi), ps(other)));
    // max(x, b), min(x, b) with b replicated: monotone increasing in x, not affine
    auto r = reduce_through(PointwiseMap::monotone_up(), part.op);
    if (!r)
      return partial_misuse(pi, a, fmt::format("{} with {} (R) is not linear, so it does not commute with the pending {}", op, iname(oi), reduce_name(part.op)));
    set_from(o, a, Placement::p(*r), pi);
  }
}

// Where(mask, a, b): a per element where mask is nonzero, else b.
void Checker::where() {
  if (!invariant_ok({0, 1, 2})) return;
  Value ab;
  if (!broadcast_shape(in(1), in(2), ab)) return;
  Value& o = out();
  if (!broadcast_shape(in(0), ab, o) || !broadcast_shards_ok(o) || !orders_ok(o)) return;
  o.dtype = in(1).dtype;
  o.uneven = in(0).uneven || in(1).uneven || in(2).uneven;
  int ro = o.rank;
  for (int a = 0; a < axes(); ++a) {
    Placement m = shift(pin(0, a), in(0).rank, ro), x = shift(pin(1, a), in(1).rank, ro), y = shift(pin(2, a), in(2).rank, ro);
    if (m.is_p())
      return partial_misuse(0, a, fmt::format("a mask pending a {} is not a mask yet: each rank would select with its own summand", reduce_name(m.op)));
    if (x.is_p() || y.is_p()) {
      int pi = x.is_p() ? 1 : 2, oi = 3 - pi;
      Placement part = pi == 1 ? x : y, other = pi == 1 ? y : x;
      if (!m.is_r())
        return partial_misuse(pi, a, fmt::format("the mask {} is {} over {}, so ranks select different elements of the pending {}", iname(0), ps(m), axn(a),
                                                 reduce_name(part.op)));
      if (other.is_p()) {
        // where(m, op_r a_r, op_r b_r) = op_r where(m, a_r, b_r) for one op on both sides
        if (other.op == part.op) {
          set_from(o, a, part, pi);
          continue;
        }
        return partial_misuse(pi, a, fmt::format("{} is {}; pending reductions of different kinds do not mix", iname(oi), ps(other)),
                              fmt::format("reduce both operands first ({} with reduce: {}, {} with reduce: {}), then select", iname(1),
                                          reduce_name(x.op), iname(2), reduce_name(y.op)));
      }
      if (!other.is_r())
        return partial_misuse(pi, a, fmt::format("{} is {}; selecting per-rank values into a pending reduction is not the reduction of the selections", iname(oi),
                                                 ps(other)));
      // where(m, x, b) with b replicated: the unselected b is the same on every rank, which avg, max and min keep
      // and a sum counts once per rank
      if (part.op == ReduceOp::Sum)
        return partial_misuse(pi, a, fmt::format("every rank selects {} (R) where the mask is {}, so the pending sum counts it {} times", iname(oi),
                                                 pi == 1 ? "zero" : "nonzero", axsize(a)));
      set_from(o, a, part, pi);
      continue;
    }
    if (!combine_layout(o, a, 1, x, 2, y, ro)) return;
    Placement xy = pl_of(o, a);
    // A sharded mask slices both operands that are whole (R) or unsharded per-rank (V) on this axis, not only
    // the one that stands for their combination: each must allow its local slice.
    if (m.is_s())
      for (int k : {1, 2}) {
        Placement pk = k == 1 ? x : y;
        if ((pk.is_r() || pk.is_v()) && !slice_ok(k, a, m.dim - (ro - in(k).rank), 0)) return;
      }
    if (!combine_layout(o, a, xy == x ? 1 : 2, xy, 0, m, ro)) return;
  }
}

}  // namespace spmd::detail
