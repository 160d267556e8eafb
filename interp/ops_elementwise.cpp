// interp/ops_elementwise.cpp - the numeric oracle: elementwise ops.
//
// Ops: SiLU/GELU/ReLU/Sigmoid/Cast/LossScale/Neg/Exp/Log/Sqrt/Rsqrt/Not, Add/Sub/Multiply/Div/Maximum/Minimum,
// the comparisons Eq/Ne/Lt/Le/Gt/Ge and And/Or, Where, Dropout (the FP8 ops are in ops_fp8.cpp).
#include "interp/runner.h"

#include <algorithm>
#include <utility>

namespace spmd::interp {

namespace {

bool all_finite(const Tensor& t) {
  return std::all_of(t.data.begin(), t.data.end(), [](const Num& e) { return std::isfinite(e.d); });
}

}  // namespace

// The single-device run's taint of a result that leaves the reals where its inputs did not (x / 0, log 0,
// 1 / sqrt(0)): there the program has no real value, and IEEE's signed zeros and infinities make the per-rank
// and single-device runs differ in ways the real-number semantics does not define, so it is not compared.
std::string leaves_reals(bool global, const Tensor& out, std::initializer_list<const Tensor*> ins, const std::string& taint) {
  if (!global || all_finite(out)) return taint;
  for (const Tensor* t : ins)
    if (!all_finite(*t)) return taint;
  return std::string(1, kExcluded) + "its value leaves the reals (a division by zero, a log or rsqrt of zero) where its inputs did not";
}

// A mask's value (1 or 0) decided by the doubles: a choice by value unless every operand is an exact constant
// (integer data, positions: degree 0 in the lanes), which equiv/ must know (Runner::inexact_choice).
void Runner::chose(int oi, const Num& a, const Num* b) {
  if (num::on() && inexact_choice < 0 && (a.deg > 0 || (b && b->deg > 0))) inexact_choice = oi;
}
Num Runner::decide(int oi, bool v, const Num& a, const Num* b) {
  chose(oi, a, b);
  return Num(v ? 1.0 : 0.0);
}

// The `scalar` of op `oi` on this rank: a number, or (local view) a size expression of axis_index.
Num Runner::scalar_of(const Op& op) const {
  ExprId e = p_.scalar_expr(op);
  return e < 0 ? Num(op.attrs.number) : Num(static_cast<double>(eval(e, "the scalar of " + std::string(op_name(op.kind)))));
}

// SiLU, GELU, ReLU, Sigmoid, Cast, LossScale, Neg, Exp, Log, Sqrt, Rsqrt, Sin, Cos, Not: a function of each element.
void Runner::pointwise(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const OpAttrs& at = op.attrs;
  Val v = in(oi, r, 0);
  DType dt = at.has_dtype ? at.dtype : DType::F32;
  const bool was_finite = global_ && all_finite(v.t);  // only the single-device run is tainted
  // The dispatcher sends only the ops named here; the function is picked once, not per element (and inlined).
  const OpKind k = op.kind;
  auto map = [&](auto f) { v.t = unary(v.t, f); };
  // SiLU and Sigmoid divide every element by 1 + exp(-x): the quotients share one field inverse (div_many)
  auto by_one_plus_exp = [&](bool times_x) {
    const Num one = 1.0;
    Tensor den = unary(v.t, [&](const Num& x) { return one + exp(-x); });
    const Num* x = std::as_const(v.t).data.data();
    Num* q = den.data.data();  // the quotients in den's place
    div_many(times_x ? x : nullptr, q, q, den.data.size());
    if (times_x)  // silu's real value as silu() gives it
      for (std::size_t w = 0; w < den.data.size(); ++w) q[w].d = x[w].d / (1 + std::exp(-x[w].d));
    v.t = std::move(den);
  };
  if (k == OpKind::SiLU && num::on()) by_one_plus_exp(true);
  else if (k == OpKind::SiLU) map([](const Num& x) { return silu(x); });
  else if (k == OpKind::GELU) map([](const Num& x) { return gelu(x); });
  else if (k == OpKind::ReLU) map([](const Num& x) { return relu(x); });
  else if (k == OpKind::Cast && at.has_dtype && is_int(dt))  // to an integer type: integer data, exact (decided by d: a choice on inexact data)
    map([this, oi, dt](const Num& x) {
      chose(oi, x, nullptr);
      return Num(dt == DType::Bool ? (x.d != 0 ? 1.0 : 0.0) : std::trunc(x.d));
    });
  else if (k == OpKind::LossScale) map([s = Num(at.number)](const Num& x) { return x * s; });
  else if (k == OpKind::Neg) map([](const Num& x) { return -x; });
  else if (k == OpKind::Exp) map([](const Num& x) { return exp(x); });
  else if (k == OpKind::Log) map([](const Num& x) { return log(x); });
  else if (k == OpKind::Sqrt) map([](const Num& x) { return sqrt(x); });
  else if (k == OpKind::Rsqrt) map([](const Num& x) { return rsqrt(x); });
  else if (k == OpKind::Sigmoid && num::on()) by_one_plus_exp(false);
  else if (k == OpKind::Sigmoid)  // 1 / (1 + exp(-x)) with the lane exp (docs/equivalence.md)
    map([](const Num& x) {
      const Num one = 1.0;  // made here: a constant's lanes are set only while the lanes are on
      return one / (one + exp(-x));
    });
  else if (k == OpKind::Sin) map([](const Num& x) { return sin(x); });
  else if (k == OpKind::Cos) map([](const Num& x) { return cos(x); });
  else if (k == OpKind::Not) map([this, oi](const Num& x) { return decide(oi, x.d == 0, x, nullptr); });
  else map([](const Num& x) { return x; });
  std::string t = was_finite ? leaves_reals(true, v.t, {}, taint) : taint;
  return set_out(oi, r, 0, std::move(v), t);
}

void Runner::elementwise(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  // The dispatcher sends only Add, Sub, Multiply, Div, Maximum, Minimum, the comparisons, And and Or here; picked
  // once, not per element.
  const OpKind k = op.kind;
  auto apply = [&](auto f) {
    if (op.n_in == 1) {
      Val v = in(oi, r, 0);
      const Num s = scalar_of(op);
      v.t = unary(v.t, [&](const Num& a) { return f(a, s); });
      return set_out(oi, r, 0, std::move(v), taint);
    }
    const Val& x = in(oi, r, 0);
    const Val& y = in(oi, r, 1);
    Val o;
    o.gshape = broadcast_shapes(x.gshape, y.gshape);
    o.mask = union_masks(x, y, o.gshape.size());
    Tensor xl = align(x, slice_target(x, o.mask), c, p_.name(p_.ins(op)[0]));
    Tensor yl = align(y, slice_target(y, o.mask), c, p_.name(p_.ins(op)[1]));
    o.t = binary(xl, yl, f);
    std::string t = leaves_reals(global_, o.t, {&xl, &yl}, taint);
    set_out(oi, r, 0, std::move(o), t);
  };
  // The comparisons and And/Or: a bool mask decided by value (decide: integer data is exact).
  auto mask = [this, oi](auto pred) { return [this, oi, pred](const Num& a, const Num& b) { return decide(oi, pred(a.d, b.d), a, &b); }; };
  if (k == OpKind::Eq) apply(mask([](double a, double b) { return a == b; }));
  else if (k == OpKind::Ne) apply(mask([](double a, double b) { return a != b; }));
  else if (k == OpKind::Lt) apply(mask([](double a, double b) { return a < b; }));
  else if (k == OpKind::Le) apply(mask([](double a, double b) { return a <= b; }));
  else if (k == OpKind::Gt) apply(mask([](double a, double b) { return a > b; }));
  else if (k == OpKind::Ge) apply(mask([](double a, double b) { return a >= b; }));
  else if (k == OpKind::And) apply(mask([](double a, double b) { return a != 0 && b != 0; }));
  else if (k == OpKind::Or) apply(mask([](double a, double b) { return a != 0 || b != 0; }));
  else if (k == OpKind::Add) apply([](const Num& a, const Num& b) { return a + b; });
  else if (k == OpKind::Sub) apply([](const Num& a, const Num& b) { return a - b; });
  else if (k == OpKind::Div) apply([](const Num& a, const Num& b) { return a / b; });
  else if (k == OpKind::Maximum) apply([](const Num& a, const Num& b) { return max2(a, b); });
  else if (k == OpKind::Minimum) apply([](const Num& a, const Num& b) { return min2(a, b); });
  else apply([](const Num& a, const Num& b) { return a * b; });
}

// Where(mask, a, b): the three operands broadcast together, each rank reading its block of each.
void Runner::where(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& m = in(oi, r, 0);
  const Val& x = in(oi, r, 1);
  const Val& y = in(oi, r, 2);
  Val xy;
  xy.gshape = broadcast_shapes(x.gshape, y.gshape);
  xy.mask = union_masks(x, y, xy.gshape.size());
  Val o;
  o.gshape = broadcast_shapes(m.gshape, xy.gshape);
  o.mask = union_masks(m, xy, o.gshape.size());
  auto ins = p_.ins(op);
  Tensor ml = align(m, slice_target(m, o.mask), c, p_.name(ins[0]));
  Tensor xl = align(x, slice_target(x, o.mask), c, p_.name(ins[1]));
  Tensor yl = align(y, slice_target(y, o.mask), c, p_.name(ins[2]));
  // two selections that never overlap, then their union (b where the mask is zero)
  // (the mask is routing: decided by d, the lanes follow the chosen branch)
  Tensor sel = binary(ml, binary(xl, yl, [](const Num& a, const Num&) { return a; }), [](const Num& k, const Num& a) { return k.d != 0 ? a : Num(0.0); });
  Tensor other = binary(ml, binary(yl, xl, [](const Num& b, const Num&) { return b; }), [](const Num& k, const Num& b) { return k.d != 0 ? Num(0.0) : b; });
  o.t = binary(sel, other, [](const Num& a, const Num& b) { return a + b; });
  set_out(oi, r, 0, std::move(o), taint);
}

void Runner::dropout(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val v = in(oi, r, 0);
  double p = op.attrs.has_number ? op.attrs.number : 0.1;
  const Num keep = 1 - p;
  std::string t = taint;
  if (op.attrs.rng_per_rank && global_) t = "Dropout with `rng: per_rank` draws a different mask on every rank";
  // The mask is a function of the element's global position (and of the rank with rng: per_rank).
  std::uint64_t key = mix(seed_ * 7919 + static_cast<std::uint64_t>(oi));
  if (op.attrs.rng_per_rank) key = mix(key ^ static_cast<std::uint64_t>(r + 1));
  Shape lo(v.gshape.size());
  for (std::size_t d = 0; d < lo.size(); ++d) {
    std::int64_t h;
    block(v.gshape[d], v.mask[d], c, lo[d], h);
  }
  Shape gst = strides_of(v.gshape);
  Shape idx(v.t.shape.size(), 0);
  for (auto& x : v.t.data) {
    std::int64_t flat = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) flat += (lo[d] + idx[d]) * gst[d];
    x = unit(mix(key ^ static_cast<std::uint64_t>(flat))) < p ? Num(0.0) : x / keep;
    for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[static_cast<std::size_t>(d)] < v.t.shape[static_cast<std::size_t>(d)]) break;
      idx[static_cast<std::size_t>(d)] = 0;
    }
  }
  set_out(oi, r, 0, std::move(v), t);
}

}  // namespace spmd::interp
