// interp/ops_elementwise.cpp - the numeric oracle: elementwise ops.
//
// Ops: SiLU/GELU/ReLU/Cast/LossScale/Neg/Exp/Log/Sqrt/Rsqrt, Add/Sub/Multiply/Div/Maximum/Minimum, Where,
// Dropout (the FP8 ops are in ops_fp8.cpp).
#include "interp/runner.h"

#include <algorithm>

namespace spmd::interp {

namespace {

bool all_finite(const Tensor& t) {
  return std::all_of(t.data.begin(), t.data.end(), [](double e) { return std::isfinite(e); });
}

// The single-device run's taint of a result that leaves the reals where its inputs did not (x / 0, log 0,
// 1 / sqrt(0)): there the program has no real value, and IEEE's signed zeros and infinities make the per-rank
// and single-device runs differ in ways the real-number semantics does not define, so it is not compared.
std::string leaves_reals(bool global, const Tensor& out, std::initializer_list<const Tensor*> ins, const std::string& taint) {
  if (!global || all_finite(out)) return taint;
  for (const Tensor* t : ins)
    if (!all_finite(*t)) return taint;
  return std::string(1, kExcluded) + "its value leaves the reals (a division by zero, a log or rsqrt of zero) where its inputs did not";
}

}  // namespace

// SiLU, GELU, ReLU, Cast, LossScale, Neg, Exp, Log, Sqrt, Rsqrt: a function of each element.
void Runner::pointwise(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const OpAttrs& at = op.attrs;
  Val v = in(oi, r, 0);
  DType dt = at.has_dtype ? at.dtype : DType::F32;
  const bool was_finite = global_ && all_finite(v.t);  // only the single-device run is tainted
  // The dispatcher sends only the ops named here; the function is picked once, not per element.
  const OpKind k = op.kind;
  std::function<double(double)> f = [](double x) { return x; };
  if (k == OpKind::SiLU) f = [](double x) { return x / (1 + std::exp(-x)); };
  else if (k == OpKind::GELU) f = [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); };
  else if (k == OpKind::ReLU) f = [](double x) { return x > 0 ? x : 0.0; };
  else if (k == OpKind::Cast && at.has_dtype && is_int(dt))
    f = [dt](double x) { return dt == DType::Bool ? (x != 0 ? 1.0 : 0.0) : std::trunc(x); };
  else if (k == OpKind::LossScale) f = [s = at.number](double x) { return x * s; };
  else if (k == OpKind::Neg) f = [](double x) { return -x; };
  else if (k == OpKind::Exp) f = [](double x) { return std::exp(x); };
  else if (k == OpKind::Log) f = [](double x) { return std::log(x); };
  else if (k == OpKind::Sqrt) f = [](double x) { return std::sqrt(x); };
  else if (k == OpKind::Rsqrt) f = [](double x) { return 1 / std::sqrt(x); };
  v.t = unary(v.t, f);
  std::string t = was_finite ? leaves_reals(true, v.t, {}, taint) : taint;
  return set_out(oi, r, 0, std::move(v), t);
}

void Runner::elementwise(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  // The dispatcher sends only Add, Sub, Multiply, Div, Maximum and Minimum here; picked once, not per element.
  const OpKind k = op.kind;
  std::function<double(double, double)> f = [](double a, double b) { return a * b; };
  if (k == OpKind::Add) f = [](double a, double b) { return a + b; };
  else if (k == OpKind::Sub) f = [](double a, double b) { return a - b; };
  else if (k == OpKind::Div) f = [](double a, double b) { return a / b; };
  else if (k == OpKind::Maximum) f = [](double a, double b) { return std::max(a, b); };
  else if (k == OpKind::Minimum) f = [](double a, double b) { return std::min(a, b); };
  if (op.n_in == 1) {
    Val v = in(oi, r, 0);
    double s = op.attrs.number;
    v.t = unary(v.t, [&](double a) { return f(a, s); });
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
  Tensor sel = binary(ml, binary(xl, yl, [](double a, double) { return a; }), [](double k, double a) { return k != 0 ? a : 0.0; });
  Tensor other = binary(ml, binary(yl, xl, [](double b, double) { return b; }), [](double k, double b) { return k != 0 ? 0.0 : b; });
  o.t = binary(sel, other, [](double a, double b) { return a + b; });
  set_out(oi, r, 0, std::move(o), taint);
}

void Runner::dropout(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val v = in(oi, r, 0);
  double p = op.attrs.has_number ? op.attrs.number : 0.1;
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
    x = unit(mix(key ^ static_cast<std::uint64_t>(flat))) < p ? 0.0 : x / (1 - p);
    for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[static_cast<std::size_t>(d)] < v.t.shape[static_cast<std::size_t>(d)]) break;
      idx[static_cast<std::size_t>(d)] = 0;
    }
  }
  set_out(oi, r, 0, std::move(v), t);
}

}  // namespace spmd::interp
